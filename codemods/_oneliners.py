"""Statements the transforms work on, one per line.

The transforms rewrite statements (a ``torch.save`` goes behind a rank check, a
``set_epoch`` goes first in an epoch loop, the process group is set up first in
the ``__main__`` block), so they expect each statement on a line of its own and
each compound statement with an indented block.  Python also allows::

    if __name__ == "__main__": main()
    for epoch in range(2): train(model, loader, opt)
    sd = model.state_dict(); torch.save(sd, "ckpt.pt")

Before the transforms run, such one-line forms that hold something the
conversion acts on (a name from ``WORDS``) are spelled out -- one statement per
line, a block under the header -- keeping their comments.  The rest of the file
keeps its form.  After the transforms, a spelled-out form that no transform
changed is put back as it was (``restore``), so that the diff shows only what
the conversion changed.
"""

from __future__ import annotations

import re
import secrets
from typing import Dict, Iterator, List, Tuple

import libcst as cst

from ._model import SPELLED_MARK

#: what the transforms act on: saving and loading, output, devices, the wrap,
#: the training step, loaders and epochs, the program's entry and exit
WORDS = re.compile(
    r"save|load|print|log|add_|writer|wandb|tqdm|open\(|set_device|cuda|device|DataParallel|"
    r"data_parallel|backward|step|DataLoader|epoch|main|exit|barrier|process_group"
)


class _Expand(cst.CSTTransformer):
    def __init__(self, module: cst.Module) -> None:
        super().__init__()
        self.module = module
        # (a mark no file already holds: ``restore`` strips exactly these)
        self.nonce = secrets.token_hex(4)
        #: (mark, code before, code after) of each statement spelled out: its first
        #: spelled-out line carries the mark, which ``restore`` finds it by
        self.spelled: List[Tuple[str, str, str]] = []
        self._records: Dict[int, int] = {}  # a spelled-out compound statement -> its record

    def _wanted(self, node: cst.CSTNode) -> bool:
        return bool(WORDS.search(self.module.code_for_node(node)))

    def _next_mark(self) -> str:
        """The mark of the statement spelled out next (its record's index)."""
        return f"{SPELLED_MARK}{self.nonce}:{len(self.spelled)}"

    def _mark(self) -> cst.TrailingWhitespace:
        return cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self._next_mark()))

    def leave_SimpleStatementSuite(
        self, original_node: cst.SimpleStatementSuite, updated_node: cst.SimpleStatementSuite
    ) -> cst.BaseSuite:
        if not self._wanted(original_node):
            return updated_node
        return cst.IndentedBlock(body=_lines(updated_node.body, updated_node.trailing_whitespace))

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ):
        if len(updated_node.body) < 2 or not self._wanted(original_node):
            return updated_node
        lines = _lines(updated_node.body, updated_node.trailing_whitespace)
        lines[0] = lines[0].with_changes(trailing_whitespace=self._mark())
        self._record(original_node, lines)
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(lines)

    def leave_MatchCase(self, original_node: cst.MatchCase, updated_node: cst.MatchCase) -> cst.MatchCase:
        # (``case 1: x = 6``: no statement of its own to mark and put back; left as written)
        return updated_node.with_changes(body=original_node.body)

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        if isinstance(original_node, cst.BaseCompoundStatement) and _suites(original_node) != _suites(result):
            result = _mark_first_block(result, _suites(original_node), self._mark())
            self._record(original_node, [result])
            self._records[id(result)] = len(self.spelled) - 1
        if isinstance(result, cst.If) and id(result.orelse) in self._records:
            # an ``elif`` renders as ``if`` on its own: its lines in the file say ``elif``
            index = self._records[id(result.orelse)]
            mark, before, after = self.spelled[index]
            self.spelled[index] = (mark, "el" + before, "el" + after)
        return result

    def _record(self, original: cst.CSTNode, nodes: List[cst.CSTNode]) -> None:
        code = self.module.code_for_node
        before = code(original.with_changes(leading_lines=()))
        after = code(nodes[0].with_changes(leading_lines=())) + "".join(code(n) for n in nodes[1:])
        self.spelled.append((self._next_mark(), before, after))


#: parts of a compound statement that hold a block of their own
_HOLDERS = (cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)


def _blocks(node: cst.CSTNode) -> Iterator[Tuple[str, int, cst.BaseSuite]]:
    """(field, position in it, block) of each block of a compound statement: its
    body, its ``else``, its handlers, its ``finally`` (an ``elif`` is a statement of
    its own)."""
    for name in ("body", "orelse", "handlers", "finalbody"):
        value = getattr(node, name, None)
        for position, part in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            block = part.body if isinstance(part, _HOLDERS) else part
            if isinstance(block, cst.BaseSuite):
                yield name, position, block


def _suites(node: cst.CSTNode) -> List[bool]:
    """Which of the blocks of a compound statement are one-line suites."""
    return [isinstance(block, cst.SimpleStatementSuite) for _, _, block in _blocks(node)]


def _mark_first_block(node: cst.CSTNode, was_one_line: List[bool], mark: cst.TrailingWhitespace) -> cst.CSTNode:
    """``node`` with ``mark`` after the colon of its first spelled-out block."""
    for (name, position, block), one_line in zip(_blocks(node), was_one_line):
        if one_line and isinstance(block, cst.IndentedBlock):
            value = getattr(node, name)
            part = value[position] if isinstance(value, (list, tuple)) else value
            block = block.with_changes(header=mark)
            part = part.with_changes(body=block) if isinstance(part, _HOLDERS) else block
            if isinstance(value, (list, tuple)):
                return node.with_changes(**{name: [*value[:position], part, *value[position + 1 :]]})
            return node.with_changes(**{name: part})
    return node


def _lines(small: List[cst.BaseSmallStatement], trailing: cst.TrailingWhitespace) -> List[cst.SimpleStatementLine]:
    """One line per small statement; the comment of the one-liner on the last."""
    lines = [
        cst.SimpleStatementLine(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]) for s in small
    ]
    lines[-1] = lines[-1].with_changes(trailing_whitespace=trailing)
    return lines


def expand(module: cst.Module) -> Tuple[cst.Module, List[Tuple[str, str, str]]]:
    """The module with its relevant one-line forms spelled out, and what was
    spelled out (for ``restore``)."""
    if not any(
        ";" in line or re.match(r"\s*(if|elif|else|for|while|with|def|try|except|finally)\b.*:\s*\S", line)
        for line in module.code.splitlines()
    ):
        return module, []  # (the usual case: no one-line form at all)
    expander = _Expand(module)
    new = module.visit(expander)
    return new, expander.spelled


def restore(code: str, spelled: List[Tuple[str, str, str]]) -> str:
    """Put back each spelled-out statement that the transforms left as it was (its
    lines, found by the mark on its first spelled-out line, are those it was spelled
    out to), and drop the marks."""
    lines = code.splitlines(keepends=True)
    for mark, before, after in reversed(spelled):  # (an outer statement first: it holds the inner ones)
        pattern = re.compile(re.escape(mark) + r"(?!\d)")
        at = [k for k, line in enumerate(lines) if pattern.search(line)]
        if len(at) != 1:
            continue
        k = at[0]
        after_lines = after.splitlines(keepends=True)
        offset = next((i for i, line in enumerate(after_lines) if pattern.search(line)), None)
        if offset is None or k < offset:
            continue
        header = lines[k]
        base = header[: len(header) - len(header.lstrip(" \t"))]
        start = k - offset
        expected = [base + line if line.strip() else line for line in after_lines]
        if lines[start : start + len(after_lines)] == expected:
            lines[start : start + len(after_lines)] = [
                base + line if line.strip() else line for line in before.splitlines(keepends=True)
            ]
    code = "".join(lines)
    for mark, _, _ in spelled:
        code = re.sub(r"[ \t]*" + re.escape(mark) + r"(?!\d)", "", code)
    return code
