"""DDP107 unseeded-random-split."""

from __future__ import annotations

from typing import Iterator

from .._analysis import Source, unseeded_index_splits, unseeded_random_splits, uses_distributed
from ._base import Diagnostic, Rule


class UnseededRandomSplit(Rule):
    """
    ## What it does
    In DDP code, reports `random_split(dataset, lengths)` without a `generator=`
    when the file does not seed torch alike on every process before it
    (`torch.manual_seed(0)`, `seed_everything(seed)`; a seed that adds the rank
    differs on every process, so it does not count). Also a split made by hand:
    `torch.randperm` without a generator, `np.random.permutation`/`shuffle` or
    `random.shuffle` in a function that builds a `Subset` or a
    `SubsetRandomSampler`, unless torch/numpy/random is seeded alike first.

    ## Why is this bad?
    `random_split` draws from torch's default generator, and every DDP process
    has its own. Unseeded, each process splits the dataset differently: the
    DistributedSampler then shards a different training set on each rank, the
    shards overlap, and a rank trains on samples another rank validates on. The
    script runs without an error and the validation numbers look too good.

    ## Example
    ```python
    train_set, val_set = random_split(dataset, [0.8, 0.2])
    ```

    ## Use instead
    ```python
    train_set, val_set = random_split(dataset, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    ```

    ## Fix safety
    No automatic fix in lint (`dp2ddp convert` adds the generator when it
    converts a script).
    """

    CODE = "DDP107"
    NAME = "unseeded-random-split"
    SEVERITY = "warning"
    MESSAGE = (
        "random_split without a generator: each DDP process draws its own split, so the ranks "
        "train on overlapping shards and on each other's validation samples; pass "
        "generator=torch.Generator().manual_seed(0)"
    )
    BY_HAND = (
        "the indices of a Subset split drawn from each DDP process's own random state ({draw}): "
        "the ranks split differently and train on each other's validation samples; draw them "
        "with a fixed seed (torch.randperm(n, generator=torch.Generator().manual_seed(0)), "
        "np.random.default_rng(0).permutation(n))"
    )
    TRIGGERS = (("random_split", "istributed"), ("Subset", "istributed"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for call in unseeded_random_splits(src):
            yield self.diagnostic(src, call)
        for call in unseeded_index_splits(src):  # a split made by hand
            yield self.diagnostic(src, call, self.BY_HAND.format(draw=src.qualname(call.func)))
