"""How much `dp2ddp verify` costs: wall time of whole runs, and the harness's
overhead on the script's own step time.

    python benchmarks/verify_overhead.py [--steps 300] [--repeat 3]

Prints medians. Not part of the test-suite (numbers, not assertions).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "verify" / "train.py"

STEP_LOOP = r'''
import os, sys, time, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
steps = int(sys.argv[1])
torch.manual_seed(0)
data = TensorDataset(torch.randn(64 * 16, 32), torch.randint(0, 4, (64 * 16,)))
loader = DataLoader(data, batch_size=16)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
done, t0 = 0, None
while done < steps:
    for x, y in loader:
        if done == 10:
            t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        done += 1
        if done >= steps:
            break
per_step = (time.perf_counter() - t0) / (steps - 10)
print(f"STEP {per_step * 1e6:.1f}")
'''


def step_time(steps: int, harnessed: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(STEP_LOOP)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        cmd = [sys.executable, str(script), str(steps)]
        if harnessed:
            env.update(
                DP2DDP_VERIFY_DIR=tmp,
                DP2DDP_VERIFY_MODE="original",
                DP2DDP_VERIFY_MAX_STEPS=str(steps + 1),
                DP2DDP_VERIFY_EPOCH_BATCHES="0",
            )
            cmd = [sys.executable, "-m", "dp2ddp.verify.harness", str(script), str(steps)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        return float(out.split("STEP")[1].split()[0])


def verify_wall(launcher: str, nnodes: int = 1) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dp2ddp", "verify", "--launcher", launcher, "--nnodes", str(nnodes),
         str(SCRIPT)],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        check=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    plain = statistics.median(step_time(args.steps, False) for _ in range(args.repeat))
    hooked = statistics.median(step_time(args.steps, True) for _ in range(args.repeat))
    print(f"step time, plain script          : {plain:8.1f} us")
    print(f"step time, under the verify harness: {hooked:8.1f} us  ({(hooked / plain - 1) * 100:+.1f} %)")
    for launcher, nnodes in (("fork", 1), ("torchrun", 1), ("torchrun", 2)):
        wall = statistics.median(verify_wall(launcher, nnodes) for _ in range(args.repeat))
        print(f"dp2ddp verify, {launcher:<8} nnodes={nnodes}: {wall:6.2f} s wall (2 processes per node)")


if __name__ == "__main__":
    main()
