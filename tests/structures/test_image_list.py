import pytest
import torch

from detcore.structures.image_list import ImageList


def make_images(sizes, channels=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(channels, h, w, generator=g) for h, w in sizes]


def test_from_tensors_pads_to_multiple_and_keeps_content():
    images = make_images([(50, 70), (64, 33), (10, 96)])
    batch = ImageList.from_tensors(images, size_divisibility=32, pad_value=-1.5)
    assert batch.tensor.shape == (3, 3, 64, 96)
    assert batch.image_sizes == [(50, 70), (64, 33), (10, 96)]
    assert len(batch) == 3
    for i, img in enumerate(images):
        h, w = img.shape[1:]
        assert torch.equal(batch[i], img)
        # Everything outside the image is padding.
        region = torch.zeros(64, 96, dtype=torch.bool)
        region[:h, :w] = True
        assert (batch.tensor[i][:, ~region] == -1.5).all()


@pytest.mark.parametrize("div", [0, 1])
def test_no_divisibility_pads_to_max(div):
    batch = ImageList.from_tensors(make_images([(5, 7), (6, 3)]), size_divisibility=div)
    assert batch.tensor.shape == (2, 3, 6, 7)
    assert (batch.tensor[1, :, :, 3:] == 0).all()


def test_sizes_already_multiple_are_not_grown():
    batch = ImageList.from_tensors(make_images([(64, 32)]), size_divisibility=32)
    assert batch.tensor.shape == (1, 3, 64, 32)


def test_dtype_device_kept_and_to():
    images = [torch.randint(0, 255, (1, 4, 5), dtype=torch.uint8)]
    batch = ImageList.from_tensors(images, size_divisibility=4)
    assert batch.tensor.dtype == torch.uint8 and batch.device == torch.device("cpu")
    moved = batch.to(torch.float32)
    assert isinstance(moved, ImageList) and moved.tensor.dtype == torch.float32
    assert moved.image_sizes == batch.image_sizes
    assert "image_sizes" in repr(batch)


def test_from_tensors_errors():
    with pytest.raises(ValueError, match="non-empty"):
        ImageList.from_tensors([])
    with pytest.raises(ValueError, match=r"tensors\[1\].*\[C, H, W\]"):
        ImageList.from_tensors([torch.zeros(3, 4, 4), torch.zeros(4, 4)])
    with pytest.raises(ValueError, match=r"tensors\[1\] is 1 channels"):
        ImageList.from_tensors([torch.zeros(3, 4, 4), torch.zeros(1, 4, 4)])
    with pytest.raises(ValueError, match="float64"):
        ImageList.from_tensors([torch.zeros(3, 4, 4), torch.zeros(3, 4, 4, dtype=torch.float64)])


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        ImageList(torch.zeros(3, 4, 4), [(4, 4)])
    with pytest.raises(ValueError, match="2 image_sizes for a batch of 1"):
        ImageList(torch.zeros(1, 3, 4, 4), [(4, 4), (4, 4)])
    with pytest.raises(ValueError, match="does not fit"):
        ImageList(torch.zeros(1, 3, 4, 4), [(5, 4)])
    with pytest.raises(TypeError, match="int"):
        ImageList(torch.zeros(1, 3, 4, 4), [(4, 4)])[0:1]
