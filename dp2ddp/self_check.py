"""convert's post-condition: lint's rules on the converted program.

A conversion is either right or it says what it could not do.  After every
transform has run, the outputs are linted with the same rules ``dp2ddp lint``
uses (one decision per pitfall: convert and lint cannot disagree), and what
lint still finds there that leaves the program half-distributed -- every error
(DataParallel left, a module trained past its wrapper, a save on every rank, a
collective in a rank branch, sharded data without DDP, ...) and the warnings
that mean the ranks train apart (a wrap only under a GPU condition) or read the
same order every epoch (no ``set_epoch``) -- and that convert did not report at
that statement is reported as a spot left for a human ("manual"): the file is
then *incomplete* in the summary and convert exits 1.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from dp2ddp.codemods._model import MARKER, Finding

#: warnings that leave a converted program wrong, not only slower or noisier
HALF_DISTRIBUTED_WARNINGS = frozenset({"DDP102", "DDP205"})
#: lint's codes that speak of the same undone thing as convert's: a DataParallel
#: wrap left for a human (DDP001) leaves the model undistributed (DDP009), or
#: distributed on some paths only (DDP205)
_SAME_PITFALL = {code: frozenset({"DDP001", "DDP009", "DDP205"}) for code in ("DDP001", "DDP009", "DDP205")}
#: what lint reports about the file itself, not about its distribution
_NOT_ABOUT_THE_CONVERSION = frozenset({"DDP900", "DDP901"})
TRANSFORM = "self-check"
#: the model a DDP009 finding names ("this optimizer trains `model`, ..."): a
#: DataParallel left for a human explains it only where that wrap is of this model
#: (a teacher's wrap left says nothing of the student trained unwrapped)
_UNWRAPPED_MODEL = re.compile(r"trains `([\w.]+)`")


def leaves_it_half_distributed(code: str, severity: str) -> bool:
    """Whether a lint finding on converted code means the conversion is not done."""
    if code in _NOT_ABOUT_THE_CONVERSION:
        return False
    return severity == "error" or code in HALF_DISTRIBUTED_WARNINGS


class SelfCheck(NamedTuple):
    #: {path: the findings lint has on the output that leave the program half
    #: distributed and that convert did not report}, in the source's lines
    missed: Dict[str, List[Finding]]
    #: {path: "line:col: CODE message (why)"} of the other findings at lint's
    #: default --fail-on (warnings) that ``dp2ddp lint`` will still report on the
    #: converted file, in the output's lines: convert's summary says so, and why
    still_linted: Dict[str, List[str]]


#: why a warning lint still reports on a file converted from DataParallel is left there
_LEFT_ON_PURPOSE = {
    "DDP303": (
        "kept on purpose: the checkpoint keeps the 'module.' keys DataParallel's checkpoints had, "
        "so old and new checkpoints load alike; add '# noqa: DDP303' there to keep it so"
    ),
}


def check(outputs: Dict[str, Tuple[bytes, bytes, List[Finding]]]) -> SelfCheck:
    """{path: (source, output, convert's findings)} of the converted files -> what
    lint still finds on the outputs (``SelfCheck``)."""
    from dp2ddp.config import LintConfig
    from dp2ddp.lint import lint_sources

    if not outputs:
        return SelfCheck({}, {})
    config = LintConfig()
    linted = lint_sources({path: output for path, (_, output, _) in outputs.items()}, config)
    missed: Dict[str, List[Finding]] = {}
    still_linted: Dict[str, List[str]] = {}
    converted: Dict[str, _Output] = {}  # (built once per file, for its first finding)
    for diagnostic in linted.diagnostics:
        if not leaves_it_half_distributed(diagnostic.code, diagnostic.severity):
            if diagnostic.severity == "warning" and diagnostic.code not in _NOT_ABOUT_THE_CONVERSION:
                from_data_parallel = any(f.code == "DDP001" and f.kind == "change" for f in outputs[diagnostic.path][2])
                why = _LEFT_ON_PURPOSE.get(diagnostic.code, "") if from_data_parallel else ""
                still_linted.setdefault(diagnostic.path, []).append(
                    f"{diagnostic.line}:{diagnostic.column}: {diagnostic.code} {diagnostic.message}"
                    + (f" -- {why}" if why else "")
                )
            continue
        source, output, findings = outputs[diagnostic.path]
        if diagnostic.path not in converted:
            converted[diagnostic.path] = _Output(source, output)
        result = converted[diagnostic.path]
        if result.marked(diagnostic.line):
            continue  # a spot convert left for a human holds it (its marker is above)
        first, last = result.source_span(diagnostic.line)
        if any(f.code == diagnostic.code and first <= f.line <= last for f in findings):
            continue  # convert said so at that statement (a change, a spot or a note)
        same = _SAME_PITFALL.get(diagnostic.code, frozenset({diagnostic.code}))
        model = _UNWRAPPED_MODEL.search(diagnostic.message) if diagnostic.code == "DDP009" else None
        if any(
            f.kind == "manual" and f.code in same
            and (model is None or result.source_statement_names(f.line, model.group(1)))
            for f in findings
        ):
            continue  # convert left that pitfall of the file (of that model) for a human, and said where
        line, column = result.to_source.position(diagnostic.line, diagnostic.column)
        missed.setdefault(diagnostic.path, []).append(
            Finding(
                diagnostic.code, "manual", line, column,
                f"the converted program still has this: {diagnostic.message}",
                TRANSFORM, diagnostic.path,
            )
        )
    return SelfCheck(missed, still_linted)


class _Output:
    """A converted file, parsed once: its statements' line spans, the statements
    its ``# dp2ddp:`` markers stand above, and the map back to the source's lines."""

    def __init__(self, source: bytes, output: bytes) -> None:
        from dp2ddp.engine import LineMap

        text = output.decode("utf-8", "replace")
        self._source_text = source.decode("utf-8", "replace")
        self._source_tree: Optional[ast.AST] = None
        self.to_source = LineMap(self._source_text, text)
        try:
            tree: Optional[ast.AST] = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        self._spans = [
            (node.lineno, node.end_lineno or node.lineno) for node in (ast.walk(tree) if tree else ()) if isinstance(node, ast.stmt)
        ]
        outermost: Dict[int, int] = {}  # first line -> last line of the outermost statement there
        for first, last in self._spans:
            outermost[first] = max(outermost.get(first, last), last)
        lines = text.splitlines()
        self._marked = []
        for number, line in enumerate(lines, 1):
            if line.strip().startswith(MARKER):
                below = next((j for j in range(number + 1, len(lines) + 1) if not lines[j - 1].strip().startswith("#")), None)
                if below in outermost:
                    self._marked.append((below, outermost[below]))

    def source_statement_names(self, line: int, name: str) -> bool:
        """The source's statement that starts at ``line`` (where a spot was
        reported) mentions ``name`` (a whole word: ``model``, not ``teacher_model``)."""
        if self._source_tree is None:
            try:
                self._source_tree = ast.parse(self._source_text)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return True  # (cannot tell: as before)
        lines = self._source_text.splitlines()
        for node in ast.walk(self._source_tree):
            if isinstance(node, ast.stmt) and node.lineno == line:
                text = "\n".join(lines[node.lineno - 1 : (node.end_lineno or node.lineno)])
                return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None
        return True

    def marked(self, line: int) -> bool:
        """``line`` lies in a statement whose marker stands right above it."""
        return any(first <= line <= last for first, last in self._marked)

    def source_span(self, line: int) -> Tuple[int, int]:
        """The source's lines of the innermost statement that holds ``line`` ((0, -1): none)."""
        holding = [(last - first, first, last) for first, last in self._spans if first <= line <= last]
        if not holding:
            return 0, -1
        _, first, last = min(holding)
        return self.to_source(first), self.to_source(last)


def incomplete(findings: Sequence[Finding]) -> bool:
    """A file whose conversion left something for a human is not converted yet."""
    return any(f.kind == "manual" for f in findings)
