"""Safe rasterising of untrusted SVG (the agent's answers and the target icons) with cairosvg.

Two layers:

1. `check_svg` parses the document with defusedxml before anything renders it: DTDs,
   entities (so entity-expansion bombs) and external entities are refused, and so are
   oversized documents, deep nesting, too many elements and every reference that is
   not a same-document fragment (`href="#id"`, `url(#id)`): no `file:`, `http:` or
   `data:` URL, no CSS `@import`.
2. Rendering runs in a persistent child process (`render_worker.py`) under an address-space
   limit (RLIMIT_AS) and a wall-clock timeout. When it runs out of time the parent kills
   it; when it dies (out of memory, a crash) the next render starts a fresh one. The
   server worker that hosts the environment is never at risk. Inside the child cairosvg
   gets a `url_fetcher` that refuses every fetch, as a second line of defence.

The output size is fixed by the caller (256x256 by default), so huge `width`/`height`
attributes are scaled into it rather than allocated.
"""

from __future__ import annotations

import atexit
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree.ElementTree import ParseError

import numpy as np
from defusedxml import DefusedXmlException
from defusedxml import ElementTree as SafeElementTree

from . import render_worker
from .render_worker import OK, OUT_OF_MEMORY, READY, REPLY, REQUEST, read_exact

_URL_RE = re.compile(r"url\(\s*(['\"]?)(.*?)\1\s*\)", re.IGNORECASE | re.DOTALL)
_WORKER = Path(render_worker.__file__).resolve()


class InvalidSvg(Exception):
    """The agent's SVG was refused or could not be rendered; `str(exc)` says why."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 100_000
    max_depth: int = 64
    max_elements: int = 10_000
    timeout_s: float = 5.0
    memory_mb: int = 512


# ---------------------------------------------------------------------------- checks
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _check_urls(text: str, where: str) -> None:
    for match in _URL_RE.finditer(text):
        if not match.group(2).strip().startswith("#"):
            raise InvalidSvg(f"external reference {match.group(2)[:80]!r} ({where}) is not allowed")


def check_svg(svg: str, limits: Limits) -> bytes:
    """Validate an untrusted SVG document; returns it as UTF-8 bytes or raises InvalidSvg."""
    if not isinstance(svg, str) or not svg.strip():
        raise InvalidSvg("the answer holds no SVG document")
    data = svg.encode("utf-8")
    if len(data) > limits.max_bytes:
        raise InvalidSvg(f"SVG is {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        root = SafeElementTree.fromstring(data, forbid_dtd=True)
    except DefusedXmlException as exc:
        raise InvalidSvg(
            f"SVG refused: {type(exc).__name__} (DTDs and entities are not allowed)"
        ) from exc
    except ParseError as exc:
        raise InvalidSvg(f"SVG is not well-formed XML: {exc}") from exc
    if _local(root.tag) != "svg":
        raise InvalidSvg(f"the root element is {_local(root.tag)!r}, not 'svg'")

    count = 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        count += 1
        if count > limits.max_elements:
            raise InvalidSvg(f"SVG has more than {limits.max_elements} elements")
        if depth > limits.max_depth:
            raise InvalidSvg(f"SVG nests deeper than {limits.max_depth} levels")
        tag = _local(element.tag)
        for name, value in element.attrib.items():
            if _local(name) == "href" and not value.strip().startswith("#"):
                raise InvalidSvg(
                    f"external reference {value[:80]!r} (element {tag!r}) is not allowed"
                )
            if "url(" in value.lower():
                _check_urls(value, f"attribute {_local(name)!r} of element {tag!r}")
        if tag == "style" and element.text:
            if "@import" in element.text.lower():
                raise InvalidSvg("CSS @import is not allowed")
            _check_urls(element.text, "element 'style'")
        stack.extend((child, depth + 1) for child in element)
    return data


# ---------------------------------------------------------------------------- child process
class RenderProcess:
    """A persistent render child, replaced whenever it dies or overruns its time."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.starts = 0  # how many children were started (for tests and benchmarks)

    def _start(self) -> subprocess.Popen[bytes]:
        # -P: don't put the script's folder on sys.path (it is run as a plain script)
        proc = subprocess.Popen(
            [sys.executable, "-P", str(_WORKER), str(self.memory_mb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.starts += 1
        try:
            ready = read_exact(proc.stdout.fileno(), len(READY), time.monotonic() + 60)  # type: ignore[union-attr]
        except TimeoutError:
            ready = None
        if ready != READY:
            self._kill(proc)
            raise InvalidSvg("the SVG render process failed to start")
        return proc

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()

    def _discard(self) -> None:
        if self._proc is not None:
            self._kill(self._proc)
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._discard()

    def render(self, svg: bytes, width: int, height: int, timeout_s: float) -> np.ndarray:
        """RGB uint8 array (height, width, 3); InvalidSvg with the reason when it fails."""
        with self._lock:
            for attempt in range(2):
                if self._proc is None or self._proc.poll() is not None:
                    self._discard()
                    self._proc = self._start()
                proc = self._proc
                try:
                    proc.stdin.write(REQUEST.pack(width, height, len(svg), timeout_s) + svg)  # type: ignore[union-attr]
                    proc.stdin.flush()  # type: ignore[union-attr]
                except BrokenPipeError:  # died while idle: start a new one and retry once
                    self._discard()
                    if attempt:
                        raise InvalidSvg("the SVG render process died") from None
                    continue
                return self._reply(proc, width, height, timeout_s)
        raise AssertionError("unreachable")

    def _reply(
        self, proc: subprocess.Popen[bytes], width: int, height: int, timeout_s: float
    ) -> np.ndarray:
        fd = proc.stdout.fileno()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        try:
            header = read_exact(fd, REPLY.size, deadline)
            status, length = REPLY.unpack(header) if header else (None, 0)
            payload = read_exact(fd, length, deadline) if header else None
        except TimeoutError:
            self._discard()
            raise InvalidSvg(f"rendering took longer than {timeout_s:g} s") from None
        if header is None or payload is None:
            self._discard()
            raise InvalidSvg(
                f"the SVG render process died (exit code {proc.poll()}); the document "
                f"probably needs more than the {self.memory_mb} MiB render memory limit"
            )
        if status == OK:
            return np.frombuffer(payload, dtype=np.uint8).reshape(height, width, 3).copy()
        if status == OUT_OF_MEMORY:
            self._discard()
            raise InvalidSvg(
                f"rendering needs more than the {self.memory_mb} MiB render memory limit"
            )
        raise InvalidSvg(f"SVG could not be rendered: {payload.decode('utf-8', 'replace')}")


# one render child per (process, memory limit), shared by every environment in the process
_RENDERERS: dict[int, RenderProcess] = {}
_RENDERERS_LOCK = threading.Lock()


def _forget_after_fork() -> None:  # a forked worker must not share its parent's child
    global _RENDERERS_LOCK
    for shared in _RENDERERS.values():  # drop our copies of its pipes; it stays the parent's
        if shared._proc is not None:
            for stream in (shared._proc.stdin, shared._proc.stdout):
                if stream is not None:
                    stream.close()
    _RENDERERS.clear()
    _RENDERERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def renderer(memory_mb: int) -> RenderProcess:
    with _RENDERERS_LOCK:
        if memory_mb not in _RENDERERS:
            _RENDERERS[memory_mb] = RenderProcess(memory_mb)
        return _RENDERERS[memory_mb]


def shutdown() -> None:
    """Stop every render child of this process (they also exit when the parent does)."""
    with _RENDERERS_LOCK:
        for proc in _RENDERERS.values():
            proc.close()
        _RENDERERS.clear()


atexit.register(shutdown)


def render_svg(svg: str, limits: Limits, width: int = 256, height: int = 256) -> np.ndarray:
    """Check and render untrusted SVG text; InvalidSvg with the reason when refused."""
    data = check_svg(svg, limits)
    return renderer(limits.memory_mb).render(data, width, height, limits.timeout_s)
