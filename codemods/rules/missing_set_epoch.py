"""DDP102 missing-set-epoch."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, argument, is_epoch_loop, is_false
from ._base import Diagnostic, Rule


class MissingSetEpoch(Rule):
    """
    ## What it does
    Reports a shuffling `DistributedSampler` in a file that has an epoch loop but
    never calls `set_epoch`.

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with the epoch number. Without
    `sampler.set_epoch(epoch)` every epoch replays the same order: no error, just
    a silently worse model.

    ## Example
    ```python
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, sampler=sampler, batch_size=32)
    for epoch in range(epochs):
        for batch in loader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
    ```

    ## Fix safety
    Unsafe: the data order of every epoch after the first changes (as intended).
    """

    CODE = "DDP102"
    NAME = "missing-set-epoch"
    SEVERITY = "warning"
    MESSAGE = "DistributedSampler shuffles but set_epoch() is never called: every epoch repeats the same order"
    FIX = "unsafe"
    FIX_TRANSFORMS = ("set-epoch",)
    FIX_DESCRIPTION = "call loader.sampler.set_epoch(epoch) at the top of the epoch loop"
    TRIGGERS = ("DistributedSampler",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if _sets_epoch(src):
            return
        if not any(is_epoch_loop(n) for n in src.nodes):
            return
        for call in src.calls:
            if src.qualname(call.func) in N.DISTRIBUTED_SAMPLER and not is_false(argument(call, 3, "shuffle")):
                yield self.diagnostic(src, call)


def _sets_epoch(src: Source) -> bool:
    """A ``set_epoch(...)`` call with a changing argument (``set_epoch(epoch)``,
    also inside a per-epoch function); ``set_epoch(0)`` once, or the word in a
    comment, does not count."""
    for call in src.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch" and call.args:
            if not isinstance(call.args[0], ast.Constant):
                return True
    return False
