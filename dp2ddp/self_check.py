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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from dp2ddp.codemods._model import Finding

#: warnings that leave a converted program wrong, not only slower or noisier
HALF_DISTRIBUTED_WARNINGS = frozenset({"DDP102", "DDP205"})
#: lint's codes that speak of the same undone thing as convert's: a DataParallel
#: wrap left for a human (DDP001) leaves the model undistributed (DDP009), or
#: distributed on some paths only (DDP205)
_SAME_PITFALL = {code: frozenset({"DDP001", "DDP009", "DDP205"}) for code in ("DDP001", "DDP009", "DDP205")}
#: what lint reports about the file itself, not about its distribution
_NOT_ABOUT_THE_CONVERSION = frozenset({"DDP900", "DDP901"})
_MARKER = "# dp2ddp:"
TRANSFORM = "self-check"


def leaves_it_half_distributed(code: str, severity: str) -> bool:
    """Whether a lint finding on converted code means the conversion is not done."""
    if code in _NOT_ABOUT_THE_CONVERSION:
        return False
    return severity == "error" or code in HALF_DISTRIBUTED_WARNINGS


def check(outputs: Dict[str, Tuple[bytes, bytes, List[Finding]]]) -> Dict[str, List[Finding]]:
    """{path: (source, output, convert's findings)} of the converted files ->
    {path: the findings lint has on the output that convert did not report}, in
    the source's lines (as convert's own findings are)."""
    from dp2ddp.config import LintConfig
    from dp2ddp.engine import LineMap
    from dp2ddp.lint import lint_sources

    if not outputs:
        return {}
    linted = lint_sources({path: output for path, (_, output, _) in outputs.items()}, LintConfig())
    missed: Dict[str, List[Finding]] = {}
    for diagnostic in linted.diagnostics:
        if not leaves_it_half_distributed(diagnostic.code, diagnostic.severity):
            continue
        source, output, findings = outputs[diagnostic.path]
        source_text = source.decode("utf-8", "replace")
        output_text = output.decode("utf-8", "replace")
        to_source = LineMap(source_text, output_text)
        statement = _statement_at(output_text, diagnostic.line)
        if _marked(output_text, diagnostic.line):
            continue  # a spot convert left for a human holds it (its marker is above)
        first, last = (to_source(statement[0]), to_source(statement[1])) if statement else (0, -1)
        if any(f.code == diagnostic.code and first <= f.line <= last for f in findings):
            continue  # convert said so at that statement (a change, a spot or a note)
        same = _SAME_PITFALL.get(diagnostic.code, frozenset({diagnostic.code}))
        if any(f.kind == "manual" and f.code in same for f in findings):
            continue  # convert left that pitfall of the file for a human, and said where
        line, column = to_source.position(diagnostic.line, diagnostic.column)
        missed.setdefault(diagnostic.path, []).append(
            Finding(
                diagnostic.code, "manual", line, column,
                f"the converted program still has this: {diagnostic.message}",
                TRANSFORM, diagnostic.path,
            )
        )
    return missed


def _statements(tree: ast.AST) -> Iterable[ast.stmt]:
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            yield node


def _statement_at(text: str, line: int) -> Optional[Tuple[int, int]]:
    """(first, last) line of the innermost statement of ``text`` that holds ``line``."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    best: Optional[Tuple[int, int]] = None
    for node in _statements(tree):
        end = node.end_lineno or node.lineno
        if node.lineno <= line <= end and (best is None or end - node.lineno < best[1] - best[0]):
            best = (node.lineno, end)
    return best


def _marked(text: str, line: int) -> bool:
    """``line`` lies in a statement whose ``# dp2ddp:`` marker stands right above it."""
    lines = text.splitlines()
    markers = [i + 1 for i, t in enumerate(lines) if t.strip().startswith(_MARKER)]
    if not markers:
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    starts: Dict[int, int] = {}  # first line -> last line of the outermost statement there
    for node in _statements(tree):
        end = node.end_lineno or node.lineno
        starts[node.lineno] = max(starts.get(node.lineno, end), end)
    for marker in markers:
        below = next((j for j in range(marker + 1, len(lines) + 1) if not lines[j - 1].strip().startswith("#")), None)
        if below is not None and below in starts and below <= line <= starts[below]:
            return True
    return False


def incomplete(findings: Sequence[Finding]) -> bool:
    """A file whose conversion left something for a human is not converted yet."""
    return any(f.kind == "manual" for f in findings)
