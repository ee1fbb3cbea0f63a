"""Incremental capture of a submission volume on any Docker host, through a helper container.

Streaming the whole tar of /home/submission over SSH costs the full size at every snapshot. Here
a short-lived helper container on the workspace's host mounts the submission volume read-only
(no network, no capabilities but reading), walks it and hashes each file in place (`_LIST`),
and only the files whose content the blob store lacks come over, as one tar (`_PACK`). The
helper runs whether or not the workspace's container still exists, so a volume whose container
is gone is captured the same way. Judging names, links, special files and limits is
`infra.snapshots.capture_listing`'s, the same as for every other capture.

The helper runs the workspace's own image (it is on the host already) with its python3.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import tarfile
from collections.abc import Iterable, Iterator
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
    capture_listing,
)
from infra.workspace import WorkspaceError

MOUNT = "/s"
HELPER_LIFETIME_S = 3600  # a helper left behind by a crash ends itself (and is auto-removed)
WANT_FILE = "/tmp/baseline-want"

# Walks the mount without following links; one JSON line per path (see `Listed`). Files over the
# limit, and everything under an ignored folder, are listed but not hashed.
_LIST = r"""
import base64, fnmatch, hashlib, json, os, stat, sys
root, limit, ignore = sys.argv[1].encode(), int(sys.argv[2]), json.loads(sys.argv[3])
out = sys.stdout
b64 = lambda raw: base64.b64encode(raw).decode()
def emit(**row): out.write(json.dumps(row) + "\n")
def ignored(rel):
    return any(fnmatch.fnmatchcase(p.decode("utf-8", "surrogateescape"), g)
               for p in rel.split(b"/") for g in ignore)
def sha(path):
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()
stack = [b""]
while stack:
    rel = stack.pop()
    try:
        names = sorted(os.listdir(root + b"/" + rel if rel else root), reverse=True)
    except OSError as e:
        emit(raw=b64(rel), kind="error", detail=e.strerror or str(e)); continue
    for name in names:
        child = rel + b"/" + name if rel else name
        full = root + b"/" + child
        try:
            st = os.lstat(full)
        except OSError as e:
            emit(raw=b64(child), kind="error", detail=e.strerror or str(e)); continue
        row = dict(raw=b64(child), mode=stat.S_IMODE(st.st_mode), mtime=st.st_mtime)
        if stat.S_ISDIR(st.st_mode):
            emit(kind="dir", **row); stack.append(child)
        elif stat.S_ISLNK(st.st_mode):
            emit(kind="symlink", target=b64(os.readlink(full)), **row)
        elif stat.S_ISREG(st.st_mode):
            digest, detail = None, ""
            if st.st_size <= limit and not ignored(child):
                try:
                    digest = sha(full)
                except OSError as e:
                    detail = e.strerror or str(e)
            emit(kind="file", size=st.st_size, sha256=digest, detail=detail, **row)
        else:
            emit(kind="other", detail="special file", **row)
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


class VolumeHelper:
    """A helper container on the host with the volume mounted read-only at `MOUNT`."""

    def __init__(self, backend: DockerBackend, image: str, volume: str) -> None:
        self.backend = backend
        labels = {**backend.labels, HELPER_LABEL: volume}
        try:
            self.container: Container = backend.client.containers.run(
                image,
                ["sleep", str(HELPER_LIFETIME_S)],
                entrypoint=[],
                detach=True,
                auto_remove=True,
                user="0",
                network_mode="none",
                cap_drop=["ALL"],
                cap_add=["DAC_READ_SEARCH"],  # read every file, whatever its mode
                security_opt=["no-new-privileges"],
                volumes={volume: {"bind": MOUNT, "mode": "ro"}},
                labels=labels,
                mem_limit="512m",
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
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        try:
            self.container.put_archive(path.rsplit("/", 1)[0] or "/", buffer.getvalue())
        except APIError as exc:
            raise CaptureError(f"helper: writing {path}: {exc.explanation}") from exc

    def close(self) -> None:
        # A helper that cannot be removed now ends by itself after HELPER_LIFETIME_S.
        with contextlib.suppress(DockerException):
            self.container.remove(force=True)


def _lines(chunks: Iterable[bytes]) -> Iterator[Listed]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            if line:
                yield Listed.model_validate(json.loads(line))
    if pending.strip():
        raise CaptureError("the helper's listing ended inside a line")


def capture_volume(
    backend: DockerBackend,
    image: str,
    volume: str,
    store: BlobStore,
    limits: Limits | None = None,
    source: str = "volume",
) -> CaptureResult:
    """Capture a submission volume on the backend's host, moving only content the store lacks."""
    limits = limits or Limits()
    try:
        backend.mount_volume(volume)  # a size-bounded volume's image, after a host reboot
    except WorkspaceError as exc:
        raise CaptureError(str(exc)) from exc
    helper = VolumeHelper(backend, image, volume)
    try:
        argv = ["python3", "-c", _LIST, MOUNT, str(limits.max_file_bytes)]
        # read as it arrives: the capture spools it, never holding the whole listing
        listing = _lines(helper.run([*argv, json.dumps(list(limits.ignore))]))

        def fetch(paths: list[bytes]) -> Iterator[BinaryIO]:
            want = b"".join(base64.b64encode(p) + b"\n" for p in paths)
            helper.put_file(WANT_FILE, want)
            chunks = helper.run(["python3", "-c", _PACK, MOUNT, WANT_FILE])
            yield cast(BinaryIO, io.BufferedReader(ChunkReader(chunks), CHUNK))

        return capture_listing(listing, fetch, store, limits, source)
    finally:
        helper.close()
