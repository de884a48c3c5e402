"""Line diffs that stay near-linear on large files.

``difflib.SequenceMatcher(None, a, b, autojunk=False)`` -- what the engine used to
map findings back to the original lines, and the hunks of ``--interactive`` and
of lint's fixes -- takes time that grows with the product of the two files'
lengths where lines repeat (``optimizer.zero_grad()``, blank lines, ``)``): on
one 2,500-line training script it was the largest part of a conversion.  Here,
as in git's ``--patience`` diff: the lines that occur once in each side anchor
the match (their longest increasing run), and only the stretches between two
anchors are matched by ``difflib`` -- they are short.  Small inputs go to
``difflib`` as before, so every small file gets the same opcodes it always got.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from typing import List, Sequence, Tuple

#: below this many line pairs (len(a) * len(b)) ``difflib`` runs on the whole
SMALL = 250_000
#: a stretch between anchors that is still this large and has no anchor of its
#: own is one replaced block (no line of it matched): bounded time on any input
LARGEST_STRETCH = 4_000_000

Opcode = Tuple[str, int, int, int, int]


def opcodes(a: Sequence[str], b: Sequence[str]) -> List[Opcode]:
    """``difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()``'s form:
    (tag, i1, i2, j1, j2) with tag equal/replace/delete/insert, covering both."""
    if len(a) * len(b) <= SMALL:
        return difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return _opcodes_of(matching_blocks(a, b), len(a), len(b))


def matching_blocks(a: Sequence[str], b: Sequence[str]) -> List[Tuple[int, int, int]]:
    """(i, j, n): a[i:i+n] == b[j:j+n], increasing in both i and j, not overlapping."""
    blocks: List[Tuple[int, int, int]] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        while alo < ahi and blo < bhi and a[alo] == b[blo]:  # common head
            blocks.append((alo, blo, 1))
            alo, blo = alo + 1, blo + 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:  # common tail
            ahi, bhi = ahi - 1, bhi - 1
            blocks.append((ahi, bhi, 1))
        if alo >= ahi or blo >= bhi:
            continue
        anchors = _unique_anchors(a, alo, ahi, b, blo, bhi)
        if not anchors:
            if (ahi - alo) * (bhi - blo) <= LARGEST_STRETCH:
                matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
                blocks.extend((alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks() if n)
            continue
        i_from, j_from = alo, blo
        for i, j in anchors:
            stack.append((i_from, i, j_from, j))
            blocks.append((i, j, 1))
            i_from, j_from = i + 1, j + 1
        stack.append((i_from, ahi, j_from, bhi))
    return _merged(sorted(blocks))


def _unique_anchors(a, alo, ahi, b, blo, bhi) -> List[Tuple[int, int]]:
    """The longest run of lines that occur once in a[alo:ahi] and once in
    b[blo:bhi], in the same order on both sides (patience sorting)."""
    in_a = Counter(a[alo:ahi])
    in_b = Counter(b[blo:bhi])
    where_in_b = {b[j]: j for j in range(blo, bhi) if in_b[b[j]] == 1}
    pairs = [(i, where_in_b[a[i]]) for i in range(alo, ahi) if in_a[a[i]] == 1 and a[i] in where_in_b]
    # longest increasing subsequence of the j's, in O(n log n)
    tails: List[int] = []  # tails[k]: the smallest j ending a run of length k + 1
    tail_index: List[int] = []
    previous: List[int] = [-1] * len(pairs)
    for index, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_index.append(index)
        else:
            tails[k] = j
            tail_index[k] = index
        previous[index] = tail_index[k - 1] if k else -1
    run: List[Tuple[int, int]] = []
    index = tail_index[-1] if tail_index else -1
    while index >= 0:
        run.append(pairs[index])
        index = previous[index]
    return run[::-1]


def _merged(blocks: List[Tuple[int, int, int]]) -> List[Tuple[int, int, int]]:
    out: List[Tuple[int, int, int]] = []
    for i, j, n in blocks:
        if out and out[-1][0] + out[-1][2] == i and out[-1][1] + out[-1][2] == j:
            out[-1] = (out[-1][0], out[-1][1], out[-1][2] + n)
        else:
            out.append((i, j, n))
    return out


def _opcodes_of(blocks: List[Tuple[int, int, int]], len_a: int, len_b: int) -> List[Opcode]:
    ops: List[Opcode] = []
    i = j = 0
    for ai, bj, size in blocks + [(len_a, len_b, 0)]:
        tag = "replace" if i < ai and j < bj else "delete" if i < ai else "insert" if j < bj else ""
        if tag:
            ops.append((tag, i, ai, j, bj))
        i, j = ai + size, bj + size
        if size:
            ops.append(("equal", ai, i, bj, j))
    return ops
