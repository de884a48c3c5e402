"""DDP101 loader-without-distributed-sampler."""

from __future__ import annotations

import ast
from typing import Iterator

from .. import _names as N
from .._analysis import (
    Source, argument, assigned_name, bound_values, calls_method, classify_loader, dotted, is_none, is_rank_expr,
    iterable_dataset, iterated, last_name, loader_loops, uses_distributed,
)
from .._loaders import statistics_passes
from ._base import Diagnostic, Rule


class LoaderWithoutDistributedSampler(Rule):
    """
    ## What it does
    In DDP code, reports a training `DataLoader` (told apart by its names --
    `train_loader`, `train_set`, `get_train_loader()` -- or `shuffle=True`) that
    has no `sampler=` / `batch_sampler=`, or whose sampler is torch's
    `RandomSampler`/`SequentialSampler` (also inside a `BatchSampler`), which
    draw from the whole dataset. Evaluation loaders are not reported: every rank
    may evaluate the whole set. Also reports a pass over a sharded training
    loader that only computes numbers from the data (a mean/std or class-weights
    pass before training: no `backward()`, no optimizer step), which now covers
    this rank's shard only.

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
    IN_TESTS = False  # a test exercises it on purpose
    TRIGGERS = (("DataLoader", "istributed"),)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for loop, name in statistics_passes(src):
            found = self.diagnostic(
                src, loop,
                f"this pass over the sharded training loader ({name}) computes statistics from this "
                "rank's shard only; iterate the dataset (unsharded) or all_reduce the sums",
            )
            found.fix = None  # (which of the two, only the author knows)
            yield found
        for call in src.calls:
            if src.qualname(call.func) not in N.DATA_LOADER:
                continue
            # (an explicit ``sampler=None`` is DataLoader's default: no sampler)
            sampler, batch_sampler = (
                None if is_none(a) else a for a in (argument(call, 3, "sampler"), argument(call, 4, "batch_sampler"))
            )
            if sampler is not None or batch_sampler is not None:
                whole = _whole_dataset_sampler(src, sampler if sampler is not None else batch_sampler, call)
                kind = classify_loader(src, call)
                if whole and (kind == "train" or kind == "unknown" and _trained_on(src, call)):
                    found = self.diagnostic(
                        src, call,
                        f"this training DataLoader's {whole} draws from the same data on every rank: "
                        "each rank trains on the same samples; "
                        + (
                            "give each rank its own draws (split the indices by rank, or a weighted "
                            "sampler that draws num_samples // world_size per rank)"
                            if "Weighted" in whole or "Subset" in whole else
                            "use a DistributedSampler" + (" inside the BatchSampler" if batch_sampler is not None else "")
                        ),
                    )
                    if batch_sampler is not None or whole.startswith(("Weighted", "Subset")):
                        found.fix = None  # convert leaves a batch sampler, weights or indices for a human
                    yield found
                continue
            if any(kw.arg is None for kw in call.keywords):
                continue  # **kwargs: cannot see what it holds
            if iterable_dataset(src, argument(call, 0, "dataset")):
                continue  # a stream: sharded in its __iter__, if at all (no sampler possible)
            if classify_loader(src, call) == "train" and not _iterated_here_without_training(src, call):
                yield self.diagnostic(src, call)


def _iterated_here_without_training(src: Source, call: ast.Call) -> bool:
    """The loader is only iterated in its function (``loader_loops``), a function
    that never calls ``backward()`` (kuangliu's ``get_mean_and_std(dataset)``:
    ``shuffle=True``, but a statistics pass, not training) -- what convert's
    sampler decides too."""
    loops = loader_loops(src, call)
    return bool(loops) and not any(calls_method(func, "backward") for func, _ in loops)


def _whole_dataset_sampler(src: Source, sampler: ast.AST, at: ast.AST, depth: int = 0) -> str:
    """torch's RandomSampler/SequentialSampler, also inside torch's BatchSampler,
    given inline or through a name assigned once in the function of ``at``: its
    name ("" otherwise -- a custom sampler may shard, a DistributedSampler does,
    and a parameter is the caller's)."""
    if depth > 3:
        return ""  # (``sampler = BatchSampler(sampler, ...)``: a name that refers to itself)
    if isinstance(sampler, ast.Name):
        values = bound_values(src, sampler.id, src.function_of(at))
        if len(values) != 1:
            return ""
        sampler = values[0]
    if not isinstance(sampler, ast.Call):
        return ""
    name = src.qualname(sampler.func)
    if name in N.BATCH_SAMPLER:
        inner = argument(sampler, 0, "sampler")
        found = _whole_dataset_sampler(src, inner, at, depth + 1) if inner is not None else ""
        return f"BatchSampler({found})" if found else ""
    if name in N.WEIGHTED_OR_SUBSET_SAMPLER and _per_rank_arguments(src, sampler):
        return ""  # ``SubsetRandomSampler(indices[rank::world_size])``: this rank's own draws
    if name in N.RANDOM_SAMPLER | N.SEQUENTIAL_SAMPLER | N.WEIGHTED_OR_SUBSET_SAMPLER:
        return name.rsplit(".", 1)[-1]
    return ""


def _per_rank_arguments(src: Source, sampler: ast.Call) -> bool:
    """The sampler's arguments (or the values of the names in them) use the rank
    or the world size: its indices, sample count or generator are per rank."""
    values = [*sampler.args, *(k.value for k in sampler.keywords)]
    values += [v for a in list(values) if isinstance(a, ast.Name) for v in bound_values(src, a.id, src.function_of(sampler))]
    return any(
        is_rank_expr(src, n) or "world" in dotted(n).lower() or last_name(getattr(n, "func", n)) == "get_world_size"
        for value in values for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))
    )


def _trained_on(src: Source, call: ast.Call) -> bool:
    """The loader (a name of no telling: ``loader``) is iterated by a loop that
    calls ``backward()``: a training loader."""
    name = assigned_name(src, call)
    if not name:
        return False
    return any(
        name in {dotted(x) for x in iterated(loop.iter)} and calls_method(loop, "backward")
        for loop in src.of_type(ast.For)
    )
