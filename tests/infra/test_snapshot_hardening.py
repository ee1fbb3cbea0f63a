"""A hostile participant against capture, export and restore: races, setuid bits, deep trees,
over-long paths, look-alike names, files that change while the engine sends them."""

from __future__ import annotations

import ctypes
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.blobs import BlobStore
from infra.snapshots import (
    Limits,
    capture_directory,
    capture_tar,
    directory_capture,
    export_tar,
    restore_directory,
)

CANARY = b"OUTSIDE-CANARY-7f3a"
RENAME_EXCHANGE = 2
AT_FDCWD = -100
SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())

SWAPPER = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
number, seconds = int(sys.argv[1]), float(sys.argv[4])
a, b = sys.argv[2].encode(), sys.argv[3].encode()
end = time.monotonic() + seconds
swaps = 0
while time.monotonic() < end:
    if libc.syscall(number, -100, a, -100, b, 2) != 0:
        raise SystemExit(f"renameat2 failed: errno {ctypes.get_errno()}")
    swaps += 1
print(swaps)
"""


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """A folder for trees too deep for pytest's own (recursive) clean-up: `rm -rf` removes it."""
    path = tmp_path / "deep-trees"
    path.mkdir()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=True)


def _exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(SYS_RENAMEAT2, AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), 2)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _blobs_hold(store: BlobStore, needle: bytes) -> bool:
    for folder, _dirs, names in os.walk(store.root):
        for name in names:
            if needle in Path(folder, name).read_bytes():
                return True
    return False


def test_directory_swapped_for_a_symlink_during_capture_never_leaks(
    store: BlobStore, tmp_path: Path
) -> None:
    """renameat2(RENAME_EXCHANGE) swaps `d` (a directory) and `l` (a symlink to a directory
    outside) as fast as it can while captures run: no capture may hold the outside file."""
    if SYS_RENAMEAT2 is None:
        pytest.fail(f"renameat2 syscall number unknown on {platform.machine()}")
    outside = tmp_path / "host-only"
    outside.mkdir()
    (outside / "canary.txt").write_bytes(CANARY)
    root = tmp_path / "submission"
    (root / "d").mkdir(parents=True)
    (root / "d" / "inside.txt").write_bytes(b"participant file")
    (root / "l").symlink_to(outside)
    try:
        _exchange(root / "d", root / "l")
        _exchange(root / "d", root / "l")
    except OSError as exc:
        pytest.fail(f"this file system refuses RENAME_EXCHANGE: {exc}")
    seconds = 6.0
    swapper = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SWAPPER,
            str(SYS_RENAMEAT2),
            str(root / "d"),
            str(root / "l"),
            str(seconds),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    captures = 0
    saw_inside = 0
    try:
        deadline = time.monotonic() + seconds - 0.5
        while time.monotonic() < deadline:
            manifest = capture_directory(root, store).manifest
            captures += 1
            paths = {e.path for e in manifest.entries}
            assert "d/canary.txt" not in paths and "l/canary.txt" not in paths
            saw_inside += "d/inside.txt" in paths or "l/inside.txt" in paths
    finally:
        out, _ = swapper.communicate(timeout=30)
    assert swapper.returncode == 0, out
    assert int(out) > 1000 and captures >= 20, (out, captures)
    assert saw_inside > 0  # the walk did enter the real directory while it was being swapped
    assert not _blobs_hold(store, CANARY)


def test_setuid_setgid_sticky_and_root_owner_never_exported_or_restored(
    store: BlobStore, tmp_path: Path
) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        shared = tarfile.TarInfo("submission/shared")
        shared.type, shared.mode = tarfile.DIRTYPE, 0o3777
        archive.addfile(shared)
        shell = tarfile.TarInfo("submission/shared/rootshell")
        shell.mode, shell.size = 0o6755, 4
        archive.addfile(shell, io.BytesIO(b"\x7fELF"))
    result = capture_tar(io.BytesIO(buffer.getvalue()), store)
    assert result.manifest.by_path()["shared/rootshell"].mode == 0o6755  # what was there

    out = io.BytesIO()
    export_tar(store, result.manifest, out)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:gz") as archive:
        members = archive.getmembers()
    assert {m.name for m in members} == {"submission", "submission/shared",
                                         "submission/shared/rootshell"}  # fmt: skip
    for member in members:
        assert member.mode & 0o7000 == 0, (member.name, oct(member.mode))
        assert member.uid != 0 and member.gid != 0, (member.name, member.uid, member.gid)
    assert {m.name: m.mode for m in members}["submission/shared/rootshell"] == 0o755

    dest = tmp_path / "restored"
    restore_directory(store, result.manifest, dest)
    for path in (dest / "shared", dest / "shared/rootshell"):
        assert os.lstat(path).st_mode & 0o7000 == 0, path


def _deep_tree(root: Path, depth: int) -> None:
    """`depth` nested folders named `a`, a file at the bottom; built by descriptors, since the
    full path can be longer than the system accepts."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("a", dir_fd=fd)
        child = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"deep")
    os.close(leaf)
    os.close(fd)


def test_thousand_level_tree_is_captured_without_recursion_error(
    store: BlobStore, deep_tmp: Path
) -> None:
    tmp_path = deep_tmp
    root = tmp_path / "deep"
    _deep_tree(root, 1000)
    result = capture_directory(root, store)
    dirs = [e for e in result.manifest.entries if e.type == "dir"]
    assert len(dirs) == 1000
    (leaf,) = result.manifest.files
    assert leaf.path == "a/" * 1000 + "bottom.txt"
    dest = tmp_path / "restored"
    assert restore_directory(store, result.manifest, dest) == []
    assert (dest / leaf.path).read_bytes() == b"deep"


_FEW_DESCRIPTORS = """
import json, resource, sys
from pathlib import Path
from infra.blobs import BlobStore
from infra.snapshots import capture_directory, restore_directory
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
root, work = Path(sys.argv[1]), Path(sys.argv[2])
store = BlobStore(work / "blobs")
manifest = capture_directory(root, store).manifest
not_restored = restore_directory(store, manifest, work / "restored")
print(json.dumps({
    "dirs": sum(1 for e in manifest.entries if e.type == "dir"),
    "files": [e.path for e in manifest.files],
    "skipped": [s.reason for s in manifest.skipped],
    "not_restored": len(not_restored),
}))
"""


def test_a_tree_deeper_than_the_descriptor_limit_is_captured_and_restored_whole(
    deep_tmp: Path,
) -> None:
    """A participant's tree 1,000 levels deep, walked by a process allowed 64 descriptors: the
    walk and the restore hold a few dozen directories open, not one a level (which lost half the
    directories of a 2,001-level tree and starved every other thread of the process)."""
    root = deep_tmp / "deep"
    _deep_tree(root, 1000)
    run = subprocess.run(
        [sys.executable, "-c", _FEW_DESCRIPTORS, str(root), str(deep_tmp)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result == {
        "dirs": 1000,
        "files": ["a/" * 1000 + "bottom.txt"],
        "skipped": [],
        "not_restored": 0,
    }
    leaf = deep_tmp / "restored" / ("a/" * 1000 + "bottom.txt")
    fd = os.open(deep_tmp / "restored", os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1000):  # by descriptors: the path is longer than the system resolves at once
        child = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf_fd = os.open("bottom.txt", os.O_RDONLY, dir_fd=fd)
    assert os.read(leaf_fd, 100) == b"deep", leaf
    os.close(leaf_fd)
    os.close(fd)


def test_a_directory_replaced_while_its_descriptor_was_closed_is_not_read_on(
    tmp_path: Path,
) -> None:
    """Deeper than the walk keeps open, a directory is opened again when the walk comes back to
    it; if it is no longer the same directory (a participant swapped it meanwhile), the rest of
    it is recorded as unreadable, not read from the newcomer."""
    root = tmp_path / "tree"
    chain = root / "x" / Path(*["d"] * (directory_capture.FD_WINDOW + 8))
    chain.mkdir(parents=True)
    (chain / "leaf.txt").write_text("deep")
    (root / "x" / "zz.txt").write_text("after the chain")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    seen: list[tuple[bytes, object]] = []
    try:
        for rel, _, _, info in directory_capture._walk(fd, str(root)):
            seen.append((rel, info))
            if rel.endswith(b"leaf.txt"):  # deepest: x's descriptor is closed by now
                (root / "x").rename(root / "x-moved")
                (root / "x").mkdir()
                (root / "x" / "zz.txt").write_text("planted")
    finally:
        os.close(fd)
    errors = [(rel, info) for rel, info in seen if isinstance(info, OSError)]
    assert [rel for rel, _ in errors] == [b"x"]
    assert "replaced while it was read" in str(errors[0][1])
    assert not any(rel.endswith(b"zz.txt") for rel, _ in seen)


def test_tree_deeper_than_path_max_is_recorded_as_skipped(store: BlobStore, deep_tmp: Path) -> None:
    tmp_path = deep_tmp
    root = tmp_path / "deeper"
    _deep_tree(root, 3000)  # 6,000 bytes of path: more than any restore could create by name
    result = capture_directory(root, store)
    skipped = [s for s in result.manifest.skipped if s.reason == "path_too_long"]
    assert len(skipped) == 1 and skipped[0].path.startswith("a/a/")
    assert result.manifest.files == []
    longest = max(len(e.key) for e in result.manifest.entries)
    assert 4000 < longest < 4096
    assert restore_directory(store, result.manifest, tmp_path / "restored") == []


def test_tar_path_longer_than_path_max_is_recorded_and_restore_never_raises(
    store: BlobStore, tmp_path: Path
) -> None:
    long_dir = "/".join(["x" * 200] * 25)  # 5,024 bytes
    long_name = "n" * 300  # over NAME_MAX
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        members = [
            (f"submission/{long_dir}/f.txt", b"long"),
            (f"submission/{long_name}", b"wide"),
            ("submission/ok.txt", b"ok"),
        ]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    result = capture_tar(io.BytesIO(buffer.getvalue()), store)
    assert [e.path for e in result.manifest.entries] == ["ok.txt"]
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    assert reasons == {f"{long_dir}/f.txt": "path_too_long", long_name: "path_too_long"}
    dest = tmp_path / "restored"
    restore_directory(store, result.manifest, dest)
    assert os.listdir(dest) == ["ok.txt"]


def _read(path: bytes) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _make(root: bytes, name: bytes, data: bytes | None = None) -> None:
    path = root + b"/" + name
    if data is None:
        os.mkdir(path)
    else:
        with open(path, "wb") as handle:
            handle.write(data)


def test_names_and_link_targets_are_kept_byte_for_byte(store: BlobStore, tmp_path: Path) -> None:
    root = os.fsencode(tmp_path / "names")
    os.mkdir(root)
    _make(root, b"\xff", b"the byte ff")
    _make(root, b"\\xff", b"backslash x f f")
    _make(root, b"link\x80")
    _make(root, b"link\x80/inner.txt", b"inside the dir")
    os.symlink(b"elsewhere", root + b"/link\\x80")
    os.symlink(b"caf\xe9-target", root + b"/latin-link")
    result = capture_directory(Path(os.fsdecode(root)), store)
    manifest = result.manifest
    assert not any(s.reason == "duplicate" for s in manifest.skipped), manifest.skipped

    def check(dest: bytes) -> None:
        assert sorted(os.listdir(dest)) == sorted(
            [b"\xff", b"\\xff", b"link\x80", b"link\\x80", b"latin-link"]
        )
        assert _read(dest + b"/\xff") == b"the byte ff"
        assert _read(dest + b"/\\xff") == b"backslash x f f"
        assert _read(dest + b"/link\x80/inner.txt") == b"inside the dir"
        assert os.readlink(dest + b"/link\\x80") == b"elsewhere"
        assert os.readlink(dest + b"/latin-link") == b"caf\xe9-target"

    dest = os.fsencode(tmp_path / "restored")
    restore_directory(store, manifest, Path(os.fsdecode(dest)))
    check(dest)
    keys = {e.key for e in manifest.entries}
    assert keys == {b"\xff", b"\\xff", b"link\x80", b"link\x80/inner.txt", b"link\\x80",
                    b"latin-link"}  # fmt: skip

    # and through the tar path: export, capture the export, restore that
    out = io.BytesIO()
    export_tar(store, manifest, out, gzip=False)
    again = capture_tar(io.BytesIO(out.getvalue()), store).manifest
    assert {e.key for e in again.entries} == keys
    dest2 = os.fsencode(tmp_path / "restored-from-tar")
    restore_directory(store, again, Path(os.fsdecode(dest2)))
    check(dest2)


class _FlakyEngine:
    """Sends the workspace's archive as an engine does when a file shrinks while it is sent: the
    stream ends inside that file. `broken` reads end so, the ones after are whole."""

    name = "stand-in"

    def __init__(self, whole: bytes, cut_at: int, broken: int) -> None:
        self.whole, self.cut_at, self.broken = whole, cut_at, broken
        self.reads = 0

    def get_archive(self, handle: object, path: str) -> bytes:
        self.reads += 1
        return self.whole[: self.cut_at] if self.reads <= self.broken else self.whole


def _submission_tar() -> tuple[bytes, int]:
    """a.txt, then train.log (256 KiB), then z.txt; and an offset inside train.log's data."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in (("submission/a.txt", b"first"), ("submission/train.log", b"L" * 262144),
                           ("submission/z.txt", b"last")):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    whole = buffer.getvalue()
    return whole, whole.index(b"L" * 1024) + 100_000


def test_file_truncated_while_the_engine_sends_it_is_recorded_and_the_rest_kept(
    store: BlobStore,
) -> None:
    from baseline.attempts.snapshots import BackendSource

    whole, cut = _submission_tar()
    engine = _FlakyEngine(whole, cut, broken=1)
    source = BackendSource(engine, object())  # type: ignore[arg-type]
    manifest = source.capture(store, Limits(), None).manifest
    by_path = manifest.by_path()
    assert set(by_path) == {"a.txt", "train.log", "z.txt"}
    assert by_path["train.log"].changed_while_read and by_path["train.log"].size == 262144
    assert not by_path["z.txt"].changed_while_read
    assert engine.reads == 2


def test_file_that_never_stops_changing_keeps_what_arrived(store: BlobStore) -> None:
    from baseline.attempts.snapshots import BackendSource

    whole, cut = _submission_tar()
    engine = _FlakyEngine(whole, cut, broken=100)
    source = BackendSource(engine, object())  # type: ignore[arg-type]
    manifest = source.capture(store, Limits(), None).manifest
    by_path = manifest.by_path()
    assert by_path["a.txt"].size == 5 and "z.txt" not in by_path
    assert by_path["train.log"].changed_while_read and 0 < by_path["train.log"].size < 262144
    (skip,) = manifest.skipped
    assert (skip.path, skip.reason) == ("train.log", "changed_while_read")
    assert "missing" in skip.detail


@pytest.mark.docker
def test_docker_archive_is_streamed_and_a_big_sparse_file_costs_no_memory(
    store: BlobStore,
) -> None:
    """A 512 MiB sparse file in the workspace: too large to keep, decided from its header, and
    the archive is never held whole (the old capture joined it: 512 MiB and more)."""
    import tracemalloc

    from baseline.attempts.snapshots import BackendSource
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
        script = "truncate -s 512M big.bin && echo small > small.txt"
        made = backend.exec(handle, ["sh", "-c", script], workdir="/home/submission", timeout_s=60)
        assert made.exit_code == 0, made.output
        tracemalloc.start()
        try:
            manifest = BackendSource(backend, handle).capture(store, Limits(), None).manifest
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        backend.destroy(handle)
        backend.close()
    assert "small.txt" in manifest.by_path()
    reasons = {s.path: (s.reason, s.size) for s in manifest.skipped}
    assert reasons["big.bin"] == ("too_large", 512 << 20)
    assert peak < 48 << 20, peak


def test_a_large_directory_is_listed_in_sorted_runs_on_disk_with_the_same_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A participant decides how many names a directory has: past `LISTING_RUN_NAMES` they are
    sorted in runs spilled to a temporary file and merged, never held whole; the manifest is
    the one an in-memory listing gives, and the run file is closed afterwards."""
    root = tmp_path / "sub"
    many = root / "many"
    many.mkdir(parents=True)
    names = [f"f{index:03d}-{'x' * (index % 7) * 30}" for index in range(250)]
    names += ["é-accented", "Z-upper", "a b", "-dash"]
    for name in names:
        (many / name).write_text(name)
    (many / "odd-\udcff").write_bytes(b"odd")  # not UTF-8: sorted by its bytes
    (many / "nested").mkdir()
    (many / "nested" / "inner.txt").write_text("inner")
    store = BlobStore(tmp_path / "blobs")
    whole = capture_directory(root, store)
    spilled: list[int] = []
    original = directory_capture._Runs.write

    def counting(self: directory_capture._Runs, run: list[bytes]) -> None:
        spilled.append(len(run))
        original(self, run)

    monkeypatch.setattr(directory_capture._Runs, "write", counting)
    monkeypatch.setattr(directory_capture, "LISTING_RUN_NAMES", 16)
    descriptors = len(os.listdir("/proc/self/fd"))
    in_runs = capture_directory(root, BlobStore(tmp_path / "blobs-runs"))
    assert spilled == [16] * 16 and len(names) + 2 == 256  # `many` in 16 runs of 16
    assert [e.key for e in in_runs.manifest.entries] == [e.key for e in whole.manifest.entries]
    assert in_runs.manifest_sha256 != "" and in_runs.file_count == whole.file_count
    assert [(e.path, e.sha256) for e in in_runs.manifest.entries] == [
        (e.path, e.sha256) for e in whole.manifest.entries
    ]
    assert len(os.listdir("/proc/self/fd")) == descriptors


def test_new_content_past_the_capture_budget_is_skipped_and_never_stored(tmp_path: Path) -> None:
    """A participant on a large disk cannot copy all of it to the portal's at every snapshot."""
    root = tmp_path / "sub"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / name).write_bytes(name.encode() * 100)
    (root / "same-as-a").write_bytes(b"a" * 100)
    store = BlobStore(tmp_path / "blobs")
    first = capture_directory(root, store, Limits(max_new_bytes=250))
    assert {e.path for e in first.manifest.files} == {"a", "b", "same-as-a"}
    assert [(s.path, s.reason) for s in first.manifest.skipped] == [("c", "over_budget")]
    assert not store.exists(hashlib.sha256(b"c" * 100).hexdigest())
    # The next capture pays only for what is new to the store.
    second = capture_directory(root, store, Limits(max_new_bytes=250), previous=first.manifest)
    assert {e.path for e in second.manifest.files} == {"a", "b", "c", "same-as-a"}
    assert second.manifest.skipped == []


def test_a_hard_link_to_a_file_outside_the_tree_is_not_read(tmp_path: Path) -> None:
    """A file linked from elsewhere on the filesystem is not the tree's to give: it is read only
    when every link to it is inside the tree."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(CANARY)
    root = tmp_path / "sub"
    (root / "deep").mkdir(parents=True)
    os.link(outside / "secret", root / "deep" / "looks-mine")
    (root / "a.txt").write_bytes(b"shared")
    os.link(root / "a.txt", root / "deep" / "b.txt")  # both links inside: kept, once
    store = BlobStore(tmp_path / "blobs")
    result = capture_directory(root, store)
    files = {e.path: e.sha256 for e in result.manifest.files}
    assert files == {
        "a.txt": hashlib.sha256(b"shared").hexdigest(),
        "deep/b.txt": hashlib.sha256(b"shared").hexdigest(),
    }
    (skipped,) = result.manifest.skipped
    assert (skipped.path, skipped.reason) == ("deep/looks-mine", "hardlink")
    assert "1 of its 2 links are inside" in skipped.detail
    assert not store.exists(hashlib.sha256(CANARY).hexdigest())
    again = capture_directory(root, store, previous=result.manifest)
    assert {e.path for e in again.manifest.files} == set(files)
    assert again.reused_hashes == 2
