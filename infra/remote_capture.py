"""Incremental capture of a submission volume on any Docker host, through a helper container.

Streaming the whole tar of /home/submission over SSH costs the full size at every snapshot. Here
a short-lived helper container on the workspace's host mounts the submission volume read-only
(no network, no capabilities but reading) and makes one pass over it (`_SCAN`): every path is
listed; a file whose (inode, size, mtime, ctime) is the one the previous capture recorded is not
read at all (its hash is the previous one, as `infra.snapshots.capture_directory` does locally);
any other file is read once, hashed, and, when its hash is not among the previous capture's,
staged in a tar inside the helper. The helper then exits and the listing and the staged tar come
back in one archive read, the listing read line by line as it arrives (never held whole here).
The whole capture is one helper run and a handful of Docker API requests on one SSH connection,
whatever the size of the tree: on an SSH host every new connection starts a `docker system
dial-stdio` there and every exec hijacks its connection, so those, not the bytes, are what a
small change costs. Before it, `DockerBackend.mount_volume` makes sure a size-bounded volume's
image is mounted (after a host reboot).

Content over the staging budget (a first capture of a large tree) is not staged but read by a
second, running helper as one tar stream (`VolumeHelper`, `_PACK`). The helper runs whether or
not the workspace's container still exists, so a volume whose container is gone is captured the
same way. Judging names, links, special files and limits is `infra.snapshots.capture_listing`'s,
the same as for every other capture.

The helper runs the workspace's own image (it is on the host already) with its python3.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import tarfile
import tempfile
from collections.abc import Iterator
from typing import BinaryIO, cast

from docker.errors import APIError, DockerException
from docker.models.containers import Container

from infra.blobs import CHUNK, BlobStore
from infra.docker_backend import HELPER_LABEL, DockerBackend
from infra.snapshots import (
    CaptureError,
    CaptureResult,
    ChunkReader,
    Limits,
    Listed,
    Manifest,
    capture_listing,
    iter_entries,
)
from infra.workspace import WorkspaceError

MOUNT = "/s"
HELPER_LIFETIME_S = 3600  # a helper left behind by a crash ends itself (and is auto-removed)
WANT_FILE = "/tmp/baseline-want"
SCAN_DIR = "/tmp/baseline-scan"  # in the scanning helper: its input and its two outputs
# What the scanning helper may stage in its own writable layer (on the host's disk) per capture.
STAGE_BYTES = 256 * 1024 * 1024

# One pass over the mount without following links. argv: root, size limit, ignored globs (JSON),
# staging budget, SCAN_DIR. Its input, previous.txt, holds the previous capture's files, one a
# line: "path-b64 stat-key sha256". Writes 1-listing.jsonl (one `Listed` a line, as found) and
# 2-staged.tar to SCAN_DIR: named so that the engine's archive of the folder (a lexical walk)
# sends the listing first. A file is read once, into memory (it is within the size limit), so
# what is staged is what was hashed.
_SCAN = r"""
import base64, fnmatch, hashlib, io, json, os, stat, sys, tarfile
root, limit, ignore = sys.argv[1].encode(), int(sys.argv[2]), json.loads(sys.argv[3])
budget, out = int(sys.argv[4]), sys.argv[5]
known, hashes = {}, set()
with open(out + "/previous.txt") as f:
    for line in f:
        path, key, digest = line.split()
        if key != "-":
            known[path] = key
        hashes.add(digest)
os.unlink(out + "/previous.txt")  # not sent back
listing = open(out + "/1-listing.jsonl", "w")
def emit(row): listing.write(json.dumps(row) + "\n")
b64 = lambda raw: base64.b64encode(raw).decode()
def ignored(rel):
    return any(fnmatch.fnmatchcase(p.decode("utf-8", "surrogateescape"), g)
               for p in rel.split(b"/") for g in ignore)
def read(path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        data = bytearray()
        while chunk := os.read(fd, 1 << 20):
            data += chunk
            if len(data) > limit:
                break
        return bytes(data)
    finally:
        os.close(fd)
tar = tarfile.open(out + "/2-staged.tar", "w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                   errors="surrogateescape")
stack = [b""]
while stack:
    rel = stack.pop()
    try:
        names = sorted(os.listdir(root + b"/" + rel if rel else root), reverse=True)
    except OSError as e:
        emit(dict(raw=b64(rel), kind="error", detail=e.strerror or str(e))); continue
    for name in names:
        child = rel + b"/" + name if rel else name
        full = root + b"/" + child
        try:
            st = os.lstat(full)
        except OSError as e:
            emit(dict(raw=b64(child), kind="error", detail=e.strerror or str(e))); continue
        row = dict(raw=b64(child), mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            row.update(kind="dir"); stack.append(child)
        elif stat.S_ISLNK(st.st_mode):
            row.update(kind="symlink", target=b64(os.readlink(full)))
        elif stat.S_ISREG(st.st_mode):
            key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
            row.update(kind="file", size=st.st_size, stat_key=key)
            if st.st_size > limit or ignored(child):
                pass
            elif known.get(row["raw"]) == key:
                row.update(same=True)
            else:
                try:
                    data = read(full)
                except OSError as e:
                    row.update(detail=e.strerror or str(e))
                else:
                    digest = hashlib.sha256(data).hexdigest()
                    row.update(sha256=digest, size=len(data))
                    if len(data) <= limit and digest not in hashes and len(data) <= budget:
                        budget -= len(data)
                        info = tarfile.TarInfo(child.decode("utf-8", "surrogateescape"))
                        info.size, info.mode, info.mtime = len(data), row["mode"], st.st_mtime
                        tar.addfile(info, io.BytesIO(data))
                        row.update(staged=True)
        else:
            row.update(kind="other", detail="special file")
        emit(row)
tar.close()
listing.close()
"""

# Writes a tar of the wanted paths (base64, one a line in a file) to stdout; links not followed.
_PACK = r"""
import base64, os, sys, tarfile
root, want = sys.argv[1].encode(), sys.argv[2]
with open(want) as f, tarfile.open(fileobj=sys.stdout.buffer, mode="w|",
                                   format=tarfile.PAX_FORMAT, encoding="utf-8",
                                   errors="surrogateescape") as tar:
    for line in f:
        rel = base64.b64decode(line)
        try:
            tar.add(root + b"/" + rel, arcname=rel.decode("utf-8", "surrogateescape"),
                    recursive=False)
        except OSError:
            pass
"""


def _tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _helper_options(backend: DockerBackend, volume: str) -> dict[str, object]:
    return {
        "entrypoint": [],
        "user": "0",
        "network_mode": "none",
        "cap_drop": ["ALL"],
        "cap_add": ["DAC_READ_SEARCH"],  # read every file, whatever its mode
        "security_opt": ["no-new-privileges"],
        "volumes": {volume: {"bind": MOUNT, "mode": "ro"}},
        "labels": {**backend.labels, HELPER_LABEL: volume},
        "mem_limit": "512m",
    }


class VolumeHelper:
    """A helper container on the host with the volume mounted read-only at `MOUNT`."""

    def __init__(self, backend: DockerBackend, image: str, volume: str) -> None:
        self.backend = backend
        try:
            self.container: Container = backend.client.containers.run(
                image,
                ["sleep", str(HELPER_LIFETIME_S)],
                detach=True,
                auto_remove=True,
                **_helper_options(backend, volume),
            )
        except DockerException as exc:
            raise CaptureError(f"helper container for volume {volume}: {exc}") from exc

    def run(self, argv: list[str]) -> Iterator[bytes]:
        """Stdout of a command in the helper, chunk by chunk (binary safe); fails on exit != 0."""
        api = self.backend.client.api
        try:
            exec_id = api.exec_create(self.container.id, argv, stdout=True, stderr=True)["Id"]
            errors = bytearray()
            for out, err in api.exec_start(exec_id, stream=True, demux=True):
                if err:
                    errors += err[:4096]
                if out:
                    yield out
            code = api.exec_inspect(exec_id).get("ExitCode")
        except DockerException as exc:
            raise CaptureError(f"helper on {self.container.name}: {exc}") from exc
        if code != 0:
            raise CaptureError(f"helper exited {code}: {errors.decode(errors='replace')[:300]}")

    def put_file(self, path: str, data: bytes) -> None:
        try:
            self.container.put_archive(
                path.rsplit("/", 1)[0] or "/", _tar_of({path.rsplit("/", 1)[-1]: data})
            )
        except APIError as exc:
            raise CaptureError(f"helper: writing {path}: {exc.explanation}") from exc

    def close(self) -> None:
        # A helper that cannot be removed now ends by itself after HELPER_LIFETIME_S.
        with contextlib.suppress(DockerException):
            self.container.remove(force=True)


def _pack(
    backend: DockerBackend, image: str, volume: str, paths: list[bytes]
) -> Iterator[BinaryIO]:
    """One tar stream of `paths` read by a running helper (what the scan did not stage)."""
    helper = VolumeHelper(backend, image, volume)
    try:
        helper.put_file(WANT_FILE, b"".join(base64.b64encode(p) + b"\n" for p in paths))
        chunks = helper.run(["python3", "-c", _PACK, MOUNT, WANT_FILE])
        yield cast(BinaryIO, io.BufferedReader(ChunkReader(chunks), CHUNK))
    finally:
        helper.close()


def _previous_input(store: BlobStore, previous: Manifest | str | None) -> BinaryIO:
    """What the scan may take from the previous capture, as a tar holding ``previous.txt`` for
    `put_archive`: one line per file, "path-b64 stat-key sha256" (stat key "-" when it has
    none). Files with the same stat key are not read again; content with a known hash is not
    staged again. Streamed part by part from the manifest into a temporary file, so that a
    large tree's manifest is never whole in memory here; a damaged previous manifest only costs
    reading everything again (as `infra.snapshots` does). Whether the store still has those
    blobs is checked afterwards (`capture_listing`); what it lacks is then packed."""
    with tempfile.TemporaryFile() as lines:
        try:
            for entry in iter_entries(store, previous) if previous is not None else ():
                if entry.type == "file" and entry.sha256:
                    raw = entry.raw_name or base64.b64encode(entry.path.encode()).decode()
                    lines.write(f"{raw} {entry.stat_key or '-'} {entry.sha256}\n".encode())
        except (KeyError, ValueError):
            lines.seek(0)
            lines.truncate()
        info = tarfile.TarInfo(SCAN_DIR.rsplit("/", 1)[-1] + "/previous.txt")
        info.size = lines.tell()
        lines.seek(0)
        archive = tempfile.TemporaryFile()  # noqa: SIM115  # the caller closes it
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.addfile(info, lines)
    archive.seek(0)
    return cast(BinaryIO, archive)


class _Scan:
    """The scanning helper: created, given the previous capture, run to its end, read back with
    one archive request (the listing, then the staged tar, read as the capture needs it)."""

    def __init__(self, backend: DockerBackend, image: str, volume: str) -> None:
        self.backend = backend
        self.image = image
        self.volume = volume
        self.container: Container | None = None
        self.archive: tarfile.TarFile | None = None

    def run(self, limits: Limits, previous: BinaryIO, stage_bytes: int) -> Iterator[Listed]:
        """The scan's listing, read line by line from the archive as it arrives."""
        argv = [MOUNT, str(limits.max_file_bytes), json.dumps(list(limits.ignore))]
        try:
            self.container = container = self.backend.client.containers.create(
                self.image,
                ["python3", "-I", "-S", "-c", _SCAN, *argv, str(stage_bytes), SCAN_DIR],
                **_helper_options(self.backend, self.volume),
            )
            container.put_archive(SCAN_DIR.rsplit("/", 1)[0], previous)
            container.start()
            status = container.wait(timeout=HELPER_LIFETIME_S)
            if status.get("StatusCode") != 0:
                errors = container.logs(stdout=False, stderr=True)[-600:]
                raise CaptureError(
                    f"helper scan of volume {self.volume} exited {status.get('StatusCode')}: "
                    f"{errors.decode(errors='replace')}"
                )
            chunks, _ = container.get_archive(SCAN_DIR, chunk_size=CHUNK)
            # Left open: the staged tar that follows the listing is read during the capture.
            self.archive = tarfile.open(  # noqa: SIM115
                fileobj=io.BufferedReader(ChunkReader(chunks), CHUNK), mode="r|"
            )
            listing = self._member("1-listing.jsonl")
        except DockerException as exc:
            raise CaptureError(f"helper scan of volume {self.volume}: {exc}") from exc
        return self._lines(listing)

    def _lines(self, listing: BinaryIO) -> Iterator[Listed]:
        try:
            for line in listing:
                if not line.endswith(b"\n"):
                    raise CaptureError(f"helper scan of volume {self.volume}: listing cut short")
                yield Listed.model_validate_json(line)
        except (tarfile.TarError, EOFError, OSError, DockerException) as exc:
            raise CaptureError(f"helper scan of volume {self.volume}: {exc}") from exc

    def _member(self, name: str) -> BinaryIO:
        """The next file of the scan's folder, which must be `name`."""
        if self.archive is None:
            raise CaptureError(f"helper scan of volume {self.volume} has not run")
        while (member := self.archive.next()) is not None:
            if member.isfile():
                handle = self.archive.extractfile(member)
                if member.name.rsplit("/", 1)[-1] == name and handle is not None:
                    return cast(BinaryIO, handle)
                break
        raise CaptureError(f"helper scan of volume {self.volume}: {name} did not come next")

    def staged(self) -> BinaryIO:
        return self._member("2-staged.tar")

    def close(self) -> None:
        # One that cannot be removed now is removed by `DockerBackend.reconcile` later.
        if self.container is not None:
            with contextlib.suppress(DockerException):
                self.container.remove(force=True)


def capture_volume(
    backend: DockerBackend,
    image: str,
    volume: str,
    store: BlobStore,
    limits: Limits | None = None,
    source: str = "volume",
    previous: Manifest | str | None = None,
    stage_bytes: int = STAGE_BYTES,
) -> CaptureResult:
    """Capture a submission volume on the backend's host, moving only content the store lacks;
    files unchanged since ``previous`` (a manifest or its digest; same stat key) are not even
    read there."""
    limits = limits or Limits()
    try:
        backend.mount_volume(volume)  # a size-bounded volume's image, after a host reboot
    except WorkspaceError as exc:
        raise CaptureError(str(exc)) from exc
    scan = _Scan(backend, image, volume)
    try:
        with _previous_input(store, previous) as given:
            scanned = scan.run(limits, given, stage_bytes)
        # Only the staged paths are remembered (at most what the staging budget holds); the
        # listing itself is spooled by the capture as it is read.
        staged: set[bytes] = set()

        def listing() -> Iterator[Listed]:
            for item in scanned:
                if item.staged:
                    staged.add(base64.b64decode(item.raw))
                yield item

        def fetch(paths: list[bytes]) -> Iterator[BinaryIO]:
            if any(path in staged for path in paths):
                yield scan.staged()
            rest = [path for path in paths if path not in staged]
            if rest:
                yield from _pack(backend, image, volume, rest)

        return capture_listing(listing(), fetch, store, limits, source, previous)
    finally:
        scan.close()
