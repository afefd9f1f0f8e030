"""Image encoding for replies: PNG (default, fast settings), JPEG, or raw RGB bytes.

The hot path of every step. OpenCV's encoder is used when it is installed (a 96x96 PNG
in ~35-55 us with no row filter and zlib level 1, about 5x faster than Pillow and no
larger for rendered tiles: other filters, levels and zlib strategies were all slower or
larger, `docs/performance.md`); Pillow otherwise. Both are lossless for PNG, so the
pixels a client decodes are the same either way. The RGB -> BGR swap OpenCV wants is
done by `cv2.cvtColor` (a reversed-channel view costs the encoder ~30 us more). A PNG
framed by hand over zlib was measured ~30% cheaper per frame (about 3% of a step) and is
not used: the codec stays a well-kept library's.

A frame is known by a 128-bit xxh3 digest of its pixels (~3 us for 96x96; blake2b took
~90 us, more than the encoding it saved): a session whose frame did not change (a move
into a wall) and frames seen recently by any session of the process re-use their
encoding.
"""

from __future__ import annotations

import io
from collections import OrderedDict

import numpy as np
import xxhash
from PIL import Image

from visenv import wire

try:
    import cv2
except ImportError:  # pragma: no cover - depends on the install
    cv2 = None

PNG_COMPRESS_LEVEL = 1
JPEG_QUALITY = 90

if cv2 is not None:
    _CV2_PARAMS = {
        "png": [
            cv2.IMWRITE_PNG_COMPRESSION,
            PNG_COMPRESS_LEVEL,
            cv2.IMWRITE_PNG_FILTER,
            cv2.IMWRITE_PNG_FILTER_NONE,
        ],  # fmt: skip
        "jpeg": [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY],
    }
    _CV2_EXT = {"png": ".png", "jpeg": ".jpg"}


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
    if encoding not in ("png", "jpeg"):
        raise ValueError(f"unknown image encoding {encoding!r}; use png, jpeg or raw")
    if cv2 is not None:
        bgr = cv2.cvtColor(array, cv2.COLOR_RGB2BGR)
        ok, buf = cv2.imencode(_CV2_EXT[encoding], bgr, _CV2_PARAMS[encoding])
        if not ok:
            raise ValueError(f"OpenCV could not encode a {shape} image as {encoding}")
        return wire.Image(encoding, buf.tobytes(), shape)
    buf = io.BytesIO()
    image = Image.fromarray(array, "RGB")
    if encoding == "png":
        image.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        image.save(buf, format="JPEG", quality=JPEG_QUALITY)
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
