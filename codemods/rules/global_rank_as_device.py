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
    Reports a global rank (`RANK`, `dist.get_rank()`, a variable named `rank`
    or `global_rank`) used as a GPU index: in `torch.cuda.set_device(...)`,
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
                if is_global_rank_expr(src, node):
                    yield self.diagnostic(src, node)
        for node in src.nodes:
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
                if text.startswith("cuda:"):
                    for value in node.values:
                        if isinstance(value, ast.FormattedValue) and is_global_rank_expr(src, value.value):
                            yield self.diagnostic(src, value.value)
