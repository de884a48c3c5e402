"""What a training loop really iterates, on ``ast`` (shared by convert and lint).

A ``for`` over ``bar`` of ``total, bar = 0.0, tqdm(loader)``, or over
``prefetcher`` of ``prefetcher = Prefetcher(train_loader)``, takes its batches
from ``loader`` / ``train_loader``: that is the object with a ``.sampler``.  The
wrapper has none (``bar.sampler.set_epoch(epoch)`` raises ``AttributeError``).

``loaders_behind`` answers with the names of the loaders (dotted), or with
:data:`UNRESOLVED` for a wrapper object whose loader cannot be told (only a
human can say which ``.sampler`` to set).

``statistics_pass`` tells a pass over the training loader that only computes
numbers from the data (a mean/std, class weights) before training: no
``backward()``, no optimizer step, nothing of the file's own that could train.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Sequence, Tuple, Union

from . import _names as N
from ._analysis import Source, assigned_name, bindings_in, calls_method, dotted, is_epoch_loop, last_name

#: calls that iterate what they are given, one item at a time
WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "track", "progress_bar"})
#: counts (an epoch loop), not batches
COUNTS = frozenset({"range", "trange"})

UNRESOLVED = "?"


def node_at(src: Source, types, line: int, col_offset: int) -> Optional[ast.AST]:
    """The node of ``types`` that starts at ``line``/``col_offset`` (ast's bytes)."""
    types = types if isinstance(types, tuple) else (types,)
    key = ("node_at", types)
    at = src.cache.get(key)
    if at is None:  # (positions indexed once per file: asked for each loader)
        at = {}
        for node in src.of_type(*types):
            at.setdefault((node.lineno, node.col_offset), node)
        src.cache[key] = at  # type: ignore[index]
    return at.get((line, col_offset))  # type: ignore[union-attr]


def _wrapped(call: ast.Call) -> List[ast.AST]:
    """What ``tqdm(x)``/``enumerate(x)``/``zip(a, b)``/``tqdm(iterable=x)`` iterate."""
    count = len(call.args) if last_name(call.func) == "zip" else 1
    inner = list(call.args[:count])
    inner += [k.value for k in call.keywords if k.arg == "iterable"]
    return inner


def bound_values(src: Source, name: str, scope) -> List[ast.AST]:
    """The values ``name`` is given in the function ``scope`` (None: module
    level): ``name = V``, and an element of ``a, name = X, V``.  A binding that
    cannot be followed (``a, name = pair``, a loop target) gives the Name."""
    values: List[ast.AST] = []
    for node in bindings_in(src, scope, (ast.Assign, ast.AnnAssign, ast.For, ast.withitem)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                values.extend(_element_for(target, node.value, name))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            values.extend(_element_for(node.target, node.value, name))
        elif isinstance(node, ast.For):
            if name in _target_names(node.target):
                values.append(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            if name in _target_names(node.optional_vars):
                values.append(node.optional_vars)
    return values


def _element_for(target: ast.AST, value: ast.AST, name: str) -> List[ast.AST]:
    if isinstance(target, ast.Name):
        return [value] if target.id == name else []
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) and not any(
            isinstance(e, ast.Starred) for e in target.elts
        ):
            return [v for t, e in zip(target.elts, value.elts) for v in _element_for(t, e, name)]
        if name in _target_names(target):
            return [target]  # (unpacked from something else: not followed)
    return []


def _target_names(target: ast.AST) -> List[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _parameters(func: ast.AST) -> List[str]:
    args = getattr(func, "args", None)
    if args is None:
        return []
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a is not None]


def _local_classes(src: Source) -> dict:
    return {c.name: c for c in src.of_type(ast.ClassDef)}


def _is_loader_value(src: Source, value: ast.AST) -> bool:
    return isinstance(value, ast.Call) and src.qualname(value.func) in N.DATA_LOADER


def _loader_like(src: Source, expr: ast.AST, scope) -> bool:
    """``expr`` names a DataLoader: bound to ``DataLoader(...)`` here, or named
    like one (``train_loader``, ``self.loader``, ``dataloader``)."""
    name = dotted(expr)
    if not name:
        return False
    if isinstance(expr, ast.Name):
        values = bound_values(src, expr.id, scope) or bound_values(src, expr.id, None)
        if any(_is_loader_value(src, v) for v in values):
            return True
    return "loader" in name.rsplit(".", 1)[-1].lower()


def loaders_behind(src: Source, expr: ast.AST, scope, depth: int = 0) -> List[str]:
    """The (dotted) names of the loaders that a loop over ``expr`` takes its
    batches from, in the function ``scope`` (None: module level).  Wrappers are
    taken off (``tqdm(loader)``, ``enumerate(loader)``, ``zip(a, b)``), names are
    followed to the wrapper call they are bound to (also in a tuple assignment),
    and an instance of the file's own class built around a loader
    (``Prefetcher(train_loader)``) gives that loader; such an instance whose
    loader cannot be told gives :data:`UNRESOLVED`.  Counts (``range``,
    ``tqdm(range(n))``) give nothing."""
    if depth > 4:
        return [UNRESOLVED]
    if isinstance(expr, ast.Call):
        func = last_name(expr.func)
        if func in COUNTS:
            return []
        if func in WRAPPERS:
            return [n for inner in _wrapped(expr) for n in loaders_behind(src, inner, scope, depth + 1)]
        return []  # (a DataLoader(...) built in the header: not a name)
    if isinstance(expr, ast.Attribute):
        return [dotted(expr)] if dotted(expr) else []
    if not isinstance(expr, ast.Name):
        return []
    values = bound_values(src, expr.id, scope)
    if not values and scope is not None and expr.id not in _parameters(scope):
        values = bound_values(src, expr.id, None)  # a global of the function
    if not values:
        return [expr.id]  # (a parameter, an import: the loader itself, for all this file tells)
    found: List[str] = []
    for value in values:
        if isinstance(value, ast.Call):
            func = last_name(value.func)
            if func in COUNTS:
                continue  # ``bar = trange(epochs)``: an epoch loop
            if func in WRAPPERS:
                inner = [n for i in _wrapped(value) for n in loaders_behind(src, i, scope, depth + 1)]
                if not inner and any(
                    isinstance(i, ast.Call) and last_name(i.func) in COUNTS for i in _wrapped(value)
                ):
                    continue  # ``tqdm(range(n))``
                found.extend(inner or [expr.id])
                continue
            if not _is_loader_value(src, value):
                found.append(_wrapped_loader(src, value, expr.id, scope))
                continue
        found.append(expr.id)
    return list(dict.fromkeys(found))


def _wrapped_loader(src: Source, call: ast.Call, name: str, scope) -> str:
    """``Prefetcher(train_loader)``, ``progress(loader)``: the one loader among
    the call's arguments.  Without one, the value itself (a factory's loader,
    for all this file tells) -- but an iterable class of the file built around
    something else, or around several loaders, gives :data:`UNRESOLVED`.  A
    class of the file that subclasses DataLoader is a loader itself."""
    cls = _local_classes(src).get(call.func.id) if isinstance(call.func, ast.Name) else None
    if cls is not None and any(
        src.qualname(base) in N.DATA_LOADER or last_name(base).endswith("DataLoader") for base in cls.bases
    ):
        return name
    arguments = [*call.args, *(k.value for k in call.keywords if k.arg is not None)]
    loaders = list(dict.fromkeys(dotted(a) for a in arguments if _loader_like(src, a, scope)))
    if len(loaders) == 1 and loaders[0] != name:
        return loaders[0]
    if loaders or cls is not None and _iterable_class(cls):
        return UNRESOLVED  # (``loader = Wrapper(loader)``, two loaders, a wrapper of what?)
    return name


def _iterable_class(cls: ast.ClassDef) -> bool:
    return any(isinstance(f, ast.FunctionDef) and f.name in ("__iter__", "__next__") for f in cls.body)


def wrapper_receiver(src: Source, call: ast.Call) -> Optional[Union[str, Sequence[str]]]:
    """``bar.sampler.set_epoch(...)`` where ``bar`` is a wrapper of a loader
    (``tqdm(loader)``, ``Prefetcher(loader)``), which has no ``.sampler``: the
    loaders behind it (or :data:`UNRESOLVED`); None for a receiver that is (or
    may be) a loader."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "set_epoch"):
        return None
    holder = func.value
    if not (isinstance(holder, ast.Attribute) and holder.attr == "sampler" and isinstance(holder.value, ast.Name)):
        return None
    name = holder.value.id
    behind = loaders_behind(src, holder.value, src.function_of(call))
    if not behind or behind == [name]:
        return None
    return [b for b in behind if b != name] or None


#: calls by bare name that cannot train (builtins)
_BUILTINS = frozenset({
    "len", "range", "float", "int", "sum", "max", "min", "abs", "print", "isinstance", "enumerate", "zip",
    "list", "tuple", "dict", "set", "sorted", "round", "str", "bool", "any", "all", "map", "iter", "next",
})


def statistics_pass(src: Source, loop: ast.AST) -> bool:
    """A ``for`` that only computes numbers from the data (a mean/std, class
    weights, a vocabulary) -- outside any epoch loop, in no function that an
    epoch loop calls or that has an ``epoch`` parameter, and its body never
    trains: no ``backward()``, no ``step()``, no call by name of anything but a
    builtin (a function of this file or an import may train)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    if any(is_epoch_loop(a) or isinstance(a, ast.While) for a in src.ancestors(loop)):
        return False
    if calls_method(loop, "backward") or calls_method(loop, "step"):
        return False
    for node in ast.walk(loop):
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in _BUILTINS:
            return False
    func = src.function_of(loop)
    if func is not None:
        if any("epoch" in p.lower() for p in _parameters(func)):
            return False
        name = getattr(func, "name", None)
        for call in src.calls:
            if last_name(call.func) == name and any(is_epoch_loop(a) for a in src.ancestors(call)):
                return False
    return True


#: calls whose arguments only show a value (the global batch size in a log line is still right)
_SHOWN = frozenset({"print", "info", "debug", "warning", "log", "echo", "write", "add_argument", "add_scalar",
                    "format", "set_description", "set_postfix"})


def batch_uses_elsewhere(src: Source, batch: str, loader_call: ast.Call) -> List[ast.AST]:
    """The uses of the global batch expression ``batch`` (``args.batch_size``)
    in the functions of the file other than the one that builds the training
    loader ``loader_call`` -- a loss, a helper the training loop calls
    (``torch.arange(args.batch_size)`` of an InfoNCE loss): once the loader is
    sharded they see this process's share of each batch, not the global one.
    Left out: the ``batch_size`` of another DataLoader (an evaluation one, whole),
    a value only shown (``print``, a log call, an f-string), a learning-rate
    scaling, an evaluation function (it iterates a whole loader), and a plain
    name that the function binds itself (another variable)."""
    home = src.function_of(loader_call)
    uses: List[ast.AST] = []
    for node in src.nodes:
        if not isinstance(node, (ast.Name, ast.Attribute)) or not isinstance(node.ctx, ast.Load):
            continue
        if dotted(node) != batch:
            continue
        func = src.function_of(node)
        if func is None or func is home or isinstance(func, ast.Lambda) and src.function_of(func) is home:
            continue
        if _eval_function(src, func):
            continue
        if isinstance(node, ast.Name) and (
            node.id in _parameters(func) or any(
                node.id in _target_names(t)
                for a in src.of_type(ast.Assign) if src.function_of(a) is func for t in a.targets
            )
        ):
            continue
        if _shown_or_passed_on(src, node):
            continue
        uses.append(node)
    return uses


#: calls whose arguments are the sizes of a tensor (a batch's own shape, when the
#: batch size is one of them)
SHAPE_FUNCTIONS = frozenset({"full", "zeros", "ones", "empty", "randn", "rand", "randint", "eye", "arange"})
SHAPE_METHODS = frozenset({"view", "reshape", "expand", "new_full", "new_zeros", "new_ones", "new_empty", "resize_"})


def sizes_a_tensor(src: Source, node: ast.AST) -> bool:
    """``node`` is (part of) a size argument: ``torch.eye(2 * batch_size)``,
    ``x.view(batch_size, -1)``, ``torch.arange(args.batch_size)`` -- a tensor built
    to match a batch of that many samples."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.Call):
            if child is anc.func:
                return False
            name = last_name(anc.func)
            method = isinstance(anc.func, ast.Attribute) and not src.qualname(anc.func).startswith("torch.")
            return name in SHAPE_METHODS if method else name in SHAPE_FUNCTIONS and src.qualname(anc.func).startswith("torch")
        if isinstance(anc, ast.stmt):
            return False
        if not isinstance(anc, (ast.BinOp, ast.Tuple, ast.List, ast.keyword, ast.Starred)):
            return False
        child = anc
    return False


def counts_batches(src: Source, node: ast.AST) -> bool:
    """``node`` divides a count of samples into batches (``len(dataset) // batch_size``,
    ``n_samples / args.batch_size``): right only for the global batch size."""
    parent = src.parent(node)
    return isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Div, ast.FloorDiv)) and parent.right is node


def batch_kept_per_process(src: Source, batch: str, loader_call: ast.Call) -> Optional[ast.AST]:
    """The first use of ``batch`` elsewhere (``batch_uses_elsewhere``) that sizes a
    tensor to the loader's batches -- SimCLR's ``torch.eye(2 * batch_size)`` mask in
    ``train()``: each process's batches must then hold ``batch`` samples, so the
    loader keeps the number per process -- when no use divides a sample count by
    it (steps per epoch: right only for the global batch) and no learning rate is
    computed from it.  None otherwise (the uses are reported)."""
    uses = batch_uses_elsewhere(src, batch, loader_call)
    if any(counts_batches(src, use) for use in uses) or scales_the_learning_rate(src, batch):
        return None
    return next((use for use in uses if sizes_a_tensor(src, use)), None)


def scales_the_learning_rate(src: Source, batch: str) -> bool:
    """A statement of the file computes a learning rate from ``batch`` (``lr = base_lr
    * args.batch_size / 256``): it means the global batch, which a per-process
    number would change."""
    for node in src.nodes:
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) and dotted(node) == batch:
            stmt = next((a for a in src.ancestors(node) if isinstance(a, ast.stmt)), None)
            text = src.segment(stmt).lower() if stmt is not None and not isinstance(
                stmt, (ast.FunctionDef, ast.For, ast.While, ast.If, ast.With, ast.Try)
            ) else ""
            if "lr" in _words(text) or "learning_rate" in text:
                return True
    return False


def _eval_function(src: Source, func: ast.AST) -> bool:
    from ._analysis import is_eval_name

    for f in [func, *src.ancestors(func)]:
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_eval_name(f.name):
            return True
    return False


def _shown_or_passed_on(src: Source, node: ast.AST) -> bool:
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.JoinedStr):
            return True
        if isinstance(anc, ast.Call):
            if last_name(anc.func) in _SHOWN:
                return True
            if src.qualname(anc.func) in N.DATA_LOADER and (
                child in anc.args[1:2] or any(k.value is child and k.arg == "batch_size" for k in anc.keywords)
            ):
                return True  # (another loader's batch_size)
        if isinstance(anc, ast.stmt):
            text = src.segment(anc).lower()
            return "lr" in _words(text) or "learning_rate" in text
        child = anc
    return False


def _words(text: str) -> set:
    import re

    return set(re.findall(r"[a-z_]+", text)) | {w for t in re.findall(r"[a-z_]+", text) for w in t.split("_")}


def sharded_loaders(src: Source) -> dict:
    """{loader name: its DistributedSampler call} for the file's
    ``name = DataLoader(..., sampler=DistributedSampler(...))`` (the sampler also
    through a name bound to it anywhere in the file)."""
    from ._analysis import assigned_name

    found = {}
    for loader, sampler in loaders_with_distributed_samplers(src, per_function=False):
        name = assigned_name(src, loader)
        if name:
            found[name] = sampler
    return found


def loaders_with_distributed_samplers(src: Source, per_function: bool) -> List[Tuple[ast.Call, ast.Call]]:
    """(DataLoader call, its DistributedSampler call) for every loader of the file
    given one -- as ``sampler=DistributedSampler(...)``, or through a name bound to
    one (``sampler = DistributedSampler(ds)``: in the loader's own function where
    ``per_function``, else anywhere in the file; the last binding counts)."""
    from ._analysis import argument

    def key(node: ast.AST, name: str) -> tuple:
        return (id(src.function_of(node)) if per_function else None, name)

    bound = {}
    for a in src.of_type(ast.Assign):
        if isinstance(a.value, ast.Call) and src.qualname(a.value.func) in N.DISTRIBUTED_SAMPLER:
            for t in a.targets:
                if dotted(t):
                    bound[key(a, dotted(t))] = a.value
    found = []
    for call in src.calls:
        if src.qualname(call.func) not in N.DATA_LOADER:
            continue
        sampler = argument(call, 3, "sampler")
        if sampler is None:
            continue
        if not (isinstance(sampler, ast.Call) and src.qualname(sampler.func) in N.DISTRIBUTED_SAMPLER):
            sampler = bound.get(key(call, dotted(sampler)))
        if sampler is not None:
            found.append((call, sampler))
    return found


def loops_over(src: Source, loader: str) -> List[ast.AST]:
    """The ``for`` loops whose batches come from ``loader`` (``loaders_behind``)."""
    return [
        loop for loop in src.of_type(ast.For, ast.AsyncFor)
        if loader in loaders_behind(src, loop.iter, src.function_of(loop))
    ]


def statistics_passes(src: Source) -> List[Tuple[ast.AST, str]]:
    """(loop, loader) for every statistics pass (``statistics_pass``) over a
    sharded loader of the file."""
    return sorted(
        ((loop, name) for name in sharded_loaders(src) for loop in loops_over(src, name) if statistics_pass(src, loop)),
        key=lambda found: (found[0].lineno, found[0].col_offset),
    )


def restarted_on_stop_iteration(src: Source, loader_call: ast.Call) -> bool:
    """The loader built by ``loader_call`` is read through an iterator that its
    function starts again when it runs out (``except StopIteration: it =
    iter(loader)``, minGPT's and many GAN trainers' iteration loops): however long
    one pass is, the loop goes on with the next."""
    name = assigned_name(src, loader_call)
    function = src.function_of(loader_call)
    if not name or "StopIteration" not in src.text:
        return False
    for handler in src.of_type(ast.ExceptHandler):
        caught = handler.type
        names = [dotted(e) for e in (caught.elts if isinstance(caught, ast.Tuple) else [caught])] if caught else []
        attempt = src.parent(handler)
        bare = (caught is None or names in (["Exception"], ["BaseException"])) and any(
            isinstance(c, ast.Call) and dotted(c.func) == "next" for s in getattr(attempt, "body", []) for c in ast.walk(s)
        )  # (except: around next(it), StarGAN's)
        if not (bare or any(n.rsplit(".", 1)[-1] == "StopIteration" for n in names)) or src.function_of(handler) is not function:
            continue
        if any(
            isinstance(c, ast.Call) and dotted(c.func) == "iter" and c.args and dotted(c.args[0]) == name
            for c in ast.walk(handler)
        ):
            return True
    return False
