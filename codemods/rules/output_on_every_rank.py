"""DDP301 output-on-every-rank."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, is_rank_expr, on_main_process_only, uses_distributed
from ._base import Diagnostic, Rule


class OutputOnEveryRank(Rule):
    """
    ## What it does
    In DDP code, reports `print(...)`, `logging.info/debug(...)` and
    `logger.info/debug(...)` that run on every rank (not under a main-process
    check). A message that names the rank (`print(f"rank {rank}: ...")`) is
    meant per rank and is not reported.

    ## Why is this bad?
    Every process runs the same code, so the log shows every line N times,
    interleaved. Progress belongs to the main process; warnings and errors may
    come from any rank.

    ## Example
    ```python
    print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Fix safety
    Safe: the computation is unchanged; only the other ranks' copies of the
    output disappear. Output whose arguments call into user code (which might
    run the model, a collective) is not moved.
    """

    CODE = "DDP301"
    NAME = "output-on-every-rank"
    SEVERITY = "info"
    MESSAGE = "printed by every rank: print/log progress from the main process only"
    FIX = "safe"
    FIX_TRANSFORMS = ("output-on-main",)
    FIX_DESCRIPTION = "put the output behind `if dist.get_rank() == 0:`"
    TRIGGERS = (("print", "istributed"), ("info", "istributed"), ("debug", "istributed"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        loggers = _loggers(src)
        for call in src.calls:
            if not isinstance(src.parent(call), ast.Expr):
                continue
            name = src.qualname(call.func)
            chatter = name == "builtins.print" or name in N.LOGGING_CHATTER or (
                isinstance(call.func, ast.Attribute)
                and call.func.attr in N.LOGGER_CHATTER_METHODS
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id in loggers
            )
            if not chatter or src.function_of(call) is None and not _in_main_block(src, call):
                continue
            if any(is_rank_expr(src, n) for arg in call.args for n in ast.walk(arg)):
                continue
            if not on_main_process_only(src, call):
                yield self.diagnostic(src, call)


def _loggers(src: Source) -> set:
    names = set()
    for node in src.nodes:
        if isinstance(node, ast.Assign) and src.is_call(node.value, N.LOGGER_FACTORY):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _in_main_block(src: Source, node: ast.AST) -> bool:
    from .._facts import is_main_guard

    return any(is_main_guard(a) for a in src.ancestors(node))
