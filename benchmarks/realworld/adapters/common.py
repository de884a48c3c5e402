"""Helpers the adapters share: identical textual edits on a tree, the probe, stubs."""
import os
import re
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def edit(root, rel, *pairs, count=1):
    """Replace each (old, new) in root/rel; old must occur (exactly `count` times
    unless count is None)."""
    p = Path(root) / rel
    text = p.read_text()
    for old, new in pairs:
        n = text.count(old)
        assert n >= 1 and (count is None or n == count), f"{rel}: anchor found {n}x: {old!r}"
        text = text.replace(old, new)
    p.write_text(text)


def sub(root, rel, pattern, repl, min_count=1):
    """Regex replace (for anchors whose surroundings the conversion may rewrite)."""
    p = Path(root) / rel
    text, n = re.subn(pattern, repl, p.read_text(), flags=re.M)
    assert n >= min_count, f"{rel}: pattern found {n}x: {pattern!r}"
    p.write_text(text)


def append(root, rel, text):
    p = Path(root) / rel
    p.write_text(p.read_text() + text)


def install_probe(root, entry):
    """Copy probe.py next to the entry script as rw_probe.py, import it first."""
    entry = Path(root) / entry
    shutil.copy(HERE / "probe.py", entry.parent / "rw_probe.py")
    lines = entry.read_text().splitlines(keepends=True)
    at = 0
    for i, line in enumerate(lines):
        if line.startswith("from __future__"):
            at = i + 1
    lines.insert(at, "import rw_probe  # noqa\n")
    entry.write_text("".join(lines))


def install_stub(root, where, name="torchvision"):
    """Copy stubs/<name> (tiny synthetic stand-in) into root/where."""
    dst = Path(root) / where / name
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(HERE / "stubs" / name, dst)


def trust_pickles(root, entry):
    """torch>=2.6 loads weights only by default; these old scripts pickle whole models."""
    edit(root, entry, ("import rw_probe  # noqa\n", "import rw_probe  # noqa\n"
                       "import functools, torch; torch.load = functools.partial(torch.load, weights_only=False)  # noqa\n"))


def cuda_on_cpu(root, entry):
    """A CUDA-only script (bare .cuda() calls) on this CPU machine: .cuda() is the identity."""
    edit(root, entry, ("import rw_probe  # noqa\n", "import rw_probe  # noqa\n"
                       "import torch; torch.Tensor.cuda = lambda t, *a, **k: t; "
                       "torch.nn.Module.cuda = lambda m, *a, **k: m  # noqa\n"))
