"""Does the demo's training step give the same bytes on another CPU vendor? A check under emulation.

Runs two training steps of the demo's frame model (params.yaml's `model` section, the project's
loss, fused AdamW as the trainer builds it) on a fixed batch under the exact pin
(`vce.core.exact.SETTINGS`), natively and under qemu-user with other CPU models (`--cpu`, e.g.
EPYC-Rome-v1 for an AMD CPUID, Haswell-v4 for an Intel one: the same binary sees another vendor
and feature set), and prints one JSON object with a hash of the weights after the steps per CPU.
qemu emulates every IEEE operation exactly, so a difference between two emulated vendors is the
libraries' vendor dispatch; a difference between emulated and native Intel is an approximate
instruction (rcpps/rsqrtps) that real CPUs of two vendors may also answer differently.

    apt-get install -y qemu-user
    python -m bench.vendor_step --cpu EPYC-Rome-v1 Haswell-v4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from vce.core import exact

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import hashlib, json
import torch
import vce.model  # configures torch under the marker
from vce.core.labels import NUM_LABELS
from vce.core.params import from_dict, load_params
from vce.model.frame_model import ModelParams, create_model

params = load_params("params.yaml")
torch.manual_seed(0)
model = create_model(from_dict(ModelParams, params["model"], "model"), torch.randn(NUM_LABELS, 64))
model.train()
size = params["demo"]["image_size"]
g = torch.Generator().manual_seed(1)
x = torch.rand(8, 3, size, size, generator=g)
y = (torch.rand(8, NUM_LABELS, generator=g) > 0.8).float()
optimiser = torch.optim.AdamW(model.param_groups(1e-3, 1e-3, 0.05), fused=True)
for _ in range(2):
    out = model(x)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    loss = bce(out["cls_logits"].float(), y) + bce(out["con_logits"].float(), y)
    optimiser.zero_grad()
    loss.backward()
    optimiser.step()
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
print(json.dumps({"loss": float(loss), "weights": hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16],
                  "aten": torch.backends.cpu.get_cpu_capability()}))
"""


def run(cpu: str) -> dict:
    env = exact.exact_env({k: v for k, v in os.environ.items() if k != exact.MARKER})
    env["PYTHONPATH"] = str(ROOT)
    prefix = [] if cpu == "native" else ["qemu-x86_64", "-cpu", cpu]
    done = subprocess.run([*prefix, sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{cpu} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.vendor_step", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", nargs="+", default=["EPYC-Rome-v1", "Haswell-v4"], help="qemu CPU models")
    args = parser.parse_args(argv)
    if args.cpu and not shutil.which("qemu-x86_64"):
        sys.exit("qemu-x86_64 not found: apt-get install -y qemu-user")
    results = {cpu: run(cpu) for cpu in ["native", *args.cpu]}
    same = len({r["weights"] for r in results.values()}) == 1
    print(json.dumps({"settings": exact.SETTINGS, "results": results, "all_equal": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
