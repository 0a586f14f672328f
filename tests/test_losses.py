"""The training loss: its formula on hand-computed values, and where its optimum lies.

The optimum tests find the zero of dL/dz numerically (autograd + bisection), so a loss that
weights smoothed targets differently (the old ASL put a negative's optimum at p = 0.42, torch's
`pos_weight` on smoothed targets a rare label's negatives at σ = 0.84) fails them.
"""

import math

import pytest
import torch
import yaml

from tests.conftest import ROOT
from vce.core.labels import LABELS, NUM_LABELS
from vce.core.params import ParamsError, from_dict
from vce.train.losses import (
    LossParams,
    VCELoss,
    asymmetric_loss,
    contrastive_loss,
    contrastive_pos_weight,
    masked_frame_loss,
)

LN2 = math.log(2.0)
EPS = 0.05  # params.yaml's label smoothing, which these tests use throughout

# Galar's positive frame share per label (fixtures/galar_label_stats.csv total_frames / 3,513,539).
GALAR_FRAMES = {
    "mouth": 2185, "esophagus": 2256, "stomach": 254994, "small intestine": 1375918, "colon": 1878361,
    "z-line": 122, "pylorus": 3183, "ileocecal valve": 3692, "active bleeding": 5325, "angiectasia": 16803,
    "blood": 391715, "erosion": 39105, "erythema": 6228, "hematin": 31773, "lymphangioectasis": 17660,
    "polyp": 18415, "ulcer": 11428,
}
GALAR_FREQ = torch.tensor([GALAR_FRAMES[label] / 3_513_539 for label in LABELS])


def loss_params(**changes) -> LossParams:
    values = {**yaml.safe_load((ROOT / "params.yaml").read_text())["loss"], **changes}
    return from_dict(LossParams, values, "loss")


def outputs(cls_value: float, con_value: float | None = None, batch: int = 1) -> dict:
    cls_logits = torch.full((batch, NUM_LABELS), cls_value)
    con = None if con_value is None else torch.full((batch, NUM_LABELS), con_value)
    return {"cls_logits": cls_logits, "con_logits": con}


def asl(z: float, t: float, smoothing: float = EPS, gamma_pos=1.0, gamma_neg=4.0, clip=0.05) -> float:
    return asymmetric_loss(torch.tensor([z]), torch.tensor([t]), gamma_pos, gamma_neg, clip, 1e-8,
                           smoothing).item()


def grad(loss_of_z, z: float) -> float:
    z = torch.tensor([z], dtype=torch.float64, requires_grad=True)
    loss_of_z(z).sum().backward()
    return z.grad.item()


def optimum(loss_of_z, lo: float = -12.0, hi: float = 12.0) -> float:
    """σ(z*) for the z* where dL/dz turns positive (bisection; dL/dz < 0 below, ≥ 0 above... or 0 on a flat floor)."""
    assert grad(loss_of_z, lo) <= 0 < grad(loss_of_z, hi), "no sign change of dL/dz in the bracket"
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if grad(loss_of_z, mid) > 0 else (mid, hi)
    return 1 / (1 + math.exp(-hi))


# ---------------------------------------------------------------------------- the formula

def test_asl_without_smoothing_is_the_papers_loss_by_hand():
    # z = 0 -> p = 0.5; positive: −(1 − 0.5)^1 · ln 0.5
    assert asl(0.0, 1.0, smoothing=0.0) == pytest.approx(0.5 * LN2, rel=1e-6)
    assert asl(math.log(3), 1.0, smoothing=0.0) == pytest.approx(-0.25 * math.log(0.75), rel=1e-6)
    # negative: p_m = 0.45, −0.45^4 · ln(0.55)
    assert asl(0.0, 0.0, smoothing=0.0) == pytest.approx(-(0.45 ** 4) * math.log(0.55), rel=1e-6)
    # an easy negative below the clip costs exactly nothing, whatever the smoothing
    assert asl(math.log(0.04 / 0.96), 0.0) == 0.0


def test_asl_smoothing_acts_inside_the_hard_targets_focusing_weight():
    # z = 0: p = 0.5, p_m = 0.45. Positive: (1 − p) · −[0.95 ln p + 0.05 ln(1 − p_m)]
    pos = 0.5 * -(0.95 * math.log(0.5) + 0.05 * math.log(0.55))
    neg = 0.45 ** 4 * -(0.05 * math.log(0.5) + 0.95 * math.log(0.55))
    assert asl(0.0, 1.0) == pytest.approx(pos, rel=1e-6)
    assert asl(0.0, 0.0) == pytest.approx(neg, rel=1e-6)


def test_mixed_targets_mix_the_two_hard_losses():
    # mixup's definition: L(λ y_a + (1 − λ) y_b) = λ L(y_a) + (1 − λ) L(y_b)
    z = torch.tensor([0.3, -2.0, 4.0])
    for t in (0.3, 0.75):
        args = (1.0, 4.0, 0.05, 1e-8, EPS)
        torch.testing.assert_close(asymmetric_loss(z, torch.full_like(z, t), *args),
                                   t * asymmetric_loss(z, torch.ones_like(z), *args)
                                   + (1 - t) * asymmetric_loss(z, torch.zeros_like(z), *args))
        w = torch.tensor([1.0, 9.0, 100.0])
        torch.testing.assert_close(contrastive_loss(z, torch.full_like(z, t), w, EPS),
                                   t * contrastive_loss(z, torch.ones_like(z), w, EPS)
                                   + (1 - t) * contrastive_loss(z, torch.zeros_like(z), w, EPS))


def test_pos_weights_are_negatives_per_positive_clipped():
    freq = torch.tensor([0.01, 0.5, 0.9, 0.0005, 0.0] + [0.1] * 12)
    weight = contrastive_pos_weight(freq, 100.0)
    torch.testing.assert_close(weight[:5], torch.tensor([99.0, 1.0, 1.0, 100.0, 100.0]))
    assert weight[5].item() == pytest.approx(9.0)


def test_total_loss_is_cls_plus_weighted_con_by_hand():
    loss_fn = VCELoss(loss_params(), torch.full((NUM_LABELS,), 0.01))  # w = 99 for every label
    targets = torch.zeros(1, NUM_LABELS)
    targets[0, 0] = 1.0
    loss, parts = loss_fn(outputs(0.0, 0.0), targets)
    cls = (asl(0.0, 1.0) + 16 * asl(0.0, 0.0)) / NUM_LABELS
    # BCE at z = 0 is ln 2 for any target; the positive (label 0) weighs 99, the negatives 1
    con = LN2 * (99 + 16) / NUM_LABELS
    assert parts["loss_cls"] == pytest.approx(cls, rel=1e-5)
    assert parts["loss_con"] == pytest.approx(con, rel=1e-5)
    assert loss.item() == pytest.approx(cls + 0.4 * con, rel=1e-5)
    assert parts["loss"] == pytest.approx(loss.item())


def test_without_contrastive_logits_only_the_classifier_loss():
    loss_fn = VCELoss(loss_params(label_smoothing=0.0), torch.full((NUM_LABELS,), 0.2))
    loss, parts = loss_fn(outputs(0.0, None), torch.ones(1, NUM_LABELS))
    assert "loss_con" not in parts
    assert loss.item() == pytest.approx(0.5 * LN2, rel=1e-6)


# ---------------------------------------------------------------------------- where the optimum lies

def test_classifier_optimum_negative_at_the_clip_positive_at_one():
    # Negative: zero loss and zero gradient for every p ≤ clip (0.05 = ε), pushed down above it.
    p_neg = optimum(lambda z: asymmetric_loss(z, torch.zeros_like(z), 1.0, 4.0, 0.05, 1e-12, EPS))
    assert p_neg == pytest.approx(0.05, abs=1e-4)
    assert asl(math.log(0.03 / 0.97), 0.0) == 0.0
    # Positive: the loss falls all the way to p = 1 (the old ASL turned back up at p = 0.86).
    for p in (0.5, 0.86, 0.95, 0.99, 0.999):
        z = math.log(p / (1 - p))
        assert grad(lambda z: asymmetric_loss(z, torch.ones_like(z), 1.0, 4.0, 0.05, 1e-12, EPS), z) < 0


def test_classifier_without_focusing_or_clip_is_smoothed_bce_with_optimum_at_eps():
    neg = optimum(lambda z: asymmetric_loss(z, torch.zeros_like(z), 0.0, 0.0, 0.0, 1e-12, EPS))
    pos = optimum(lambda z: asymmetric_loss(z, torch.ones_like(z), 0.0, 0.0, 0.0, 1e-12, EPS))
    assert neg == pytest.approx(EPS, abs=1e-6)
    assert pos == pytest.approx(1 - EPS, abs=1e-6)


@pytest.mark.parametrize("freq", [0.3, 1e-3, 3.5e-5])  # common, rare, z-line rare (weight clipped at 100)
def test_contrastive_optimum_at_eps_and_one_minus_eps_for_common_and_rare_labels(freq):
    w = contrastive_pos_weight(torch.tensor([freq]), 100.0).double()
    neg = optimum(lambda z: contrastive_loss(z, torch.zeros_like(z), w, EPS))
    pos = optimum(lambda z: contrastive_loss(z, torch.ones_like(z), w, EPS))
    assert neg == pytest.approx(EPS, abs=1e-6)
    assert pos == pytest.approx(1 - EPS, abs=1e-6)


def test_perfect_model_at_galar_frequencies_costs_only_the_smoothing_entropy():
    """A model at the optimum on Galar's label frequencies: L = 0.11 (the seed logged 0.18-0.41; the
    old loss could not go below 0.88)."""
    generator = torch.Generator().manual_seed(0)
    targets = (torch.rand(200_000, NUM_LABELS, generator=generator) < GALAR_FREQ).float()
    params = loss_params()
    loss_fn = VCELoss(params, targets.mean(dim=0))
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    cls = torch.where(targets > 0, 30.0, logit(0.01))  # confident positives, negatives under the clip
    con = torch.where(targets > 0, logit(1 - EPS), logit(EPS))  # the contrastive optimum
    loss, parts = loss_fn({"cls_logits": cls, "con_logits": con}, targets)
    entropy = -(EPS * math.log(EPS) + (1 - EPS) * math.log(1 - EPS))
    f = targets.mean(dim=0)
    floor = entropy * ((1 - f) + f * loss_fn.pos_weight).mean().item()
    assert parts["loss_cls"] < 1e-6
    assert parts["loss_con"] == pytest.approx(floor, rel=1e-4)
    assert loss.item() == pytest.approx(params.con_weight * floor, rel=1e-4)
    assert loss.item() == pytest.approx(0.108, abs=0.005)


# ---------------------------------------------------------------------------- masking, robustness

def test_masked_frame_loss_ignores_invalid_frames():
    per_label = torch.rand(2, 5, NUM_LABELS)
    valid = torch.tensor([[True, False, True, True, False], [False] * 5])
    expected = per_label[valid].mean()
    torch.testing.assert_close(masked_frame_loss(per_label, valid), expected)
    per_label[~valid] = 1e6  # whatever an invalid frame costs, it adds nothing
    torch.testing.assert_close(masked_frame_loss(per_label, valid), expected)
    assert masked_frame_loss(per_label, torch.zeros_like(valid)).item() == 0.0


def test_temporal_loss_leaves_invalid_and_padded_frames_out():
    """The temporal model's loss: labels and logits of invalid/padded frames change nothing."""
    from vce.infer.temporal import TemporalConvNet, TemporalParams, temporal_loss

    values = yaml.safe_load((ROOT / "params.yaml").read_text())["temporal"]
    torch.manual_seed(0)
    model = TemporalConvNet(8, from_dict(TemporalParams, values, "temporal")).eval()  # no dropout draws
    embeddings = torch.randn(2, 16, 8)
    valid = torch.ones(2, 16, dtype=torch.bool)
    valid[0, 3] = valid[1, 10:] = False  # an undecodable frame; a short video padded to the crop
    labels = torch.zeros(2, 16, NUM_LABELS)
    labels[0, :, 2] = 1
    params = loss_params()
    reference = temporal_loss(model, embeddings, valid, labels, params)
    garbage = labels.clone()
    garbage[~valid] = 1.0  # every label "present" on the frames that carry none
    torch.testing.assert_close(temporal_loss(model, embeddings, valid, garbage, params), reference)
    # and it is the mean over exactly the valid frames
    logits = model(embeddings, valid.float())
    per_label = asymmetric_loss(logits, labels, params.gamma_pos, params.gamma_neg, params.clip, params.eps,
                                params.label_smoothing)
    torch.testing.assert_close(reference, per_label.mean(dim=-1)[valid].mean())


def test_gradients_finite_at_saturated_logits():
    logits = torch.tensor([[50.0, -50.0] * 8 + [0.0]], requires_grad=True)
    loss_fn = VCELoss(loss_params(), torch.full((NUM_LABELS,), 0.05))
    loss, _ = loss_fn({"cls_logits": logits, "con_logits": logits * 2}, torch.rand(1, NUM_LABELS))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="pos_freq"):
        VCELoss(loss_params(), torch.zeros(5))
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match=r"frequencies in \[0, 1\]"):
            VCELoss(loss_params(), torch.tensor([bad] + [0.1] * (NUM_LABELS - 1)))
    # A label never seen (0) and one on every frame (1) are frequencies like any other.
    VCELoss(loss_params(), torch.tensor([0.0, 1.0] + [0.1] * (NUM_LABELS - 2)))
    with pytest.raises(ParamsError, match="loss.label_smoothing"):
        loss_params(label_smoothing=0.5)
    with pytest.raises(ParamsError, match="loss.pos_weight_max"):
        loss_params(pos_weight_max=0.5)
