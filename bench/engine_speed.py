"""Score engine speed: fitting and applying it on simulated Galar-size data, with a profile.

Frame probabilities from one of the bench simulators (`--sim 1`: `bench.simulate`, 2:
`bench.simulate2`, 3: `bench.simulate3`) on the real Galar timelines (all 80 videos, about
3.5 M frames, or a random `--videos` of them). The engine (`params.yaml` `thresholds.engine`,
or `--params`) is fitted on the videos of `--fit-share` of them and applied to all of them,
so "fit" reads that share of the frames and "events" every frame. Prints one JSON object:
frames, CPU seconds (`time.process_time`: every thread of the process) and wall seconds of
`fit_engine` and of `engine_submission`, and, with `--profile N`, the N entries of a cProfile
of each (a second, profiled run: the timings above are not inflated by the profiler) by
cumulative time.

Run: python -m bench.engine_speed [--sim 1] [--videos 0] [--fit-share 1.0] [--profile 25]
(all 80 videos: 47 s wall, 2.9 GB peak; `--videos 20`: 10 s, 0.85 GB; `/usr/bin/time`, code of
2026-12-04, 2-core AMD EPYC with AVX-512, the other core busy)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

from bench.simulate import FIXTURE, ROOT, restrict, setup
from vce.post.engine import engine_submission, fit_engine, gate, tuning_timeline


def _kind(policy) -> str:
    """A policy's kind, with its detector for runs ("runs/ar", "runs/threshold")."""
    data = policy.to_dict()
    return f"{data['kind']}/{data['detector']}" if data["kind"] == "runs" else data["kind"]


def timed(call):
    """(result, CPU seconds, wall seconds) of `call()`."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = call()
    return result, round(time.process_time() - cpu, 2), round(time.perf_counter() - wall, 2)


def profiled(call, top: int) -> list:
    """The `top` entries of a cProfile of `call()` by cumulative time: [calls, cumulative s, own s, where]."""
    profile = cProfile.Profile()
    profile.runcall(call)
    stats = pstats.Stats(profile, stream=io.StringIO())
    stats.sort_stats("cumulative")
    rows = []
    for func in stats.fcn_list[:top]:
        calls, _, own, cumulative, _ = stats.stats[func]
        where = f"{func[0].replace(str(ROOT) + '/', '')}:{func[1]}({func[2]})"
        rows.append([calls, round(cumulative, 2), round(own, 2), where])
    return rows


def simulated(args):
    """(ground truth, frame probabilities) of the chosen simulator on the chosen videos."""
    gt, frame_labels, rng, _, threshold_params = setup(args)
    if args.sim == 1:
        from bench.simulate import simulate_probs
        frame_probs = simulate_probs(frame_labels, 0.9, rng)
    elif args.sim == 2:
        from bench.simulate2 import defaults, simulate_probs2
        frame_probs, _ = simulate_probs2(frame_labels, rng, defaults())
    else:
        from bench.simulate3 import defaults as defaults3
        from bench.simulate3 import simulate_probs3
        frame_probs, _ = simulate_probs3(frame_labels, rng, defaults3())
    return gt, frame_probs, threshold_params.engine, rng


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", type=int, choices=(1, 2, 3), default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--videos", type=int, default=0, help="a random subset of this many videos (0: all 80)")
    parser.add_argument("--fit-share", type=float, default=1.0, help="share of the videos the engine is fitted on")
    parser.add_argument("--profile", type=int, default=0, help="also profile both, this many entries (0: no profile)")
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = parser.parse_args(argv)
    gt, frame_probs, params, rng = simulated(args)
    video_ids = [v["video_id"] for v in gt["videos"]]
    fit_ids = set(rng.permutation(video_ids)[: max(int(round(len(video_ids) * args.fit_share)), 1)].tolist())
    fit_probs = frame_probs[frame_probs["video_id"].isin(fit_ids)]
    gt_fit = restrict(gt, fit_ids)

    def fit():
        gate._FITS.clear()  # the presence fits' cache: every run fits from scratch
        return fit_engine(tuning_timeline(fit_probs, params), gt_fit, params)

    engine, fit_cpu, fit_wall = timed(fit)
    (submission, _), apply_cpu, apply_wall = timed(lambda: engine_submission(frame_probs, engine))
    out = {"sim": args.sim, "seed": args.seed, "videos": len(video_ids), "fit_videos": len(fit_ids),
           "fit_frames": len(fit_probs), "frames": len(frame_probs),
           "fit": {"cpu_s": fit_cpu, "wall_s": fit_wall},
           "events": {"cpu_s": apply_cpu, "wall_s": apply_wall,
                      "events": sum(len(v["events"]) for v in submission["videos"])},
           "policies": {label: _kind(policy) for label, policy in engine.policies.items()}}
    print(json.dumps({key: out[key] for key in ("frames", "fit", "events")}), file=sys.stderr, flush=True)
    if args.profile:
        out["profile_fit"] = profiled(fit, args.profile)
        out["profile_events"] = profiled(lambda: engine_submission(frame_probs, engine), args.profile)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
