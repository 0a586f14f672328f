"""The head of a video: where the mouth and the esophagus end, as one posterior over both ends.

The two first regions are the shortest (Galar: 13 frames each at the median) and the hardest to
place: a monotone region path (`vce.post.anatomy`) that pays a switch for every region skips a
13-frame mouth whose scores ramp into the esophagus's, and when it does keep it, tIoU 0.95 asks
for its end to the frame. But the head of a video has a shape the ground truth shows: a mouth
starts at the video's first frame (every one of the 65 Galar videos that hold the mouth) and the
esophagus starts where the mouth ends (62 of the 65 that hold the esophagus). So, per video,
over its first `width` positions:

1. A cell (a, b), 0 <= a <= b: the mouth on positions [0, a), the esophagus on [a, b), the
   decoded region path after them (the stomach where the path says mouth or esophagus). a = 0:
   no mouth; b = a: no esophagus.
2. Its log-likelihood from the calibrated region emissions s (`engine.region_emissions`):
   M(a) + E(b) - E(a), M and E the prefix sums of s_mouth - s_rest and s_esophagus - s_rest.
   A frame model's errors persist from frame to frame, so summed frame evidence is
   overconfident: it is tempered by a temperature tau (picked on the tuning videos).
3. Its prior: p_mouth(a) p_esophagus(b - a), each length's prior learned from the tuning ground
   truth (`length_prior`: the share of videos without the region at 0, a kernel density over
   the log of the region's lengths above).
4. The posterior over every cell, normalised per video. The mouth's candidates are its ends a
   ranked by their marginal probability, the esophagus's the cells (a, b) ranked by theirs;
   each region's presence evidence is its posterior probability of being there at all.

Ranking every end by its probability is what the metric rewards on a present label: a later
candidate cannot lower its AP, and the exact end, wherever it falls in the ranking, earns
1 / its rank at tIoU 0.95. The engine uses the head for a region only where it beats the
decoded run's candidates on the tuning videos (`fit_engine`).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

MOUTH, ESOPHAGUS = 0, 1  # the region states the head places (vce.core.labels.REGIONS order)
HEAD_REGIONS = ("mouth", "esophagus")


def length_prior(lengths: np.ndarray, width: int, bandwidth: float) -> np.ndarray:
    """(width + 1,) log prior of a region's length in positions: index 0 the share of tuning videos
    without it (floored at 1 / (2 V)), 1..width a Gaussian kernel density over log length
    (`bandwidth`) of the tuning videos' lengths (0 where absent), read at each length and carrying
    the rest of the mass. Read without the log-normal's 1 / length, so it peaks at the lengths seen:
    with it, lengths all 10 and a bandwidth of 0.4 put the mode at 8.5, and a ranking of ends by
    probability starts 1.5 frames short."""
    lengths = np.asarray(lengths, dtype=np.float64)
    n = max(len(lengths), 1)
    absent = float(np.clip((lengths == 0).sum() / n, 0.5 / n, 1 - 0.5 / n))
    present = lengths[lengths > 0]
    x = np.arange(1, width + 1, dtype=np.float64)
    if len(present) == 0:
        density = np.ones(width)
    else:
        z = (np.log(x)[:, None] - np.log(present)[None, :]) / bandwidth  # (width, n present)
        density = np.exp(-0.5 * z**2).sum(axis=1)  # read at each length: it peaks at the lengths seen
    density = np.maximum(density / density.sum(), 1e-300) * (1 - absent)
    return np.log(np.concatenate([[absent], density]))


def head_lengths(gt: dict, video_ids: list, label: str) -> np.ndarray:
    """(V,) the span from the first to the last ground-truth event of `label` per video (0 without one)."""
    by_id = {str(video["video_id"]): video["events"] for video in gt["videos"]}
    out = np.zeros(len(video_ids), np.int64)
    for v, video_id in enumerate(video_ids):
        spans = [(e["start"], e["end"]) for e in by_id.get(video_id, []) if label in e["label"]]
        if spans:
            out[v] = max(e for _, e in spans) - min(s for s, _ in spans) + 1
    return out


def head_profiles(scores: np.ndarray, path: np.ndarray, video_first: np.ndarray, video_end: np.ndarray,
                  width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, E, n): (V, width + 1) prefix sums of s_mouth - s_rest and s_esophagus - s_rest over each
    video's first positions (s: (P, 5) region emissions; rest: the decoded `path`'s region, the
    stomach in place of the mouth and esophagus), and (V,) how many positions each video has there."""
    n = np.minimum(video_end - video_first, width)
    offsets = np.arange(width)
    positions = np.minimum(video_first[:, None] + offsets[None, :], np.maximum(video_end - 1, 0)[:, None])  # (V, width)
    inside = offsets[None, :] < n[:, None]
    rest = scores[positions, np.maximum(path[positions], ESOPHAGUS + 1)]
    zeros = np.zeros((len(n), 1))
    mouth = np.concatenate([zeros, np.cumsum(np.where(inside, scores[positions, MOUTH] - rest, 0.0), axis=1)], axis=1)
    esophagus = np.concatenate([zeros, np.cumsum(np.where(inside, scores[positions, ESOPHAGUS] - rest, 0.0), axis=1)],
                               axis=1)
    return mouth, esophagus, n


def head_posterior(mouth: np.ndarray, esophagus: np.ndarray, n: int, priors: tuple, temperature: float) -> np.ndarray:
    """(width + 1, width + 1) posterior of one video's cells (a, b) (module docstring; 0 where
    b < a or b > n, the video's positions in the head): `mouth`, `esophagus` its rows of
    `head_profiles`, `priors` the two regions' `length_prior`."""
    width = len(mouth) - 1
    a = np.arange(width + 1)[:, None]
    b = np.arange(width + 1)[None, :]
    possible = (b >= a) & (b <= n)
    prior_mouth, prior_esophagus = (np.asarray(p, dtype=np.float64) for p in priors)
    log_post = (temperature * (mouth[:, None] + esophagus[None, :] - esophagus[:, None])
                + prior_mouth[:, None] + prior_esophagus[np.clip(b - a, 0, width)])
    log_post = np.where(possible, log_post, -np.inf)
    return np.exp(log_post - logsumexp(log_post))


def ranked_cells(posterior: np.ndarray, region: int, count: int) -> tuple[list, float]:
    """(up to `count` spans in positions [first, last] ranked by posterior, the region's presence
    probability) of `region` (MOUTH: its ends a, by marginal; ESOPHAGUS: its cells (a, b), b > a)."""
    if region == MOUTH:
        marginal = posterior.sum(axis=1)[1:]  # P(mouth ends at a), a >= 1
        top = _top(marginal, count)
        return [(0, int(a)) for a in top], float(marginal.sum())
    present = np.triu(posterior, k=1)  # cells with b > a
    top = _top(present.ravel(), count)
    width = posterior.shape[0]
    return [(int(c // width), int(c % width) - 1) for c in top], float(present.sum())


def _top(values: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` largest positive `values`, largest first (ties: lower index)."""
    candidates = np.flatnonzero(values > 0)
    if len(candidates) > count:
        candidates = candidates[np.argpartition(-values[candidates], count - 1)[:count]]
    return candidates[np.lexsort((candidates, -values[candidates]))]


def head_spans(scores: np.ndarray, path: np.ndarray, observed: np.ndarray, video_first: np.ndarray,
               video_end: np.ndarray, priors: tuple, temperature: float, count: int) -> dict:
    """{MOUTH: ..., ESOPHAGUS: ...}, each (per video: up to `count` ranked spans in positions,
    (V,) presence probability): the head of every video (module docstring), `priors` the two
    `length_prior`s (their length fixes the width). A video without an observed frame in its
    head has no spans and presence -inf: the prior alone places nothing."""
    width = len(priors[0]) - 1
    mouth, esophagus, n = head_profiles(scores, path, video_first, video_end, width)
    out = {region: ([], np.full(len(n), -np.inf)) for region in (MOUTH, ESOPHAGUS)}
    seen = np.concatenate([[0], np.cumsum(observed, dtype=np.int64)])
    for v in range(len(n)):
        if seen[video_first[v] + n[v]] == seen[video_first[v]]:
            for spans, _ in out.values():
                spans.append([])
            continue
        posterior = head_posterior(mouth[v], esophagus[v], int(n[v]), priors, temperature)
        for region, (spans, presence) in out.items():
            ranked, presence[v] = ranked_cells(posterior, region, count)
            first = int(video_first[v])
            spans.append([(first + a, first + b) for a, b in ranked])
    return out
