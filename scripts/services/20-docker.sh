#!/usr/bin/env bash
# Docker Engine for the workspace tests: install docker.io if missing, start dockerd by hand (no
# systemd here) when it is not answering, wait until `docker info` works, then build the base and
# workspace test images (cached by Dockerfile hash, so a second run builds nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
# Size-bounded submission volumes (infra/disk_images.py): mkfs.ext4, and mount/losetup for loops.
command -v mkfs.ext4 >/dev/null 2>&1 || missing="$missing e2fsprogs"
command -v losetup >/dev/null 2>&1 || missing="$missing mount"
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  bash "$(dirname "$0")/../apt-install.sh" $missing
fi
if ! docker info >/dev/null 2>&1; then
  log=/tmp/baseline-dockerd.log
  # setsid: dockerd must outlive this script and the test run that started it. Networks of /24
  # from 172.18.0.0/15 (512 of them) instead of Docker's default /16s (31 in all): the suite's
  # workers each make test networks at once, and a 32nd network cannot be created.
  setsid dockerd --host unix:///var/run/docker.sock \
    --default-address-pool base=172.18.0.0/15,size=24 >"$log" 2>&1 < /dev/null &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    echo "dockerd did not come up; last lines of $log:" >&2
    tail -20 "$log" >&2
    exit 1
  fi
fi
docker info --format 'dockerd {{.ServerVersion}} on {{.OperatingSystem}}, cgroup v{{.CgroupVersion}}'
# A loop-mounted ext4 image must work here (the disk bound of every workspace's submission).
probe=$(mktemp -d /tmp/baseline-loop-probe.XXXXXX)
truncate -s 8M "$probe/disk.img"
mkfs.ext4 -q -F "$probe/disk.img"
mkdir "$probe/mnt"
if ! mount -o loop "$probe/disk.img" "$probe/mnt"; then
  rm -rf "$probe"
  echo "cannot loop-mount an ext4 image: size-bounded submission volumes need loop devices" >&2
  exit 1
fi
umount "$probe/mnt" && rm -rf "$probe"
echo "loop-mounted ext4 images work (disk bound of submission volumes)"
image=$(.venv/bin/python -m infra.image_build --profile cpu)
echo "workspace test image: $image"
{
  echo "BASELINE_TEST_DOCKER_URL=unix:///var/run/docker.sock"
  echo "BASELINE_TEST_IMAGE=$image"
} >> "${BASELINE_CI_ENV:-/dev/null}"
