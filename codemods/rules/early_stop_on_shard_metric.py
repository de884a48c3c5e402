"""DDP307 early-stop-on-shard-metric."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from .._analysis import Source, dotted, is_collective, rank_local_stops, uses_distributed
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
    `reduce_tensor()` helper of the file) is fine -- unless what is handed to the
    collective is a Python number (`epoch_loss = running_loss / len(loader)` of
    `loss.item()` sums, then `dist.all_reduce(epoch_loss)`): that raises, and is
    reported as an error.
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
    TRIGGERS = (("backward", "break"), ("backward", "return"), ("all_reduce",), ("reduce(",), ("broadcast(",))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for stop, _ in rank_local_stops(src):
            yield self.diagnostic(src, stop)
        for call, name in _python_numbers_reduced(src):
            found = self.diagnostic(
                src, call,
                f"{dotted(call.func)}({name}) is handed a Python number, not a tensor: it raises "
                f"(and nothing is averaged); reduce a tensor (torch.tensor({name}, device=device)) "
                "and read it back with .item()",
            )
            found.severity = "error"
            yield found


def _python_numbers_reduced(src: Source) -> Iterator[tuple]:
    """``dist.all_reduce(epoch_loss)`` where the function binds ``epoch_loss`` only
    to Python numbers (``running_loss / len(loader)`` of ``loss.item()`` sums,
    literals, ``len()``): a collective needs a tensor."""
    for call in src.calls:
        if not is_collective(src, call) or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        name = call.args[0].id
        scope = src.function_of(call)
        if scope is None:
            continue
        numbers: dict = {}
        if _number_name(scope, name, numbers, 0):
            yield call, name


def _number_name(scope: ast.AST, name: str, numbers: dict, depth: int) -> bool:
    if name in numbers:
        return numbers[name]
    numbers[name] = False  # (a cycle: not proven)
    values = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            values.append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            values.append(node.value)
        elif isinstance(node, (ast.For, ast.With, ast.arguments)) and name in {
            n.id for n in ast.walk(getattr(node, "target", node)) if isinstance(n, ast.Name)
        } | ({a.arg for a in node.args} if isinstance(node, ast.arguments) else set()):
            return False  # bound by a loop, a with or a parameter: not known
    numbers[name] = bool(values) and depth < 4 and all(_number(scope, v, numbers, depth + 1) for v in values)
    return numbers[name]


def _number(scope: ast.AST, value: Optional[ast.AST], numbers: dict, depth: int) -> bool:
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ast.Call):
        if isinstance(value.func, ast.Attribute) and value.func.attr == "item" and not value.args:
            return True
        if isinstance(value.func, ast.Attribute) and value.func.attr in ("get_world_size", "get_rank"):
            return True  # dist.get_world_size(): an int
        return isinstance(value.func, ast.Name) and value.func.id in ("len", "float", "int", "round")
    if isinstance(value, ast.BinOp):
        return _number(scope, value.left, numbers, depth) and _number(scope, value.right, numbers, depth)
    if isinstance(value, ast.UnaryOp):
        return _number(scope, value.operand, numbers, depth)
    if isinstance(value, ast.Name):
        return _number_name(scope, value.id, numbers, depth)
    return False
