"""DDP305 collective-in-rank-branch."""

from __future__ import annotations

import ast
from typing import Iterator, List

from .._analysis import (
    Source,
    calls_method,
    ddp_wrapped_names,
    dotted,
    is_collective,
    rank_branch,
    uses_distributed,
)
from ._base import Diagnostic, Rule


class CollectiveInRankBranch(Rule):
    """
    ## What it does
    Reports a collective (`dist.barrier()`, `all_reduce`, `broadcast`,
    `all_gather`, ...) inside a branch that depends on the rank (`if rank == 0:`,
    `if dist.get_rank() != 0:`, `if is_main_process():`), and a `break` or
    `return` inside such a branch that leaves a loop or function where the other
    ranks go on to a collective (a `backward()` of a DDP model, a DDP forward, a
    `barrier`). What counts as a rank check is documented in `_analysis`
    (`is_rank_dependent`): comparisons of `dist.get_rank()`, `rank`,
    `local_rank`, `args.rank % ngpus`, `int(os.environ["RANK"])`; calls named
    `is_main_process()` / `is_master()`; variables named `is_main`, `master`...

    The deliberate pairing used by some libraries -- a `barrier()` for the other
    ranks before rank 0 downloads, and one for rank 0 after -- is recognised (two
    or more rank-dependent barriers in one function) and not reported.

    ## Why is this bad?
    A collective completes only when every rank of the group calls it. If only
    rank 0 reaches it, rank 0 waits forever and the others wait in their next
    collective: the job hangs until the 30-minute timeout kills it, with no
    error pointing here.

    ## Example
    ```python
    if dist.get_rank() == 0:
        save_checkpoint(model)
        dist.barrier()
    ```

    ## Use instead
    ```python
    if dist.get_rank() == 0:
        save_checkpoint(model)
    dist.barrier()
    ```

    ## Fix safety
    No automatic fix.
    """

    CODE = "DDP305"
    NAME = "collective-in-rank-branch"
    SEVERITY = "error"
    MESSAGE = "collective inside a branch that depends on the rank: the other ranks never reach it (deadlock)"
    TRIGGERS = ("rank", "RANK", "main", "master")

    def check(self, src: Source) -> Iterator[Diagnostic]:
        paired = _paired_barrier_functions(src)
        for call in src.calls:
            if not is_collective(src, call):
                continue
            branch = rank_branch(src, call)
            if branch is None:
                continue
            if src.qualname(call.func).endswith("barrier") and src.function_of(call) in paired:
                continue
            yield self.diagnostic(src, call)
        if not uses_distributed(src):
            return
        wrapped = ddp_wrapped_names(src)
        for node in ast.walk(src.tree):
            if isinstance(node, (ast.Break, ast.Return)) and rank_branch(src, node) is not None:
                scope = _left_scope(src, node)
                if scope is not None and _syncs(src, scope, wrapped):
                    kind = "break" if isinstance(node, ast.Break) else "return"
                    yield self.diagnostic(
                        src,
                        node,
                        f"rank-dependent {kind}: the other ranks go on to a collective "
                        "(DDP backward/forward, barrier) and wait forever",
                    )


def _paired_barrier_functions(src: Source) -> set:
    counts = {}
    for call in src.calls:
        if src.qualname(call.func).endswith("barrier") and rank_branch(src, call) is not None:
            owner = src.function_of(call)
            counts[owner] = counts.get(owner, 0) + 1
    return {owner for owner, n in counts.items() if n >= 2}


def _left_scope(src: Source, node: ast.AST):
    for anc in src.ancestors(node):
        if isinstance(node, ast.Break) and isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return anc
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return anc if isinstance(node, ast.Return) else None
    return None


def _syncs(src: Source, scope: ast.AST, wrapped: set) -> bool:
    """The loop/function reaches a collective: backward, a DDP forward, a barrier..."""
    for sub in ast.walk(scope):
        if isinstance(sub, ast.Call):
            if is_collective(src, sub):
                return True
            if wrapped and dotted(sub.func) in wrapped:
                return True
    # a backward() in DDP code is the DDP gradient all-reduce
    return calls_method(scope, "backward")
