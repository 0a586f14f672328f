"""Training rules that a whole-pipeline test cannot see: mixup mixes the targets too, and
validation and the saved model use the EMA weights, not the raw ones."""

import copy

import numpy as np
import pytest
import torch
from conftest import section_params
from torch.utils.data import Dataset

from vce.core.labels import NUM_LABELS
from vce.model.frame_model import ModelParams, create_model
from vce.train.losses import LossParams, VCELoss
from vce.train.trainer import Trainer, TrainParams, evaluate, mixup


class Frames(Dataset):
    """Random uint8 frames with random labels; keys are rows or (row, seed) like FrameDataset's."""

    def __init__(self, count: int, seed: int, size: int = 64):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=generator)
        self.targets = (torch.rand(count, NUM_LABELS, generator=generator) < 0.3).float()

    def __len__(self):
        return len(self.images)

    def __getitem__(self, key):
        row = key[0] if isinstance(key, tuple) else key
        return self.images[row], self.targets[row], True, row


def make_trainer(tmp_path, **train):
    torch.manual_seed(0)
    model = create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 64))
    train_set, val_set = Frames(64, 1), Frames(32, 2)
    loss_fn = VCELoss(section_params(LossParams, "loss"), train_set.targets.mean(dim=0))
    params = section_params(TrainParams, "train", **{"epochs": 1, "batch_size": 16, "samples_per_epoch": 64,
                                                      "num_workers": 0, "device": "cpu", "checkpoint_every": 0,
                                                      **train})
    return Trainer(model, loss_fn, params, 42, train_set, np.ones(len(train_set)), val_set, tmp_path / "state", "t")


def test_mixup_mixes_targets_with_the_images_lambda_and_partner():
    images = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1).expand(6, 3, 2, 2).contiguous()
    targets = torch.nn.functional.one_hot(torch.arange(6), NUM_LABELS).float()  # frame i has label i only
    mixed_images, mixed_targets = mixup(images, targets, alpha=0.3, seed=5)
    value = mixed_images[:, 0, 0, 0]  # = λ·i + (1 − λ)·perm(i)
    lam = None
    for i in range(6):
        row = mixed_targets[i, :6]
        assert row.sum().item() == pytest.approx(1.0)  # mass of two one-hot rows
        weights = {int(j): row[j].item() for j in torch.nonzero(row).flatten()}
        assert sum(j * w for j, w in weights.items()) == pytest.approx(value[i].item(), abs=1e-5)
        if len(weights) == 2:
            lam = lam or weights[i]
            assert weights[i] == pytest.approx(lam, abs=1e-6)
    assert lam is not None and 0 < lam < 1  # targets are mixed, not left hard
    assert not torch.equal(mixed_targets, targets)


def test_train_step_feeds_the_loss_mixed_targets(tmp_path, one_thread):
    trainer = make_trainer(tmp_path, mixup_alpha=0.3)
    seen = []
    loss_fn = trainer.loss_fn

    def recording(outputs, targets):
        seen.append(targets.detach().clone())
        return loss_fn(outputs, targets)

    trainer.loss_fn = recording
    frames = Frames(16, 3)
    images, targets = frames.images, frames.targets
    trainer.train_step(images, targets, seed=5)
    _, expected = mixup(images.float(), targets, 0.3, 5)
    torch.testing.assert_close(seen[0], expected)
    assert ((seen[0] > 0) & (seen[0] < 1)).any()  # soft targets reached the loss


def test_validation_and_the_saved_model_use_the_ema_weights(tmp_path, one_thread):
    trainer = make_trainer(tmp_path, ema_decay=0.999, ema_warmup=True)
    saved = []
    result = trainer.fit(lambda model, record: saved.append((copy.deepcopy(model.state_dict()), record)))
    ema, raw = trainer.ema.module, trainer.model
    differs = [k for k, v in raw.state_dict().items() if v.is_floating_point() and not torch.equal(v, ema.state_dict()[k])]
    assert differs  # 4 steps apart: EMA and raw weights are not the same model
    state, record = saved[-1]
    for key, tensor in ema.state_dict().items():  # the saved model is the EMA, bit for bit
        assert torch.equal(state[key], tensor), key
    on_ema = evaluate(ema, trainer.loss_fn, trainer.val_loader, trainer.device, False, trainer.ddp)
    on_raw = evaluate(raw, trainer.loss_fn, trainer.val_loader, trainer.device, False, trainer.ddp)
    assert record["val_loss"] == pytest.approx(on_ema["loss"], rel=1e-6)
    assert abs(on_raw["loss"] - on_ema["loss"]) > 1e-4  # so the check above tells them apart
    assert result["best"]["val_loss"] == record["val_loss"]


class KeyedFrames(Frames):
    """Frames that record every (row, seed) key the sampler hands them, in order."""

    def __init__(self, count: int, seed: int):
        super().__init__(count, seed)
        self.keys = []

    def __getitem__(self, key):
        self.keys.append(key)
        return super().__getitem__(key)


def test_device_augmentation_uses_each_frames_sampler_seed(tmp_path, one_thread):
    trainer = make_trainer(tmp_path, augment_on="device", mixup_alpha=0.0)
    trainer.train_loader.dataset.__class__ = KeyedFrames
    trainer.train_loader.dataset.keys = []
    step = trainer.train_step
    used = []
    trainer.train_step = lambda images, targets, seed, sample_seeds=None: (
        used.append((images.shape, list(sample_seeds))), step(images, targets, seed, sample_seeds))[1]
    trainer.fit(lambda model, record: None)
    handed = [seed for _, seed in trainer.train_loader.dataset.keys]
    assert [seed for _, seeds in used for seed in seeds] == handed  # same seeds, same order, every frame
    assert all(shape == (16, 3, 64, 64) for shape, _ in used)


def test_device_augmented_training_resumes_bit_exact(tmp_path, one_thread):
    clean = make_trainer(tmp_path / "clean", augment_on="device", checkpoint_every=2)
    clean.fit(lambda model, record: None)

    killed = make_trainer(tmp_path / "killed", augment_on="device", checkpoint_every=2)
    step, calls = killed.train_step, []

    def dies_at_the_third_step(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # after the step-2 checkpoint
        return step(*args)

    killed.train_step = dies_at_the_third_step
    with pytest.raises(KeyboardInterrupt):
        killed.fit(lambda model, record: None)
    resumed = make_trainer(tmp_path / "killed", augment_on="device", checkpoint_every=2)
    assert resumed.try_resume() and resumed.step == 2
    resumed.fit(lambda model, record: None)
    for key, tensor in clean.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], tensor), key


def test_device_augmentation_changes_what_the_step_sees(tmp_path, one_thread):
    """The device path really augments: the same step without sample seeds gives another loss."""
    on = make_trainer(tmp_path / "on", augment_on="device", mixup_alpha=0.0)
    frames = Frames(16, 3)
    seeds = np.arange(16)
    loss_augmented = on.train_step(frames.images, frames.targets, 5, seeds)
    off = make_trainer(tmp_path / "off", augment_on="device", mixup_alpha=0.0)
    loss_plain = off.train_step(frames.images, frames.targets, 5, None)
    assert loss_augmented != pytest.approx(loss_plain, rel=1e-6)
