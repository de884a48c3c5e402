"""DDP307 early-stop-on-shard-metric."""

from __future__ import annotations

from typing import Iterator

from .._analysis import Source, rank_local_stops, uses_distributed
from ._base import Diagnostic, Rule


class EarlyStopOnShardMetric(Rule):
    """
    ## What it does
    In DDP code, reports a `break` or `return` that leaves the training loop on a
    value computed from this rank's batches: a name assigned in a loop that calls
    `backward()` from a loss, an accuracy or an `.item()` (`running_loss +=
    loss.item()`), what a training function of the file returns (`train_loss =
    train_one_epoch(...)`), what a function of the file computes over a loader
    sharded by a `DistributedSampler` (`valid_loss = validate(model,
    valid_loader)`), or computed from such a name (`train_loss =
    running_loss / len(loader)`) -- also through an object it is handed to
    (`early_stopping(train_loss, model)` ... `if early_stopping.early_stop:`).
    A value made the same on every rank first (`dist.all_reduce(t)`, a
    `reduce_tensor()` helper of the file) is fine.
    Counters (`step += 1`) are not metrics: every rank takes the same number of
    steps.

    ## Why is this bad?
    Each rank sees its own shard of the data, so each computes a different
    training loss. One rank decides to stop while the others go on to their next
    forward/backward, whose all-reduce waits for the rank that left: the job
    hangs (NCCL) or dies with "connection closed" (Gloo). An early stop on a
    validation metric computed over the whole (unsharded) validation set is
    fine: every rank computes the same value; over a sharded one it is not.

    ## Example
    ```python
    for epoch in range(epochs):
        running = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            running += loss.item()
        if running / len(loader) < target:
            break
    ```

    ## Use instead
    ```python
        mean = torch.tensor([running / len(loader)], device=device)
        dist.all_reduce(mean)
        if mean.item() / dist.get_world_size() < target:
            break
    ```

    ## Fix safety
    No automatic fix: the value to agree on (a mean, a sum, rank 0's decision
    broadcast) is the author's choice.
    """

    CODE = "DDP307"
    NAME = "early-stop-on-shard-metric"
    SEVERITY = "warning"
    MESSAGE = (
        "the loop stops on a value computed from this rank's shard: ranks may stop at different "
        "times and the others wait forever in their next all-reduce; all_reduce the value first"
    )
    TRIGGERS = (("backward", "break"), ("backward", "return"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for stop, _ in rank_local_stops(src):
            yield self.diagnostic(src, stop)
