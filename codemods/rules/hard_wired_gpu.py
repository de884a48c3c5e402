"""DDP005 hard-wired-gpu."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .._analysis import Source, environ_key, keyword, last_name, literal_gpu_indices, uses_distributed
from ._base import Diagnostic, Rule

_CUDA_INDEX = re.compile(r"^cuda:\d+$")


class HardWiredGPU(Rule):
    """
    ## What it does
    In DDP code, reports a GPU chosen by a literal index: `"cuda:0"`,
    `torch.device("cuda", 1)`, `.cuda(0)`, `.to(0)`, `device_ids=[0, 1, 2, 3]`,
    `map_location="cuda:0"`, `torch.cuda.set_device(0)`, a constant such as
    `DEVICE = "cuda:0"` or `gpu_id = 0` where it is used as the device (also in a
    function of the file it is passed to: `device = 0; main(device)`), and
    `os.environ["CUDA_VISIBLE_DEVICES"] = "0"` (one GPU) set in the script.

    ## Why is this bad?
    Every DDP process runs the same line, so they all pick the same GPU: N
    processes on GPU 0, the others idle, out-of-memory errors. Each process must
    use the GPU of its `LOCAL_RANK`. A script that makes one GPU visible leaves
    every other rank without a GPU at its `LOCAL_RANK` (`set_device` fails):
    choose the GPUs on the command line (`CUDA_VISIBLE_DEVICES=0,1 torchrun ...`).

    ## Example
    ```python
    model = DDP(model.to("cuda:0"), device_ids=[0])
    ```

    ## Use instead
    ```python
    device = torch.device(f"cuda:{local_rank}")
    model = DDP(model.to(device), device_ids=[local_rank])
    ```

    ## Fix safety
    No automatic fix in lint (`dp2ddp convert` rewrites DataParallel and
    single-GPU scripts to the per-rank device).
    """

    CODE = "DDP005"
    NAME = "hard-wired-gpu"
    SEVERITY = "warning"
    MESSAGE = "GPU chosen by a literal index: every process lands on the same GPU; use the device of LOCAL_RANK"
    TRIGGERS = (("cuda", "istributed"), ("CUDA_VISIBLE_DEVICES", "istributed"), (".to(", "istributed"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        # DEVICE = "cuda:0" ... model.to(DEVICE)
        wired = {
            target.id
            for node in src.of_type(ast.Assign)
            if _cuda_index_string(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for assign, name, index in literal_gpu_indices(src):
            yield self.diagnostic(
                src,
                assign,
                f"GPU {index} chosen by its index ({name} = {index}, used as the device): every "
                "process lands on that GPU; use the device of LOCAL_RANK",
            )
        for node in src.of_type(ast.Assign):
            if _one_visible_gpu(src, node):
                yield self.diagnostic(
                    src,
                    node,
                    "CUDA_VISIBLE_DEVICES set to one GPU in the script: the other ranks find no GPU "
                    "at their LOCAL_RANK; choose the GPUs on the command line",
                )
        for call in src.calls:
            if _local_rank_is_zero_here(src, call):
                continue  # ``if local_rank == 0: dist.barrier(device_ids=[0])``: 0 is this process's GPU
            name = src.qualname(call.func)
            if name == "torch.cuda.set_device" and call.args and (
                _int_literal(call.args[0]) or _cuda_index_string(call.args[0])
            ):
                yield self.diagnostic(src, call)  # every rank on that one GPU
                continue
            if last_name(call.func) == "to" and call.args and _int_literal(call.args[0]):
                yield self.diagnostic(src, call.args[0])
                continue
            if last_name(call.func) == "cuda" and not name.startswith("torch.cuda") and call.args:
                if _int_literal(call.args[0]):
                    yield self.diagnostic(src, call)
                    continue
            if (
                name == "torch.device"
                and len(call.args) == 2
                and isinstance(call.args[0], ast.Constant)
                and call.args[0].value == "cuda"
                and _int_literal(call.args[1])
            ):
                yield self.diagnostic(src, call)
                continue
            ids = keyword(call, "device_ids")
            if isinstance(ids, (ast.List, ast.Tuple)) and ids.elts and all(_int_literal(e) for e in ids.elts):
                yield self.diagnostic(src, ids)
            args = list(call.args[:1]) if last_name(call.func) in ("to", "device") else []
            args += [kw.value for kw in call.keywords if kw.arg in ("device", "map_location")]
            for arg in args:
                if _cuda_index_string(arg):
                    yield self.diagnostic(src, arg)
                elif isinstance(arg, ast.Name) and arg.id in wired:
                    yield self.diagnostic(src, arg)


def _local_rank_is_zero_here(src: Source, call: ast.Call) -> bool:
    """``call`` runs under ``if local_rank == 0:`` (the local rank read under any
    name that says so, or ``LOCAL_RANK`` from the environment) and names GPU 0 only:
    there, 0 is the local rank (yolov5's ``torch_distributed_zero_first``)."""
    literals = [n for n in ast.walk(call) if isinstance(n, ast.Constant) and isinstance(n.value, (int, str))
                and not isinstance(n.value, bool)]
    if any(isinstance(n.value, int) and n.value != 0 or isinstance(n.value, str) and n.value.startswith("cuda:")
           and n.value != "cuda:0" for n in literals):
        return False
    child = call
    for anc in src.ancestors(call):
        if isinstance(anc, ast.If) and child in anc.body:
            test = anc.test
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) and (
                isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value in (0, "0")
            ):
                left = test.left
                if "local_rank" in src.segment(left).lower() or environ_key(src, left) == "LOCAL_RANK":
                    return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = anc
    return False


def _one_visible_gpu(src: Source, node: ast.Assign) -> bool:
    """``os.environ["CUDA_VISIBLE_DEVICES"] = "0"``."""
    value = node.value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.strip().isdigit()):
        return False
    return any(
        isinstance(t, ast.Subscript)
        and src.qualname(t.value) == "os.environ"
        and isinstance(t.slice, ast.Constant)
        and t.slice.value == "CUDA_VISIBLE_DEVICES"
        for t in node.targets
    )


def _int_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def _cuda_index_string(node: ast.AST) -> bool:
    """``"cuda:0"``, also as a branch: ``"cuda:0" if torch.cuda.is_available() else "cpu"``."""
    if isinstance(node, ast.IfExp):
        return _cuda_index_string(node.body) or _cuda_index_string(node.orelse)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_CUDA_INDEX.match(node.value))
