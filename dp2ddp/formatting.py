"""Formatting of what the transforms changed: black, only for the statements and
headers that the transforms wrote and that are over the line length; every
other line keeps the user's own layout."""

from __future__ import annotations

import threading
from typing import List, Set

import libcst as cst

from dp2ddp.codemods._model import SPELLED_MARKS


def format_changed(original: cst.Module, new: cst.Module, line_length: int = 88) -> cst.Module:
    """Black-format the statements the transforms wrote that are over ``line_length``."""
    if original.deep_equals(new):
        return new
    seen = set()

    class Collect(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            seen.add(original.code_for_node(node.with_changes(leading_lines=())))

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, _HEADERS):
                seen.add(original.code_for_node(_header_only(node)))
            return super().on_visit(node)

    original.visit(Collect())
    return new.visit(_Reformat(new, seen, line_length))


class _Reformat(cst.CSTTransformer):
    def __init__(self, module: cst.Module, seen: Set[str], line_length: int) -> None:
        super().__init__()
        self.module = module
        self.seen = seen
        self.line_length = line_length
        self.indents: List[str] = []

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.indents.append(node.indent if node.indent is not None else self.module.default_indent)

    def leave_IndentedBlock(self, original_node, updated_node):
        self.indents.pop()
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        bare = updated_node.with_changes(leading_lines=())
        code = self.module.code_for_node(bare)
        if code in self.seen:
            return updated_node
        indent = "".join(self.indents)
        width = len(indent.expandtabs(4))
        if all(width + len(SPELLED_MARKS.sub("", line)) <= self.line_length for line in code.splitlines()):
            return updated_node  # (a respelling mark, gone from the output, takes no room)
        try:
            formatted = _black_format(code, self.line_length - width)
            if "\t" in self.module.default_indent:
                formatted = _tab_indented(formatted)
            body = cst.parse_module(formatted).body
        except Exception as exc:  # the code stays valid, only unformatted: say so
            FORMAT_FAILURES.append(f"black could not format a changed statement: {exc!r}")
            return updated_node
        if not body or not all(isinstance(s, cst.SimpleStatementLine) for s in body):
            return updated_node
        first = body[0].with_changes(leading_lines=updated_node.leading_lines)
        if len(body) == 1:
            return first
        return cst.FlattenSentinel([first, *body[1:]])

    def on_leave(self, original_node, updated_node):
        result = super().on_leave(original_node, updated_node)
        if isinstance(result, _HEADERS):
            result = self._reformat_header(result)
        return result

    def _reformat_header(self, node):
        """A ``for``/``if``/``while``/``with`` header the transforms made too long."""
        header = self.module.code_for_node(_header_only(node))
        if header in self.seen:
            return node
        first_line = header.splitlines()[0] if header else ""
        width = len("".join(self.indents).expandtabs(4))
        if width + len(SPELLED_MARKS.sub("", first_line)) <= self.line_length:
            return node
        try:
            formatted = _black_format(header, self.line_length - width)
            new = cst.parse_module(formatted).body
        except Exception as exc:
            FORMAT_FAILURES.append(f"black could not format a changed header: {exc!r}")
            return node
        if len(new) != 1 or type(new[0]) is not type(node):
            return node
        changes = {"body": node.body, "leading_lines": node.leading_lines}
        if hasattr(node, "orelse"):
            changes["orelse"] = node.orelse
        return new[0].with_changes(**changes)


_HEADERS = (cst.For, cst.While, cst.If, cst.With)


_BLACK_LOCK = threading.Lock()
#: black failures of the current process (tests assert it stays empty)
FORMAT_FAILURES: List[str] = []


def _black_format(code: str, width: int) -> str:
    """Black, for the oldest supported Python (no syntax the user's interpreter
    might lack).  Serialised: black's parser caches are not safe to fill from
    several threads at once, and a failure there would silently leave the code
    unformatted."""
    with _BLACK_LOCK:  # the first import of black, too, from one thread at a time
        import black

        mode = black.Mode(line_length=max(40, width), target_versions={black.TargetVersion.PY38})
        return black.format_str(code, mode=mode)


def _tab_indented(code: str) -> str:
    """Black's continuation lines indented with tabs, as the rest of a tab-indented
    file is -- unless that would change the code (a string over several lines)."""
    import ast
    import re

    tabbed = re.sub(r"(?m)^((?:    )+)", lambda found: "\t" * (len(found.group(1)) // 4), code)
    try:
        same = ast.dump(ast.parse(tabbed)) == ast.dump(ast.parse(code))
    except SyntaxError:
        same = False
    return tabbed if same else code


def _header_only(node):
    """The statement with its body reduced to ``pass`` (and no else)."""
    body = cst.IndentedBlock(body=[cst.SimpleStatementLine([cst.Pass()])])
    changes = {"body": body, "leading_lines": ()}
    if hasattr(node, "orelse"):
        changes["orelse"] = None
    return node.with_changes(**changes)
