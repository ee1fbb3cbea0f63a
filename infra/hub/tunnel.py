"""A small TCP multiplexer over one byte stream: the hub <-> workspace channel.

The single-user server runs inside the attempt's workspace container, which may have no network
at all (egress policy `none`), sit behind the egress firewall (which admits nothing but the
egress proxy), or live on a remote Docker host reached over SSH. The one channel that always
exists is `docker exec -i`: its stdin/stdout carry this protocol, so

- the hub side listens on 127.0.0.1 (the proxy's target) and forwards each connection to the
  single-user server's port inside the container, and
- the container side listens on 127.0.0.1 (the single-user server's JUPYTERHUB_API_URL) and
  forwards each connection to the hub's API on the host,

without opening any network path into or out of the workspace. The same code runs on both ends:
this module uses the standard library only, because the container side is started as
``python3 -c <this file's source> PORT:TARGET ...`` inside the workspace image.

Frames: ``>BII`` (kind, channel, length) then ``length`` bytes. Channel ids from the side that
opens them: even from the hub side, odd from the container side, so they never collide.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from collections.abc import Sequence

OPEN, DATA, CLOSE = 1, 2, 3
HEADER = struct.Struct(">BII")
CHUNK = 65536


class Mux:
    """Both ends of the tunnel: `listen` forwards local connections, frames open remote ones."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        parity: int,
        allowed_targets: frozenset[int] | None = None,
    ) -> None:
        # The hub side passes the ports the container may open (the hub's API only): whatever
        # runs in the workspace must not reach any other service on the host's loopback.
        self.allowed_targets = allowed_targets
        self.reader = reader
        self.writer = writer
        self.next_id = parity
        self.channels: dict[int, asyncio.Queue[bytes | None]] = {}
        self.servers: list[asyncio.Server] = []
        self.send_lock = asyncio.Lock()

    async def send(self, kind: int, channel: int, payload: bytes = b"") -> None:
        async with self.send_lock:
            self.writer.write(HEADER.pack(kind, channel, len(payload)) + payload)
            await self.writer.drain()

    async def listen(self, port: int, target: int, host: str = "127.0.0.1") -> int:
        """Forward connections made to `host`:`port` to `target` on the other side; the port
        listened on (the kernel's choice when `port` is 0: taken by the bind itself, so no other
        socket can take it between a choice and the bind)."""

        async def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            channel = self.next_id
            self.next_id += 2
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            self.channels[channel] = queue
            await self.send(OPEN, channel, str(target).encode())
            await self.pipe(channel, r, w, queue)

        server = await asyncio.start_server(accepted, host, port, reuse_address=True)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def pipe(
        self,
        channel: int,
        r: asyncio.StreamReader,
        w: asyncio.StreamWriter,
        queue: asyncio.Queue[bytes | None],
    ) -> None:
        async def upstream() -> None:
            try:
                while data := await r.read(CHUNK):
                    await self.send(DATA, channel, data)
            except (ConnectionError, OSError):
                pass
            await self.send(CLOSE, channel)

        async def downstream() -> None:
            try:
                while (data := await queue.get()) is not None:
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            w.close()

        up = asyncio.ensure_future(upstream())
        try:
            await downstream()
        except asyncio.CancelledError:  # the process is shutting down: close quietly
            w.close()
        finally:
            up.cancel()
            self.channels.pop(channel, None)

    async def opened(self, channel: int, target: int, queue: asyncio.Queue[bytes | None]) -> None:
        refused = self.allowed_targets is not None and target not in self.allowed_targets
        if refused or target <= 0:
            self.channels.pop(channel, None)
            await self.send(CLOSE, channel)
            return
        try:
            r, w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            self.channels.pop(channel, None)
            await self.send(CLOSE, channel)
            return
        await self.pipe(channel, r, w, queue)

    async def run(self) -> None:
        """Dispatch frames until the stream ends; then close every channel and listener."""
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                header = await self.reader.readexactly(HEADER.size)
                kind, channel, length = HEADER.unpack(header)
                payload = await self.reader.readexactly(length) if length else b""
                if kind == OPEN:
                    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
                    self.channels[channel] = queue
                    target = int(payload) if payload.isdigit() else -1
                    task = asyncio.ensure_future(self.opened(channel, target, queue))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                elif kind == DATA and channel in self.channels:
                    self.channels[channel].put_nowait(payload)
                elif kind == CLOSE and channel in self.channels:
                    self.channels[channel].put_nowait(None)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for queue in self.channels.values():
                queue.put_nowait(None)
            for server in self.servers:
                server.close()


def parse_forwards(specs: Sequence[str]) -> list[tuple[int, int]]:
    """``LISTEN:TARGET`` pairs of ports."""
    pairs = []
    for spec in specs:
        listen, _, target = spec.partition(":")
        pairs.append((int(listen), int(target)))
    return pairs


async def _container_main(forwards: list[tuple[int, int]]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**22)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout.buffer
    )
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    mux = Mux(reader, writer, parity=1)
    for listen, target in forwards:
        await mux.listen(listen, target)
    await mux.run()


if __name__ == "__main__":
    asyncio.run(_container_main(parse_forwards(sys.argv[1:])))
