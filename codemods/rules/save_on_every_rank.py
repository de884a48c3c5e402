"""DDP302 save-on-every-rank."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Optional

from .. import _names as N
from .._analysis import Source, on_main_process_only, uses_distributed
from ._base import Diagnostic, Rule


class SaveOnEveryRank(Rule):
    """
    ## What it does
    In DDP code, reports `torch.save` that every rank reaches: not under a
    main-process check (`if dist.get_rank() == 0:`, `if is_main_process():`,
    `if args.local_rank in [-1, 0]:`, after `if rank != 0: return`), and not in a
    function that this file only calls under such a check. A save helper
    (`save_checkpoint`, `export_model`...) that this file never calls is not
    reported: its callers elsewhere decide.

    ## Why is this bad?
    All ranks hold the same weights and write the same path at the same time:
    wasted I/O at best, a corrupt or truncated checkpoint at worst (several
    writers on a shared file system).

    ## Example
    ```python
    torch.save(model.module.state_dict(), "checkpoint.pt")
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "checkpoint.pt")
    dist.barrier()  # if other ranks read the file afterwards
    ```

    ## Fix safety
    Safe: the file is written once, with the same content; a barrier is added
    where the script reads the file back and every rank reaches that spot.
    """

    CODE = "DDP302"
    NAME = "save-on-every-rank"
    SEVERITY = "error"
    MESSAGE = "torch.save runs on every rank: save from the main process only (if dist.get_rank() == 0)"
    FIX = "safe"
    FIX_TRANSFORMS = ("save-on-main",)
    FIX_DESCRIPTION = "put torch.save behind `if dist.get_rank() == 0:`"
    TRIGGERS = ("save",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for call in src.calls:
            if src.qualname(call.func) not in N.TORCH_SAVE or on_main_process_only(src, call):
                continue
            func = src.function_of(call)
            if func is not None and not _called_unguarded(src, func):
                continue
            yield self.diagnostic(src, call)


_SAVE_HELPER = re.compile(r"(?i)save|checkpoint|ckpt|export|dump|write|persist")


def _called_unguarded(src: Source, func: ast.AST) -> bool:
    """Some call of ``func`` in this file runs on every rank.  A function this file
    never calls counts as reached by every rank -- unless its name says it is a
    save helper, which callers elsewhere usually guard."""
    name: Optional[str] = getattr(func, "name", None)
    if name is None:
        return False
    calls = [
        c for c in src.calls
        if (isinstance(c.func, ast.Name) and c.func.id == name)
        or (isinstance(c.func, ast.Attribute) and c.func.attr == name)
    ]
    if not calls:
        return not _SAVE_HELPER.search(name)
    for call in calls:
        if on_main_process_only(src, call):
            continue
        outer = src.function_of(call)
        if outer is None or outer is func or _called_unguarded(src, outer):
            return True
    return False
