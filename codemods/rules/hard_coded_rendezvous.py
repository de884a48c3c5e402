"""DDP007 hard-coded-rendezvous."""

from __future__ import annotations

import ast
from typing import Iterator

from .._analysis import Source, environ_key
from ._base import Diagnostic, Rule

_KEYS = ("MASTER_ADDR", "MASTER_PORT")


class HardCodedRendezvous(Rule):
    """
    ## What it does
    Reports `MASTER_ADDR` / `MASTER_PORT` written into `os.environ` by the script
    (`os.environ["MASTER_PORT"] = "29500"`, `os.putenv(...)`). A default that the
    environment overrides (`os.environ.setdefault(...)`) is not reported: a
    launcher's or the user's value wins; nor is a value the program works out
    (a free port found and broadcast over MPI), nor a test file's set-up.

    ## Why is this bad?
    The rendezvous address belongs to the launcher: `torchrun --standalone` picks
    a free port, and `--rdzv_endpoint` names the host for several machines. A
    port fixed in code clashes when two jobs share a machine ("Address already
    in use") and a fixed address cannot work on several nodes.

    ## Example
    ```python
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    ```

    ## Use instead
    Nothing in the code; launch with `torchrun --standalone ...` on one machine or
    `torchrun --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT ...` on several.

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP007"
    NAME = "hard-coded-rendezvous"
    SEVERITY = "info"
    MESSAGE = "rendezvous address set in code: leave MASTER_ADDR/MASTER_PORT to torchrun (--standalone or --rdzv_endpoint)"
    IN_TESTS = False  # a test spawns its own processes and says where they meet
    TRIGGERS = _KEYS

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for node in src.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Subscript)
                        and src.qualname(target.value) == "os.environ"
                        and isinstance(target.slice, ast.Constant)
                        and target.slice.value in _KEYS
                        and _literal(node.value)
                        and not _only_when_unset(src, node, target.slice.value)
                    ):
                        yield self.diagnostic(src, node)
            elif isinstance(node, ast.Call) and src.qualname(node.func) == "os.putenv":
                if node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in _KEYS and (
                    len(node.args) < 2 or _literal(node.args[1])
                ):
                    yield self.diagnostic(src, node)


def _literal(value: ast.AST) -> bool:
    """A value written in the code: ``"29500"``, ``str(29500)``, ``f"{12355}"``."""
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.Call) and not value.keywords and len(value.args) == 1:
        return isinstance(value.func, ast.Name) and value.func.id in ("str", "int") and _literal(value.args[0])
    if isinstance(value, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) or isinstance(v, ast.FormattedValue) and _literal(v.value)
                   for v in value.values)
    return False


def _only_when_unset(src: Source, node: ast.AST, key: str) -> bool:
    """``node`` runs only when the launcher set no ``key``: under ``if "MASTER_PORT"
    not in os.environ:`` or ``if not os.environ.get("MASTER_PORT"):`` (EDM) -- a
    default, as ``os.environ.setdefault``; torchrun's value wins."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.If) and child in anc.body:
            test = anc.test
            if (
                isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotIn)
                and isinstance(test.left, ast.Constant) and test.left.value == key
                and src.qualname(test.comparators[0]) == "os.environ"
            ):
                return True
            if (
                isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
                and environ_key(src, test.operand) == key
            ):
                return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = anc
    return False
