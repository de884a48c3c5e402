"""DDP109 padded-evaluation-shards."""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List

from .. import _names as N
from .._analysis import (
    Source,
    argument,
    assigned_name,
    calls_method,
    classify_loader,
    dotted,
    evaluated_only,
    is_eval_name,
    is_train_name,
    loader_loops,
    uses_distributed,
)
from .._loaders import loaders_with_distributed_samplers
from ._base import Diagnostic, Rule


class PaddedEvaluationShards(Rule):
    """
    ## What it does
    In DDP code, reports a `DistributedSampler` of an evaluation loader: one whose
    sampler, dataset or loader is named for validation or testing (`val_sampler`,
    `dataset_val`, `test_loader`), or whose loader is only iterated under
    `torch.no_grad()` without `backward()`. A sampler of a loader that trains
    (iterated where `backward()` is called, or named for training), one with
    `drop_last=True`, and a file that asserts (or raises unless) the dataset's
    length is a multiple of the world size are not reported.

    ## Why is this bad?
    `DistributedSampler` gives every rank the same number of samples: where
    `len(dataset)` is not a multiple of the world size it pads the shards by
    repeating samples from the start (up to `world_size - 1` of them). Accuracy,
    losses or counts summed over the ranks then count those samples twice, and
    the figure differs from a one-process evaluation and from one world size to
    another (several vision-transformer repositories print a warning about it
    and go on). Training does not mind a repeated sample; an evaluation does.

    ## Example
    ```python
    val_loader = DataLoader(val_set, batch_size=64,
                            sampler=DistributedSampler(val_set, shuffle=False))
    correct, total = evaluate(model, val_loader)  # all_reduced: padded samples counted twice
    ```

    ## Use instead
    ```python
    rank, world = dist.get_rank(), dist.get_world_size()
    shard = Subset(val_set, range(rank, len(val_set), world))  # no padding
    val_loader = DataLoader(shard, batch_size=64)
    correct, total = evaluate(model, val_loader)  # then all_reduce the sums and the counts
    ```
    or evaluate on one rank (the others wait at a barrier).

    ## Fix safety
    No automatic fix: how the metrics are gathered (sums and counts, a list of
    predictions) is the author's.
    """

    CODE = "DDP109"
    NAME = "padded-evaluation-shards"
    SEVERITY = "warning"
    MESSAGE = (
        "DistributedSampler pads the shards to one length by repeating up to world_size - 1 samples "
        "unless len(dataset) is a multiple of the world size: metrics over this evaluation loader "
        "count them twice; give each rank Subset(dataset, range(rank, len(dataset), world_size)) "
        "and all_reduce sums and counts, or evaluate on one rank"
    )
    TRIGGERS = ("DistributedSampler",)
    IN_TESTS = False

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for sampler in padded_evaluation_samplers(src):
            yield self.diagnostic(src, sampler)


def padded_evaluation_samplers(src: Source) -> Iterator[ast.Call]:
    """The ``DistributedSampler(...)`` calls of evaluation loaders that pad their
    shards (no ``drop_last=True``; the file never requires the length to divide)."""
    if _length_required_to_divide(src):
        return
    loaders = _loaders_of_samplers(src)
    for call in src.calls:
        if src.qualname(call.func) not in N.DISTRIBUTED_SAMPLER:
            continue
        drop_last = argument(call, 5, "drop_last")
        if isinstance(drop_last, ast.Constant) and drop_last.value is True:
            continue
        its_loaders = loaders.get(id(call), [])
        if any(_trains(src, loader) for loader in its_loaders):
            continue
        dataset = argument(call, 0, "dataset")
        names = [assigned_name(src, call), dotted(dataset) if dataset is not None else ""]
        names += [assigned_name(src, loader) for loader in its_loaders]
        words = [n.rsplit(".", 1)[-1] for n in names if n]
        if any(is_train_name(w) for w in words):
            continue
        if any(is_eval_name(w) for w in words) or any(evaluated_only(src, loader) for loader in its_loaders):
            yield call


def _loaders_of_samplers(src: Source) -> Dict[int, List[ast.Call]]:
    """id(DistributedSampler call) -> the DataLoader calls it is handed to (directly,
    or through a name bound to it in the same function)."""
    found: Dict[int, List[ast.Call]] = {}
    for loader, sampler in loaders_with_distributed_samplers(src, per_function=True):
        found.setdefault(id(sampler), []).append(loader)
    return found


def _trains(src: Source, loader: ast.Call) -> bool:
    if classify_loader(src, loader) == "train":
        return True
    return any(calls_method(loop, "backward") for _, loop in loader_loops(src, loader) or [])


def _length_required_to_divide(src: Source) -> bool:
    """``assert len(ds) % world_size == 0`` or ``if len(ds) % world: raise ...``."""
    for node in src.of_type(ast.Assert):
        if _modulo_of_a_length(node.test):
            return True
    for node in src.of_type(ast.If):
        if _modulo_of_a_length(node.test) and any(isinstance(s, ast.Raise) for s in node.body):
            return True
    return False


def _modulo_of_a_length(test: ast.AST) -> bool:
    return any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
        and any(isinstance(c, ast.Call) and dotted(c.func) == "len" for c in ast.walk(n.left))
        for n in ast.walk(test)
    )
