"""The remote helper's scan and pack (`infra.remote_capture`) never follow a path string: a
directory the participant swaps for a link in the middle of a scan, a link swapped for a file,
a packed path under a link. The scripts run here as the helper runs them (`python3 -I -S -c`),
with a hook that makes the swap happen at the exact moment between two steps of the walk; the
pack also runs in a real helper on the ssh:// host."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.docker_backend import DockerBackend
from infra.remote_capture import (
    _PACK,
    _SCAN,
    KNOWN_HEX,
    LISTING_END,
    SCAN_DONE,
    VolumeHelper,
)
from infra.remote_capture import _pack as pack_in_helper
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image

__all__ = ["test_image"]

SECRET = b"root:x:0:0:the helper's own file\n"


def _hook(name: bytes, swap: str) -> str:
    """Python run before the script: right after the walk's first lstat of `name` (so the walk
    has judged it by what it was), `swap` runs (Python, with `os` imported)."""
    return (
        "import os\n"
        "_real_lstat = os.lstat\n"
        "def _lstat(path, *args, **kwargs):\n"
        "    st = _real_lstat(path, *args, **kwargs)\n"
        f"    if os.fsencode(path) == {name!r} and not getattr(_lstat, 'done', False):\n"
        "        _lstat.done = True\n"
        + "".join(f"        {line}\n" for line in swap.splitlines())
        + "    return st\n"
        "os.lstat = _lstat\n"
    )


def _scan(
    root: Path, work: Path, hook: str = ""
) -> tuple[subprocess.CompletedProcess[bytes], list[dict[str, object]], bytes]:
    argv = [str(root), str(1 << 20), "[]", str(1 << 20), str(work / "scan"), str(work / "beat")]
    argv += [SCAN_DONE.decode(), str(KNOWN_HEX)]
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", hook + _SCAN, *argv],
        input=zlib.compress(b""),
        capture_output=True,
        timeout=60,
        check=False,
    )
    inflate = zlib.decompressobj()
    listing = inflate.decompress(done.stdout)
    rows = []
    for line in listing.split(b"\n"):
        if line + b"\n" == LISTING_END:
            break
        if line and not line.startswith(b"= "):
            rows.append(json.loads(line))
    return done, rows, inflate.unused_data


def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(SECRET)
    return outside


def _names(rows: list[dict[str, object]]) -> dict[bytes, dict[str, object]]:
    return {base64.b64decode(str(row["raw"])): row for row in rows}


def test_a_directory_swapped_for_a_link_during_the_scan_is_not_followed(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "s"
    (root / "d").mkdir(parents=True)
    (root / "d" / "own.txt").write_bytes(b"own")
    (root / "z.txt").write_bytes(b"after")
    swap = f"os.rename({str(root / 'd')!r}, {str(root / 'd-old')!r})\n"
    swap += f"os.symlink({str(outside)!r}, {str(root / 'd')!r})"
    done, rows, staged = _scan(root, tmp_path, _hook(b"d", swap))
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.endswith(SCAN_DONE)
    listed = _names(rows)
    # listed as the folder it was, then reported unreadable when it was no longer one
    assert [row["kind"] for row in rows if row["raw"] == listed[b"d"]["raw"]] == ["dir", "error"]
    assert b"d/passwd" not in listed
    assert all(row.get("sha256") != hashlib.sha256(SECRET).hexdigest() for row in rows)
    assert SECRET not in staged
    errors = [row for row in rows if row["kind"] == "error"]
    assert [base64.b64decode(str(row["raw"])) for row in errors] == [b"d"]
    assert listed[b"z.txt"]["sha256"] == hashlib.sha256(b"after").hexdigest()


def test_a_link_swapped_for_a_file_before_it_is_read_is_one_error_not_a_failed_scan(
    tmp_path: Path,
) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "lnk").symlink_to("target")
    (root / "a.txt").write_bytes(b"alpha")
    swap = f"os.unlink({str(root / 'lnk')!r})\nopen({str(root / 'lnk')!r}, 'w').close()"
    done, rows, _ = _scan(root, tmp_path, _hook(b"lnk", swap))
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.endswith(SCAN_DONE)
    listed = _names(rows)
    assert listed[b"lnk"]["kind"] == "error" and listed[b"lnk"]["detail"]
    assert listed[b"a.txt"]["sha256"] == hashlib.sha256(b"alpha").hexdigest()


def test_a_file_swapped_after_its_lstat_is_read_as_what_was_opened(tmp_path: Path) -> None:
    """The stat key listed is the opened file's, so the next capture reads it again."""
    root = tmp_path / "s"
    root.mkdir()
    (root / "f").write_bytes(b"first")
    swap = f"os.unlink({str(root / 'f')!r})\nopen({str(root / 'f')!r}, 'wb').write(b'second!')"
    done, rows, _ = _scan(root, tmp_path, _hook(b"f", swap))
    assert done.returncode == 0, done.stderr.decode()
    row = _names(rows)[b"f"]
    opened = (root / "f").stat()
    assert row["sha256"] == hashlib.sha256(b"second!").hexdigest() and row["size"] == 7
    assert str(row["stat_key"]).startswith(f"{opened.st_ino}:7:")


def _pack(root: Path, work: Path, paths: list[bytes]) -> subprocess.CompletedProcess[bytes]:
    want = work / "want"
    want.write_bytes(b"".join(base64.b64encode(p) + b"\n" for p in paths))
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", _PACK, str(root), str(want), str(work / "beat")],
        capture_output=True,
        timeout=60,
        check=False,
    )


def _members(archive: bytes) -> Iterator[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r|") as tar:
        for member in tar:
            handle = tar.extractfile(member)
            yield member.name, handle.read() if handle else b""


def test_the_pack_reaches_no_file_through_a_link_and_only_regular_files(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    root = tmp_path / "s"
    (root / "real").mkdir(parents=True)
    (root / "real" / "ok.txt").write_bytes(b"ok")
    (root / "d").symlink_to(outside)  # a folder listed before, swapped for a link since
    (root / "f").symlink_to(outside / "passwd")
    os.mkfifo(root / "pipe")  # a file listed before, a FIFO now: left out, not waited on
    done = _pack(root, tmp_path, [b"d/passwd", b"f", b"pipe", b"real/ok.txt", b"gone"])
    assert done.returncode == 0, done.stderr.decode()
    assert list(_members(done.stdout)) == [("real/ok.txt", b"ok")]


@pytest.mark.docker
@pytest.mark.sshd
def test_the_helper_on_an_ssh_host_packs_nothing_through_a_link(test_image: str) -> None:
    backend = DockerBackend.from_url(docker_url("ssh"), labels=TEST_LABELS)
    volume = new_name("bl-vol")
    backend.client.volumes.create(volume, labels=TEST_LABELS)
    try:
        backend.client.containers.run(
            test_image,
            ["sh", "-c", "mkdir /s/real && printf ok > /s/real/ok.txt && ln -s /etc /s/d"],
            entrypoint=[],
            user="0",
            remove=True,
            network_mode="none",
            volumes={volume: {"bind": "/s", "mode": "rw"}},
            labels=TEST_LABELS,
        )
        helper = VolumeHelper.for_volume(backend, test_image, volume)
        archive = b"".join(
            stream.read() for stream in pack_in_helper(helper, [b"d/passwd", b"real/ok.txt"])
        )
        assert list(_members(archive)) == [("real/ok.txt", b"ok")]
    finally:
        backend.remove_helpers(volume)
        backend.client.volumes.get(volume).remove(force=True)
        backend.close()
