"""DDP307 early-stop-on-shard-metric."""

from __future__ import annotations

import ast
import re
from typing import Iterator, Set

from .._analysis import Source, calls_method, dotted, uses_distributed
from ._base import Diagnostic, Rule

_METRIC = re.compile(r"(?i)loss|acc|correct")


class EarlyStopOnShardMetric(Rule):
    """
    ## What it does
    In DDP code, reports a `break` or `return` that leaves the training loop on a
    value computed from this rank's batches: a name assigned in a loop that calls
    `backward()` from a loss, an accuracy or an `.item()` (`running_loss +=
    loss.item()`), or computed from such a name (`train_loss = running_loss /
    len(loader)`). Counters (`step += 1`) are not metrics: every rank takes the
    same number of steps.

    ## Why is this bad?
    Each rank sees its own shard of the data, so each computes a different
    training loss. One rank decides to stop while the others go on to their next
    forward/backward, whose all-reduce waits for the rank that left: the job
    hangs (NCCL) or dies with "connection closed" (Gloo). An early stop on a
    validation metric computed over the whole (unsharded) validation set is
    fine: every rank computes the same value.

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
        for loop in src.of_type(ast.For, ast.While):
            if not any(isinstance(n, (ast.For, ast.While)) and calls_method(n, "backward") for n in ast.walk(loop) if n is not loop):
                continue  # not an epoch loop around a training loop
            local = _shard_values(loop)
            if not local:
                continue
            for node in ast.walk(loop):
                if isinstance(node, ast.If) and _names(node.test) & local:
                    if any(isinstance(n, (ast.Break, ast.Return)) for stmt in node.body for n in ast.walk(stmt)):
                        yield self.diagnostic(src, node)


def _names(node: ast.AST) -> Set[str]:
    return {dotted(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n)}


def _shard_values(epoch_loop: ast.AST) -> Set[str]:
    """Names holding a value computed from the rank's own batches, in ``epoch_loop``."""
    local: Set[str] = set()
    for inner in ast.walk(epoch_loop):
        if inner is epoch_loop or not isinstance(inner, (ast.For, ast.While)) or not calls_method(inner, "backward"):
            continue
        for node in ast.walk(inner):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                value = node.value
                calls_item = any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "item"
                    for c in ast.walk(value)
                )
                if calls_item or any(_METRIC.search(n) for n in _names(value)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        local |= {dotted(t) for t in ast.walk(target) if isinstance(t, (ast.Name, ast.Attribute))} - {""}
    changed = True
    while changed and local:
        changed = False
        for node in ast.walk(epoch_loop):
            if isinstance(node, ast.Assign) and _names(node.value) & local:
                for target in node.targets:
                    for name in {dotted(t) for t in ast.walk(target) if isinstance(t, ast.Name)} - local - {""}:
                        local.add(name)
                        changed = True
    return local
