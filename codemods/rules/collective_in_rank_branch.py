"""DDP305 collective-in-rank-branch."""

from __future__ import annotations

import ast
from typing import Iterator, List, Optional

from .._analysis import (
    Source,
    bound_values,
    calls_method,
    ddp_wrapped_names,
    dotted,
    is_collective,
    is_main_process_check,
    is_not_main_check,
    last_name,
    rank_branch,
    uses_distributed,
)
from .._analysis import runs_without_a_process_group
from ._base import Diagnostic, Rule


class CollectiveInRankBranch(Rule):
    """
    ## What it does
    Reports a collective (`dist.barrier()`, `all_reduce`, `broadcast`,
    `all_gather`, ..., and the `state_dict()` of an FSDP model under
    `FULL_STATE_DICT`, its default, which gathers every rank's shards even with
    `rank0_only=True`) inside a branch that depends on the rank (`if rank == 0:`,
    `if dist.get_rank() != 0:`, `if is_main_process():`) -- also through a
    function of the file that runs one (`if rank == 0: print(sync_metric(loss))`,
    `validate(model.module, loader)` that all-reduces its sums) -- and a `break` or
    `return` inside such a branch -- or under a flag that only such a branch sets
    and no collective shares (`if rank == 0: should_stop = ...` then `if
    should_stop: break`) -- that leaves a loop or function where the other
    ranks go on to a collective (a `backward()` of a DDP model, a DDP forward, a
    `barrier`). What counts as a rank check is documented in `_analysis`
    (`is_rank_dependent`): comparisons of `dist.get_rank()`, `rank`,
    `local_rank`, `args.rank % ngpus`, `int(os.environ["RANK"])`; calls named
    `is_main_process()` / `is_master()`; variables named `is_main`, `master`...

    Symmetric code is not reported: the same collective in both branches
    (`if rank == src: dist.gather(t, out, src) else: dist.gather(t, None, src)`),
    a `return` in both branches, and the deliberate pairing used by some
    libraries -- a `barrier()` for the other ranks before rank 0 downloads, and
    one for rank 0 after (in one function, a barrier on the main-process side of a
    rank check and one on the other side; two behind the same check are no pair).

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
    TRIGGERS = (("istributed", "rank"), ("istributed", "RANK"), ("istributed", "main"), ("istributed", "master"))

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
            name = src.qualname(call.func)
            if _other_branch_has(src, branch, call, lambda n: isinstance(n, ast.Call) and src.qualname(n.func) == name):
                continue  # `if rank == src: gather(...) else: gather(...)`: every rank calls it
            yield self.diagnostic(src, call)
        # ``if rank == 0: print(sync_metric(loss))``: a function of the file that runs one
        reaching = _collective_functions(src)
        methods = _collective_methods(src)
        for call in src.calls if reaching or methods else ():
            if isinstance(call.func, ast.Name) and call.func.id in reaching:
                name, collective = call.func.id, reaching[call.func.id]
            elif isinstance(call.func, ast.Attribute) and call.func.attr in methods and _instance_of(
                src, call.func.value, methods[call.func.attr][1]
            ):
                # ``if rank == 0: model.save_pretrained(path)`` of a class whose method waits in a barrier
                name, collective = call.func.attr, methods[call.func.attr][0]
            else:
                continue
            branch = rank_branch(src, call)
            if branch is None or src.function_of(call) is not None and src.function_of(call).name == name:
                continue
            if _other_branch_has(src, branch, call, lambda n: isinstance(n, ast.Call) and last_name(n.func) == name):
                continue
            yield self.diagnostic(
                src,
                call,
                f"{name}() runs a collective ({collective}) inside a branch that depends on the "
                "rank: the other ranks never reach it and this rank waits forever; call it on every "
                "rank, then use the result under the check",
            )
        if not uses_distributed(src):
            return
        wrapped = ddp_wrapped_names(src)
        for node in src.nodes:
            branch = (rank_branch(src, node) or _flag_set_on_some_ranks(src, node)) if isinstance(
                node, (ast.Break, ast.Return)
            ) else None
            if branch is not None:
                kind_of = type(node)
                if _other_branch_has(src, branch, node, lambda n: isinstance(n, kind_of)):
                    continue  # the other ranks leave too
                if runs_without_a_process_group(src, node):
                    continue  # ``if not dist.is_initialized(): return``: no collective to miss (YOLOX)
                scope = _left_scope(src, node)
                # a break skips the rest of the loop's iterations (all of its body);
                # a return skips what follows it in the function
                after = 0 if isinstance(node, ast.Break) else node.lineno
                if scope is not None and _syncs(src, scope, wrapped, after):
                    kind = "break" if isinstance(node, ast.Break) else "return"
                    yield self.diagnostic(
                        src,
                        node,
                        f"rank-dependent {kind}: the other ranks go on to a collective "
                        "(DDP backward/forward, barrier) and wait forever",
                    )


def _flag_set_on_some_ranks(src: Source, node: ast.AST) -> Optional[ast.If]:
    """The ``if should_stop:`` around ``node`` whose flag only some ranks set:
    ``should_stop = ...`` inside a rank branch of the same function (early stopping
    decided on rank 0), and never handed to a collective (``dist.broadcast``,
    ``broadcast_object_list``, ``all_reduce`` of it) that would share it."""
    parent = src.parent(node)
    while parent is not None and not isinstance(parent, ast.If):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.For, ast.While)):
            return None
        parent = src.parent(parent)
    if parent is None:
        return None
    test = parent.test.operand if isinstance(parent.test, ast.UnaryOp) else parent.test
    flag = dotted(test)
    if not flag:
        return None
    scope = src.function_of(parent)
    nodes = list(ast.walk(scope)) if scope is not None else src.nodes
    set_on_some = any(
        isinstance(n, (ast.Assign, ast.AugAssign)) and any(dotted(t) == flag for t in getattr(n, "targets", [getattr(n, "target", None)]))
        and rank_branch(src, n) is not None
        for n in nodes
    )
    handed = {
        dotted(sub) for n in nodes if isinstance(n, ast.Call) and is_collective(src, n)
        for arg in n.args for sub in ast.walk(arg)
    } - {""}
    # ``buf = [stop]; dist.broadcast_object_list(buf, 0); stop = buf[0]`` (yolov5)
    shared = flag in handed or any(
        isinstance(n, ast.Assign) and any(dotted(t) == flag for t in n.targets)
        and dotted(n.value.value if isinstance(n.value, ast.Subscript) else n.value) in handed
        for n in nodes
    )
    return parent if set_on_some and not shared else None


def _collective_functions(src: Source) -> dict:
    """Functions of the module that run a collective on every call (not behind a
    rank check of their own), directly or through another such function:
    {name: the collective}."""
    found: dict = {}
    collectives = [c for c in src.calls if is_collective(src, c)]
    if not collectives:
        return found  # (most files: nothing to follow)
    functions = {f.name: f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for call in collectives:
        func = src.function_of(call)
        while func is not None and (isinstance(func, ast.Lambda) or src.function_of(func) is not None):
            func = src.function_of(func)  # (the module-level function around a nested one)
        if func is not None and functions.get(func.name) is func and func.name not in found:
            if rank_branch(src, call) is None:
                found[func.name] = src.qualname(call.func).rsplit(".", 1)[-1]
    changed = bool(found)
    while changed:
        changed = False
        for name, func in functions.items():
            if name in found:
                continue
            for call in ast.walk(func):
                if (
                    isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in found
                    and rank_branch(src, call) is None
                ):
                    found[name] = found[call.func.id]
                    changed = True
                    break
    return found


def _collective_methods(src: Source) -> dict:
    """Methods of the module's classes that run a collective directly, not behind
    a rank check of their own: {method name: (the collective, the class)}."""
    found: dict = {}
    for cls in (n for n in src.tree.body if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.name.startswith("__"):
                continue
            for call in ast.walk(method):
                if isinstance(call, ast.Call) and is_collective(src, call) and rank_branch(src, call) is None:
                    found.setdefault(method.name, (src.qualname(call.func).rsplit(".", 1)[-1], cls))
                    break
    return found


def _instance_of(src: Source, receiver: ast.AST, cls: ast.ClassDef) -> bool:
    """``receiver`` is an object of ``cls``: ``self`` in its methods, or a name bound
    to ``cls(...)`` (a method name alone could be another object's: a progress
    bar's ``update``)."""
    if isinstance(receiver, ast.Name) and receiver.id == "self":
        return any(a is cls for a in src.ancestors(receiver))
    if not isinstance(receiver, ast.Name):
        return False
    values = bound_values(src, receiver.id)
    return bool(values) and all(isinstance(v, ast.Call) and dotted(v.func) == cls.name for v in values)


def _other_branch_has(src: Source, branch, node, predicate) -> bool:
    """The branch of ``branch`` that does not hold ``node`` contains a match."""
    # an if statement's branches are lists of statements, an ``a if c else b``'s
    # are single expressions
    body = branch.body if isinstance(branch.body, list) else [branch.body]
    orelse = branch.orelse if isinstance(branch.orelse, list) else [branch.orelse]
    inside_body = any(node is n or any(node is d for d in ast.walk(n)) for n in body)
    other = orelse if inside_body else body
    return any(predicate(n) for stmt in other for n in ast.walk(stmt))


def _paired_barrier_functions(src: Source) -> set:
    """Functions with the download-first idiom: ``if not main: barrier()`` ...
    ``if main: barrier()`` -- each rank reaches one of the two barriers, so every
    rank meets.  Two barriers behind the *same* condition are no pair."""
    sides: dict = {}
    for call in src.calls:
        if not src.qualname(call.func).endswith("barrier"):
            continue
        branch = rank_branch(src, call)
        if not isinstance(branch, ast.If):
            continue
        in_body = any(call is n for stmt in branch.body for n in ast.walk(stmt))
        test, rest = _rank_conjunct(src, branch.test)
        main, not_main = is_main_process_check(src, test), is_not_main_check(src, test)
        side = ("main" if main else "other" if not_main else None) if in_body else (
            "other" if main else "main" if not_main else None
        )
        # (HF: `if args.local_rank not in [-1, 0] and not evaluate:` ... `if
        # args.local_rank == 0 and not evaluate:` -- the same other condition on both)
        sides.setdefault((src.function_of(call), rest), set()).add(side)
    return {owner for (owner, _), seen in sides.items() if {"main", "other"} <= seen}


def _rank_conjunct(src: Source, test: ast.AST):
    """``(rank test, the other conjuncts)`` of ``rank_test and other...``; the test
    itself and "" when it is no such conjunction."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        ranked = [v for v in test.values if is_main_process_check(src, v) or is_not_main_check(src, v)]
        if len(ranked) == 1:
            return ranked[0], ast.dump(ast.BoolOp(op=ast.And(), values=[v for v in test.values if v is not ranked[0]]))
    return test, ""


def _left_scope(src: Source, node: ast.AST):
    for anc in src.ancestors(node):
        if isinstance(node, ast.Break) and isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return anc
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return anc if isinstance(node, ast.Return) else None
    return None


def _syncs(src: Source, scope: ast.AST, wrapped: set, after: int = 0) -> bool:
    """The loop/function reaches a collective (after line ``after``): a backward
    (DDP's gradient all-reduce), a DDP forward, a barrier..."""
    for sub in ast.walk(scope):
        if not isinstance(sub, ast.Call) or sub.lineno <= after:
            continue
        if is_collective(src, sub) or (wrapped and dotted(sub.func) in wrapped):
            return True
        if isinstance(sub.func, ast.Attribute) and sub.func.attr == "backward":
            return True
    return False
