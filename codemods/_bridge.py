"""The one bridge between the two trees' positions.

Rules decide on the standard library's ``ast``; fixes edit with LibCST.  Both
count lines from 1, but in a line ``ast`` counts UTF-8 *bytes* (``col_offset``)
and LibCST counts *characters* (``PositionProvider``): on a line with a
non-ASCII name before the spot (``训练集, 验证集 = random_split(ds, [48, 16])``)
the two differ.  Every place that finds the ``ast`` node of a LibCST node, or
the other way round, goes through these two functions.
"""

from __future__ import annotations

from typing import Sequence, Tuple


def character_column(lines: Sequence[str], line: int, byte_offset: int) -> int:
    """LibCST's 1-based column of the spot ``ast`` puts at ``byte_offset`` of ``line``."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return len(text.encode("utf-8")[:byte_offset].decode("utf-8", "replace")) + 1


def byte_offset(lines: Sequence[str], line: int, character_column: int) -> int:
    """``ast``'s ``col_offset`` of the spot LibCST puts at 1-based ``character_column``."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return len(text[: character_column - 1].encode("utf-8"))


def cst_position(lines: Sequence[str], node) -> Tuple[int, int]:
    """(line, 1-based character column) of an ``ast`` node, as LibCST counts them."""
    return node.lineno, character_column(lines, node.lineno, node.col_offset)
