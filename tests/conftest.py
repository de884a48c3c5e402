"""Shared test helpers: paths, fixture discovery, running scripts under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SUPPORT = Path(__file__).resolve().parent / "support"
RANK_LOG = SUPPORT / "rank_log.py"

#: Set DP2DDP_UPDATE_GOLDEN=1 to rewrite the expected outputs (then review the diff!).
UPDATE_GOLDEN = os.environ.get("DP2DDP_UPDATE_GOLDEN") == "1"


@pytest.fixture(autouse=True)
def _no_cache_by_default(monkeypatch):
    """Tests are hermetic: no run reuses what another stored in a ``.dp2ddp_cache``
    (the caches' own tests turn them back on)."""
    monkeypatch.setenv("DP2DDP_NO_CACHE", "1")


def script_env(tmp: Path) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONHASHSEED="0",
        DP2DDP_WRITE_LOG=str(tmp / "writes"),
        PYTHONDONTWRITEBYTECODE="1",
        # no proxy / network; keep torch quiet
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def torchrun_cmd(nproc: int = 2) -> List[str]:
    # --tee 3: every rank's stdout and stderr (tracebacks) in the output, prefixed by rank
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "--tee", "3"]


@dataclass
class Run:
    """A finished script run: exit code, output and which ranks wrote which files."""

    returncode: int
    output: str
    writes: List[dict] = field(default_factory=list)

    #: per rank (as tests/support/rank_log.py records them): each optimizer's
    #: parameters at the end, and the indices each training pass over a DataLoader drew
    states: List[dict] = field(default_factory=list)

    def writers_of(self, path: Path) -> List[Optional[str]]:
        target = str(path.resolve())
        return [w["rank"] for w in self.writes if w["path"] == target]

    def ranks_in_sync(self, tolerance: float = 1e-6) -> Optional[str]:
        """None when every rank ends with the same parameters in every optimizer,
        else what differs."""
        if len(self.states) < 2:
            return f"{len(self.states)} rank(s) recorded their state"
        first = self.states[0]
        for other in self.states[1:]:
            if len(other["params"]) != len(first["params"]):
                return "the ranks built different numbers of optimizers"
            for k, (a, b) in enumerate(zip(first["params"], other["params"])):
                if len(a) != len(b):
                    return f"optimizer {k}: the ranks train different parameters"
                worst = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
                if worst > tolerance:
                    return f"optimizer {k}: ranks {first['rank']} and {other['rank']} differ by {worst:.3g}"
        return None

    def training_sharded(self) -> Optional[str]:
        """None when, in every training epoch, the ranks drew disjoint indices
        (DistributedSampler's padding may repeat fewer than one per rank), else why not."""
        if len(self.states) < 2:
            return f"{len(self.states)} rank(s) recorded their state"
        epochs = [s["epochs"] for s in self.states]
        if not epochs[0]:
            return "no training pass over a DataLoader was seen"
        if len({len(e) for e in epochs}) != 1:
            return f"the ranks ran {[len(e) for e in epochs]} training passes"
        for n, passes in enumerate(zip(*epochs)):
            seen = [set(p) for p in passes]
            shared = set.intersection(*seen)
            if len(shared) >= len(seen):
                return f"training pass {n}: the ranks drew {len(shared)} indices in common"
        return None


def run_script(
    workdir: Path,
    entry: str,
    args: List[str],
    distributed: bool,
    cuda_shim: bool = False,
    nproc: int = 2,
    timeout: int = 240,
) -> Run:
    logs = workdir.parent / f"{workdir.name}-logs"
    logs.mkdir(exist_ok=True)
    cmd = (torchrun_cmd(nproc) if distributed else [sys.executable]) + [str(RANK_LOG)]
    if cuda_shim:
        cmd.append("--cuda-shim")
    cmd += [entry, *args]
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=script_env(logs),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    writes = []
    for log in sorted(logs.glob("writes.*.jsonl")):
        writes += [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    states = [json.loads(log.read_text()) for log in sorted(logs.glob("writes.*.state.json"))]
    return Run(proc.returncode, proc.stdout, writes, states)


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
