"""The pipe between the API process and a worker process, as both ends read and write it.

Each message is the envelope ``(request_id, body)`` pickled (`envelope`, `opened`) in
multiprocessing.Connection's framing (a 4-byte big-endian length, then the bytes:
`framed`, `read_framed`), so the worker (`worker_process.worker_main`) uses a plain
Connection while the API process's end (`pool.WorkerHandle`) stays non-blocking; what goes
in the envelopes is the worker protocol of `messages.py`.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any


def envelope(request_id: int, body: Any) -> bytes:
    """The pickled envelope of a message (either way over the pipe)."""
    return pickle.dumps((request_id, body), protocol=pickle.HIGHEST_PROTOCOL)


def opened(data: bytes) -> tuple[int, Any]:
    """(request_id, body) of an envelope."""
    return pickle.loads(data)


def framed(data: bytes) -> bytes:
    """`data` as multiprocessing.Connection frames it (what its `recv_bytes` reads)."""
    return struct.pack("!i", len(data)) + data


async def read_framed(reader: asyncio.StreamReader) -> bytes:
    """The next frame's bytes, as multiprocessing.Connection's `send_bytes` framed them."""
    (size,) = struct.unpack("!i", await reader.readexactly(4))
    if size == -1:
        (size,) = struct.unpack("!Q", await reader.readexactly(8))
    return await reader.readexactly(size)
