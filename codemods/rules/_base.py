"""The lint rule base class and its diagnostics.

A rule is a class in its own module of this package (adding the file is the
whole registration).  It carries its stable ``CODE``, a ``NAME`` that names the
bad pattern, its ``SEVERITY``, the ``MESSAGE`` that says what to do, whether a fix
exists and how safe it is (``FIX``: "safe" = behaviour kept, "unsafe" = review
it), which convert transforms make that fix (``FIX_TRANSFORMS``), and its docs in
the class docstring with the sections What it does / Why is this bad? / Example /
Use instead / Fix safety.  Positive and negative examples live in
``fixtures/rules/<CODE>/``.

Rules look at the standard library's ``ast`` (see ``_analysis``), so that lint
stays fast; ``TRIGGERS`` says which words a file must contain for the rule to
be able to fire -- any one of the alternatives, an alternative being a word or a
tuple of words that must all occur ("istributed" matches ``torch.distributed``
and ``DistributedSampler``) -- and a file in which no selected rule can fire is
never parsed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Iterator, List, Optional, Tuple

from .._analysis import Source

SEVERITIES = ("info", "warning", "error")
SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety")


@dataclass
class Diagnostic:
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    code: str
    name: str
    severity: str
    message: str
    #: None, or {"safety": "safe"|"unsafe", "description": ..., "edits": [...] (with --fix-edits)}
    fix: Optional[Dict[str, object]] = None

    def to_dict(self) -> Dict[str, object]:
        return {
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "code": self.code,
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
        }

    @property
    def sort_key(self) -> Tuple:
        return (self.path, self.line, self.column, self.code)


class Rule:
    CODE: ClassVar[str] = ""
    NAME: ClassVar[str] = ""
    SEVERITY: ClassVar[str] = "warning"
    MESSAGE: ClassVar[str] = ""
    #: None (no fix), "safe" or "unsafe"
    FIX: ClassVar[Optional[str]] = None
    #: names of the convert transforms that fix it ("*" = the whole conversion)
    FIX_TRANSFORMS: ClassVar[Tuple[str, ...]] = ()
    FIX_DESCRIPTION: ClassVar[str] = ""
    #: alternatives (a word, or a tuple of words that must all occur); empty: always
    TRIGGERS: ClassVar[Tuple] = ()
    #: False: the pitfall is one of a training program, and a test file (pytest's and
    #: unittest's conventions, ``_analysis.is_test_module``) that uses DataParallel,
    #: a device or a loader on purpose is not reported
    IN_TESTS: ClassVar[bool] = True
    #: in the default set (as ruff's): False for a rule whose precision on real DDP
    #: code (the lint set of ``benchmarks/realworld/``) is under ``DEFAULT_PRECISION``
    #: or that gave a false error there; it then runs only when a selector names it
    #: (its code, a prefix, ``ALL``)
    DEFAULT: ClassVar[bool] = True

    @classmethod
    def can_fire(cls, text: str) -> bool:
        if not cls.TRIGGERS:
            return True
        for alternative in cls.TRIGGERS:
            words = (alternative,) if isinstance(alternative, str) else alternative
            if all(word in text for word in words):
                return True
        return False

    def check(self, src: Source) -> Iterator[Diagnostic]:
        raise NotImplementedError

    def diagnostic(self, src: Source, node: ast.AST, message: Optional[str] = None) -> Diagnostic:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        end_line = getattr(node, "end_lineno", None) or line
        end_col = getattr(node, "end_col_offset", None)
        if end_col is None:
            end_col = col
        fix = None
        if self.FIX:
            fix = {"safety": self.FIX, "description": self.FIX_DESCRIPTION}
        return Diagnostic(
            path=src.path,
            line=line,
            column=_char_column(src, line, col) + 1,
            end_line=end_line,
            end_column=_char_column(src, end_line, end_col) + 1,
            code=self.CODE,
            name=self.NAME,
            severity=self.SEVERITY,
            message=message or self.MESSAGE,
            fix=fix,
        )

    @classmethod
    def docs(cls) -> str:
        import inspect

        return inspect.cleandoc(cls.__doc__ or "")


def _char_column(src: Source, line: int, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; editors count characters."""
    if 0 < line <= len(src.lines):
        text = src.lines[line - 1]
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))
    return byte_col
