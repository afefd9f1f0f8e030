"""The render child: `python -P .../render_worker.py MEMORY_MB` (started by `rasterize.py`).

Reads requests from stdin and answers on stdout, one at a time, until stdin closes.
Its address space is limited to what it uses after start-up plus MEMORY_MB, so a
document that needs more memory fails here, not in the server worker. It exits after
running out of memory, so the parent starts a clean one, and an alarm ends it shortly
after a render's timeout in case its parent is gone.

This file imports only the standard library at the top (and cairosvg + Pillow in the
child), so that a child starts fast; it is run as a script, not through the package.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import struct
import sys
import time

# frames between parent and child (big-endian)
REQUEST = struct.Struct(">IIIf")  # width, height, svg byte length, timeout_s; then the svg bytes
REPLY = struct.Struct(">BI")  # status, payload length; then the payload
OK, REFUSED, OUT_OF_MEMORY = 0, 1, 2
READY = b"R"


class RefusedFetch(Exception):
    pass


def refuse_fetch(url: str, resource_type: str) -> bytes:
    """cairosvg url_fetcher that never reads a file or the network."""
    raise RefusedFetch(f"external reference {url[:80]!r} is not allowed")


def render_in_process(svg: bytes, width: int, height: int) -> bytes:
    """Render checked SVG bytes to packed RGB on white."""
    from cairosvg.parser import Tree
    from cairosvg.surface import PNGSurface
    from PIL import Image

    tree = Tree(bytestring=svg, url_fetcher=refuse_fetch, unsafe=False)
    surface = PNGSurface(
        tree, None, 96, output_width=width, output_height=height, background_color="white"
    )
    image_surface = surface.cairo
    image_surface.flush()
    # ARGB32 is native-endian (BGRA in memory here); opaque because of the white background
    data = bytes(image_surface.get_data())
    rgba = Image.frombuffer(
        "RGBA", (width, height), data, "raw", "BGRA", image_surface.get_stride(), 1
    )
    return rgba.convert("RGB").tobytes()


def read_exact(fd: int, n: int, deadline: float | None = None) -> bytes | None:
    """Read n bytes from fd; None on EOF; TimeoutError past the deadline."""
    import select

    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _limit_memory(memory_mb: int) -> None:
    with open("/proc/self/statm") as statm:
        used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = used + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    memory_mb = int(sys.argv[1])
    # keep the protocol on a private descriptor so a stray print cannot corrupt it
    out = os.dup(1)
    os.dup2(2, 1)
    import cairosvg.parser  # noqa: F401  (import before limiting memory)
    import cairosvg.surface  # noqa: F401
    import PIL.Image  # noqa: F401

    _limit_memory(memory_mb)
    _write_all(out, READY)
    stdin = sys.stdin.buffer.fileno()
    while True:
        header = read_exact(stdin, REQUEST.size)
        if header is None:
            return
        width, height, length, timeout_s = REQUEST.unpack(header)
        svg = read_exact(stdin, length)
        if svg is None:
            return
        # the parent kills us at the timeout; should it be gone, end ourselves a little later
        signal.alarm(math.ceil(timeout_s) + 2)
        status = OK
        try:
            payload = render_in_process(svg, width, height)
        except MemoryError:
            status, payload = OUT_OF_MEMORY, b"out of memory"
        except RecursionError:
            status, payload = REFUSED, b"the document nests too deeply to render"
        except Exception as exc:  # any renderer error is the document's fault: report it
            status, payload = REFUSED, f"{type(exc).__name__}: {exc}"[:500].encode()
        signal.alarm(0)
        _write_all(out, REPLY.pack(status, len(payload)) + payload)
        if status == OUT_OF_MEMORY:
            sys.exit(3)


if __name__ == "__main__":
    main()
