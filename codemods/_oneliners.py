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
from typing import List, Tuple

import libcst as cst

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
        #: (code before, code after) of each statement spelled out, as the module renders them
        self.spelled: List[Tuple[str, str]] = []

    def _wanted(self, node: cst.CSTNode) -> bool:
        return bool(WORDS.search(self.module.code_for_node(node)))

    def leave_SimpleStatementSuite(
        self, original_node: cst.SimpleStatementSuite, updated_node: cst.SimpleStatementSuite
    ) -> cst.BaseSuite:
        if not self._wanted(original_node):
            return updated_node
        lines = _lines(updated_node.body, updated_node.trailing_whitespace)
        return cst.IndentedBlock(body=lines)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ):
        if len(updated_node.body) < 2 or not self._wanted(original_node):
            return updated_node
        lines = _lines(updated_node.body, updated_node.trailing_whitespace)
        lines[0] = lines[0].with_changes(leading_lines=updated_node.leading_lines)
        return cst.FlattenSentinel(lines)

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        split = isinstance(original_node, cst.SimpleStatementLine) and isinstance(result, cst.FlattenSentinel)
        if split or isinstance(original_node, cst.BaseCompoundStatement) and _suites(original_node) != _suites(result):
            before = self.module.code_for_node(original_node)
            nodes = result.nodes if isinstance(result, cst.FlattenSentinel) else [result]
            after = "".join(self.module.code_for_node(n) for n in nodes)
            self.spelled.append((before, after))
        return result


def _suites(node: cst.CSTNode) -> List[bool]:
    """Which of the blocks of a compound statement are one-line suites."""
    found = []
    for name in ("body", "orelse", "handlers", "finalbody"):
        value = getattr(node, name, None)
        for part in value if isinstance(value, (list, tuple)) else [value]:
            body = part.body if isinstance(part, (cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)) else part
            if isinstance(body, cst.BaseSuite):
                found.append(isinstance(body, cst.SimpleStatementSuite))
    return found


def _lines(small: List[cst.BaseSmallStatement], trailing: cst.TrailingWhitespace) -> List[cst.SimpleStatementLine]:
    """One line per small statement; the comment of the one-liner on the last."""
    lines = [
        cst.SimpleStatementLine(body=[s.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)]) for s in small
    ]
    lines[-1] = lines[-1].with_changes(trailing_whitespace=trailing)
    return lines


def expand(module: cst.Module) -> Tuple[cst.Module, List[Tuple[str, str]]]:
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


def restore(code: str, spelled: List[Tuple[str, str]]) -> str:
    """Put back each spelled-out statement that the transforms left as it was:
    its lines, found once in ``code`` under any indentation, become the original
    one-liner again (indented alike)."""
    for before, after in spelled:
        after_lines = after.splitlines(keepends=True)
        lines = code.splitlines(keepends=True)
        hits = []
        for start in range(len(lines) - len(after_lines) + 1):
            first = lines[start]
            indent = first[: len(first) - len(first.lstrip(" \t"))]
            if all(
                lines[start + i] == (indent + expected if expected.strip() else expected)
                or (not expected.strip() and lines[start + i] == expected)
                for i, expected in enumerate(after_lines)
            ):
                hits.append((start, indent))
        if len(hits) != 1:
            continue  # changed by a transform (or not to be told apart): kept spelled out
        start, indent = hits[0]
        before_lines = [
            (indent + line if line.strip() else line) for line in before.splitlines(keepends=True)
        ]
        lines[start : start + len(after_lines)] = before_lines
        code = "".join(lines)
    return code
