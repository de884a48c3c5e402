"""How to launch a converted entry point (pitfalls.md section E)."""

from __future__ import annotations

import os
import shlex
from typing import List, Sequence


def _script(path: str) -> str:
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return shlex.quote(rel)


def single_node(path: str, nproc: str = "gpu", args: Sequence[str] = ()) -> str:
    extra = " " + " ".join(shlex.quote(a) for a in args) if args else ""
    return f"torchrun --standalone --nproc_per_node={nproc} {_script(path)}{extra}"


def multi_node(path: str, nproc: str = "gpu", nnodes: str = "2", args: Sequence[str] = ()) -> str:
    job = os.path.splitext(os.path.basename(path))[0] or "job"
    extra = " " + " ".join(shlex.quote(a) for a in args) if args else ""
    return (
        f"torchrun --nnodes={nnodes} --nproc_per_node={nproc} --rdzv_backend=c10d "
        f"--rdzv_endpoint=HOST:29400 --rdzv_id={job} {_script(path)}{extra}"
    )


def instructions(entries: Sequence[str], nproc: str = "gpu") -> List[str]:
    """Lines telling how to run each converted entry point."""
    if not entries:
        return []
    lines = ["Launch on one machine (one process per GPU; on CPU give a number, e.g. 2):"]
    lines += [f"  {single_node(e, nproc)}" for e in entries]
    lines.append("On several machines (the same command on every node; HOST = node 0's address):")
    lines += [f"  {multi_node(e, nproc)}" for e in entries]
    lines.append("Without torchrun, `python SCRIPT` still runs it as a single process.")
    return lines
