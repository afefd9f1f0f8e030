"""Image encoding for replies: PNG (default, fast settings), JPEG, or raw RGB bytes.

The hot path of every step. A PNG is one zlib stream (level 2) of the rows, each with
filter byte 0 (no filter), framed by its three chunks (`_png`): ~38 us of CPU for a
96x96 frame against ~55 us through OpenCV's libpng at its fastest settings (level 1, no
filter; other filters, levels and strategies there were slower or larger), and ~10%
smaller; Pillow took ~140 us. PNG is lossless, so the pixels a client decodes are the
same whichever encoder made them (`docs/performance.md`). JPEG goes through OpenCV when
it is installed (RGB -> BGR by `cv2.cvtColor`; a reversed-channel view cost its encoder
~30 us more), Pillow otherwise.

A frame is known by a 128-bit xxh3 digest of its pixels (~3 us for 96x96; blake2b took
~90 us, more than the encoding it saved): a session whose frame did not change (a move
into a wall) and frames seen recently by any session of the process re-use their
encoding.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections import OrderedDict

import numpy as np
import xxhash
from PIL import Image

from visenv import wire

try:
    import cv2
except ImportError:  # pragma: no cover - depends on the install
    cv2 = None

PNG_COMPRESS_LEVEL = 2
JPEG_QUALITY = 90

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data."""
    crc = zlib.crc32(data, zlib.crc32(kind))
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


_PNG_END = _chunk(b"IEND", b"")


def _png(array: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of a contiguous (H, W, 3) uint8 array: no row filter, one IDAT."""
    height, width = array.shape[:2]
    rows = np.zeros((height, width * 3 + 1), dtype=np.uint8)  # column 0: filter type 0
    rows[:, 1:] = array.reshape(height, width * 3)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    pixels = zlib.compress(rows.data, PNG_COMPRESS_LEVEL)
    return _PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", pixels) + _PNG_END


def _check(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.uint8)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an RGB image of shape (H, W, 3), got {array.shape}")
    return array


def encode_image(array: np.ndarray, encoding: str = "png") -> wire.Image:
    """Encode one RGB uint8 (H, W, 3) array."""
    array = _check(array)
    shape = (int(array.shape[0]), int(array.shape[1]), 3)
    if encoding == "raw":
        return wire.Image("raw", array.tobytes(), shape)
    if encoding == "png":
        return wire.Image(encoding, _png(array), shape)
    if encoding != "jpeg":
        raise ValueError(f"unknown image encoding {encoding!r}; use png, jpeg or raw")
    if cv2 is not None:
        bgr = cv2.cvtColor(array, cv2.COLOR_RGB2BGR)
        ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {shape} image as {encoding}")
        return wire.Image(encoding, buf.tobytes(), shape)
    buf = io.BytesIO()
    Image.fromarray(array, "RGB").save(buf, format="JPEG", quality=JPEG_QUALITY)
    return wire.Image(encoding, buf.getvalue(), shape)


def decode_image(image: wire.Image) -> np.ndarray:
    """The RGB array back from an encoded image (for tests)."""
    return image.to_array()


# encodings of recent frames, shared by the sessions of this process: states recur (a
# player walking back and forth, sessions of one level)
SHARED_FRAMES = 1024
_Key = tuple[str, tuple[int, ...], bytes]
_shared: OrderedDict[_Key, wire.Image] = OrderedDict()


def _key(array: np.ndarray, encoding: str) -> _Key:
    """What identifies an encoding of `array` (contiguous uint8): encoding, shape, digest."""
    return encoding, array.shape, xxhash.xxh3_128_digest(array.data)


def _encode_shared(array: np.ndarray, encoding: str, key: _Key) -> wire.Image:
    """`encode_image`, re-using the encoding of an identical recent frame (same `key`)."""
    encoded = _shared.get(key)
    if encoded is not None:
        _shared.move_to_end(key)
        return encoded
    encoded = encode_image(array, encoding)
    _shared[key] = encoded
    if len(_shared) > SHARED_FRAMES:
        _shared.popitem(last=False)
    return encoded


class ImageCache:
    """Re-uses the last encoding of a session's images while they are unchanged (a move
    into a wall leaves the frame as it was), by their digests."""

    def __init__(self) -> None:
        self._last: list[tuple[_Key, wire.Image]] = []

    def encode(self, images: list[np.ndarray], encoding: str) -> list[wire.Image]:
        if encoding == "raw":
            self._last.clear()
            return [encode_image(array, encoding) for array in images]
        out: list[wire.Image] = []
        for i, array in enumerate(images):
            array = _check(array)
            key = _key(array, encoding)
            if i < len(self._last) and self._last[i][0] == key:
                out.append(self._last[i][1])
                continue
            encoded = _encode_shared(array, encoding, key)
            if i < len(self._last):
                self._last[i] = (key, encoded)
            else:
                self._last.append((key, encoded))
            out.append(encoded)
        del self._last[len(images) :]
        return out
