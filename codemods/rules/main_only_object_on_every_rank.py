"""DDP309 main-only-object-on-every-rank."""

from __future__ import annotations

from typing import Iterator

from .. import _writes as W
from .._analysis import Source, dotted, uses_distributed
from ._base import Diagnostic, Rule


class MainOnlyObjectOnEveryRank(Rule):
    """
    ## What it does
    In DDP code, reports a use of an object made on the main process only --
    `writer = SummaryWriter(d) if dist.get_rank() == 0 else None`, `saver = None`
    then `if rank == 0: saver = Saver(...)` (also `self.writer`, and the parameter
    of a function it is handed to) -- that every rank runs: `writer.log_dir`, a
    `writer.add_scalar(...)` outside the check. A use under the same check, under
    `if writer is not None:` / `if writer:`, after `if writer is None: return`, or
    in a function called only on the main process is not reported.

    ## Why is this bad?
    The object is None on every other rank: they crash there with an
    `AttributeError`, and the main process then waits for them in the next
    collective (or the job dies).

    ## Example
    ```python
    writer = SummaryWriter() if dist.get_rank() == 0 else None
    log_dir = writer.log_dir  # AttributeError on rank 1
    ```

    ## Use instead
    ```python
    if writer is not None:
        log_dir = writer.log_dir
    ```

    ## Fix safety
    No fix in lint: what the other ranks should do instead is the author's to
    say. `dp2ddp convert` guards the uses of the writers it makes main-process-only
    itself, or reports them.
    """

    CODE = "DDP309"
    NAME = "main-only-object-on-every-rank"
    SEVERITY = "error"
    MESSAGE = "an object made on the main process only is used on every rank"
    TRIGGERS = (("None", "istributed"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        names = W.main_only_names(src, W.main_only_bindings(src))
        for use in W.unguarded_uses(src, names):
            yield self.diagnostic(src, use, W.MAIN_ONLY_USE_MESSAGE.format(name=dotted(use)))
