#!/usr/bin/env bash
# Fail when the tests left a container, volume or network behind. Everything the tests create
# carries the label `baseline.test-run` (tests/docker_env.py), and the `baseline` processes they
# start (and the test process itself, tests/conftest.py) run as a deployment named `test-...`
# (label `baseline.deployment`): anything still carrying either after the suite is a leak. So is
# a Task Standard family's run (label `baseline.family-run`, infra/family_run.py: a start or a
# scoring, which removes its container when it ends) and a saved state of a family's workspace
# (repository `baseline-family-state`, removed with its workspace or its scoring).
# `--clean` also removes what it reports (before a run: what an earlier, failed one left).
set -euo pipefail
label=baseline.test-run
deployment=baseline.deployment
if ! docker info >/dev/null 2>&1; then
  echo "leak check: dockerd is not reachable, cannot check for leaks" >&2
  exit 1
fi
# The ids of the objects of one kind (container, volume, network) that carry the test-run label
# or belong to a test deployment. Docker filters labels by exact value only: the deployment's
# prefix is matched here.
ids() {
  local kind=$1 list
  case $kind in
    container) list="docker ps -a" ;;
    volume) list="docker volume ls" ;;
    network) list="docker network ls" ;;
  esac
  local id_field='{{.ID}}'
  [ "$kind" = volume ] && id_field='{{.Name}}'
  $list -q --filter "label=$label"
  $list --filter "label=$deployment" --format "$id_field {{.Label \"$deployment\"}}" |
    awk '$2 ~ /^test-/ {print $1}'
}
describe() {
  local kind=$1 id
  for id in $2; do
    case $kind in
      container) docker inspect -f '  container {{.Name}} {{.State.Status}}' "$id" ;;
      *) echo "  $kind $id" ;;
    esac
  done
}
containers=$( (ids container; docker ps -aq --filter label=baseline.family-run) | sort -u)
# by tag, not id: an id may carry other repositories' tags too
states=$(docker images baseline-family-state --format '{{.Repository}}:{{.Tag}}' | sort -u)
volumes=$(ids volume | sort -u)
networks=$(ids network | sort -u)
# A bounded submission volume is an ext4 image under the volume root (infra/disk_images.py); an
# image whose Docker volume is gone is host disk (and maybe a loop mount) nobody will free.
volume_root=${BASELINE_VOLUME_ROOT:-/var/lib/baseline/volumes}
orphans() {
  [ -d "$volume_root" ] || return 0
  for dir in "$volume_root"/*/; do
    [ -d "$dir" ] || continue
    name=$(basename "$dir")
    docker volume inspect "$name" >/dev/null 2>&1 || echo "$name"
  done
}
orphan_images=$(orphans)
if [ -z "$containers$volumes$networks$orphan_images$states" ]; then
  echo "leak check: nothing of the tests (label $label, a test- deployment, a family run or saved state) is left"
  exit 0
fi
echo "leak check: these are left behind (label $label, a test- deployment, a family run or saved state):" >&2
describe container "$containers" >&2
describe volume "$volumes" >&2
describe network "$networks" >&2
for tag in $states; do echo "  family state image $tag" >&2; done
for name in $orphan_images; do echo "  volume image $volume_root/$name (its volume is gone)" >&2; done
if [ "${1:-}" = "--clean" ]; then
  [ -n "$containers" ] && docker rm -f $containers >/dev/null
  [ -n "$volumes" ] && docker volume rm -f $volumes >/dev/null
  [ -n "$networks" ] && docker network rm $networks >/dev/null
  [ -n "$states" ] && docker rmi $states >/dev/null
  # the images of the volumes just removed are orphans now too
  for name in $(orphans); do
    if mountpoint -q "$volume_root/$name/mnt"; then umount "$volume_root/$name/mnt"; fi
    rm -rf "${volume_root:?}/$name"
  done
  echo "leak check: removed them" >&2
fi
exit 1
