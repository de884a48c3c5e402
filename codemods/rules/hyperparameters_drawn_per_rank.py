"""DDP108 hyperparameters-drawn-per-rank."""

from __future__ import annotations

import ast
from typing import Iterator, List, Optional, Set, Tuple

from .. import _names as N
from .._analysis import Source, dotted, last_name, uses_distributed
from ._base import Diagnostic, Rule

#: draws from a process's own global random state (Python's, NumPy's)
DRAWS = frozenset(
    {
        "random.random", "random.uniform", "random.choice", "random.randint", "random.randrange",
        "random.gauss", "random.sample", "random.betavariate", "random.lognormvariate",
        "numpy.random.rand", "numpy.random.random", "numpy.random.uniform", "numpy.random.choice",
        "numpy.random.randint", "numpy.random.normal", "numpy.random.randn",
    }
)
#: what seeds that state alike on every process (when its arguments do not name the rank)
SEEDS = frozenset({"random.seed", "numpy.random.seed"})
_RANK_WORDS = ("rank", "local_rank", "gpu")
#: what hands the main process's value to every rank (dp2ddp's helper, by either name it gets)
_SHARING = frozenset({"broadcast_object_list", "broadcast", "main_process_value", "dp2ddp_main_process_value"})


class HyperparametersDrawnPerRank(Rule):
    """
    ## What it does
    In DDP code, reports a value drawn from Python's or NumPy's global random
    state (`random.random()`, `random.choice([2, 3])`, `np.random.uniform(...)`)
    in the code that sets the run up -- at module level or in a function that the
    module level or the `__main__` block calls (`main(config)`), outside any loop
    and any class -- when the program does not seed that state alike on every
    process first (`random.seed(0)`, `seed_everything(seed)`; a seed that names
    the rank differs per process). A draw whose target names a seed is left
    alone (DDP broadcasts the initial weights anyway). Also a vocabulary
    numbered in a set's order (`word_list = list(set(words))`, then
    `enumerate(word_list)`): string hashes, and so a set's order, differ per
    process. A draw in a function that starts the ranks itself (`mp.spawn(worker,
    (args,), nprocs=n)`) is made once, before they exist, and handed to each.

    ## Why is this bad?
    Each DDP process has its own random state, so each draws its own value. A
    learning rate drawn so differs between the ranks, and the copies of the
    model drift apart although DDP averages their gradients; a number of epochs
    or steps drawn so makes one rank stop early while the others wait in the
    next all-reduce for ever; a file name built from the values differs, and a
    rank loads a checkpoint that another rank saved under its own name.

    ## Example
    ```python
    lr = random.random() * 5e-4
    epochs = random.choice([100, 150])
    ```

    ## Use instead
    ```python
    drawn = [random.random() * 5e-4, random.choice([100, 150])]
    dist.broadcast_object_list(drawn, src=0)  # the main process's draw, on every rank
    lr, epochs = drawn
    ```

    ## Fix safety
    `dp2ddp convert` has every rank take the main process's draw, where the
    process group is up by then -- in a function the set-up calls, or below the
    set-up of a script that trains at module level -- and no condition on the
    rank is around it (the broadcast is a collective that every rank reaches):
    `lr = main_process_value(random.random() * 5e-4)`. Other draws, and a
    vocabulary in a set's order, stay reported. `lint --fix` changes nothing:
    in code that already runs distributed, the value may be meant per rank.
    """

    CODE = "DDP108"
    NAME = "hyperparameters-drawn-per-rank"
    SEVERITY = "error"
    MESSAGE = (
        "{draw}() draws from this process's own random state while the run is set up: every rank "
        "gets its own {target} (a different number of epochs hangs the others, a different learning "
        "rate makes the copies diverge); draw it on the main process and share it "
        "(dist.broadcast_object_list), or seed {module} alike on every rank before it"
    )
    TRIGGERS = (("random", "istributed"), ("set(", "enumerate", "istributed"))

    def check(self, src: Source) -> Iterator[Diagnostic]:
        if not uses_distributed(src):
            return
        for call, message in drawn_per_rank(src):
            yield self.diagnostic(src, call, message)


def drawn_per_rank(src: Source) -> List[Tuple[ast.Call, str]]:
    """(draw, message) of every value drawn per process while the run is set up
    (``setup_draws``) from a random state the program does not seed alike: one
    decision for lint and for convert's random-split transform, which reports them."""
    seeded = _seeded(src)
    found = []
    for stmt, call in setup_draws(src):
        draw = src.qualname(call.func)
        module = draw.rsplit(".", 1)[0]
        if module in seeded:
            continue
        target = ", ".join(dotted(t) or "value" for t in stmt.targets)
        message = HyperparametersDrawnPerRank.MESSAGE.format(
            draw=draw.replace("numpy.", "np."), target=target, module=module.replace("numpy", "np")
        )
        found.append((call, message))
    found += set_ordered_vocabularies(src)
    return found


def shareable_draws(src: Source) -> List[Tuple[ast.Assign, List[ast.Call]]]:
    """(assignment, its draws) of the ``drawn_per_rank`` draws whose value convert
    can take from the main process on every rank: a plain assignment (not under a
    condition that names the rank -- the broadcast is a collective) in the code that
    sets the run up.  (Whether the process group is up there is the fix's to check.)"""
    draws = {id(call) for call, _ in drawn_per_rank(src)}
    found: List[Tuple[ast.Assign, List[ast.Call]]] = []
    for stmt, call in setup_draws(src):
        if id(call) not in draws or not isinstance(stmt, ast.Assign):
            continue
        if any(
            isinstance(a, ast.If) and any(w in src.segment(a.test).lower() for w in _RANK_WORDS)
            for a in src.ancestors(stmt)
        ):
            continue  # (if rank == 0: ... -- the other ranks would wait in the broadcast)
        if all(seen is not stmt for seen, _ in found):
            found.append((stmt, [c for c in ast.walk(stmt.value) if isinstance(c, ast.Call) and id(c) in draws]))
    return found


#: how a vocabulary numbered in a set's order is reported (DDP108)
SET_ORDER_MESSAGE = (
    "{target} numbers the items of a set in its iteration order, which differs on each process "
    "(string hashes are randomised per process; torchrun does not fix PYTHONHASHSEED): each rank "
    "gets its own vocabulary, and the averaged gradients mix different words; use sorted(set(...))"
)


def set_ordered_vocabularies(src: Source) -> List[Tuple[ast.Call, str]]:
    """``word_list = list(set(words))`` in the code that sets the run up, then
    numbered (``{w: i for i, w in enumerate(word_list)}``): the order of a set of
    strings differs between processes.  (graykode's BERT.)"""
    if "set(" not in src.text or "enumerate" not in src.text:
        return []
    entry_functions = _entry_functions(src)
    numbered = {
        dotted(c.args[0]) for c in src.calls
        if isinstance(c.func, ast.Name) and c.func.id == "enumerate" and c.args and dotted(c.args[0])
    }
    found = []
    for stmt in src.of_type(ast.Assign):
        value = stmt.value
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "tuple")
                and len(value.args) == 1 and isinstance(value.args[0], ast.Call)
                and isinstance(value.args[0].func, ast.Name) and value.args[0].func.id == "set"):
            continue
        target = ", ".join(dotted(t) for t in stmt.targets if dotted(t))
        if not target or target not in numbered:
            continue
        scope = _setup_scope(src, stmt)
        if scope is None or scope != "module" and scope not in entry_functions:
            continue
        found.append((value.args[0], SET_ORDER_MESSAGE.format(target=target)))
    return found


def setup_draws(src: Source) -> List[tuple]:
    """(assignment, draw) of the values drawn from a global random state in the
    code that sets the run up: module level, or a top-level function called from
    the module level / the ``__main__`` block; not in a loop, a comprehension or a
    class; not a seed."""
    entry_functions = _entry_functions(src)
    launchers = _launchers(src) if "spawn" in src.text or "start_processes" in src.text else set()
    broadcast = {
        dotted(a) for c in src.calls if last_name(c.func) in _SHARING for a in c.args[:1]
    } - {""}
    found = []
    for stmt in src.of_type(ast.Assign):
        if any("seed" in (dotted(t) or "").lower() for t in stmt.targets):
            continue
        if any(dotted(t) in broadcast for t in stmt.targets) or (
            isinstance(stmt.value, ast.Call) and last_name(stmt.value.func) in _SHARING
        ):
            continue  # shared: drawn = [...]; dist.broadcast_object_list(drawn), main_process_value(draw)
        call = next((c for c in ast.walk(stmt.value) if isinstance(c, ast.Call) and src.qualname(c.func) in DRAWS), None)
        if call is None:
            continue
        scope = _setup_scope(src, stmt)
        if scope is None or scope != "module" and scope not in entry_functions:
            continue
        if scope != "module" and scope in launchers:
            continue  # drawn once, in the process that spawns the ranks (handed to them in ``args``)
        found.append((stmt, call))
    return found


def _launchers(src: Source) -> Set[str]:
    """Top-level functions that start the ranks themselves (``mp.spawn(main_worker,
    (args,), nprocs=n)``): they run in the launching process only, before any rank
    exists, and what they draw reaches every rank alike through the spawn's
    arguments (the barlowtwins/VICReg ``dist_url`` with a random port)."""
    return {
        f.name for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(isinstance(c, ast.Call) and src.qualname(c.func) in N.SPAWN for c in ast.walk(f))
    }


def _setup_scope(src: Source, node: ast.AST) -> Optional[object]:
    """"module", the top-level function holding ``node``, or None (in a loop, a
    comprehension, a class, a nested function)."""
    function = None
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor, ast.While, ast.ClassDef, ast.Lambda, ast.comprehension)):
            return None
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if function is not None:
                return None
            function = anc
    if function is None:
        return "module"
    return function.name if function in src.tree.body else None


def _entry_functions(src: Source) -> Set[str]:
    """Top-level functions called from the module level or the ``__main__`` block."""
    names = set()
    for call in src.calls:
        if isinstance(call.func, ast.Name) and not any(
            isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.Lambda))
            for a in src.ancestors(call)
        ):
            names.add(call.func.id)
    return names


def _seeded(src: Source) -> Set[str]:
    """The random modules ("random", "numpy.random") the file seeds alike on every
    process (a seed helper seeds them all)."""
    seeded: Set[str] = set()
    for call in src.calls:
        if any(w in (dotted(n) or "").lower() for a in call.args for n in ast.walk(a) for w in _RANK_WORDS):
            continue
        name = src.qualname(call.func)
        if name in SEEDS:
            seeded.add(name.rsplit(".", 1)[0])
        elif last_name(call.func) in N.SEED_HELPERS:
            seeded |= {"random", "numpy.random"}
    return seeded
