"""Big inputs: a 50,000-line script and a folder of 10,000 files.

    python benchmarks/big_inputs.py [--lines 50000] [--files 10000]

Runs `dp2ddp convert --check` and `dp2ddp lint` on each (in a child process)
and prints wall time and peak memory (max RSS).  Not part of the test-suite.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = (ROOT / "fixtures" / "e2e" / "dp_classifier" / "before" / "train.py").read_text()

BLOCK = '''

def train_{i}(model, loader, optimizer, criterion, device):
    model.train()
    total = 0.0
    for inputs, targets in loader:
        inputs, targets = inputs.cuda(), targets.cuda()
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print("epoch done", total)
    torch.save(model.state_dict(), "checkpoint_{i}.pt")
    return total
'''


def run(cmd):
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True, env=dict(os.environ)
    )
    wall = time.perf_counter() - start
    rss = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"
    return wall, rss, proc.returncode


_MEASURE = """
import resource, sys
from dp2ddp.cli import cli
try:
    cli(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, 'MiB')
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.py"
        blocks = [SCRIPT]
        i = 0
        while sum(b.count("\n") for b in blocks) < args.lines:
            blocks.append(BLOCK.format(i=i))
            i += 1
        big.write_text("".join(blocks))
        lines = big.read_text().count("\n")
        many = Path(tmp) / "many"
        for n in range(args.files):
            folder = many / f"pkg{n // 500}"
            folder.mkdir(parents=True, exist_ok=True)
            text = SCRIPT if n % 100 == 0 else f"import torch\n\n\ndef f{n}(x):\n    return torch.relu(x) * {n}\n"
            (folder / f"mod{n}.py").write_text(text)
        for label, target in ((f"one file, {lines} lines", big), (f"{args.files} files", many)):
            for cmd in (["convert", "--check", "-q", "--no-cache"], ["lint", "--no-config", "--exit-zero", "-q", "--no-cache"]):
                wall, rss, code = run([*cmd, str(target)])
                print(f"{label:<26} {' '.join(cmd[:2]):<16} {wall:7.1f} s   max RSS {rss:>9}   exit {code}")


if __name__ == "__main__":
    main()
