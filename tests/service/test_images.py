"""Image codecs of replies and the unchanged-frame cache."""

from __future__ import annotations

import numpy as np
import pytest

from env_server.service.images import ImageCache, decode_image, encode_image


@pytest.fixture
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (24, 40, 3), dtype=np.uint8)


@pytest.mark.parametrize("encoding", ["png", "raw"])
def test_lossless_round_trip(image, encoding):
    encoded = encode_image(image, encoding)
    assert encoded.encoding == encoding and encoded.shape == (24, 40, 3)
    np.testing.assert_array_equal(decode_image(encoded), image)


def test_png_and_jpeg_are_real_files(image):
    assert encode_image(image, "png").data[:8] == b"\x89PNG\r\n\x1a\n"
    jpeg = encode_image(np.full((16, 16, 3), (200, 30, 30), np.uint8), "jpeg")
    assert jpeg.data[:2] == b"\xff\xd8"
    assert np.abs(decode_image(jpeg).astype(int) - (200, 30, 30)).max() < 8  # channel order kept


def test_bad_input_is_refused(image):
    with pytest.raises(ValueError, match="unknown image encoding"):
        encode_image(image, "gif")
    with pytest.raises(ValueError, match=r"\(H, W, 3\)"):
        encode_image(image[:, :, 0])


def test_cache_reuses_unchanged_frames_and_sees_in_place_changes(image):
    cache = ImageCache()
    (first,) = cache.encode([image], "png")
    assert cache.encode([image.copy()], "png")[0] is first  # equal pixels: the same bytes
    image[0, 0] = (1, 2, 3)  # mutated in place: must be encoded again
    (second,) = cache.encode([image], "png")
    assert second is not first
    np.testing.assert_array_equal(decode_image(second), image)
    assert cache.encode([image], "raw")[0].encoding == "raw"  # another encoding: not reused


@pytest.mark.parametrize("shape", [(1, 1, 3), (96, 96, 3), (7, 300, 3), (513, 5, 3)])
def test_png_decodes_to_the_same_pixels_in_pillow_and_opencv(shape):
    """The PNG this module writes (OpenCV's encoder, no row filter) reads back the same in
    another decoder: Pillow and OpenCV both give the array."""
    import io

    import cv2
    from PIL import Image

    array = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    array[: shape[0] // 2] = 7  # a flat half, as rendered tiles are, besides the noise
    data = encode_image(array, "png").data
    with Image.open(io.BytesIO(data)) as im:
        assert im.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(im), array)
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(bgr[:, :, ::-1], array)
