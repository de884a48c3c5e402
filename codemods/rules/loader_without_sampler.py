"""DDP101 loader-without-distributed-sampler."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import Source, argument, classify_loader, iterable_dataset, uses_distributed
from ._base import Diagnostic, Rule


class LoaderWithoutDistributedSampler(Rule):
    """
    ## What it does
    In DDP code, reports a training `DataLoader` (told apart by its names --
    `train_loader`, `train_set`, `get_train_loader()` -- or `shuffle=True`) that
    has no `sampler=` / `batch_sampler=`. Evaluation loaders are not reported:
    every rank may evaluate the whole set.

    ## Why is this bad?
    Without a `DistributedSampler` every process iterates the whole dataset:
    N times the work per epoch, the same batches on every GPU, and none of the
    speed-up DDP was for.

    ## Example
    ```python
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    ```

    ## Use instead
    ```python
    train_loader = DataLoader(
        train_set, batch_size=32, sampler=DistributedSampler(train_set, shuffle=True)
    )
    ```
    and `train_loader.sampler.set_epoch(epoch)` at the top of every epoch.

    ## Fix safety
    Unsafe: each process then sees a different part of the data, so the training
    changes (it is what DDP needs, but review the batch size: the fix keeps the
    global batch by dividing `batch_size` by the world size).
    """

    CODE = "DDP101"
    NAME = "loader-without-distributed-sampler"
    SEVERITY = "error"
    MESSAGE = "training DataLoader without a DistributedSampler: every rank trains on the whole dataset"
    FIX = "unsafe"
    FIX_TRANSFORMS = ("distributed-sampler", "set-epoch")
    FIX_DESCRIPTION = "add sampler=DistributedSampler(dataset, shuffle=...) and set_epoch"
    TRIGGERS = (("DataLoader", "istributed"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for call in src.calls:
            if src.qualname(call.func) not in N.DATA_LOADER:
                continue
            if argument(call, 3, "sampler") is not None or argument(call, 4, "batch_sampler") is not None:
                continue
            if any(kw.arg is None for kw in call.keywords):
                continue  # **kwargs: cannot see what it holds
            if iterable_dataset(src, argument(call, 0, "dataset")):
                continue  # a stream: sharded in its __iter__, if at all (no sampler possible)
            if classify_loader(src, call) == "train":
                yield self.diagnostic(src, call)
