"""One demo training step under each CPU numerics setting: what pinning the kernels costs.

Builds the demo's frame model (params.yaml's `model` section, random prompt embeddings of the
right shape), and times forward + backward + AdamW on one batch of `train.batch_size` random
64-pixel frames, in a fresh process per setting:

- `native`: this machine's kernels and thread count (`base.exact_cpu: false`);
- `native_1_thread`: the same on one thread (the kernels' cost alone, also on a loaded machine);
- `exact`: the switch's settings (`vce.core.exact.SETTINGS`: AVX2 kernels pinned, one thread);
- `baseline`: the same with ATen's and MKL's baseline (SSE2) paths instead of AVX2, the switch's
  first version.

Prints one JSON object: median seconds per step over `--repeats` rounds of `--steps` steps, the
ratios to native, and the load average (two threads on a busy 2-core machine are slower than one). The model and batch are the demo's; the DataLoader is not in it (decode
workers run on the other core).

    python -m bench.exact_step [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from vce.core import exact

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "native": {},
    "native_1_thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    "exact": exact.exact_env({}),
    "baseline": {**exact.exact_env({}), "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                 "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}

CHILD = """
import json, statistics, sys, time
import torch
import yaml
import vce.model  # configures torch under the marker
from vce.core.params import from_dict, load_params
from vce.core.labels import NUM_LABELS
from vce.model.frame_model import ModelParams, create_model

params = load_params("params.yaml")
torch.manual_seed(0)
model = create_model(from_dict(ModelParams, params["model"], "model"), torch.randn(NUM_LABELS, 64))
model.train()
size = params["demo"]["image_size"]
x = torch.randn(params["train"]["batch_size"], 3, size, size)
optimiser = torch.optim.AdamW(model.parameters(), 1e-3)


def step():
    out = model(x)
    loss = sum(v.float().mean() for v in (out.values() if isinstance(out, dict) else [out]) if torch.is_tensor(v))
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()


steps, repeats = int(sys.argv[1]), int(sys.argv[2])
for _ in range(3):
    step()
rounds = []
for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps):
        step()
    rounds.append((time.perf_counter() - start) / steps)
print(json.dumps({"s_per_step": round(statistics.median(rounds), 4), "aten": torch.backends.cpu.get_cpu_capability(),
                  "threads": torch.get_num_threads()}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per setting (median)")
    args = parser.parse_args(argv)
    clean = {k: v for k, v in os.environ.items() if k not in exact.SETTINGS and k != exact.MARKER}
    results = {}
    for name, settings in SETTINGS.items():
        run = subprocess.run([sys.executable, "-c", CHILD, str(args.steps), str(args.repeats)], cwd=ROOT,
                             env={**clean, **settings}, capture_output=True, text=True)
        if run.returncode:
            sys.exit(f"{name} failed:\n{run.stderr[-2000:]}")
        results[name] = json.loads(run.stdout.strip().splitlines()[-1])
    native = results["native"]["s_per_step"]
    summary = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "steps": args.steps, "repeats": args.repeats, "settings": results,
               **{f"{name}_over_native": round(r["s_per_step"] / native, 2) for name, r in results.items()
                  if name != "native"}}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
