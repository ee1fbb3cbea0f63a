"""Snapshot capture, export, restore, verify and diff, including hostile archives and trees."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
from pathlib import Path

import pytest

from infra.blobs import BlobStore
from infra.snapshots import (
    CaptureError,
    Limits,
    Manifest,
    capture_archive,
    capture_directory,
    capture_tar,
    diff,
    export_tar,
    load_manifest,
    restore_directory,
    tar_file,
    verify,
)


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def _tar(
    members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT
) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return buffer.getvalue()


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, 1_700_000_000
    return info, data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def _manifest_paths(manifest: Manifest) -> set[str]:
    return {e.path for e in manifest.entries}


def test_capture_keeps_files_dedups_and_strips_root(store: BlobStore) -> None:
    data = _tar(
        [
            _special("submission", tarfile.DIRTYPE),
            _file("submission/reproduce.sh", b"echo hi\n", 0o755),
            _file("submission/src/a.py", b"same"),
            _file("submission/src/b.py", b"same"),
            _file("submission/.git/HEAD", b"ref: refs/heads/main\n"),
        ]
    )
    result = capture_tar(io.BytesIO(data), store)
    by_path = result.manifest.by_path()
    assert set(by_path) == {"reproduce.sh", "src/a.py", "src/b.py", ".git/HEAD"}
    assert by_path["reproduce.sh"].mode == 0o755
    assert by_path["src/a.py"].sha256 == hashlib.sha256(b"same").hexdigest()
    # two identical files + three others + the manifest and its one part of entries
    assert result.new_blobs == 5
    again = capture_tar(io.BytesIO(data), store)
    assert again.new_blobs == 1  # only its own manifest (it carries its creation time)
    assert again.manifest.entries == result.manifest.entries
    assert verify(store, result.manifest_sha256) == []


def test_ignored_folders_and_large_files_are_recorded_with_sizes(store: BlobStore) -> None:
    data = _tar(
        [
            _file("submission/venv/lib/x.py", b"x" * 100),
            _file("submission/venv/lib/y.py", b"y" * 50),
            _file("submission/pkg/__pycache__/m.pyc", b"c" * 7),
            _file("submission/node_modules/z.js", b"z"),
            _file("submission/wandb/run.log", b"w" * 3),
            _file("submission/big.bin", b"b" * 2048),
            _file("submission/keep.txt", b"k"),
        ]
    )
    result = capture_tar(io.BytesIO(data), store, Limits(max_file_bytes=1024))
    assert _manifest_paths(result.manifest) == {"keep.txt"}
    skipped = {(s.path, s.reason): (s.size, s.count) for s in result.manifest.skipped}
    assert skipped[("venv", "ignored")] == (150, 2)
    assert skipped[("pkg/__pycache__", "ignored")] == (7, 1)
    assert skipped[("node_modules", "ignored")] == (1, 1)
    assert skipped[("wandb", "ignored")] == (3, 1)
    assert skipped[("big.bin", "too_large")] == (2048, 1)


def test_hostile_archive_paths_links_and_devices(store: BlobStore) -> None:
    data = _tar(
        [
            _file("submission/../../etc/evil", b"escape"),
            _file("/etc/passwd", b"root"),
            _file("submission/a/../../up", b"up"),
            _special("submission/out", tarfile.SYMTYPE, "/etc"),
            _file("submission/out/shadow", b"through the link"),
            _special("submission/rel", tarfile.SYMTYPE, "../../../../root"),
            _special("submission/fifo", tarfile.FIFOTYPE),
            _special("submission/null", tarfile.CHRTYPE),
            _special("submission/disk", tarfile.BLKTYPE),
            _special("submission/hard", tarfile.LNKTYPE, "/etc/passwd"),
            _file("submission/ok.txt", b"fine"),
            _special("submission/ok-link", tarfile.LNKTYPE, "submission/ok.txt"),
        ]
    )
    result = capture_tar(io.BytesIO(data), store)
    by_path = result.manifest.by_path()
    assert set(by_path) == {"out", "rel", "ok.txt", "ok-link"}
    assert by_path["out"].type == "symlink" and by_path["out"].target == "/etc"
    assert by_path["rel"].target == "../../../../root"
    assert by_path["ok-link"].sha256 == by_path["ok.txt"].sha256
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    assert reasons["submission/../../etc/evil"] == "unsafe_path"
    assert reasons["/etc/passwd"] == "unsafe_path"
    assert reasons["submission/a/../../up"] == "unsafe_path"
    assert reasons["out/shadow"] == "unsafe_path"
    assert reasons["fifo"] == reasons["null"] == reasons["disk"] == "special_file"
    assert reasons["hard"] == "hardlink"


def test_restore_and_export_never_escape(store: BlobStore, tmp_path: Path) -> None:
    data = _tar(
        [
            _special("submission/out", tarfile.SYMTYPE, str(tmp_path / "outside")),
            _file("submission/out/pwned", b"x"),
            _file("submission/dir/file.txt", b"content", 0o640),
        ]
    )
    result = capture_tar(io.BytesIO(data), store)
    (tmp_path / "outside").mkdir()
    dest = tmp_path / "restored"
    restore_directory(store, result.manifest, dest)
    assert (dest / "dir/file.txt").read_bytes() == b"content"
    assert os.readlink(dest / "out") == str(tmp_path / "outside")
    assert list((tmp_path / "outside").iterdir()) == []

    out = io.BytesIO()
    export_tar(store, result.manifest, out)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:gz") as archive:
        names = archive.getnames()
        assert all(n == "submission" or n.startswith("submission/") for n in names)
        member = archive.extractfile("submission/dir/file.txt")
        assert member is not None and member.read() == b"content"
    with pytest.raises(FileExistsError):
        restore_directory(store, result.manifest, dest)


def test_tar_file_is_the_export_owned_as_asked_read_from_its_start_and_removed_after(
    store: BlobStore,
) -> None:
    """What a workspace is seeded, restored and scored from: the export (uncompressed) in a
    temporary file, every member owned by the owner given, gone once the block ends."""
    archive = _tar([_file("src/train.py", b"fit()\n", 0o755), _file("notes.md", b"# notes\n")])
    manifest = capture_tar(io.BytesIO(archive), store).manifest
    exported = io.BytesIO()
    export_tar(store, manifest, exported, gzip=False, owner=(4242, 4343))
    with tar_file(store, manifest, owner=(4242, 4343)) as streamed:
        assert not isinstance(streamed, io.BytesIO)  # on disk, not in memory
        content = streamed.read()
        with tarfile.open(fileobj=io.BytesIO(content)) as members:
            owners = {(m.name, m.uid, m.gid) for m in members}
    assert content == exported.getvalue()
    assert owners == {
        ("submission", 4242, 4343),
        ("submission/notes.md", 4242, 4343),
        ("submission/src/train.py", 4242, 4343),
    }
    assert streamed.closed


def test_non_utf8_names_round_trip(store: BlobStore, tmp_path: Path) -> None:
    raw = b"submission/caf\xe9.txt"
    info = tarfile.TarInfo(raw.decode("utf-8", "surrogateescape"))
    data = _tar([(info, b"latin-1 name")], fmt=tarfile.GNU_FORMAT)
    result = capture_tar(io.BytesIO(data), store)
    (entry,) = result.manifest.entries
    assert entry.path == "caf\\xe9.txt" and entry.raw_name is not None
    # the manifest serialises (no surrogates leak into JSON) and reloads
    assert load_manifest(store, result.manifest_sha256).entries[0].raw_name == entry.raw_name
    dest = tmp_path / "r"
    restore_directory(store, result.manifest, dest)
    assert (os.fsencode(dest) + b"/caf\xe9.txt") in [
        os.fsencode(dest) + b"/" + n for n in os.listdir(os.fsencode(dest))
    ]


def test_truncated_archive_is_a_clear_error(store: BlobStore) -> None:
    data = _tar([_file("submission/a.bin", os.urandom(5000))])
    with pytest.raises(CaptureError, match="could not be read"):
        capture_tar(io.BytesIO(data[:2048]), store)
    with pytest.raises(CaptureError):
        capture_tar(io.BytesIO(b"not a tar at all" * 100), store)


def test_an_archive_cut_inside_a_file_passed_over_is_read_again_then_kept_as_far_as_it_came(
    store: BlobStore,
) -> None:
    """A file over the limit (its content never read) that changes while the engine sends it
    ends the archive there: the capture reads it again, as for a file being kept, and keeps
    what arrived when every pass ends there, instead of failing whole."""
    big = os.urandom(3000)
    data = _tar([_file("submission/a.txt", b"alpha"), _file("submission/big.bin", big),
                 _file("submission/z.txt", b"zulu")])  # fmt: skip
    cut = data[: data.index(big) + 1000]
    limits = Limits(max_file_bytes=1024)
    sent: list[bytes] = [cut, data]
    healed = capture_archive(lambda: io.BytesIO(sent.pop(0)), store, limits)
    assert _manifest_paths(healed.manifest) == {"a.txt", "z.txt"}
    assert [(s.path, s.reason) for s in healed.manifest.skipped] == [("big.bin", "too_large")]
    broken = capture_archive(lambda: io.BytesIO(cut), store, limits)
    assert _manifest_paths(broken.manifest) == {"a.txt"}
    reasons = {(s.path, s.reason) for s in broken.manifest.skipped}
    assert reasons == {("big.bin", "too_large"), ("big.bin", "changed_while_read")}
    # An archive cut inside content nobody passed over is still an error.
    with pytest.raises(CaptureError, match="could not be read"):
        capture_tar(io.BytesIO(data[:700]), store)


def test_directory_capture_hostile_tree(store: BlobStore, tmp_path: Path) -> None:
    root = tmp_path / "sub"
    (root / ".git").mkdir(parents=True)
    (root / ".git/HEAD").write_text("ref")
    (root / "secret-link").symlink_to("/etc/shadow")
    (root / "dir-link").symlink_to("/etc")
    os.mkfifo(root / "pipe")
    (root / "venv/bin").mkdir(parents=True)
    (root / "venv/bin/python").write_bytes(b"p" * 10)
    with open(os.fsencode(root) + b"/na\xefve.txt", "wb") as handle:
        handle.write(b"bytes name")
    (root / "ok.txt").write_text("ok")
    result = capture_directory(root, store)
    by_path = result.manifest.by_path()
    assert by_path["secret-link"].type == "symlink" and by_path["dir-link"].target == "/etc"
    assert ".git/HEAD" in by_path and "ok.txt" in by_path
    assert by_path["na\\xefve.txt"].raw_name is not None
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    assert reasons["pipe"] == "special_file" and reasons["venv"] == "ignored"
    assert verify(store, result.manifest_sha256) == []


def test_unreadable_file_is_recorded(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sub"
    root.mkdir()
    (root / "locked").write_text("secret")
    (root / "open").write_text("fine")
    real_open = os.open

    def deny(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == b"locked":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    result = capture_directory(root, store)
    assert {e.path for e in result.manifest.files} == {"open"}
    (skip,) = result.manifest.skipped
    assert (skip.path, skip.reason, skip.size) == ("locked", "unreadable", 6)


def test_file_growing_while_read_is_consistent(store: BlobStore, tmp_path: Path) -> None:
    root = tmp_path / "sub"
    root.mkdir()
    growing = root / "train.log"
    # Big enough that reading it spans many writes of the thread below (I/O releases the GIL).
    growing.write_bytes(b"start\n" + b"y" * (8 << 20))
    stop = threading.Event()

    def grow() -> None:
        with open(growing, "ab") as handle:
            while not stop.is_set():
                handle.write(b"x" * 4096)
                handle.flush()
                time.sleep(0.0002)

    writer = threading.Thread(target=grow)
    writer.start()
    try:
        results = []
        for _ in range(40):  # bounded: stop at the first capture that saw the file change
            results.append(capture_directory(root, store, Limits(max_file_bytes=1 << 30)))
            if results[-1].manifest.by_path()["train.log"].changed_while_read:
                break
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join()
    for result in results:
        entry = result.manifest.by_path()["train.log"]
        assert entry.sha256 is not None
        blob = store.get_bytes(entry.sha256)
        assert len(blob) == entry.size and blob.startswith(b"start\n")
        assert verify(store, result.manifest_sha256) == []
    assert any(r.manifest.by_path()["train.log"].changed_while_read for r in results)


def test_file_growing_past_the_limit_is_skipped(store: BlobStore, tmp_path: Path) -> None:
    root = tmp_path / "sub"
    root.mkdir()
    (root / "f").write_bytes(b"a" * 100)
    result = capture_directory(root, store, Limits(max_file_bytes=50))
    assert result.manifest.skipped[0].reason == "too_large"


def test_incremental_directory_capture_reuses_unchanged_hashes(
    store: BlobStore, tmp_path: Path
) -> None:
    root = tmp_path / "sub"
    root.mkdir()
    for index in range(20):
        (root / f"f{index}").write_bytes(os.urandom(100))
    first = capture_directory(root, store)
    assert first.reused_hashes == 0
    stat = os.stat(root / "f3")
    (root / "f3").write_bytes(os.urandom(100))  # same size
    os.utime(root / "f3", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and same mtime
    (root / "f20").write_bytes(b"new")
    second = capture_directory(root, store, previous=first.manifest)
    assert second.reused_hashes == 19
    change = diff(first.manifest, second.manifest)
    assert change.added == ["f20"] and change.changed == ["f3"] and change.removed == []
    expected = hashlib.sha256((root / "f3").read_bytes()).hexdigest()
    assert second.manifest.by_path()["f3"].sha256 == expected


def test_verify_detects_corruption_and_loss(store: BlobStore) -> None:
    data = _tar([_file("submission/a", b"aaaa"), _file("submission/b", b"bbbb")])
    result = capture_tar(io.BytesIO(data), store)
    digest_a = result.manifest.by_path()["a"].sha256
    digest_b = result.manifest.by_path()["b"].sha256
    assert digest_a and digest_b
    path = store.path(digest_a)
    path.chmod(0o644)
    path.write_bytes(b"tampered")
    store.path(digest_b).unlink()
    problems = verify(store, result.manifest_sha256)
    assert sorted(p.path for p in problems) == ["a", "b"]
    store.path(result.manifest_sha256).unlink()
    assert verify(store, result.manifest_sha256)[0].path == "(manifest)"


HOSTILE_TREE = r"""
set -e
cd /home/submission
mkdir -p .git venv/lib src
echo ref > .git/HEAD
echo x > venv/lib/site.py
echo 'print(1)' > src/main.py
mkfifo pipe
ln -s /etc/shadow shadow-link
ln -s / root-link
printf 'latin' > "$(printf 'caf\351.txt')"
head -c 11000000 /dev/zero > big.bin
"""


def _hostile_capture(backend: object, handle: object, store: BlobStore) -> Manifest:
    from infra.workspace import SUBMISSION_DIR, WorkspaceBackend, WorkspaceHandle

    assert isinstance(backend, WorkspaceBackend) and isinstance(handle, WorkspaceHandle)
    result = backend.exec(handle, ["sh", "-c", HOSTILE_TREE], timeout_s=60)
    assert result.exit_code == 0, result.output
    data = backend.get_archive(handle, SUBMISSION_DIR)
    return capture_tar(io.BytesIO(data), store).manifest


def _check_hostile(manifest: Manifest) -> None:
    by_path = manifest.by_path()
    assert by_path["src/main.py"].type == "file" and ".git/HEAD" in by_path
    assert by_path["shadow-link"].target == "/etc/shadow"
    assert by_path["root-link"].target == "/"
    assert by_path["caf\\xe9.txt"].raw_name is not None
    reasons = {s.path: (s.reason, s.size) for s in manifest.skipped}
    assert reasons["pipe"][0] == "special_file"
    assert reasons["venv"] == ("ignored", 2)
    assert reasons["big.bin"] == ("too_large", 11_000_000)


def test_hostile_workspace_on_the_local_sandbox(store: BlobStore, tmp_path: Path) -> None:
    import uuid

    from infra.workspace import HardwareProfile, WorkspaceSpec
    from tests.infra.test_local_backend import sandbox_backend

    for backend in sandbox_backend(tmp_path / "local"):
        profile = HardwareProfile(name="cpu-small", cpus=0.5, memory_mb=256, pids=64)
        handle = backend.create(
            WorkspaceSpec(name=f"ws-{uuid.uuid4().hex[:8]}", image="host", profile=profile)
        )
        try:
            backend.start(handle)
            _check_hostile(_hostile_capture(backend, handle, store))
        finally:
            backend.destroy(handle)


@pytest.mark.docker
def test_hostile_workspace_on_docker(store: BlobStore) -> None:
    from infra.docker_backend import DockerBackend
    from infra.workspace import HardwareProfile, WorkspaceSpec
    from tests.docker_env import TEST_LABELS, docker_url, new_name, workspace_image

    backend = DockerBackend.from_url(docker_url("unix"), labels=TEST_LABELS)
    profile = HardwareProfile(name="cpu-small", cpus=0.5, memory_mb=256, pids=64)
    handle = backend.create(
        WorkspaceSpec(name=new_name(), image=workspace_image(), profile=profile)
    )
    try:
        backend.start(handle)
        _check_hostile(_hostile_capture(backend, handle, store))
    finally:
        backend.destroy(handle)
        backend.close()
