"""How to launch a converted entry point (pitfalls.md section E)."""

from __future__ import annotations

import os
import re
import shlex
from typing import List, Optional, Sequence, Tuple


_RELATIVE_IMPORT = re.compile(rb"^\s*from\s+\.", re.MULTILINE)


def module_form(path: str) -> Optional[Tuple[str, str]]:
    """(folder to run from, dotted module) for an entry point inside a package
    that imports relatively (``from .model import Net``): it only runs as
    ``python -m pkg.main`` -- and so under ``torchrun -m pkg.main`` -- from the
    folder above the package.  None for a plain script."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return None
    try:
        with open(path, "rb") as handle:
            if not _RELATIVE_IMPORT.search(handle.read()):
                return None
    except OSError:
        return None
    parts = [os.path.splitext(os.path.basename(path))[0]]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        parts.insert(0, os.path.basename(folder))
        folder = os.path.dirname(folder)
    return folder, ".".join(parts)


def _script(path: str) -> str:
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return shlex.quote(rel)


def _target(path: str) -> Tuple[str, str]:
    """(``cd DIR && `` or "", what torchrun runs)."""
    form = module_form(path)
    if form is None:
        return "", _script(path)
    root, module = form
    rel = os.path.relpath(root)
    return ("" if rel == "." else f"cd {shlex.quote(rel)} && "), f"-m {module}"


def job_name(stem: str) -> str:
    """A word for an rdzv id or a Slurm job name (a file named ``tr ain.py``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "job"


def single_node(path: str, nproc: str = "gpu", args: Sequence[str] = ()) -> str:
    extra = " " + " ".join(shlex.quote(a) for a in args) if args else ""
    cd, target = _target(path)
    return f"{cd}torchrun --standalone --nproc_per_node={nproc} {target}{extra}"


def multi_node(path: str, nproc: str = "gpu", nnodes: str = "2", args: Sequence[str] = ()) -> str:
    job = job_name(os.path.splitext(os.path.basename(path))[0])
    extra = " " + " ".join(shlex.quote(a) for a in args) if args else ""
    cd, target = _target(path)
    return (
        f"{cd}torchrun --nnodes={nnodes} --nproc_per_node={nproc} --rdzv_backend=c10d "
        f"--rdzv_endpoint=HOST:29400 --rdzv_id={job} {target}{extra}"
    )


#: entry points whose launch commands are printed one by one; past it, the first few
#: and a count (300 entry points printed 606 lines)
LISTED_ENTRIES = 5


def instructions(entries: Sequence[str], nproc: str = "gpu") -> List[str]:
    """Lines telling how to run each converted entry point (the first
    ``LISTED_ENTRIES - 2`` and a count where there are more than ``LISTED_ENTRIES``)."""
    if not entries:
        return []
    shown = list(entries) if len(entries) <= LISTED_ENTRIES else list(entries[: LISTED_ENTRIES - 2])
    more = len(entries) - len(shown)
    rest = (
        [f"  ... and {more} more entry point{'s' if more != 1 else ''}, likewise "
         "(--emit-launch DIR writes the launch scripts of every one)"]
        if more else []
    )
    lines = ["Launch on one machine (one process per GPU; on CPU give a number, e.g. 2):"]
    lines += [f"  {single_node(e, nproc)}" for e in shown] + rest
    lines.append("On several machines (the same command on every node; HOST = node 0's address):")
    lines += [f"  {multi_node(e, nproc)}" for e in shown] + rest
    lines.append("Without torchrun, `python SCRIPT` still runs it as a single process.")
    return lines
