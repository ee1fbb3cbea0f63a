"""Incremental capture of a submission volume on any Docker host, through a helper container.

Streaming the whole tar of /home/submission over SSH costs the full size at every snapshot. Here
a helper container on the workspace's host mounts the submission volume read-only (no network,
no capabilities but reading) and makes one pass over it (`_SCAN`): every path is listed; a file
whose (inode, size, mtime, ctime) is the one the previous capture recorded is not read at all
(its hash is the previous one, as `infra.snapshots.capture_directory` does locally) and costs
one bit of a bitmap over the previous capture's files, which the capture here keeps with one
insert from its index of that capture (`ListingCapture.collect`); any other file is read once,
hashed, listed, and, when its hash is not among the previous capture's, staged inside the
helper. When the pass is over, the listing and then the staged tar come back on the scan's
standard output, the listing read line by line as it arrives (never held whole here).

On an SSH host every Docker API request that is not a plain request on a kept connection starts
a `docker system dial-stdio` there, and creating, starting and removing a container is engine
work of a few hundred milliseconds each: for a small change those, not the bytes, are what a
capture costs. So the helper is long-lived, one per volume (`VolumeHelper.for_volume`, found by
its name in one request): a capture is one exec, given the previous capture's files on its
stdin and streamed back, whatever the size of the tree; finding the helper and starting the
exec (three requests, on the connection kept open: see `infra.docker_backend._tune_ssh`) happen
while the capture here reads the previous manifest, and the helper scans while that manifest is
indexed here. The helper ends itself once no capture has used it for `HELPER_IDLE_S` (and is
auto-removed); removing the volume removes its helpers first (`DockerBackend._remove_volume`),
and `DockerBackend.reconcile` removes one left stopped. Before a new helper is made,
`DockerBackend.mount_volume` makes sure a size-bounded volume's image is mounted (after a host
reboot); a running helper proves it is.

Content over the staging budget (a first capture of a large tree) is not staged but read by the
same helper as one tar stream (`_PACK`). The helper runs whether or not the workspace's
container still exists, so a volume whose container is gone is captured the same way. Judging
names, links, special files and limits is `infra.snapshots.capture_listing`'s, the same as for
every other capture.

The helper runs the workspace's own image (it is on the host already) with its python3.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import tarfile
import time
import uuid
import zlib
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import BinaryIO, cast

from docker.errors import APIError, DockerException, NotFound
from docker.utils.socket import STDERR

from infra.blobs import CHUNK, BlobStore
from infra.docker_backend import HELPER_LABEL, DockerBackend
from infra.exec_stream import ExecConnection
from infra.snapshots import (
    CaptureError,
    CaptureResult,
    ChunkReader,
    Limits,
    Listed,
    ListingCapture,
    Manifest,
)
from infra.workspace import WorkspaceError

MOUNT = "/s"
# A helper no capture has used for this long ends itself (and is auto-removed): it outlives the
# gap between interval captures, and one a crashed portal left behind does not stay forever.
HELPER_IDLE_S = 3600
# How long a capture waits for the engine to finish removing a helper that ended (auto-removal).
REMOVAL_WAIT_S = 30.0
BEAT_FILE = "/tmp/baseline-beat"  # touched by every exec in the helper; its age is the idle time
LISTING_END = b"--\n"  # between the scan's listing (JSON lines) and its staged tar
SCAN_DONE = b"\nbaseline: scan done\n"  # the scan's last bytes, only when it succeeded
WORK_DIR = "/tmp"  # in the helper: each capture's folder (`baseline-scan-<id>`) and want file
# What the scanning helper may stage in its own writable layer (on the host's disk) per capture.
STAGE_BYTES = 256 * 1024 * 1024
# Hex digits of each known hash the scan is told (`_previous_input`): its input is a third
# smaller than with whole hashes, and at 64 bits a false match (content then packed, not staged)
# is as good as never.
KNOWN_HEX = 16

# The helper's main process: waits until no exec has touched the beat file for the idle time.
_IDLE = r"""
import os, sys, time
beat, idle = sys.argv[1], int(sys.argv[2])
open(beat, "w").close()
while time.time() - os.stat(beat).st_mtime < idle:
    time.sleep(5)
"""

# The scans' walk, shared by `_SCAN` and `_PACK`: a directory is opened one name at a time from
# the mount's root, each relative to its parent's descriptor and never through a link
# (`O_NOFOLLOW`), and everything in it is read relative to that descriptor. A path string is
# never followed: a directory the participant swaps for a link while the scan runs fails to
# open (its files are reported unreadable) instead of leading outside the mount. The chain of
# open directories is the current path's, at most `window` long (deeper levels are opened again
# from the nearest one still open), so depth costs no descriptors.
_WALK = r"""
import os, stat
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
class Walk:
    def __init__(self, root, window=32):
        self.root = os.open(root, O_DIR)
        self.window, self.chain = window, []
    def opendir(self, parts, expect=None):
        chain = self.chain
        while chain and chain[-1][0] != parts[:len(chain[-1][0])]:
            os.close(chain.pop()[1])
        fd = chain[-1][1] if chain else self.root
        for depth in range(len(chain[-1][0]) if chain else 0, len(parts)):
            fd = os.open(parts[depth], O_DIR, dir_fd=fd)
            chain.append((parts[:depth + 1], fd))
            if len(chain) > self.window:
                os.close(chain.pop(0)[1])
        if expect is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != expect:
                raise OSError(0, "replaced while it was captured")
        return fd
    def open_file(self, name, dir_fd):
        fd = os.open(name, O_FILE, dir_fd=dir_fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise OSError(0, "replaced while it was captured")
        return fd, st
"""

# One pass over the mount without following links. argv: root, size limit, ignored globs (JSON),
# staging budget, its folder (made here), the beat file. Its input, one zlib stream on its stdin
# (self-delimiting: the portal sends it once the exec runs, and need not close its side), holds
# the previous capture's files, one a line, numbered from 0: "path-b64 stat-key mode hash-prefix"
# (the first `KNOWN_HEX` hex digits of the sha256: enough to not stage known content; a rare
# false match is only packed afterwards, as any file not staged). Writes to stdout the listing
# as it is found (one `Listed` a line, JSON), except the files whose stat key and mode are the
# ones the previous capture recorded (most of them): each is one set bit, by its number, of a
# bitmap sent as the listing's last line ("= bitmap-b64", see `ListingCapture.collect`); then
# the line `LISTING_END`, all as one zlib stream (the listing is most of what a small change
# moves, and shrinks several times), then the staged tar as it is (written to its folder during
# the pass), and removes its folder. So the capture here judges the listing while the pass goes
# on. Its last bytes are `SCAN_DONE` (its last argument): the output is whole, no request for
# the exit status needed. A file is read once, into memory (it is within the size limit), so
# what is staged is what was hashed; its stat key is the opened file's. Whatever fails on one
# path (it vanished, was replaced, cannot be read) is that path's error row, never the scan's.
_SCAN = (
    _WALK
    + r"""
import base64, binascii, fnmatch, hashlib, io, json, re, shutil, sys, tarfile, zlib
from stat import S_IMODE, S_ISREG
root, limit, ignore = sys.argv[1].encode(), int(sys.argv[2]), json.loads(sys.argv[3])
budget, out, beat = int(sys.argv[4]), sys.argv[5], sys.argv[6]
known_hex = int(sys.argv[8])
def alive():
    try: os.utime(beat)
    except OSError: pass
def scan():
    global budget
    known, hashes, count = {}, set(), 0
    os.makedirs(out)
    inflate, rest = zlib.decompressobj(), b""
    while not inflate.eof:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            raise SystemExit("input cut short")
        *lines, rest = (rest + inflate.decompress(chunk)).split(b"\n")
        for line in lines:
            path, key, mode, digest = line.split()
            if key != b"-":
                known[path] = (key + b" " + mode, count)
            hashes.add(digest)
            count += 1
    unchanged = bytearray((count + 7) // 8)
    out_fd = open(sys.stdout.fileno(), "wb", buffering=1 << 16, closefd=False)
    squeeze = zlib.compressobj(1)
    pending = []
    def send(line):
        pending.append(line)
        if len(pending) == 1024:
            out_fd.write(squeeze.compress(b"".join(pending))); pending.clear()
    def emit(row): send(json.dumps(row).encode() + b"\n")
    b64 = lambda raw: base64.b64encode(raw).decode()
    b64_bytes = lambda raw: binascii.b2a_base64(raw, newline=False)
    def problem(e): return e.strerror or str(e)
    match = re.compile("|".join(fnmatch.translate(g) for g in ignore)).match if ignore else None
    def name_ignored(name):
        return match is not None and match(name.decode("utf-8", "surrogateescape")) is not None
    def read(name, dir_fd):
        fd, st = walk.open_file(name, dir_fd)
        try:
            data = bytearray()
            while chunk := os.read(fd, 1 << 20):
                data += chunk
                if len(data) > limit:
                    break
            return bytes(data), st
        finally:
            os.close(fd)
    walk = Walk(root)
    tar = tarfile.open(out + "/staged.tar", "w", format=tarfile.PAX_FORMAT, encoding="utf-8",
                       errors="surrogateescape")
    stack = [((), None, False)]  # (path parts, its (device, inode) when listed, ignored)
    while stack:
        parts, expect, rel_ignored = stack.pop()
        rel = b"/".join(parts)
        alive()
        try:
            dir_fd = walk.opendir(parts, expect)
            names = sorted((os.fsencode(n) for n in os.listdir(dir_fd)), reverse=True)
        except OSError as e:
            emit(dict(raw=b64(rel), kind="error", detail=problem(e))); continue
        for name in names:
            child = rel + b"/" + name if rel else name
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError as e:
                emit(dict(raw=b64(child), kind="error", detail=problem(e))); continue
            raw = b64_bytes(child)
            ignored = rel_ignored or name_ignored(name)
            previous = known.get(raw)
            if previous is not None and S_ISREG(st.st_mode) and st.st_size <= limit:
                was, number = previous
                same = was == b"%d:%d:%d:%d %d" % (st.st_ino, st.st_size, st.st_mtime_ns,
                                                   st.st_ctime_ns, S_IMODE(st.st_mode))
                if same and not ignored:  # most: one bit, no line
                    unchanged[number >> 3] |= 1 << (number & 7)
                    continue
            row = dict(raw=raw.decode(), mode=S_IMODE(st.st_mode), mtime=st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                row.update(kind="dir")
                stack.append((parts + (name,), (st.st_dev, st.st_ino), ignored))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    row.update(kind="symlink", target=b64(os.readlink(name, dir_fd=dir_fd)))
                except OSError as e:
                    row = dict(raw=row["raw"], kind="error", detail=problem(e))
            elif stat.S_ISREG(st.st_mode):
                key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
                row.update(kind="file", size=st.st_size, stat_key=key)
                if st.st_size > limit or ignored:
                    pass
                else:
                    try:
                        data, st = read(name, dir_fd)
                    except OSError as e:
                        row.update(detail=problem(e))
                    else:
                        digest = hashlib.sha256(data).hexdigest()
                        key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
                        row.update(sha256=digest, size=len(data), stat_key=key,
                                   mode=S_IMODE(st.st_mode), mtime=st.st_mtime)
                        seen = digest[:known_hex].encode() in hashes
                        if len(data) <= limit and not seen and len(data) <= budget:
                            budget -= len(data)
                            info = tarfile.TarInfo(child.decode("utf-8", "surrogateescape"))
                            info.size, info.mode, info.mtime = len(data), row["mode"], st.st_mtime
                            tar.addfile(info, io.BytesIO(data))
                            row.update(staged=True)
            else:
                row.update(kind="other", detail="special file")
            emit(row)
    tar.close()
    pending.append(b"= " + base64.b64encode(unchanged) + b"\n--\n")
    out_fd.write(squeeze.compress(b"".join(pending)) + squeeze.flush())
    alive()
    with open(out + "/staged.tar", "rb") as staged:
        shutil.copyfileobj(staged, out_fd, 1 << 16)
    out_fd.write(sys.argv[7].encode())
    out_fd.close()
try:
    scan()
finally:
    shutil.rmtree(out, ignore_errors=True)
"""
)

# Writes a tar of the wanted files (paths base64, one a line in a file, removed once read) to
# stdout, each opened through the walk's descriptors (`_WALK`); a path that is no longer a
# regular file reached without links is left out (the capture here records it gone). A file's
# size is the one it had when opened: a file that shrinks while read is padded, one that grows
# is cut, so the stream stays a valid tar and the capture finds the content changed (its hash).
_PACK = (
    _WALK
    + r"""
import base64, sys, tarfile
from stat import S_IMODE
root, want, beat = sys.argv[1].encode(), sys.argv[2], sys.argv[3]
with open(want) as f:
    paths = [base64.b64decode(line) for line in f]
os.unlink(want)
class Exact:
    def __init__(self, fd, size): self.fd, self.left = fd, size
    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        data = bytearray()
        while len(data) < n:
            try:
                chunk = os.read(self.fd, n - len(data))
            except OSError:
                chunk = b""
            if not chunk:
                data += bytes(n - len(data))
            data += chunk
        self.left -= n
        return bytes(data)
walk = Walk(root)
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT,
                  encoding="utf-8", errors="surrogateescape") as tar:
    for index, rel in enumerate(paths):
        if index % 1000 == 0:
            try: os.utime(beat)
            except OSError: pass
        parts = tuple(rel.split(b"/"))
        try:
            fd, st = walk.open_file(parts[-1], walk.opendir(parts[:-1]))
        except OSError:
            continue
        try:
            info = tarfile.TarInfo(rel.decode("utf-8", "surrogateescape"))
            info.size, info.mode, info.mtime = st.st_size, S_IMODE(st.st_mode), st.st_mtime
            tar.addfile(info, Exact(fd, st.st_size))
        finally:
            os.close(fd)
"""
)


def _tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def helper_name(volume: str) -> str:
    """The one helper of a volume: found by name, so a capture needs no listing request."""
    return f"{volume}-helper"


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
    """The long-lived helper of a volume on its host, the volume mounted read-only at `MOUNT`."""

    def __init__(self, backend: DockerBackend, image: str, volume: str) -> None:
        self.backend = backend
        self.image = image
        self.volume = volume
        self.container_id = ""

    @classmethod
    def for_volume(cls, backend: DockerBackend, image: str, volume: str) -> VolumeHelper:
        """The volume's running helper (one request), or a new one when there is none usable."""
        helper = cls(backend, image, volume)
        try:
            attrs = backend.api.inspect_container(helper_name(volume))
        except NotFound:
            attrs = None
        except DockerException as exc:
            raise CaptureError(f"helper of volume {volume}: {exc}") from exc
        if attrs is not None and helper._usable(attrs):
            helper.container_id = str(attrs["Id"])
        else:
            helper._replace(attrs)
        return helper

    def _usable(self, attrs: dict[str, object]) -> bool:
        """Running, on this volume, and made with this backend's labels (a helper of another
        run or portal is not ours to use)."""
        config = attrs.get("Config")
        labels = config.get("Labels") if isinstance(config, dict) else None
        state = attrs.get("State")
        wanted = {**self.backend.labels, HELPER_LABEL: self.volume}
        return (
            isinstance(labels, dict)
            and all(labels.get(key) == value for key, value in wanted.items())
            and isinstance(state, dict)
            and bool(state.get("Running"))
        )

    def _replace(self, attrs: dict[str, object] | None) -> None:
        """Start a new helper, after removing the unusable one that has the name."""
        try:
            if attrs is not None:
                self._remove_old(str(attrs["Id"]))
            self.backend.mount_volume(self.volume)  # a size-bounded volume's image, after a reboot
        except (DockerException, WorkspaceError) as exc:
            raise CaptureError(f"helper of volume {self.volume}: {exc}") from exc
        try:
            container = self.backend.client.containers.run(
                self.image,
                ["python3", "-I", "-S", "-c", _IDLE, BEAT_FILE, str(HELPER_IDLE_S)],
                name=helper_name(self.volume),
                detach=True,
                auto_remove=True,
                **_helper_options(self.backend, self.volume),
            )
        except APIError as exc:
            if exc.status_code != 409:  # 409: another capture made it a moment ago
                raise CaptureError(f"helper of volume {self.volume}: {exc}") from exc
            try:
                container = self.backend.client.containers.get(helper_name(self.volume))
            except DockerException as again:
                raise CaptureError(f"helper of volume {self.volume}: {again}") from again
        except DockerException as exc:
            raise CaptureError(f"helper of volume {self.volume}: {exc}") from exc
        self.container_id = str(container.id)

    def _remove_old(self, container_id: str) -> None:
        """Remove an unusable helper and wait until it is gone, so that its name is free. A
        helper that has just ended is being removed by the engine already (it is auto-removed):
        a second removal is refused with 409 while the first runs."""
        api = self.backend.api
        try:
            api.remove_container(container_id, force=True)
        except NotFound:
            return
        except APIError as exc:
            if exc.status_code != 409:
                raise
        deadline = time.monotonic() + REMOVAL_WAIT_S
        while True:
            try:
                api.inspect_container(container_id)
            except NotFound:
                return
            if time.monotonic() > deadline:
                raise CaptureError(
                    f"helper of volume {self.volume}: the ended helper {container_id[:12]} "
                    f"is still being removed after {REMOVAL_WAIT_S:.0f} s"
                )
            time.sleep(0.1)

    def run(self, argv: list[str], done: bytes = b"", stdin: bool = False) -> _Output:
        """Start a command in the helper now; its stdout, chunk by chunk (binary safe), fails on
        exit != 0. A command that ends its output with `done` when (and only when) it succeeds
        spares the request for its exit status. Closing the output early closes the exec's
        connection (the command then ends on a broken pipe): the helper outlives the capture,
        so nothing may be left waiting in it."""
        api = self.backend.client.api
        try:
            exec_id = api.exec_create(
                self.container_id, argv, stdout=True, stderr=True, stdin=stdin
            )["Id"]
            connection = ExecConnection(api, exec_id)
        except DockerException as exc:
            raise CaptureError(f"helper of volume {self.volume}: {exc}") from exc
        return _Output(self._output(exec_id, connection, done), connection)

    def _output(
        self, exec_id: str, connection: ExecConnection, done: bytes
    ) -> Generator[bytes, None, None]:
        api = self.backend.client.api
        errors = bytearray()
        tail = b""
        try:
            for stream, data in connection.frames():
                if stream == STDERR:
                    errors += data[: 4096 - len(errors)]
                elif data:
                    tail = (tail + data)[-len(done) :] if done else b""
                    yield data
            if done and tail == done:
                return
            code = api.exec_inspect(exec_id).get("ExitCode")
        except (DockerException, OSError) as exc:
            raise CaptureError(f"helper of volume {self.volume}: {exc}") from exc
        finally:
            connection.close()
        if code != 0:
            raise CaptureError(f"helper exited {code}: {errors.decode(errors='replace')[:300]}")
        if done:
            raise CaptureError("helper output cut short (exit 0 without its last line)")

    def put_archive(self, folder: str, archive: bytes | BinaryIO) -> None:
        try:
            self.backend.api.put_archive(self.container_id, folder, archive)
        except DockerException as exc:
            raise CaptureError(
                f"helper of volume {self.volume}: writing to {folder}: {exc}"
            ) from exc


class _Output:
    """A running exec's stdout chunks; `close` ends it even when it was never read."""

    def __init__(self, chunks: Generator[bytes, None, None], connection: ExecConnection) -> None:
        self.chunks = chunks
        self.connection = connection

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks

    def send(self, data: bytes) -> None:
        """Write to the exec's stdin (its stdout is read apart, as frames)."""
        try:
            self.connection.send(data)
        except OSError as exc:
            raise CaptureError(f"helper input broke off: {exc}") from exc

    def close(self) -> None:
        self.chunks.close()
        self.connection.close()


def _pack(helper: VolumeHelper, paths: list[bytes]) -> Iterator[BinaryIO]:
    """One tar stream of `paths` read by the helper (what the scan did not stage)."""
    want = f"baseline-want-{uuid.uuid4().hex}"
    helper.put_archive(
        WORK_DIR, _tar_of({want: b"".join(base64.b64encode(p) + b"\n" for p in paths)})
    )
    chunks = helper.run(
        ["python3", "-I", "-S", "-c", _PACK, MOUNT, f"{WORK_DIR}/{want}", BEAT_FILE]
    )
    reader = io.BufferedReader(ChunkReader(chunks), CHUNK)
    try:
        yield cast(BinaryIO, reader)
        while reader.read(CHUNK):  # to its end, so that the exit status is checked
            pass
    finally:
        chunks.close()


def _previous_input(capture: ListingCapture) -> bytes:
    """What the scan may take from the previous capture, one zlib stream for its stdin (it
    crosses the SSH connection): one line per file in `ListingCapture.previous_files`' order,
    "path-b64 stat-key mode hash-prefix" (stat key "-" when it has none; the sha256's first
    `KNOWN_HEX` hex digits). Files with the same stat key and mode are not read again (only
    their numbers come back); content with a known hash is not staged again. Written from the
    previous manifest's parts (one at a time); compressed as it is made, so only the
    compressed input is held (a few bytes per file). A damaged previous manifest only costs
    reading everything again (as `infra.snapshots` does).
    Whether the store still has those blobs is checked afterwards (`ListingCapture.collect`);
    what it lacks is then packed."""
    squeeze = zlib.compressobj(1)
    out: list[bytes] = []
    lines: list[bytes] = []
    try:
        for key, stat_key, mode, digest in capture.previous_files():
            lines.append(
                b"%s %s %d %s\n"
                % (
                    base64.b64encode(key),
                    (stat_key or "-").encode(),
                    mode,
                    digest[:KNOWN_HEX].encode(),
                )
            )
            if len(lines) == 4096:
                out.append(squeeze.compress(b"".join(lines)))
                lines.clear()
    except (KeyError, ValueError, TypeError):  # a damaged previous manifest: nothing known
        return zlib.compress(b"", 1)
    out.append(squeeze.compress(b"".join(lines)) + squeeze.flush())
    return b"".join(out)


def _inflate_head(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The scan's output with its leading zlib stream (the listing) inflated; what follows the
    end of that stream (the staged tar) passes as it is."""
    inflate = zlib.decompressobj()
    for chunk in chunks:
        if inflate.eof:
            yield chunk
            continue
        if data := inflate.decompress(chunk):
            yield data
        if inflate.eof and inflate.unused_data:
            yield inflate.unused_data


class _Scan:
    """One scan in the volume's helper: given the previous capture, run, its output read as it
    arrives (the listing while the pass goes on, then the staged tar as the capture needs it)."""

    def __init__(self, backend: DockerBackend, image: str, volume: str) -> None:
        self.backend = backend
        self.image = image
        self.volume = volume
        self.helper: VolumeHelper | None = None
        self.output: _Output | None = None
        self.stream: io.BufferedReader | None = None
        self.listed = False
        self.unchanged: bytes | None = None

    def start(self, limits: Limits, stage_bytes: int) -> None:
        """Find (or make) the volume's helper and start the scan in it: it waits for its input
        (`send`). Its requests cross the connection while the capture here reads the previous
        manifest."""
        self.helper = VolumeHelper.for_volume(self.backend, self.image, self.volume)
        folder = f"baseline-scan-{uuid.uuid4().hex}"
        argv = [MOUNT, str(limits.max_file_bytes), json.dumps(list(limits.ignore))]
        argv += [str(stage_bytes), f"{WORK_DIR}/{folder}", BEAT_FILE, SCAN_DONE.decode()]
        argv += [str(KNOWN_HEX)]
        self.output = self.helper.run(
            ["python3", "-I", "-S", "-c", _SCAN, *argv], SCAN_DONE, stdin=True
        )

    def send(self, given: bytes) -> None:
        """Give the started scan its input (`_previous_input`)."""
        if self.output is None:
            raise CaptureError(f"helper scan of volume {self.volume}: not started")
        self.output.send(given)

    def listing(self) -> Iterator[Listed]:
        """The scan's listing, read line by line from its output as it arrives."""
        if self.output is None:
            raise CaptureError(f"helper scan of volume {self.volume}: not started")
        self.stream = io.BufferedReader(ChunkReader(_inflate_head(self.output)), CHUNK)
        return self._lines(self.stream)

    def _lines(self, stream: io.BufferedReader) -> Iterator[Listed]:
        try:
            for line in stream:
                if line == LISTING_END:
                    self.listed = self.unchanged is not None
                    break
                if not line.endswith(b"\n"):
                    break
                if line.startswith(b"= "):
                    self.unchanged = base64.b64decode(line[2:-1], validate=True)
                else:
                    yield Listed.model_validate_json(line)
            if self.listed:
                return
        except (OSError, DockerException, zlib.error, ValueError) as exc:
            raise CaptureError(f"helper scan of volume {self.volume}: {exc}") from exc
        raise CaptureError(f"helper scan of volume {self.volume}: listing cut short")

    def kept(self) -> bytes:
        """The scan's bitmap of the previous capture's files it found unchanged."""
        if self.unchanged is None or not self.listed:
            raise CaptureError(f"helper scan of volume {self.volume}: the listing is not read")
        return self.unchanged

    def staged(self) -> BinaryIO:
        """The staged tar, which follows the whole listing."""
        if self.stream is None or not self.listed:
            raise CaptureError(f"helper scan of volume {self.volume}: the listing is not read")
        return cast(BinaryIO, self.stream)

    def finish(self) -> None:
        """Read the scan's output to its end, so that its exit status is known (raises if the
        scan failed)."""
        if self.stream is not None:
            try:
                while self.stream.read(CHUNK):
                    pass
            except (OSError, DockerException) as exc:
                raise CaptureError(f"helper scan of volume {self.volume}: {exc}") from exc

    def close(self) -> None:
        """Close the exec's connection; a scan cut off removes its folder as it ends."""
        if self.output is not None:
            self.output.close()


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
    scan = _Scan(backend, image, volume)
    # The helper is found and the scan's exec started (three requests over the connection) and
    # then given its input, in order, by one thread, while the input is made here from the
    # previous manifest and then the capture indexes that manifest (`ListingCapture.prepare`),
    # as the helper scans.
    with ThreadPoolExecutor(max_workers=1) as pool:
        started = pool.submit(scan.start, limits, stage_bytes)
        capture: ListingCapture | None = None
        sent: Future[None] | None = None
        try:
            capture = ListingCapture(store, limits, source, previous)
            sent = pool.submit(scan.send, _previous_input(capture))
            capture.prepare()
            started.result()
            sent.result()
        except BaseException:
            if capture is not None:
                capture.close()
            for step in (started, sent):
                with contextlib.suppress(Exception):  # wait for the exec, to close it
                    if step is not None:
                        step.result()
            scan.close()
            raise
    try:
        scanned = scan.listing()
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
                if scan.helper is None:
                    raise CaptureError(f"helper scan of volume {volume}: not started")
                yield from _pack(scan.helper, rest)

        result = capture.collect(listing(), fetch, scan.kept)
        scan.finish()
        return result
    finally:
        capture.close()
        scan.close()
