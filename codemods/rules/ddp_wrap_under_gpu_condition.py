"""DDP205 ddp-wrap-under-gpu-condition."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from .. import _names as N
from .._analysis import Source, dotted
from ._base import Diagnostic, Rule

#: names of GPU counts and switches in a condition (``n_gpu > 1``, ``args.cuda``)
_GPU_NAME = re.compile(r"(?i)^(n_?gpus?|num_?gpus?|ngpus?|gpu_count|use_cuda|cuda|multi_?gpu)$")
#: a condition that asks about the distributed run (where skipping the wrap is right)
_DISTRIBUTED_NAME = re.compile(r"(?i)rank|world|distributed|is_initialized|ddp")


class DDPWrapUnderGPUCondition(Rule):
    """
    ## What it does
    Reports a `DistributedDataParallel` wrap that only happens under a condition
    on the GPUs (`if torch.cuda.device_count() > 1:`, `... if n_gpu > 1 else
    model`, `if torch.cuda.is_available():`) with no wrap on the other branch --
    the DataParallel habit of wrapping only on several GPUs, carried over.

    ## Why is this bad?
    Under DDP the number of GPUs one process sees says nothing about the number
    of processes. One GPU per machine, a `CUDA_VISIBLE_DEVICES` of one device
    per process, or a CPU run with Gloo skip the wrap: every process then trains
    its own copy of the model on its own shard, the gradients are never
    averaged, and nothing fails. Every process of a distributed run must wrap.

    ## Example
    ```python
    if torch.cuda.device_count() > 1:
        model = DDP(model, device_ids=[local_rank])
    ```

    ## Use instead
    ```python
    model = DDP(model, device_ids=[local_rank] if torch.cuda.is_available() else None)
    ```
    (a condition on the distributed run itself -- `if dist.is_initialized():`,
    `if world_size > 1:` -- is fine, and not reported).

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP205"
    NAME = "ddp-wrap-under-gpu-condition"
    SEVERITY = "warning"
    MESSAGE = (
        "DistributedDataParallel wraps only under a condition on the GPUs: with one GPU per process, "
        "or on CPU, the processes train unsynchronised copies; wrap in every process"
    )
    TRIGGERS = ("DistributedDataParallel", "DDP")

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for call in src.calls:
            if src.qualname(call.func) not in N.DDP:
                continue
            branch = _gpu_branch(src, call)
            if branch is not None:
                yield self.diagnostic(src, branch)


def _gpu_branch(src: Source, call: ast.Call) -> Optional[ast.AST]:
    """The ``if``/conditional expression on the GPUs that holds ``call`` in one
    branch while the other branch wraps nothing; None otherwise -- also when an
    enclosing condition asks about the distributed run (``elif args.distributed:
    if torch.cuda.is_available(): ...``, PyTorch's ImageNet example: a GPU-only
    distributed mode, on purpose)."""
    for parent in src.ancestors(call):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            break
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and _distributed_test(parent.test):
            return None
    child: ast.AST = call
    for parent in src.ancestors(call):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            in_body = child in parent.body if isinstance(parent, ast.If) else child is parent.body
            other = parent.orelse if in_body else parent.body
            other_nodes = other if isinstance(other, list) else [other]
            if _gpu_test(src, parent.test) and not any(
                src.is_call(n, N.DDP) for o in other_nodes for n in ast.walk(o)
            ):
                return parent
        child = parent
    return None


def _distributed_test(test: ast.AST) -> bool:
    names = [dotted(n) for n in ast.walk(test) if isinstance(n, (ast.Name, ast.Attribute))]
    return any(_DISTRIBUTED_NAME.search(name) for name in names if name)


def _gpu_test(src: Source, test: ast.AST) -> bool:
    if _distributed_test(test):
        return False
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and src.qualname(node.func) in N.CUDA_DEVICE_COUNT | N.CUDA_IS_AVAILABLE:
            return True
        if isinstance(node, (ast.Name, ast.Attribute)):
            last = node.attr if isinstance(node, ast.Attribute) else node.id
            if _GPU_NAME.match(last):
                return True
    return False
