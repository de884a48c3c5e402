"""DDP102 missing-set-epoch."""

from __future__ import annotations

import ast
from typing import Iterator, Optional

from .. import _names as N
from .._analysis import Source, argument, dotted, is_epoch_loop, is_eval_name, is_false, last_name
from .._loaders import UNRESOLVED, loops_over, sharded_loaders, statistics_pass, wrapper_receiver
from .._program import SETS_EPOCH_TEXT, imported_by
from ._base import Diagnostic, Rule


class MissingSetEpoch(Rule):
    """
    ## What it does
    Reports a shuffling `DistributedSampler` in a file that has an epoch loop but
    never calls `set_epoch`.

    ## Why is this bad?
    `DistributedSampler` seeds its shuffle with the epoch number. Without
    `sampler.set_epoch(epoch)` every epoch replays the same order: no error, just
    a silently worse model.

    ## Example
    ```python
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, sampler=sampler, batch_size=32)
    for epoch in range(epochs):
        for batch in loader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            ...
    ```

    ## Fix safety
    Unsafe: the data order of every epoch after the first changes (as intended).
    """

    CODE = "DDP102"
    NAME = "missing-set-epoch"
    SEVERITY = "warning"
    MESSAGE = "DistributedSampler shuffles but set_epoch() is never called: every epoch repeats the same order"
    FIX = "unsafe"
    FIX_TRANSFORMS = ("set-epoch",)
    FIX_DESCRIPTION = "call loader.sampler.set_epoch(epoch) at the top of the epoch loop"
    TRIGGERS = ("DistributedSampler",)

    def check(self, src: Source) -> Iterator[Diagnostic]:
        wrong = list(_set_on_a_wrapper(self, src))
        yield from wrong
        if wrong:
            return
        if _sets_epoch(src):
            yield from _another_sampler_set(self, src)
            return
        if not any(is_epoch_loop(n) for n in src.nodes):
            return
        if _handed_elsewhere(src):
            return  # ``train_one_epoch(model, loader, epoch)`` of another module may set it
        if imported_by(src, SETS_EPOCH_TEXT):
            return  # a loader factory (Swin's build_loader) whose importer calls set_epoch
        constant = _constant_set_epoch(src)
        one_pass = _only_statistics_passes(src)
        for call in src.calls:
            if id(call) in one_pass:
                continue  # (a pass that computes statistics: its order does not matter; DDP101 says what does)
            if src.qualname(call.func) in N.DISTRIBUTED_SAMPLER and not is_false(argument(call, 3, "shuffle")):
                yield self.diagnostic(
                    src, call,
                    None if constant is None else
                    f"DistributedSampler shuffles but set_epoch() is only called with a constant "
                    f"(set_epoch({constant.args[0].value!r}), line {constant.lineno}): every epoch "
                    "repeats the same order; call set_epoch(epoch) at the start of every epoch",
                )


def _set_on_a_wrapper(rule: Rule, src: Source) -> Iterator[Diagnostic]:
    """``bar.sampler.set_epoch(epoch)`` where ``bar`` is ``tqdm(loader)``,
    ``enumerate(loader)`` or ``Prefetcher(loader)`` (``_loaders.wrapper_receiver``):
    the wrapper has no ``.sampler`` -- AttributeError on the first epoch."""
    for call in src.calls:
        behind = wrapper_receiver(src, call)
        if behind is None:
            continue
        name = dotted(call.func.value.value)  # type: ignore[attr-defined]
        known = [b for b in behind if b != UNRESOLVED]
        found = rule.diagnostic(
            src, call,
            f"set_epoch() is called on {name}.sampler, but {name} wraps a DataLoader and has no "
            "sampler (AttributeError): call it on the DataLoader's own sampler"
            + (f" ({known[0]}.sampler.set_epoch(epoch))" if len(known) == 1 else ""),
        )
        found.fix = None  # (an existing call, edited by hand)
        yield found


def _only_statistics_passes(src: Source) -> set:
    """ids of the DistributedSampler calls whose loaders are iterated by
    statistics passes only (``_loaders.statistics_pass``): no epoch to set."""
    found = set()
    for name, sampler in sharded_loaders(src).items():
        loops = loops_over(src, name)
        if loops and all(statistics_pass(src, loop) for loop in loops):
            found.add(id(sampler))
    return found


def _constant_set_epoch(src: Source) -> Optional[ast.Call]:
    """The first ``set_epoch(0)``-style call, with a constant (None without one)."""
    for call in src.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch" and call.args:
            if isinstance(call.args[0], ast.Constant):
                return call
    return None


def _sets_epoch(src: Source) -> bool:
    """A ``set_epoch(...)`` call with a changing argument (``set_epoch(epoch)``,
    also inside a per-epoch function); ``set_epoch(0)`` once, or the word in a
    comment, does not count."""
    for call in src.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch" and call.args:
            if not isinstance(call.args[0], ast.Constant):
                return True
    return False


def _another_sampler_set(rule: Rule, src: Source) -> Iterator[Diagnostic]:
    """``val_sampler.set_epoch(epoch)`` while the shuffling training sampler is
    never set: reported at that sampler.  Only when every ``set_epoch`` call names
    a sampler (or ``loader.sampler``) this file builds by name -- any other
    receiver (``self.sampler``, a helper's argument) may be the missing one --
    and not for a sampler or loader named for validation (its order does not
    matter)."""
    names = {}  # id(DistributedSampler call) -> the names it goes by (sampler, loader.sampler)
    by_name = {}  # a name -> its DistributedSampler call
    for a in src.of_type(ast.Assign):
        if src.is_call(a.value, N.DISTRIBUTED_SAMPLER):
            for t in filter(None, map(dotted, a.targets)):
                by_name[t] = a.value
    for a in src.of_type(ast.Assign):
        if src.is_call(a.value, N.DATA_LOADER):
            sampler = argument(a.value, 3, "sampler")
            call = by_name.get(dotted(sampler)) if sampler is not None else None
            if call is None and sampler is not None and src.is_call(sampler, N.DISTRIBUTED_SAMPLER):
                call = sampler
            for t in filter(None, map(dotted, a.targets)):
                if call is not None:
                    by_name[f"{t}.sampler"] = call
    calls = {}
    for name, call in by_name.items():
        names.setdefault(id(call), []).append(name)
        calls[id(call)] = call
    set_ones = set()
    for call in src.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch" and call.args:
            if isinstance(call.args[0], ast.Constant):
                continue
            if dotted(func.value) not in by_name:
                return
            set_ones.add(dotted(func.value))
    set_calls = {id(by_name[n]) for n in set_ones}
    for key, call in calls.items():
        if key in set_calls or is_false(argument(call, 3, "shuffle")):
            continue
        if any(is_eval_name(n.split(".")[-2 if n.endswith(".sampler") else -1]) for n in names[key]):
            continue
        found = rule.diagnostic(
            src, call,
            f"DistributedSampler shuffles but set_epoch() is only called on {', '.join(sorted(set_ones))}, "
            f"not on this one ({' / '.join(names[key])}): every epoch repeats the same order",
        )
        found.fix = None  # set-epoch adds no second call next to an existing one: a human's edit
        yield found


#: calls that take a loader without training on it
_ITERATING = frozenset({"enumerate", "len", "iter", "next", "zip", "list", "tqdm", "trange", "isinstance"})


def _handed_elsewhere(src: Source) -> bool:
    """An epoch loop hands a loader (or its sampler) to a function this file does
    not define -- an import, another object's method -- where ``set_epoch`` may be
    called: a file cannot see that, so it does not guess."""
    local = {n.name for n in src.of_type(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)}
    samplers = {
        dotted(t) for a in src.of_type(ast.Assign)
        if src.is_call(a.value, N.DISTRIBUTED_SAMPLER) and not is_false(argument(a.value, 3, "shuffle"))
        for t in a.targets
    } - {""}
    handed = set(samplers)  # the shuffling sampler, and the loaders it feeds
    for a in src.of_type(ast.Assign):
        if src.is_call(a.value, N.DATA_LOADER):
            sampler = argument(a.value, 3, "sampler")
            if sampler is not None and (
                dotted(sampler) in samplers
                or src.is_call(sampler, N.DISTRIBUTED_SAMPLER) and not is_false(argument(sampler, 3, "shuffle"))
            ):
                handed |= {dotted(t) for t in a.targets} - {""}
    if not handed:
        return False
    for loop in (n for n in src.nodes if is_epoch_loop(n)):
        for call in ast.walk(loop):
            if not isinstance(call, ast.Call) or last_name(call.func) in _ITERATING:
                continue
            if last_name(call.func) in local:
                continue  # a function or method of this file (checked where it is)
            if any(dotted(a) in handed for a in (*call.args, *(k.value for k in call.keywords))):
                return True
    return False
