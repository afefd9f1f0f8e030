"""A loopback TCP proxy that can lose a reply (for the exactly-once retry tests)."""

from __future__ import annotations

import asyncio
import threading

_FRAME_TYPES = 10  # HTTP/2 frame types 0-9 (DATA 0, HEADERS 1, ..., CONTINUATION 9)


def carries_request(data: bytes) -> bool:
    """Whether bytes the client sent hold a request. HTTP/1.1: any bytes. HTTP/2 (gRPC,
    whole frames): a DATA frame with a payload, which every unary request and every call
    on the SDK's Calls stream sends; never a write of other frames alone (PING, SETTINGS,
    WINDOW_UPDATE acks, a stream's HEADERS), which gRPC sends on its own, several to a
    write under load. Armed by those, the proxy once cut a connection before the create
    was sent, and the create, sent again on a new one, was made (a loaded suite run)."""
    frames, pos = [], 0
    while pos + 9 <= len(data):
        length, kind = int.from_bytes(data[pos : pos + 3], "big"), data[pos + 3]
        if kind >= _FRAME_TYPES:
            return True  # not HTTP/2 frames: HTTP/1.1
        frames.append((kind, length))
        pos += 9 + length
    if pos != len(data):
        return True  # not whole frames: HTTP/1.1, or a request split across reads
    return any(kind == 0 and length > 0 for kind, length in frames)


class LossyProxy:
    """A loopback TCP proxy. After `lose_next_reply()`, the first bytes the server
    sends back after the client's next request are dropped and both connections are
    cut: the request reached the server, its reply never reached the client."""

    def __init__(self, target: str, listen_port: int = 0) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.listen_port = listen_port  # 0: any free one
        self._lose = threading.Event()
        self._armed = False
        self.stall = False  # when set, replies are held back (never delivered) instead
        self.lost = 0
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._started.wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.listen_port}"

    def lose_next_reply(self) -> None:
        self._lose.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)
        )
        self.listen_port = self.server.sockets[0].getsockname()[1]
        self._started.set()
        self.loop.run_forever()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection(self.host, self.port)
        except OSError:
            cwriter.close()
            return

        async def pipe(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lossy: bool
        ) -> None:
            try:
                while data := await reader.read(65536):
                    if lossy and self.stall:
                        continue
                    if not lossy and self._lose.is_set() and carries_request(data):
                        self._armed = True  # a request went out after lose_next_reply()
                    if lossy and self._armed:
                        self._lose.clear()
                        self._armed = False
                        self.lost += 1
                        break
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                for w in (cwriter, swriter):
                    w.close()  # also ends the other direction's read

        await asyncio.gather(pipe(creader, swriter, False), pipe(sreader, cwriter, True))

    def close(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
