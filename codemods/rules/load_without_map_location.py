"""DDP304 load-without-map-location."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, argument, uses_distributed
from ._base import Diagnostic, Rule


class LoadWithoutMapLocation(Rule):
    """
    ## What it does
    In DDP code, reports `torch.load(...)` without `map_location` (nor
    `**kwargs` that may carry it), unless it is one branch of an `if` whose
    other branch loads with a `map_location` (`if args.gpu is None:
    torch.load(p)` / `else: torch.load(p, map_location=loc)`: the branch
    without one runs without a GPU per process).

    ## Why is this bad?
    A checkpoint remembers the device each tensor was saved from, usually
    `cuda:0`. Without `map_location` every rank loads its copy onto GPU 0: N
    copies on one GPU (out of memory), and a crash on a machine without GPUs.

    ## Example
    ```python
    state = torch.load("checkpoint.pt")
    ```

    ## Use instead
    ```python
    state = torch.load("checkpoint.pt", map_location=device)  # this rank's device
    ```

    ## Fix safety
    Safe: the tensors land on the rank's own device, where the model that loads
    them lives; values are unchanged.
    """

    CODE = "DDP304"
    NAME = "load-without-map-location"
    SEVERITY = "warning"
    MESSAGE = "torch.load without map_location loads onto the device it was saved from (GPU 0 on every rank): pass map_location=device"
    FIX = "safe"
    FIX_TRANSFORMS = ("load-map-location",)
    FIX_DESCRIPTION = "add map_location=device"
    IN_TESTS = False  # a test exercises it on purpose
    TRIGGERS = (("load", "istributed"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for call in src.calls:
            if src.qualname(call.func) in N.TORCH_LOAD and argument(call, 1, "map_location") is None:
                if any(kw.arg is None for kw in call.keywords):
                    continue  # ``**kwargs`` may carry it
                if _other_branch_maps(src, call):
                    continue  # ``if args.gpu is None: load(p) else: load(p, map_location=loc)``
                yield self.diagnostic(src, call)


def _other_branch_maps(src: Source, call: ast.Call) -> bool:
    """The load is in one branch of an ``if`` whose other branch loads with a
    ``map_location``: the branch without it is the no-GPU-per-process case
    (ImageNet example, MoCo: ``if args.gpu is None:``)."""
    child = call
    for anc in src.ancestors(call):
        if isinstance(anc, ast.If):
            other = anc.orelse if child in anc.body else anc.body if child in anc.orelse else None
            if other:
                return any(
                    isinstance(n, ast.Call) and src.qualname(n.func) in N.TORCH_LOAD
                    and argument(n, 1, "map_location") is not None
                    for stmt in other for n in ast.walk(stmt)
                )
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = anc
    return False
