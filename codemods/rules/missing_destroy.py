"""DDP008 missing-destroy-process-group."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .. import _names as N
from .._analysis import Source
from .._facts import is_main_guard
from .._program import project_setup_calls
from ._base import Diagnostic, Rule


class MissingDestroyProcessGroup(Rule):
    """
    ## What it does
    Reports `init_process_group` in a file that never calls
    `destroy_process_group` -- not in a library's set-up helper (a file without
    a `__main__` block that starts the group only in a function named for it,
    `init_distributed_mode`, `init_dist`, `setup`): the program that calls it
    tears the group down.

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
    TRIGGERS = ("init_process_group", "dist.init(", "distributed.init(")  # (the last two: a project wrapper, EDM)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        from .ddp_without_process_group import _reached

        # (a set-up in a helper the file never calls starts no group)
        inits = [c for c in src.calls if src.qualname(c.func) in N.INIT_PROCESS_GROUP and _reached(src, c)]
        if not inits and "init" in src.text:  # ``dist.init()`` of the project's own wrapper module (EDM)
            inits = [c for c in project_setup_calls(src) if _reached(src, c)]
        if not inits or any(src.qualname(c.func) in N.DESTROY_PROCESS_GROUP for c in src.calls):
            return
        if not _is_script(src):
            return  # a set-up helper of a library (DETR's util/misc.py): its caller tears down
        yield self.diagnostic(src, inits[0])


_SETUP_HELPER = re.compile(r"(?i)^_?(init|setup|set_up)(_\w*)?_?(dist|ddp|distributed|process|group|mode|parallel)\w*$|^_?(setup|init)$")


def _is_script(src: Source) -> bool:
    """Not a set-up helper of a library: a file without a ``__main__`` block whose
    process group starts only in functions named for it (DETR's
    ``init_distributed_mode``, mmcv's ``init_dist``) leaves the teardown to the
    program that calls them."""
    if any(is_main_guard(s) for s in src.tree.body):
        return True
    helpers = set()
    for call in src.calls:
        if src.qualname(call.func) in N.INIT_PROCESS_GROUP:
            func = src.function_of(call)
            if func is None or isinstance(func, ast.Lambda) or not _SETUP_HELPER.match(func.name):
                return True
            helpers.add(func.name)
    # the file calls its own set-up helper at module level: a script after all
    return any(
        isinstance(c.func, ast.Name) and c.func.id in helpers and src.function_of(c) is None for c in src.calls
    )
