"""DDP008 missing-destroy-process-group."""

from __future__ import annotations

from typing import Iterator

from .. import _names as N
from .._analysis import Source
from ._base import Diagnostic, Rule


class MissingDestroyProcessGroup(Rule):
    """
    ## What it does
    Reports `init_process_group` in a file that never calls
    `destroy_process_group`.

    ## Why is this bad?
    Without it the process group is torn down by the interpreter at exit, which
    warns ("process group has NOT been destroyed") and can hang with NCCL.

    ## Example
    ```python
    dist.init_process_group("nccl")
    train()
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    try:
        train()
    finally:
        dist.destroy_process_group()
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP008"
    NAME = "missing-destroy-process-group"
    SEVERITY = "info"
    MESSAGE = "the process group is never destroyed: call dist.destroy_process_group() at the end"
    TRIGGERS = ("init_process_group",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        inits = [c for c in src.calls if src.qualname(c.func) in N.INIT_PROCESS_GROUP]
        if inits and not any(src.qualname(c.func) in N.DESTROY_PROCESS_GROUP for c in src.calls):
            yield self.diagnostic(src, inits[0])
