"""Removing a bounded volume's image on the host, and its scripts taking turns on one volume (no
Docker: the host commands on a temporary root). The mounted case runs on the real engine in
tests/infra/test_disk_quota.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra.disk_images import DiskImageError, DiskImages
from infra.gpus import local_runner


def test_a_volume_whose_image_is_not_mounted_is_removed_with_what_its_folder_holds(
    tmp_path: Path,
) -> None:
    images = DiskImages(local_runner, root=str(tmp_path))
    folder = Path(images.folder("ws-reproduction-x-submission"))
    (folder / "mnt" / "data").mkdir(parents=True)  # written while the image was not mounted
    (folder / "mnt" / "data" / "out.txt").write_text("left\n")
    (folder / "disk.img").write_bytes(b"")
    images.remove("ws-reproduction-x-submission")
    assert not folder.exists()
    images.remove("ws-reproduction-x-submission")  # nothing left: nothing to do


def _waiting_for_lock_on(inode: int) -> bool:
    """Whether a process waits for a lock on the file `inode` (a `->` line of /proc/locks names
    it as MAJOR:MINOR:INODE)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[-3].endswith(f":{inode}"):
            return True
    return False


@contextmanager
def _held(folder: Path) -> Iterator[None]:
    """The volume's lock, held as another process's create or remove holds it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _blocked(worker: threading.Thread, folder: Path) -> None:
    """Start `worker` and wait until it waits for the volume's lock; fail if it finished
    without waiting."""
    inode = folder.stat().st_ino
    worker.start()
    deadline = time.monotonic() + 10
    while not _waiting_for_lock_on(inode):
        assert worker.is_alive(), "it ran while another script held the volume"
        assert time.monotonic() < deadline, "it neither waited nor finished"
        time.sleep(0.01)


def test_a_removal_waits_for_the_script_that_holds_the_volume(tmp_path: Path) -> None:
    """A restart's create mounting the image while a removal unmounts it made `mnt/data` on the
    host's disk: the scripts of one volume take turns."""
    images = DiskImages(local_runner, root=str(tmp_path))
    folder = Path(images.folder("ws-reproduction-y-submission"))
    (folder / "mnt").mkdir(parents=True)
    (folder / "disk.img").write_bytes(b"")
    removal = threading.Thread(target=images.remove, args=("ws-reproduction-y-submission",))
    with _held(folder):
        _blocked(removal, folder)
        assert (folder / "disk.img").exists()
    removal.join()
    assert not folder.exists()


def test_a_create_that_waited_for_a_removal_fails_and_makes_nothing_again(
    tmp_path: Path,
) -> None:
    images = DiskImages(local_runner, root=str(tmp_path))
    name = "ws-reproduction-z-submission"
    folder = Path(images.folder(name))
    (folder / "mnt").mkdir(parents=True)
    (folder / "disk.img").write_bytes(b"")
    errors: list[str] = []

    def create() -> None:
        try:
            images.create(name, 16 << 20, os.getuid())
        except DiskImageError as exc:
            errors.append(str(exc))

    creation = threading.Thread(target=create)
    with _held(folder):
        _blocked(creation, folder)
        shutil.rmtree(folder)  # what the removal holding the lock does
    creation.join()
    assert len(errors) == 1 and "was removed meanwhile" in errors[0]
    assert not folder.exists()


def test_a_create_whose_mount_did_not_take_makes_no_data_folder_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mount` says it succeeded, but the folder is no mount point: the data folder would be on
    the host's own disk, unbounded. The create fails instead."""
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 (e2fsprogs) is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mount").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "mount").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    images = DiskImages(local_runner, root=str(tmp_path / "volumes"))
    with pytest.raises(DiskImageError, match="is not mounted after mounting it"):
        images.create("ws-reproduction-w-submission", 16 << 20, os.getuid())
    folder = Path(images.folder("ws-reproduction-w-submission"))
    assert not (folder / "mnt" / "data").exists()
    images.remove("ws-reproduction-w-submission")
    assert not folder.exists()
