"""The packaged photos for PCA pictures, a folder of photos, and image conversion for transfer."""

import numpy as np
import pytest
from PIL import Image

from laplax.data import photos, arrays


def test_builtin_photos_load_offline_as_square_rgb():
  names, images = photos.load_photos(32)
  assert names == list(photos.BUILTIN_PHOTOS) and len(names) == 9
  assert images.shape == (9, 32, 32, 3) and images.dtype == np.uint8
  # Real photos, all different: no blank or duplicated picture.
  assert all(im.std() > 10 for im in images)
  flat = images.reshape(9, -1).astype(np.int64)
  assert len({tuple(r) for r in flat}) == 9
  chosen, subset = photos.load_photos(16, names=["chelsea", "china"])
  assert chosen == ["chelsea", "china"] and subset.shape == (2, 16, 16, 3)


def test_square_resize_crops_the_centre():
  wide = np.zeros((10, 30, 3), np.uint8)
  wide[:, 10:20] = 200  # the centre square is white, the sides black
  out = photos.square_resize(wide, 5)
  assert out.shape == (5, 5, 3) and out.min() >= 190
  grey = photos.square_resize(np.full((8, 8), 7, np.uint8), 4)
  assert grey.shape == (4, 4, 3) and (grey == 7).all()


def test_folder_of_photos_and_errors(tmp_path):
  Image.fromarray(np.full((12, 20, 3), 50, np.uint8)).save(tmp_path / "b.png")
  Image.fromarray(np.full((30, 30), 90, np.uint8)).save(tmp_path / "a.jpg")
  (tmp_path / "notes.txt").write_text("not a photo")
  names, images = photos.load_photos(8, tmp_path)
  assert names == ["a", "b"] and images.shape == (2, 8, 8, 3)
  assert abs(int(images[0].mean()) - 90) <= 1 and abs(int(images[1].mean()) - 50) <= 1
  with pytest.raises(photos.PhotoError, match="unknown photos \\['lena'\\]"):
    photos.load_photos(8, names=["lena"])
  with pytest.raises(photos.PhotoError, match="no .jpg / .png photos"):
    photos.load_photos(8, tmp_path / "missing")
  (tmp_path / "broken.jpg").write_bytes(b"not a jpeg")
  with pytest.raises(photos.PhotoError, match="cannot read the photo .*broken.jpg"):
    photos.load_photos(8, tmp_path)


def test_convert_images_channels_and_size():
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
  grey = arrays.convert_images(rgb, size=8, channels=1)
  luma = rgb.astype(np.float64) @ [0.299, 0.587, 0.114]
  assert grey.shape == (3, 8, 8, 1)
  assert np.abs(grey[..., 0].astype(np.float64) - luma).max() <= 0.5 + 1e-3
  up = arrays.convert_images(grey, size=16, channels=3)
  assert up.shape == (3, 16, 16, 3) and (up[..., 0] == up[..., 1]).all()
  # A constant image stays constant through the resize.
  flat = arrays.convert_images(np.full((1, 7, 7, 1), 33, np.uint8), size=4, channels=1)
  assert (flat == 33).all()
  with pytest.raises(ValueError, match="channels=2"):
    arrays.convert_images(rgb, size=8, channels=2)
