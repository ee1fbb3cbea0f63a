"""Removing a bounded volume's image on the host (no Docker: the host commands on a temporary
root). The mounted case runs on the real engine in tests/infra/test_disk_quota.py."""

from __future__ import annotations

from pathlib import Path

from infra.disk_images import DiskImages
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
