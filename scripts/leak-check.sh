#!/usr/bin/env bash
# Fail when the tests left a container, volume or network behind. Everything the tests create
# carries the label `baseline.test-run` (tests/docker_env.py); anything still carrying it after the
# suite is a leak. `--clean` also removes what it reports (after a failed run, before the next).
set -euo pipefail
label=baseline.test-run
if ! docker info >/dev/null 2>&1; then
  echo "leak check: dockerd is not reachable, cannot check for leaks" >&2
  exit 1
fi
containers=$(docker ps -aq --filter "label=$label")
volumes=$(docker volume ls -q --filter "label=$label")
networks=$(docker network ls -q --filter "label=$label")
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
if [ -z "$containers$volumes$networks$orphan_images" ]; then
  echo "leak check: no container, volume, network (label $label) or volume image is left"
  exit 0
fi
echo "leak check: the tests left these behind (label $label):" >&2
[ -n "$containers" ] && docker ps -a --filter "label=$label" --format '  container {{.Names}} {{.Status}} {{.Label "baseline.test-run"}}' >&2
[ -n "$volumes" ] && docker volume ls --filter "label=$label" --format '  volume {{.Name}}' >&2
[ -n "$networks" ] && docker network ls --filter "label=$label" --format '  network {{.Name}}' >&2
for name in $orphan_images; do echo "  volume image $volume_root/$name (its volume is gone)" >&2; done
if [ "${1:-}" = "--clean" ]; then
  [ -n "$containers" ] && docker rm -f $containers >/dev/null
  [ -n "$volumes" ] && docker volume rm -f $volumes >/dev/null
  [ -n "$networks" ] && docker network rm $networks >/dev/null
  # the images of the volumes just removed are orphans now too
  for name in $(orphans); do
    mountpoint -q "$volume_root/$name/mnt" && umount "$volume_root/$name/mnt"
    rm -rf "${volume_root:?}/$name"
  done
  echo "leak check: removed them" >&2
fi
exit 1
