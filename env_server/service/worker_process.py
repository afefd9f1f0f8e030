"""The worker process's entry point, `worker_main`: the worker's end of the pipe.

The API process (`pool.WorkerHandle`) starts a process on `worker_main`, which registers
the environments it was given, imports (`preload`) and pre-warms them, says `Ready`, then
reads envelopes (`pipe.py`) and answers each with `Worker.handle` until the pipe closes
or a `Stop` comes.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection

from env_server.core import registry

from .messages import Ready, Stop, Warmed
from .models import ServiceError
from .pipe import envelope, opened
from .worker import LOG_FORMAT, Worker

worker_log = logging.getLogger("visenv.worker")


def worker_main(
    conn: Connection,
    index: int,
    env_paths: dict[str, str] | None = None,
    prewarm: Sequence[str] = (),
    preload: Sequence[str] = (),
) -> None:
    """Entry point of a worker process, the worker's end of the pipe: answer messages
    (`Worker.handle`) until the pipe closes."""
    for name, path in (env_paths or {}).items():
        registry.BUILTIN.setdefault(name, path)
    # Ctrl-C and SIGTERM to the process group reach the API process, which stops us in order
    # (and if it dies, the pipe closes and we exit)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)  # stderr, as the server's
    worker = Worker()
    worker.preload(preload)
    # what exists now (modules) lives as long as the process: out of every later
    # collection (full ones over it took 100-300 ms under load: step tails)
    gc.freeze()
    # an environment bound to its thread (OpenGL) is warmed here, on the main thread,
    # before Ready (seconds, at start only); the others behind Ready, in a thread
    first = worker.prewarm([name for name in prewarm if worker.thread_bound(name)])
    prewarm = [name for name in prewarm if name not in first]
    if first and not prewarm:
        gc.freeze()  # the pre-warmed simulators, too
    conn.send_bytes(envelope(0, Ready(os.getpid(), first)))
    sending = threading.Lock()  # the pre-warm thread's notices and the answers share the pipe

    def send(data: bytes) -> None:
        with sending:
            conn.send_bytes(data)

    def warmed(name: str, took: float | str) -> None:
        if name == prewarm[-1] and not worker.sessions:
            gc.freeze()  # the pre-warmed simulators, too
        try:
            send(envelope(0, Warmed(name, took)))
        except (EOFError, OSError):
            pass  # the server is gone: the main thread exits too

    if prewarm:  # behind Ready, in a thread: messages are answered meanwhile
        worker.prewarm_behind(list(prewarm), warmed)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            break
        request_id, batch = opened(data)
        if isinstance(batch, Stop):
            break
        try:
            result = worker.handle(batch)
        except Exception as exc:  # a malformed message: a bug in the service
            result = ServiceError.internal(exc, f"worker {index} message", worker_log)
        send(envelope(request_id, result))
    for session in worker.sessions.values():
        session.env.close()
