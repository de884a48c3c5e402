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

    def writers_of(self, path: Path) -> List[Optional[str]]:
        target = str(path.resolve())
        return [w["rank"] for w in self.writes if w["path"] == target]


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
    return Run(proc.returncode, proc.stdout, writes)


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
