"""Device augmentation: torchvision's parameter distributions, exact geometry and colour operations."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import repo_params
from scipy.stats import ks_2samp
from torchvision import transforms as v1
from torchvision.transforms.v2 import functional as TF

from vce.core.params import from_dict
from vce.data.dataset import AugmentParams, train_transform
from vce.train.augment import AugmentDraw, _color, _erase, _geometry, augment_batch, draw

AUG = SimpleNamespace(crop_scale_min=0.6, hflip=0.5, vflip=0.5, rotation=15.0, brightness=0.2, contrast=0.2,
                      saturation=0.1, hue=0.02, erasing=0.25)
N = 3000


def identity(batch: int, size: int, **override) -> AugmentDraw:
    params = dict(crop=np.tile([0, 0, size, size], (batch, 1)), hflip=np.zeros(batch, bool),
                  vflip=np.zeros(batch, bool), angle=np.zeros(batch), jitter=np.tile([1.0, 1.0, 1.0, 0.0], (batch, 1)),
                  order=np.tile(np.arange(4), (batch, 1)), erase=np.zeros((batch, 4), int))
    params.update(override)
    return AugmentDraw(**params)


@pytest.fixture(scope="module")
def ours():
    return draw(np.arange(N), 256, 224, AUG)


@pytest.fixture(scope="module")
def torchvision_draws():
    torch.manual_seed(0)
    image = torch.zeros(3, 256, 256)
    crops = np.array([v1.RandomResizedCrop.get_params(image, (0.6, 1.0), (3 / 4, 4 / 3)) for _ in range(N)])
    angles = np.array([v1.RandomRotation.get_params([-15.0, 15.0]) for _ in range(N)])
    jitter = [v1.ColorJitter.get_params((0.8, 1.2), (0.8, 1.2), (0.9, 1.1), (-0.02, 0.02)) for _ in range(N)]
    erased = [v1.RandomErasing.get_params(torch.zeros(3, 224, 224), (0.02, 0.33), (0.3, 3.3), [0])
              for _ in range(N)]
    return SimpleNamespace(crops=crops, angles=angles,
                           factors=np.array([[b, c, s, h] for _, b, c, s, h in jitter]),
                           first_op=np.array([int(order[0]) for order, *_ in jitter]),
                           erase_hw=np.array([(h, w) for _, _, h, w, _ in erased]))


def test_crop_distribution_matches_torchvision(ours, torchvision_draws):
    theirs = torchvision_draws.crops
    for k, name in enumerate(("top", "left", "height", "width")):
        assert ks_2samp(ours.crop[:, k], theirs[:, k]).pvalue > 1e-3, name
    area = lambda c: c[:, 2] * c[:, 3] / 256**2
    assert ks_2samp(area(ours.crop), area(theirs)).pvalue > 1e-3
    assert (ours.crop[:, 0] + ours.crop[:, 2] <= 256).all() and (ours.crop[:, 1] + ours.crop[:, 3] <= 256).all()


def test_flip_rotation_jitter_erasing_distributions_match_torchvision(ours, torchvision_draws):
    assert abs(ours.hflip.mean() - 0.5) < 0.04 and abs(ours.vflip.mean() - 0.5) < 0.04
    assert ks_2samp(ours.angle, torchvision_draws.angles).pvalue > 1e-3
    for k, name in enumerate(("brightness", "contrast", "saturation", "hue")):
        assert ks_2samp(ours.jitter[:, k], torchvision_draws.factors[:, k]).pvalue > 1e-3, name
    counts = np.bincount(ours.order[:, 0], minlength=4) / N  # each operation first a quarter of the time
    assert np.abs(counts - 0.25).max() < 0.04
    erased = ours.erase[:, 2] > 0
    assert abs(erased.mean() - AUG.erasing) < 0.03
    for k, name in enumerate(("height", "width")):
        assert ks_2samp(ours.erase[erased, 2 + k], torchvision_draws.erase_hw[:, k]).pvalue > 1e-3, name


def test_same_seeds_same_batch_other_seeds_other_batch():
    images = torch.randint(0, 256, (4, 3, 40, 40), dtype=torch.uint8)
    first = augment_batch(images, [1, 2, 3, 4], 32, AUG)
    assert first.dtype == torch.uint8 and first.shape == (4, 3, 32, 32)
    assert torch.equal(first, augment_batch(images, [1, 2, 3, 4], 32, AUG))
    assert not torch.equal(first, augment_batch(images, [5, 6, 7, 8], 32, AUG))


def test_identity_parameters_return_the_frame_and_flips_are_exact():
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    same = _geometry(images, identity(2, 16), 16)
    assert torch.allclose(same * 255, images.float(), atol=1e-3)
    flipped = _geometry(images, identity(2, 16, hflip=np.array([True, False]), vflip=np.array([False, True])), 16)
    assert torch.allclose(flipped[0] * 255, torch.flip(images[0], dims=[2]).float(), atol=1e-3)
    assert torch.allclose(flipped[1] * 255, torch.flip(images[1], dims=[1]).float(), atol=1e-3)


def test_crop_takes_the_box_and_rotation_fills_corners_with_zero():
    images = torch.randint(0, 256, (1, 3, 16, 16), dtype=torch.uint8)
    cropped = _geometry(images, identity(1, 16, crop=np.array([[4, 2, 8, 8]])), 8)  # top 4, left 2, 8×8
    assert torch.allclose(cropped[0] * 255, images[0, :, 4:12, 2:10].float(), atol=1e-3)
    quarter = _geometry(images, identity(1, 16, angle=np.array([90.0])), 16)
    assert torch.allclose(quarter[0] * 255, torch.rot90(images[0], k=1, dims=(1, 2)).float(), atol=1e-2)
    tilted = _geometry(torch.full((1, 3, 16, 16), 255, dtype=torch.uint8), identity(1, 16, angle=np.array([45.0])), 16)
    assert tilted[0, :, 0, 0].max() == 0 and tilted[0, :, 8, 8].min() > 0.99


@pytest.mark.parametrize("k, fn", [(0, TF.adjust_brightness), (1, TF.adjust_contrast), (2, TF.adjust_saturation),
                                   (3, TF.adjust_hue)])
def test_each_colour_operation_equals_torchvision(k, fn):
    torch.manual_seed(k)
    images = torch.rand(3, 3, 8, 8)
    values = [0.7, 1.0, 1.3] if k < 3 else [-0.02, 0.0, 0.3]
    jitter = np.tile([1.0, 1.0, 1.0, 0.0], (3, 1))
    jitter[:, k] = values
    out = _color(images.clone(), identity(3, 8, jitter=jitter))
    for i, value in enumerate(values):
        assert torch.allclose(out[i], fn(images[i], value), atol=1e-4), (k, value)


def test_jitter_order_is_per_sample():
    images = torch.rand(2, 3, 8, 8)
    jitter = np.tile([1.4, 1.0, 0.5, 0.0], (2, 1))  # brightness then saturation differs from the reverse
    order = np.array([[0, 2, 1, 3], [2, 0, 1, 3]])
    out = _color(images.clone(), identity(2, 8, jitter=jitter, order=order))
    assert torch.allclose(out[0], TF.adjust_saturation(TF.adjust_brightness(images[0], 1.4), 0.5), atol=1e-5)
    assert torch.allclose(out[1], TF.adjust_brightness(TF.adjust_saturation(images[1], 0.5), 1.4), atol=1e-5)


def test_erasing_fills_the_box_only():
    images = torch.ones(1, 3, 10, 10)
    out = _erase(images, identity(1, 10, erase=np.array([[2, 3, 4, 5]])), [51, 102, 153])
    assert torch.allclose(out[0, :, 2:6, 3:8], torch.tensor([0.2, 0.4, 0.6]).view(3, 1, 1).expand(3, 4, 5))
    assert torch.allclose(out.sum(), torch.tensor(3 * (100 - 20) + 20 * (0.2 + 0.4 + 0.6)))


def test_the_device_path_rounds_as_the_loader_path_does():
    """Parameters that change nothing: the loader path (torchvision v2 on uint8) returns each
    frame as it was, and so must the device path, whose float chain lands a hair off the
    integers (255 * x / 255, bilinear weights, the HSV round trip): rounded, not truncated."""
    nothing = from_dict(AugmentParams, {**repo_params()["train"]["augment"], "crop_scale_min": 1.0, "hflip": 0.0,
                                        "vflip": 0.0, "rotation": 0.0, "brightness": 0.0, "contrast": 0.0,
                                        "saturation": 0.0, "hue": 0.0, "erasing": 0.0}, "train.augment")
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8)
    loader = torch.stack([train_transform(24, nothing, mean=(0.5, 0.5, 0.5))(image) for image in images])
    assert torch.equal(loader, images)
    off = (augment_batch(images, [1, 2, 3, 4], 24, nothing).int() - loader.int()).abs()
    assert off.max() == 0, f"{int((off > 0).sum())} of {off.numel()} values off by up to {int(off.max())}"
