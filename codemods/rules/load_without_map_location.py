"""DDP304 load-without-map-location."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, argument, per_rank_target, uses_distributed
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
                if _saved_on_the_cpu_here(src, call):
                    continue  # ``torch.save(feats.cpu(), join(d, "trainfeat.pth"))`` ... ``torch.load(join(e, "trainfeat.pth"))``
                if _other_branch_maps(src, call):
                    continue  # ``if args.gpu is None: load(p) else: load(p, map_location=loc)``
                if call.args and per_rank_target(src, call.args[0]):
                    continue  # ``queue{rank}.pth``: this rank's own file, saved from its own GPU (SwAV)
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


def _file_name(path: ast.AST) -> str:
    """The last string constant of a path expression (``"trainfeat.pth"`` of
    ``os.path.join(args.dump_features, "trainfeat.pth")``), or ""."""
    names = [n.value for n in ast.walk(path) if isinstance(n, ast.Constant) and isinstance(n.value, str) and "." in n.value]
    return names[-1].rsplit("/", 1)[-1] if names else ""


def _on_the_cpu(value: ast.AST) -> bool:
    """``x.cpu()``, ``{k: v.cpu() ...}``, ``[t.cpu() ...]``: CPU tensors only."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        return value.func.attr in ("cpu", "numpy", "tolist", "item")
    if isinstance(value, ast.DictComp):
        return _on_the_cpu(value.value)
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
        return _on_the_cpu(value.elt)
    if isinstance(value, ast.Dict):
        return bool(value.values) and all(_on_the_cpu(v) for v in value.values)
    return False


def _saved_on_the_cpu_here(src: Source, load: ast.Call) -> bool:
    """The file loads a file of the same name that it saves as CPU tensors
    (DINO's features dumped with ``.cpu()`` and loaded back): nothing to map."""
    path = argument(load, 0, "f")
    name = _file_name(path) if path is not None else ""
    if not name:
        return False
    return any(
        src.qualname(save.func) in N.TORCH_SAVE and len(save.args) >= 2
        and _file_name(save.args[1]) == name and _on_the_cpu(save.args[0])
        for save in src.calls
    )
