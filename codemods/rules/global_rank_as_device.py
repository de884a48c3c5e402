"""DDP004 global-rank-as-device."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, is_global_rank_expr, keyword, last_name
from ._base import Diagnostic, Rule


class GlobalRankAsDevice(Rule):
    """
    ## What it does
    Reports a global rank (`RANK`, `SLURM_PROCID`, `dist.get_rank()`, a variable
    assigned one whatever its name, or one named `rank` or `global_rank` whose
    value is not seen; not the process index `mp.spawn` hands its function) used as a GPU index: in `torch.cuda.set_device(...)`,
    `.cuda(...)`, `.to(...)`, `torch.device("cuda", ...)`, `f"cuda:{...}"` or
    `device_ids=[...]`.

    ## Why is this bad?
    The global rank counts processes across all machines; a machine has GPUs
    0..N-1. On the second node rank 8 asks for GPU 8, which does not exist (or
    two processes share one GPU). It works on one machine and fails on two.

    ## Example
    ```python
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    ```

    ## Use instead
    ```python
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    ```

    ## Fix safety
    No automatic fix: the local rank may have to be passed in.
    """

    CODE = "DDP004"
    NAME = "global-rank-as-device"
    SEVERITY = "warning"
    MESSAGE = "a global rank is used as a GPU index: use LOCAL_RANK (the GPU on this node) instead"
    IN_TESTS = False  # a test exercises it on purpose
    TRIGGERS = (("rank", "cuda"), ("RANK", "cuda"), ("rank", "device_ids"), ("RANK", "device_ids"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for call in src.calls:
            name = src.qualname(call.func)
            candidates = []
            if name in N.CUDA_SET_DEVICE or (
                last_name(call.func) in ("cuda", "to") and isinstance(call.func, ast.Attribute)
                and not name.startswith("torch.")
            ):
                candidates += call.args[:1]
            if name in N.TORCH_DEVICE and len(call.args) == 2:
                candidates.append(call.args[1])
            ids = keyword(call, "device_ids")
            if isinstance(ids, (ast.List, ast.Tuple)):
                candidates += ids.elts
            for node in candidates:
                if _holds_global_rank(src, node):
                    yield self.diagnostic(src, node)
        for node in src.nodes:
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
                if text.startswith("cuda:"):
                    for value in node.values:
                        if isinstance(value, ast.FormattedValue) and _holds_global_rank(src, value.value):
                            yield self.diagnostic(src, value.value)


def _holds_global_rank(src: Source, node: ast.AST) -> bool:
    """``node`` holds a global rank: the expression itself (``dist.get_rank()``,
    ``int(os.environ["SLURM_PROCID"])``), or a name its function assigns only such
    values (``gpu = dist.get_rank()``), whatever it is called.  A name assigned
    anything else (``rank = int(os.environ["LOCAL_RANK"])``), and the process index
    that ``mp.spawn`` hands its function on one machine, are local."""
    if not isinstance(node, ast.Name):
        return is_global_rank_expr(src, node)
    scope = src.function_of(node)
    values = [
        a.value
        for a in (src.of_type(ast.Assign) if scope is None else [n for n in ast.walk(scope) if isinstance(n, ast.Assign)])
        if any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets) and src.function_of(a) is scope
    ]
    if values:
        return all(is_global_rank_expr(src, v) for v in values)
    if scope is not None and _spawn_index_parameter(src, scope, node.id):
        return False
    return is_global_rank_expr(src, node)


def _spawn_index_parameter(src: Source, scope: ast.AST, name: str, depth: int = 0) -> bool:
    """``name`` is the first parameter of a function this file hands to
    ``mp.spawn`` -- the process index on this machine (PyTorch's DDP tutorial) --
    or a parameter that such a function hands it to (``main(rank, world)`` calls
    ``ddp_setup(rank, world)``: the tutorial series)."""
    args = getattr(scope, "args", None)
    params = [a.arg for a in args.args] if args is not None else []
    if name not in params:
        return False
    position, function = params.index(name), getattr(scope, "name", None)
    if position == 0 and any(
        src.qualname(call.func) in N.SPAWN and call.args and isinstance(call.args[0], ast.Name)
        and call.args[0].id == function
        for call in src.calls
    ):
        return True
    if depth >= 2:
        return False
    for call in src.calls:  # the callers that hand it a spawn index
        if isinstance(call.func, ast.Name) and call.func.id == function and len(call.args) > position:
            handed, caller = call.args[position], src.function_of(call)
            if isinstance(handed, ast.Name) and caller is not None and _spawn_index_parameter(
                src, caller, handed.id, depth + 1
            ):
                return True
    return False
