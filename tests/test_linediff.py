"""dp2ddp.linediff: opcodes that cover both sides and match only equal lines, the
same as difflib's on small inputs, and on large files with repeated lines."""

from __future__ import annotations

import difflib
import random

import pytest

from dp2ddp import linediff


def _valid(ops, a, b):
    i = j = 0
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j), "the opcodes leave a gap or overlap"
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
        else:
            assert (tag == "insert") == (i1 == i2) and (tag == "delete") == (j1 == j2)
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))


def _block(n):
    return [f"class Net{n}(nn.Module):", "    def forward(self, x):", "        return x", "",
            f"def train_{n}():", "    optimizer.zero_grad()", "    loss.backward()", "    optimizer.step()", ""]


def _edited(lines, seed):
    rng = random.Random(seed)
    out = []
    for line in lines:
        roll = rng.random()
        if roll < 0.05:
            continue  # deleted
        if roll < 0.10:
            out.append(line + "  # changed")
            continue
        out.append(line)
        if roll > 0.95:
            out.append("    if dist.get_rank() == 0:")  # inserted, repeated everywhere
    return out


def test_small_inputs_get_difflibs_own_opcodes():
    a = sum((_block(n) for n in range(20)), [])
    b = _edited(a, 1)
    assert len(a) * len(b) <= linediff.SMALL
    assert linediff.opcodes(a, b) == difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


@pytest.mark.parametrize("seed", range(5))
def test_large_files_with_repeated_lines(seed):
    a = sum((_block(n) for n in range(600)), [])  # 5,400 lines, most of them repeated
    b = _edited(a, seed)
    ops = linediff.opcodes(a, b)
    _valid(ops, a, b)
    matched = sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag == "equal")
    kept = sum(1 for line in b if not line.endswith("# changed") and not line.startswith("    if dist"))
    # every line the edit kept is matched, as an exact diff would (the unique lines anchor each block)
    assert matched >= 0.98 * kept


def test_no_unique_line_at_all():
    a = ["x"] * 3000 + ["y"] * 3000
    b = ["y"] * 2500 + ["x"] * 2000
    ops = linediff.opcodes(a, b)
    _valid(ops, a, b)


def test_empty_sides():
    for a, b in (([], []), (["a"] * 600, []), ([], ["b"] * 600)):
        _valid(linediff.opcodes(a, b), a, b)
