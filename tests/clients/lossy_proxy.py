"""A loopback TCP proxy that can lose a reply (for the exactly-once retry tests)."""

from __future__ import annotations

import asyncio
import threading

# HTTP/2 control frames (PING 17 bytes, WINDOW_UPDATE 13, SETTINGS ack 9) that gRPC
# sends on its own must not arm the proxy: only a request (headers + body) does, or a
# message on a stream already open (a call on the SDK's Calls stream: one DATA frame,
# which can be shorter than that)
CONTROL_FRAME_BYTES = 64


def carries_request(data: bytes) -> bool:
    """Whether bytes the client sent hold a request: more than control frames, or an
    HTTP/2 DATA frame (type 0) with a payload."""
    if len(data) > CONTROL_FRAME_BYTES:
        return True
    pos = 0
    while pos + 9 <= len(data):
        length, kind = int.from_bytes(data[pos : pos + 3], "big"), data[pos + 3]
        if kind == 0 and length > 0:
            return True
        pos += 9 + length
    return False


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
