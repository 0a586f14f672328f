"""Each loss against its formula on hand-computed values."""

import math

import pytest
import torch

from vce.core.labels import NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.train.losses import (
    LossParams,
    VCELoss,
    asymmetric_loss,
    contrastive_pos_weight,
)

LN2 = math.log(2.0)


def outputs(cls_value: float, con_value: float | None = None, batch: int = 1) -> dict:
    cls_logits = torch.full((batch, NUM_LABELS), cls_value)
    con = None if con_value is None else torch.full((batch, NUM_LABELS), con_value)
    return {"cls_logits": cls_logits, "con_logits": con}


def test_asl_positive_term_by_hand():
    # z = 0 -> p = 0.5; y = 1: −(1 − 0.5)^1 · ln 0.5 = 0.5 · ln 2
    loss = asymmetric_loss(torch.tensor([0.0]), torch.tensor([1.0]), 1.0, 4.0, 0.05, 1e-8)
    assert loss.item() == pytest.approx(0.5 * LN2, rel=1e-6)
    # z = ln 3 -> p = 0.75: −0.25 · ln 0.75
    loss = asymmetric_loss(torch.tensor([math.log(3)]), torch.tensor([1.0]), 1.0, 4.0, 0.05, 1e-8)
    assert loss.item() == pytest.approx(-0.25 * math.log(0.75), rel=1e-6)


def test_asl_negative_term_with_probability_shift_by_hand():
    # z = 0, y = 0: p_m = 0.5 − 0.05 = 0.45; −0.45^4 · ln(0.55)
    loss = asymmetric_loss(torch.tensor([0.0]), torch.tensor([0.0]), 1.0, 4.0, 0.05, 1e-8)
    assert loss.item() == pytest.approx(-(0.45 ** 4) * math.log(0.55), rel=1e-6)
    # an easy negative below the clip costs exactly nothing: p = 0.04 < 0.05
    z = math.log(0.04 / 0.96)
    assert asymmetric_loss(torch.tensor([z]), torch.tensor([0.0]), 1.0, 4.0, 0.05, 1e-8).item() == 0.0


def test_asl_soft_targets_interpolate_the_two_terms():
    z = torch.tensor([0.3])
    pos = asymmetric_loss(z, torch.tensor([1.0]), 1.0, 4.0, 0.05, 1e-8)
    neg = asymmetric_loss(z, torch.tensor([0.0]), 1.0, 4.0, 0.05, 1e-8)
    soft = asymmetric_loss(z, torch.tensor([0.3]), 1.0, 4.0, 0.05, 1e-8)
    torch.testing.assert_close(soft, 0.3 * pos + 0.7 * neg)


def test_pos_weights_are_negatives_per_positive_clipped():
    freq = torch.tensor([0.01, 0.5, 0.9, 0.0005, 0.0] + [0.1] * 12)
    weight = contrastive_pos_weight(freq, 100.0)
    torch.testing.assert_close(weight[:5], torch.tensor([99.0, 1.0, 1.0, 100.0, 100.0]))
    assert weight[5].item() == pytest.approx(9.0)


def test_total_loss_is_cls_plus_weighted_con_with_label_smoothing():
    params = LossParams()  # γ⁺=1, γ⁻=4, clip .05, smoothing .05, con_weight .4, max 100
    freq = torch.full((NUM_LABELS,), 0.01)  # w = 99 for every label
    loss_fn = VCELoss(params, freq)
    targets = torch.zeros(1, NUM_LABELS)
    targets[0, 0] = 1.0
    loss, parts = loss_fn(outputs(0.0, 0.0), targets)
    # smoothed targets: 0.95 for label 0, 0.05 for the 16 others; z = 0 everywhere.
    pos_cls, neg_cls = 0.5 * LN2, -(0.45 ** 4) * math.log(0.55)
    cls = (0.95 * pos_cls + 0.05 * neg_cls + 16 * (0.05 * pos_cls + 0.95 * neg_cls)) / NUM_LABELS
    # BCE at z = 0: ln 2 · (w·y + 1 − y)
    con = LN2 * ((99 * 0.95 + 0.05) + 16 * (99 * 0.05 + 0.95)) / NUM_LABELS
    assert parts["loss_cls"] == pytest.approx(cls, rel=1e-5)
    assert parts["loss_con"] == pytest.approx(con, rel=1e-5)
    assert loss.item() == pytest.approx(cls + 0.4 * con, rel=1e-5)
    assert parts["loss"] == pytest.approx(loss.item())


def test_without_contrastive_logits_only_the_classifier_loss():
    loss_fn = VCELoss(LossParams(label_smoothing=0.0), torch.full((NUM_LABELS,), 0.2))
    loss, parts = loss_fn(outputs(0.0, None), torch.ones(1, NUM_LABELS))
    assert "loss_con" not in parts
    assert loss.item() == pytest.approx(0.5 * LN2, rel=1e-6)


def test_gradients_finite_at_saturated_logits():
    logits = torch.tensor([[50.0, -50.0] * 8 + [0.0]], requires_grad=True)
    loss_fn = VCELoss(LossParams(), torch.full((NUM_LABELS,), 0.05))
    loss, _ = loss_fn({"cls_logits": logits, "con_logits": logits * 2}, torch.rand(1, NUM_LABELS))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="pos_freq"):
        VCELoss(LossParams(), torch.zeros(5))
    with pytest.raises(ParamsError, match="loss.label_smoothing"):
        from_dict(LossParams, {"label_smoothing": 0.5}, "loss")
    with pytest.raises(ParamsError, match="loss.pos_weight_max"):
        from_dict(LossParams, {"pos_weight_max": 0.5}, "loss")
