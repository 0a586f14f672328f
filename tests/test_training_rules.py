"""Training rules that a whole-pipeline test cannot see: mixup mixes the targets too, and
validation and the saved model use the EMA weights, not the raw ones."""

import copy

import numpy as np
import pytest
import torch
from conftest import section_params
from torch.utils.data import Dataset

from vce.core.labels import NUM_LABELS
from vce.model.device import Distributed
from vce.model.frame_model import ModelParams, create_model
from vce.train.losses import LossParams, VCELoss
from vce.train.trainer import Trainer, TrainParams, evaluate, kept_epoch, mixup


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


def fit_recording(trainer):
    """fit, keeping each best epoch's saved weights and record; returns (saves, result)."""
    saved = []
    result = trainer.fit(lambda model, record: saved.append(({k: v.clone() for k, v in model.state_dict().items()},
                                                              dict(record))))
    return saved, result


def assert_same_saves(one, other):
    assert [record for _, record in one] == [record for _, record in other]
    for (state, _), (expected, _) in zip(one, other):
        for key, tensor in expected.items():
            assert torch.equal(state[key], tensor), key


def test_background_validation_changes_no_record_and_no_saved_model(tmp_path, one_thread):
    """Each epoch validated in a thread while the next trains: the same history, the same best
    epochs saved with the same EMA weights as validating in line (3 epochs: two in the background)."""
    runs = {}
    for background in (True, False):
        trainer = make_trainer(tmp_path / str(background), epochs=3, num_workers=1, ema_decay=0.9)
        trainer.background_validation = lambda background=background: background
        runs[background] = (*fit_recording(trainer), trainer)
    (saves, result, trainer), (plain_saves, plain_result, plain) = runs[True], runs[False]
    assert [r["epoch"] for r in result["history"]] == [1, 2, 3]
    assert result["history"] == plain_result["history"] and result["best"] == plain_result["best"]
    assert len(saves) >= 1
    assert_same_saves(saves, plain_saves)
    for key, tensor in plain.ema.module.state_dict().items():
        assert torch.equal(trainer.ema.module.state_dict()[key], tensor), key


def test_a_run_killed_before_its_background_validation_is_kept_resumes_it(tmp_path, one_thread):
    """Killed in epoch 2 while epoch 1's validation was pending: the checkpoint holds epoch 1's EMA
    and partial record, and the resumed run validates it first: history, saves and weights as uninterrupted."""
    clean = make_trainer(tmp_path / "clean", epochs=3, num_workers=1, checkpoint_every=2, ema_decay=0.9)
    clean.background_validation = lambda: True
    clean_saves, clean_result = fit_recording(clean)

    killed = make_trainer(tmp_path / "killed", epochs=3, num_workers=1, checkpoint_every=2, ema_decay=0.9)
    killed.background_validation = lambda: True
    step, calls = killed.train_step, []

    def dies_in_epoch_two(*args):
        calls.append(1)
        if len(calls) == 7:  # 4 steps an epoch: after epoch 2's step-2 checkpoint
            raise KeyboardInterrupt
        return step(*args)

    killed.train_step = dies_in_epoch_two
    with pytest.raises(KeyboardInterrupt):
        killed.fit(lambda model, record: None)
    resumed = make_trainer(tmp_path / "killed", epochs=3, num_workers=1, checkpoint_every=2, ema_decay=0.9)
    resumed.background_validation = lambda: True
    assert resumed.try_resume() and (resumed.epoch, resumed.step) == (1, 2)
    assert resumed.history == [] and resumed.pending is not None  # epoch 1 not yet validated when killed
    saves, result = fit_recording(resumed)
    assert result["history"] == clean_result["history"]
    assert_same_saves(saves, [s for s in clean_saves if s[1]["epoch"] >= 1])
    for key, tensor in clean.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[key], tensor), key


@pytest.mark.parametrize("change, expected", [
    ({}, True),                                    # one CPU process, a thread to spare, decode workers
    ({"num_workers": 0}, False),                   # the thread would decode under the trainer's GIL
    ({"threads": 2}, False),                       # every core already computes the step
    ({"world": 2}, False),                         # DDP: no collectives from a second thread
])
def test_background_validation_only_where_a_core_is_idle(tmp_path, monkeypatch, change, expected):
    trainer = make_trainer(tmp_path, num_workers=change.get("num_workers", 1))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: change.get("threads", 1))
    if "world" in change:
        monkeypatch.setattr(trainer, "ddp", Distributed(rank=0, world=change["world"]))
    assert trainer.background_validation() is expected


@pytest.mark.parametrize("keep, history, expected", [
    ("best", [0.3, 0.5, 0.4], [True, True, False]),   # a higher validation mAP replaces the kept epoch
    ("best", [0.5, 0.5, 0.2], [True, False, False]),  # a tie keeps the earlier epoch
    ("last", [0.3, 0.5, 0.4], [False, False, True]),  # the final epoch, whatever validation says
])
def test_train_keep_picks_the_epoch_the_stage_keeps(keep, history, expected):
    params = section_params(TrainParams, "train", epochs=3, keep=keep)
    best, kept = None, []
    for epoch, val_map in enumerate(history, 1):
        record = {"epoch": epoch, "val_map": val_map}
        kept.append(kept_epoch(record, best, params))
        best = record if kept[-1] else best
    assert kept == expected


def test_keep_last_saves_the_final_epochs_ema_in_both_trainers(tmp_path, one_thread, monkeypatch):
    """`train.keep: last`: the image trainer saves the last epoch's EMA once, and the probe returns
    its last epoch's heads (a probe of 3 epochs on random features, its validation mAP made to fall
    epoch by epoch, so the best-epoch rule would keep epoch 1)."""
    trainer = make_trainer(tmp_path, epochs=3, keep="last")
    saves, result = fit_recording(trainer)
    assert [record["epoch"] for _, record in saves] == [3] and result["best"]["epoch"] == 3
    for key, tensor in trainer.ema.module.state_dict().items():
        assert torch.equal(saves[0][0][key], tensor), key

    import vce.train.probe
    from vce.train.probe import FeatureSet, fit_probe
    falling = iter([0.9, 0.5, 0.1])
    monkeypatch.setattr(vce.train.probe, "evaluate_features", lambda *args: {"loss": 0.0, "map": next(falling)})
    torch.manual_seed(0)
    model = create_model(section_params(ModelParams, "model"), torch.randn(NUM_LABELS, 64))
    width = model.classifier.in_features
    generator = np.random.default_rng(0)
    features = generator.normal(size=(48, width)).astype(np.float16)
    targets = (generator.random((48, NUM_LABELS)) < 0.3).astype(np.float32)
    data = FeatureSet(features, targets, np.ones(48, bool))
    loss_fn = VCELoss(section_params(LossParams, "loss"), torch.from_numpy(targets).mean(dim=0))
    params = section_params(TrainParams, "train", epochs=3, keep="last", batch_size=16, samples_per_epoch=48,
                            mixup_alpha=0.0)
    out = fit_probe(model, loss_fn, params, 42, data, np.ones(48), data, torch.device("cpu"))
    assert [r["val_map"] for r in out["history"]] == [0.9, 0.5, 0.1]
    assert out["best"]["epoch"] == 3 and out["best"]["val_map"] == 0.1
