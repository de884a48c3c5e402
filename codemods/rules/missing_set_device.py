"""DDP003 missing-set-device."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, environ_key, is_rank_dependent, keyword
from ._base import Diagnostic, Rule


class MissingSetDevice(Rule):
    """
    ## What it does
    Reports `init_process_group` in a script that uses CUDA but never calls
    `torch.cuda.set_device(local_rank)` (and does not pass `device_id=` to
    `init_process_group`), unless it shows each process only its own GPU
    (`os.environ["CUDA_VISIBLE_DEVICES"] = str(rank % 8)` before CUDA starts).

    ## Why is this bad?
    Until a process picks its GPU, CUDA work without an explicit index -- NCCL's
    communicators, `.cuda()`, `torch.device("cuda")` -- lands on GPU 0. Every rank
    then allocates memory on GPU 0: rank 0 runs out of memory while the other
    GPUs idle, or NCCL hangs.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = model.cuda()
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = model.cuda()
    ```

    ## Fix safety
    No automatic fix (`dp2ddp convert` writes the whole set-up for DataParallel
    and single-GPU scripts).
    """

    CODE = "DDP003"
    NAME = "missing-set-device"
    SEVERITY = "warning"
    MESSAGE = "the process group is set up without torch.cuda.set_device(local_rank): every rank will use GPU 0"
    IN_TESTS = False  # a test exercises it on purpose
    TRIGGERS = ("init_process_group",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        inits = [c for c in src.calls if src.qualname(c.func) in N.INIT_PROCESS_GROUP]
        if not inits or any(keyword(c, "device_id") is not None for c in inits):
            return
        if all(_backend(c) == "gloo" for c in inits):
            return  # a CPU process group
        if any(src.qualname(c.func) in N.CUDA_SET_DEVICE for c in src.calls):
            return
        if not _uses_cuda(src):
            return
        if _visible_devices_per_rank(src):
            return  # each process sees only its own GPU: plain "cuda" is it
        yield self.diagnostic(src, inits[0])


def _visible_devices_per_rank(src: Source) -> bool:
    """``os.environ["CUDA_VISIBLE_DEVICES"] = f"{rank % 8}"`` (guided-diffusion's
    ``setup_dist``), ``= os.environ["LOCAL_RANK"]``: the process is shown one GPU,
    chosen by its rank, which is device 0 to it."""
    if "CUDA_VISIBLE_DEVICES" not in src.text:
        return False
    for node in src.of_type(ast.Assign):
        if any(environ_key(src, t) == "CUDA_VISIBLE_DEVICES" for t in node.targets):
            text = src.segment(node.value).lower()
            if is_rank_dependent(src, node.value) or "rank" in text or "gpu" in text:
                return True
    return False


def _uses_cuda(src: Source) -> bool:
    if "nccl" in src.text:
        return True
    if "cuda" not in src.text:
        return False
    for call in src.calls:
        name = src.qualname(call.func)
        if name.endswith(".cuda") and not name.startswith("torch.cuda"):
            return True
        if name == "torch.device":
            return True
    return False


def _backend(call) -> object:
    from .._analysis import argument

    value = argument(call, 0, "backend")
    return getattr(value, "value", None)
