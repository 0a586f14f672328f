"""A third simulation whose error model breaks the AR(1)-logit assumption of the finding decoder.

Same ground truth and protocol as `bench.simulate` and `bench.simulate2` (the 80 real Galar
timelines, tuned on a random half, the other half scored with the official metric;
`bench.simulate.run_protocol`, which also prints the per-label decomposition and the oracle
gaps), but the frame probabilities are made the way a real frame model errs, not as AR(1)
noise around a mid-range level:

- **calibration far from the middle**: a finding's or landmark's negatives sit at
  p ~ U(`--neg-low`, `--neg-high`) (near 0) and its positives' median p ~ U(`--pos-low`,
  `--pos-high`) (low for the rare labels: a model trained on 1 % prevalence is timid), labels
  whose seed AUC is at chance have no step at all; regions are a softmax of five logits;
- **non-AR noise**: white noise, plus a slow drift made of three sinusoids of random period
  (500-5,000 frames) and phase, plus sparse impulses (a share `--impulse-rate` of the frames,
  Student t with 1.5 degrees of freedom: heavy tails, single frames far off);
- **heavy-tailed false-positive bursts**: per (video, finding) Poisson(`--bursts`) bursts whose
  length is Pareto (shape 1.2, from 5 frames, at most 3,000) and whose height is the label's
  step times U(0.7, 1.5), on its negative frames;
- **device shift**: each video comes from one of `--devices` capsules, which scale every logit
  by a lognormal factor (sd `--device-scale-sd`) and add a per-label offset N(0,
  `--device-sd`); each video adds its own offset N(0, `--video-sd`);
- **neighbouring-region confusions**: each region boundary is shifted by N(0, `--boundary-sd`)
  and, within `--confuse-width` frames of it, stretches (geometric, mean 15 frames) read as
  the region on the other side, more often the closer they are.

`oracle_region_runs_as_scored` (the region runs where the confused scores' argmax puts them) is
the ceiling of one event per region, next to `oracle_region_runs` (the true runs).

Run: python -m bench.simulate3 [--seed 0] [--videos N]   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from bench.simulate import FIXTURE, ROOT, SEED_AUC, run_protocol, setup
from bench.simulate2 import as_scored_runs
from vce.core.labels import LABELS, PATHOLOGY, REGIONS

CHANCE_AUC = 0.55  # a seed AUC at or below this: the label's positives look like its negatives


def confused_regions(regions: np.ndarray, rng, boundary_sd: float, width: int) -> np.ndarray:
    """(T,) region index a frame model reads: each true boundary shifted by N(0, boundary_sd),
    and within `width` frames of it stretches (geometric, mean 15) of the two regions it
    separates read as the other one, with probability falling linearly from 0.5 at the
    boundary to 0 at `width` (frames of a third region are left alone)."""
    state = regions.argmax(axis=1)
    read = state.copy()
    n = len(state)
    for c in np.flatnonzero(np.diff(state) != 0) + 1:
        before, after = state[c - 1], state[c]
        centre = int(np.clip(round(c + rng.normal(0, boundary_sd)), 0, n))
        if centre > c:
            read[c:centre][state[c:centre] == after] = before
        else:
            read[centre:c][state[centre:c] == before] = after
        t, hi = max(min(c, centre) - width, 0), min(max(c, centre) + width, n)
        while t < hi:
            length = int(rng.geometric(1 / 15))
            if rng.random() < 0.5 * max(1 - abs(t + length / 2 - centre) / max(width, 1), 0):
                span = slice(t, min(t + length, hi))
                read[span] = np.where(state[span] == before, after, np.where(state[span] == after, before, read[span]))
            t += length
    return read


def _drift(rng, n: int, n_labels: int, sd: float) -> np.ndarray:
    """(n, n_labels) three sinusoids of random period (500-5,000 frames) and phase each, sd `sd`."""
    t = np.arange(n)[:, None]
    out = np.zeros((n, n_labels))
    for _ in range(3):
        period = rng.uniform(500, 5000, n_labels)
        out += np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, n_labels))
    return out * sd / np.sqrt(1.5)


def _impulses(rng, shape, rate: float) -> np.ndarray:
    """Sparse heavy-tailed single-frame errors: Student t (1.5 degrees of freedom) on `rate` of the frames."""
    hit = rng.random(shape) < rate
    return np.where(hit, np.clip(2.0 * rng.standard_t(1.5, shape), -10, 10), 0.0)


def label_levels(rng, args) -> tuple[np.ndarray, np.ndarray]:
    """(negatives' logit (17,), positives' logit (17,)) of every label; regions 0 / 3 (softmax inputs)."""
    negative = logit(rng.uniform(args.neg_low, args.neg_high, len(LABELS)))
    positive = logit(rng.uniform(args.pos_low, args.pos_high, len(LABELS)))
    chance = np.array([SEED_AUC[label] <= CHANCE_AUC for label in LABELS])
    positive = np.where(chance, negative, np.maximum(positive, negative))
    region_cols = [LABELS.index(r) for r in REGIONS]
    negative[region_cols], positive[region_cols] = 0.0, 3.0
    return negative, positive


def simulate_probs3(frame_labels: pd.DataFrame, rng, args) -> tuple[pd.DataFrame, dict]:
    """Frame probabilities under the error model of the module docstring, and the region runs
    as the confused region scores place them (`as_scored_runs`, a ceiling for any decoder)."""
    negative, positive = label_levels(rng, args)
    step = positive - negative
    device_scale = np.exp(rng.normal(0, args.device_scale_sd, args.devices))
    device_offset = rng.normal(0, args.device_sd, (args.devices, len(LABELS)))
    region_cols = [LABELS.index(r) for r in REGIONS]
    finding_cols = [LABELS.index(f) for f in PATHOLOGY]
    probs = np.empty((len(frame_labels), len(LABELS)), np.float32)
    times = frame_labels["t"].to_numpy()
    as_scored = []
    for video_id, rows in frame_labels.groupby("video_id", sort=False).indices.items():
        truth = frame_labels.iloc[rows][list(LABELS)].to_numpy(dtype=np.float64)  # (T, 17)
        n = len(truth)
        read = confused_regions(truth[:, region_cols], rng, args.boundary_sd, args.confuse_width)
        signal = truth.copy()
        signal[:, region_cols] = np.eye(len(REGIONS))[read] * (truth[:, region_cols].sum(axis=1, keepdims=True) > 0)
        as_scored.append(as_scored_runs(video_id, times[rows], signal[:, region_cols]))
        z = negative + step * signal
        z += args.white_sd * rng.standard_normal(truth.shape) + _drift(rng, n, len(LABELS), args.drift_sd)
        z += _impulses(rng, truth.shape, args.impulse_rate)
        for k in finding_cols:
            for _ in range(rng.poisson(args.bursts)):
                length = int(min(5 * (1 + rng.pareto(1.2)), 3000))
                start = int(rng.integers(0, max(n - length, 1)))
                burst = slice(start, start + length)
                z[burst, k] += step[k] * rng.uniform(0.7, 1.5) * (truth[burst, k] == 0)
        device = rng.integers(args.devices)
        z = device_scale[device] * z + device_offset[device] + rng.normal(0, args.video_sd, len(LABELS))
        p = expit(z)
        regions = np.exp(z[:, region_cols] - z[:, region_cols].max(axis=1, keepdims=True))
        p[:, region_cols] = regions / regions.sum(axis=1, keepdims=True)
        probs[rows] = p
    out = frame_labels[["video_id", "t"]].copy()
    out[list(LABELS)] = probs
    return out, {"videos": as_scored}


def parser() -> argparse.ArgumentParser:
    """The simulator's command line (its error model's knobs and the protocol's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--neg-low", type=float, default=0.002, help="negatives' p of a finding: lowest")
    parser.add_argument("--neg-high", type=float, default=0.03, help="negatives' p of a finding: highest")
    parser.add_argument("--pos-low", type=float, default=0.05, help="positives' median p of a finding: lowest")
    parser.add_argument("--pos-high", type=float, default=0.4, help="positives' median p of a finding: highest")
    parser.add_argument("--white-sd", type=float, default=0.6, help="white logit noise (std)")
    parser.add_argument("--drift-sd", type=float, default=0.6, help="slow sinusoidal logit drift (std)")
    parser.add_argument("--impulse-rate", type=float, default=0.01, help="share of frames with a heavy-tailed impulse")
    parser.add_argument("--bursts", type=float, default=2.0, help="mean false-positive bursts per (video, finding)")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--device-sd", type=float, default=0.7, help="per (device, label) logit offset (std)")
    parser.add_argument("--device-scale-sd", type=float, default=0.3, help="per-device log logit scale (std)")
    parser.add_argument("--video-sd", type=float, default=0.3, help="per (video, label) logit offset (std)")
    parser.add_argument("--boundary-sd", type=float, default=8.0, help="region boundary shift, frames (std)")
    parser.add_argument("--confuse-width", type=int, default=150, help="frames around a boundary where regions mix")
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--videos", type=int, default=0, help="use a random subset of this many videos (0: all 80)")
    return parser


def defaults():
    """The error model's default knobs (`bench.engine_speed`)."""
    return parser().parse_args([])


MODEL_KEYS = ("seed", "neg_low", "neg_high", "pos_low", "pos_high", "white_sd", "drift_sd", "impulse_rate", "bursts",
              "devices", "device_sd", "device_scale_sd", "video_sd", "boundary_sd", "confuse_width")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    began = time.perf_counter()
    gt, frame_labels, rng, event_params, threshold_params = setup(args)
    frame_probs, as_scored = simulate_probs3(frame_labels, rng, args)
    results = run_protocol(gt, frame_labels, frame_probs, rng, event_params, threshold_params, True,
                           ceilings={"oracle_region_runs_as_scored": as_scored})
    model = {key: getattr(args, key) for key in MODEL_KEYS}
    print(json.dumps({"model": {**model, "videos": args.videos or len(gt["videos"])}, **results,
                      "seconds": round(time.perf_counter() - began, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
