"""Submission volumes with a hard size: an ext4 file system in a sparse image file on the host.

Docker's local volume driver has no size option for a volume kept on disk (its ``size`` works
for tmpfs only, which a submission cannot be: it must outlive its container), and overlay2 on
ext4 has no storage quota at all. So a bounded submission volume is a file system of its own:
``<root>/<volume>/disk.img`` (sparse: it takes host disk only as it fills, never more than its
size) formatted ext4 and loop-mounted at ``<root>/<volume>/mnt``; the Docker volume binds the
folder ``mnt/data`` in it. A write past the size fails with ENOSPC inside the workspace, and the
host's disk is not touched beyond the image.

The folder bound is inside the mounted file system, so when the mount is missing (the host
rebooted) Docker refuses to mount the volume instead of binding an empty, unbounded folder of
the host: `ensure_mounted` mounts it again, and the backend calls it before every start.

The commands run on the volume's host through a `CommandRunner` (a local subprocess, or SSH for
an ``ssh://`` host), as a user allowed to mount (root). Each script holds an exclusive `flock`
on the volume's folder while it works (`_LOCK`): two processes working on one volume (a
workspace's removal beside a restart that mounts it) take turns. Interleaved, the removal
unmounted the image between the other's "mounted?" and its `mkdir mnt/data`, which then made
the data folder on the host's own disk (unbounded, and the removal failed on it). A script that
got the lock after the folder was removed says so and fails; it never makes an image again.
"""

from __future__ import annotations

import os
import re

from infra.gpus import CommandRunner

DEFAULT_ROOT = "/var/lib/baseline/volumes"
ROOT_ENV = "BASELINE_VOLUME_ROOT"
_VOLUME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")

LOCK_WAIT_S = 20  # well inside the command channel's own time-out (`infra.gpus.local_runner`)
# Opens the volume's folder ($d) as fd 9 and locks it; held until the script ends.
_LOCK = f"""exec 9<"$d"
flock -w {LOCK_WAIT_S} 9 || {{ echo "volume folder $d stayed locked {LOCK_WAIT_S} s" >&2; exit 1; }}
"""
# Arguments: folder, size in bytes, owner uid. Idempotent: an existing image is never formatted
# again (it holds a participant's work), only mounted when it is not. The data folder is made
# only inside the mounted image.
_CREATE = f"""set -eu
d=$1; size=$2; owner=$3
mkdir -p "$d/mnt"
{_LOCK}[ -d "$d/mnt" ] || {{ echo "volume folder $d was removed meanwhile" >&2; exit 1; }}
if [ ! -f "$d/disk.img" ]; then
  rm -f "$d/disk.img.new"
  truncate -s "$size" "$d/disk.img.new"
  mkfs.ext4 -q -F -m 0 -E "root_owner=$owner:$owner,lazy_itable_init=1,lazy_journal_init=1" \
    "$d/disk.img.new"
  mv "$d/disk.img.new" "$d/disk.img"
fi
mountpoint -q "$d/mnt" || mount -o loop,nosuid,nodev "$d/disk.img" "$d/mnt"
mountpoint -q "$d/mnt" || {{ echo "$d/mnt is not mounted after mounting it" >&2; exit 1; }}
if [ ! -d "$d/mnt/data" ]; then mkdir "$d/mnt/data"; chown "$owner:$owner" "$d/mnt/data"; fi
"""
_MOUNT = f"""set -eu
d=$1
{_LOCK}mountpoint -q "$d/mnt" || mount -o loop,nosuid,nodev "$d/disk.img" "$d/mnt"
"""
# Unmounted, `mnt` is the host's own folder: anything found in it (a `data` folder written while
# the image was not mounted) is the volume's content too, and goes with it (seen in CI: a
# reproduction's destroy failing on "Directory not empty", its volume left behind).
_REMOVE = f"""set -eu
d=$1
[ -d "$d" ] || exit 0
{_LOCK}[ -d "$d" ] || exit 0
if mountpoint -q "$d/mnt"; then umount "$d/mnt"; fi
rm -f "$d/disk.img" "$d/disk.img.new"
if [ -d "$d/mnt" ] && ! mountpoint -q "$d/mnt"; then rm -rf "$d/mnt"; fi
rmdir "$d"
"""


class DiskImageError(RuntimeError):
    """A host command on a volume's image failed; the message says which and why."""


class DiskImages:
    """The size-bounded volumes of one host, kept under `root` on that host."""

    def __init__(self, runner: CommandRunner, root: str | None = None) -> None:
        self.runner = runner
        self.root = (root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT).rstrip("/")

    def folder(self, volume: str) -> str:
        if not _VOLUME.match(volume):
            raise DiskImageError(f"not a valid volume name: {volume!r}")
        return f"{self.root}/{volume}"

    def data_dir(self, volume: str) -> str:
        """The host folder the Docker volume binds (inside the mounted image)."""
        return f"{self.folder(volume)}/mnt/data"

    def create(self, volume: str, size_bytes: int, owner_uid: int) -> str:
        """Make (or remount) the image of `volume`, `size_bytes` in all; its data folder."""
        if size_bytes <= 0:
            raise DiskImageError(f"a volume's size must be positive, not {size_bytes}")
        self._run("creating", volume, _CREATE, str(size_bytes), str(owner_uid))
        return self.data_dir(volume)

    def ensure_mounted(self, volume: str) -> None:
        self._run("mounting", volume, _MOUNT)

    def remove(self, volume: str) -> None:
        """Unmount and delete the image (its content with it); nothing to do when absent."""
        self._run("removing", volume, _REMOVE)

    def _run(self, doing: str, volume: str, script: str, *args: str) -> None:
        result = self.runner(["sh", "-c", script, "sh", self.folder(volume), *args])
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise DiskImageError(
                f"{doing} the disk image of volume {volume} under {self.root} failed "
                f"(exit {result.exit_code}): {detail[-1] if detail else 'no output'}"
            )
