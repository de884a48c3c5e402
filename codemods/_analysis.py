"""Fast analysis on the standard library's ``ast`` for the lint rules.

LibCST keeps every byte of a file, which the rewrites need; the lint rules only
need the shape of the code, and ``ast`` parses it about ten times faster.  This
module gives them:

* ``Source``: one parsed file (text, lines, tree, parent links, import map);
* ``Source.qualname(node)``: ``torch.nn.DataParallel`` for ``nn.DataParallel``
  after ``import torch.nn as nn``, ``DP`` after ``from torch.nn.parallel import
  DataParallel as DP`` -- qualified names from the file's imports, never the
  spelling of the text;
* recognisers shared by the rules: rank checks, collectives, DDP wraps, loaders,
  epoch loops.

Nothing here imports LibCST or torch.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

from . import _names as N

# ------------------------------------------------------------------ the file
def decode(data: bytes) -> str:
    """Text of a Python file, honouring its coding cookie and BOM (PEP 263)."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


#: fields that never hold a node, or hold only the shared operator and context
#: singletons (``Load``, ``Add``, ``Eq`` ...: no position, no parent of their own)
_LEAF_FIELDS = frozenset(
    ("ctx", "op", "ops", "id", "attr", "arg", "asname", "module", "level", "kind",
     "conversion", "type_comment", "is_async", "simple", "name")
)
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {ast.Constant: ()}


def decode_position(exc: UnicodeDecodeError) -> Tuple[int, int]:
    """(line, column), 1-based, of the first byte that does not decode."""
    data = exc.object if isinstance(exc.object, (bytes, bytearray)) else b""
    start = min(exc.start, len(data))
    line_start = data.rfind(b"\n", 0, start) + 1
    return data.count(b"\n", 0, start) + 1, start - line_start + 1


def _child_fields(cls: type) -> Tuple[str, ...]:
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        leaves = _LEAF_FIELDS - {"name"} if cls.__name__ == "TypeAlias" else _LEAF_FIELDS  # type X = ...
        fields = _CHILD_FIELDS[cls] = tuple(f for f in cls._fields if f not in leaves)
    return fields


class Source:
    """A parsed file and the lookups the rules share (computed lazily)."""

    def __init__(self, path: str, text: str, tree: Optional[ast.Module] = None) -> None:
        self.path = path
        self.text = text
        self.lines = text.splitlines()
        self.tree = tree if tree is not None else ast.parse(text, filename=path)
        self._nodes: Optional[List[ast.AST]] = None
        self._parents: Optional[Dict[ast.AST, ast.AST]] = None
        self._aliases: Optional[Dict[str, str]] = None
        self._calls: Optional[List[ast.Call]] = None
        self._qualnames: Dict[int, str] = {}
        self._of_type: Dict[tuple, tuple] = {}
        self.cache: Dict[str, object] = {}

    # -- structure ---------------------------------------------------------
    def _index(self) -> None:
        """One walk of the tree: every node and the calls.  The operator and
        context nodes (``Load``, ``Add``, ``Eq`` ...) are shared singletons with
        no position and no parent of their own: not indexed.  (A hand-made walk
        over the fields that can hold nodes: ``ast.iter_child_nodes`` is half
        the cost of linting a file.)"""
        nodes: List[ast.AST] = []
        todo = [self.tree]
        node_type, known = ast.AST, _CHILD_FIELDS
        while todo:
            node = todo.pop()
            nodes.append(node)
            names = known.get(node.__class__)
            if names is None:
                names = _child_fields(node.__class__)
            for name in names:
                value = getattr(node, name, None)
                if value is None:
                    continue
                if value.__class__ is list:
                    for item in value:
                        if isinstance(item, node_type):
                            todo.append(item)
                elif isinstance(value, node_type):
                    todo.append(value)
        self._nodes = nodes
        self._calls = sorted(
            (n for n in nodes if isinstance(n, ast.Call)), key=lambda c: (c.lineno, c.col_offset)
        )

    def _index_parents(self) -> None:
        """Parent links, on first use (many files need none)."""
        parents: Dict[ast.AST, ast.AST] = {}
        node_type, known = ast.AST, _CHILD_FIELDS
        for node in self.nodes:
            for name in known[node.__class__]:
                value = getattr(node, name, None)
                if value is None:
                    continue
                if value.__class__ is list:
                    for item in value:
                        if isinstance(item, node_type):
                            parents[item] = node
                elif isinstance(value, node_type):
                    parents[value] = node
        self._parents = parents

    @property
    def nodes(self) -> List[ast.AST]:
        if self._nodes is None:
            self._index()
        return self._nodes  # type: ignore[return-value]

    @property
    def parents(self) -> Dict[ast.AST, ast.AST]:
        if self._parents is None:
            self._index_parents()
        return self._parents  # type: ignore[return-value]

    def parent(self, node: ast.AST) -> Optional[ast.AST]:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        current = self.parents.get(node)
        while current is not None:
            yield current
            current = self.parents.get(current)

    def function_of(self, node: ast.AST) -> Optional[ast.AST]:
        for anc in self.ancestors(node):
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                return anc
        return None

    @property
    def calls(self) -> List[ast.Call]:
        if self._calls is None:
            self._index()
        return self._calls  # type: ignore[return-value]

    def of_type(self, *types: type) -> List[ast.AST]:
        """The nodes of these types, in the order of ``nodes`` (a fresh list; the
        filter runs once per file and set of types: rules and recognisers ask for
        the same types once per name or call, and a filter of every node each
        time grew with the square of the file)."""
        found = self._of_type.get(types)
        if found is None:
            found = self._of_type[types] = tuple(n for n in self.nodes if isinstance(n, types))
        return list(found)

    def segment(self, node: ast.AST) -> str:
        """The source text of ``node`` (ast columns are UTF-8 byte offsets)."""
        try:
            start, end = node.lineno, node.end_lineno  # type: ignore[attr-defined]
            col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        except AttributeError:
            return ""
        if start is None or end is None or end_col is None or start > len(self.lines):
            return ""
        if start == end:
            return self.lines[start - 1].encode()[col:end_col].decode("utf-8", "replace")
        first = self.lines[start - 1].encode()[col:].decode("utf-8", "replace")
        middle = self.lines[start : end - 1]
        last = self.lines[end - 1].encode()[:end_col].decode("utf-8", "replace")
        return "\n".join([first, *middle, last])

    # -- names -------------------------------------------------------------
    @property
    def aliases(self) -> Dict[str, str]:
        """Local name -> qualified name, from every import in the file."""
        if self._aliases is None:
            aliases: Dict[str, str] = {}
            for node in self.of_type(ast.Import, ast.ImportFrom):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.asname:
                            aliases[alias.asname] = alias.name
                        else:
                            head = alias.name.split(".")[0]
                            aliases.setdefault(head, head)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    for alias in node.names:
                        if alias.name != "*":
                            aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            self._aliases = aliases
        return self._aliases

    def qualname(self, node: Optional[ast.AST]) -> str:
        """Qualified name of a Name/Attribute chain ('' when it is not one)."""
        key = id(node)
        cached = self._qualnames.get(key)
        if cached is None:
            cached = self._qualnames[key] = self._qualname(node)
        return cached

    def _qualname(self, node: Optional[ast.AST]) -> str:
        parts: List[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return ""
        head = self.aliases.get(node.id)
        if head is None:
            head = "builtins." + node.id if node.id in _BUILTINS else node.id
        return ".".join([head, *reversed(parts)])

    def is_call(self, node: ast.AST, names: Iterable[str]) -> bool:
        return isinstance(node, ast.Call) and self.qualname(node.func) in names

    def calls_to(self, names: FrozenSet[str]) -> List[ast.Call]:
        """The calls whose callee's qualified name is in ``names``, in source
        order.  A callee's last name (``attr``, or what an imported name stands
        for) must be one of the names' last parts: most calls are ruled out
        before their qualified name is built."""
        tails = _TAILS.get(names)
        if tails is None:
            tails = _TAILS[names] = frozenset(n.rpartition(".")[2] for n in names)
        aliases = self.aliases
        found = []
        for call in self.calls:
            func = call.func
            if func.__class__ is ast.Attribute:
                tail = func.attr
            elif func.__class__ is ast.Name:
                tail = aliases.get(func.id, func.id).rpartition(".")[2]
            else:
                continue
            if tail in tails and self.qualname(func) in names:
                found.append(call)
        return found

    def imports_module(self, prefix: str) -> bool:
        return any(q == prefix or q.startswith(prefix + ".") for q in self.aliases.values())


_TAILS: Dict[FrozenSet[str], FrozenSet[str]] = {}
_BUILTINS = frozenset({"print", "open", "len", "isinstance", "range", "enumerate", "zip", "iter", "next"})


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain as written, '' otherwise."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return ""


def last_name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def keyword(call: ast.Call, name: str) -> Optional[ast.AST]:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def argument(call: ast.Call, position: int, name: str) -> Optional[ast.AST]:
    value = keyword(call, name)
    if value is not None:
        return value
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    return positional[position] if position < len(positional) else None


def unpacked_keyword(src: "Source", call: ast.Call, name: str) -> Optional[ast.AST]:
    """The value a ``**`` argument of ``call`` gives ``name``: a dict literal
    (``**{"shuffle": True}``), ``dict(shuffle=True)``, or a name bound once, in the
    call's function, to one of those (``kwargs = {...}; f(**kwargs)``)."""
    for kw in call.keywords:
        if kw.arg is not None:
            continue
        value = kw.value
        if isinstance(value, ast.Name):
            scope = src.function_of(call)
            values = bound_values(src, value.id, scope)
            value = values[0] if len(values) == 1 and not _changed_in_place(src, value.id, scope) else None
        if isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values):
                if isinstance(key, ast.Constant) and key.value == name:
                    return item
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
            found = keyword(value, name)
            if found is not None:
                return found
    return None


def _changed_in_place(src: Source, name: str, scope) -> bool:
    """``name[k] = v``, ``del name[k]``, ``name.update(...)`` (and the like), or
    ``name |= ...`` in ``scope``: a dict whose literal no longer tells its keys."""
    for node in src.nodes:
        if src.function_of(node) is not scope:
            continue
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) and dotted(node.value) == name:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and dotted(node.func.value) == name:
            if node.func.attr in ("update", "pop", "popitem", "setdefault", "clear", "__setitem__"):
                return True
        if isinstance(node, ast.AugAssign) and dotted(node.target) == name:
            return True
    return False


def is_none(node: Optional[ast.AST]) -> bool:
    """A literal ``None`` (``sampler=None``: the argument's default, as if not given)."""
    return isinstance(node, ast.Constant) and node.value is None


def is_true(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def is_false(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


# ------------------------------------------------------------------ what kind of file
def uses_distributed(src: Source) -> bool:
    """The file is DDP code: it imports torch.distributed or the DDP wrapper."""
    if "uses_distributed" not in src.cache:
        src.cache["uses_distributed"] = _uses_distributed(src)
    return src.cache["uses_distributed"]  # type: ignore[return-value]


def _uses_distributed(src: Source) -> bool:
    """DDP code sets up, joins or asks the process group -- it calls a function of
    ``torch.distributed`` itself (``init_process_group``, ``get_rank``,
    ``all_reduce``...), or FSDP's -- or builds a DDP / DistributedSampler.
    Importing it is not enough (library modules import it for utilities), nor is
    a call into one of its tool packages that a single process uses
    (``torch.distributed.checkpoint.load`` in a checkpoint-conversion script,
    ``elastic``, ``rpc``), nor asking what the build supports
    (``is_available()``, ``is_nccl_available()``: an environment report).  Each
    of those names has "distributed" / "Distributed" in its import: a file
    without the word cannot call them."""
    if "istributed" not in src.text:
        return False
    wanted = N.DDP | N.DISTRIBUTED_SAMPLER
    for call in src.calls:
        name = src.qualname(call.func)
        if name in wanted:
            return True
        if name.startswith("torch.distributed."):
            rest = name[len("torch.distributed."):]
            if rest.startswith("is_") and rest.endswith("_available"):
                continue  # (is_available, is_nccl_available...: what this build supports)
            if "." not in rest or rest.split(".")[0] in _PROCESS_GROUP_PACKAGES:
                return True
    return False


#: packages of torch.distributed whose calls run in a process group
_PROCESS_GROUP_PACKAGES = frozenset({"fsdp", "nn", "algorithms", "distributed_c10d", "optim", "tensor", "_tensor"})


_TEST_FILE = re.compile(r"(^|[\\/])(test_[^\\/]*|[^\\/]*_test|conftest)\.py$|(^|[\\/])tests?[\\/]")


def is_test_module(src: Source) -> bool:
    """A test file by pytest's and unittest's conventions: named ``test_*.py`` /
    ``*_test.py`` / ``conftest.py`` or in a ``tests/`` folder, and holding tests
    (``def test_...``, a ``unittest.TestCase`` subclass) or importing pytest or
    unittest.  Its DataParallel, devices and loaders exercise the library on
    purpose; it is not a training program."""
    if "cache_test_module" in src.cache:
        return src.cache["cache_test_module"]  # type: ignore[return-value]
    result = bool(_TEST_FILE.search(src.path)) and (
        any(q.split(".")[0] in ("pytest", "unittest") for q in src.aliases.values())
        or any(_is_test_definition(node) for node in src.tree.body)
    )
    src.cache["cache_test_module"] = result
    return result


def _is_test_definition(node: ast.AST) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.name.startswith("test")
    if isinstance(node, ast.ClassDef):
        return any(last_name(b).endswith("TestCase") for b in node.bases) or any(
            _is_test_definition(item) for item in node.body
        )
    return False


#: the methods that hand a module's parameters to an optimizer
PARAMETER_METHODS = frozenset({"parameters", "named_parameters"})


def optimized_models(src: Source, optimizer: ast.Call) -> List[str]:
    """``model`` of ``SGD(model.parameters())`` (also in parameter groups, or
    through a variable: ``params = [p for p in model.parameters() if ...]``)."""
    params = argument(optimizer, 0, "params")
    if params is None:
        return []
    roots: List[ast.AST] = [params]
    if isinstance(params, ast.Name):
        roots += [v for v in values_bound_to(src, params.id) if v is not None]
    names: List[str] = []
    function = src.function_of(optimizer)
    followed: Set[str] = set()
    for _ in range(3):  # parameter groups from a dict of the function (minGPT: param_dict[pn] of
        deeper: List[ast.AST] = []  # {pn: p for pn, p in self.named_parameters()})
        for root in roots:
            for node in ast.walk(root):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PARAMETER_METHODS:
                    name = dotted(node.func.value)
                    if name and name not in names:
                        names.append(name)
                elif isinstance(node, ast.Name) and node.id not in followed and function is not None:
                    followed.add(node.id)
                    deeper += [v for v in values_bound_to(src, node.id) if v is not None and src.function_of(v) is function]
        if names or not deeper:
            break
        roots = deeper
    return names


def optimizer_methods(src: Source) -> Set[str]:
    """Methods of the file's classes that build an optimizer over their own module's
    parameters and return it, training nothing themselves (minGPT's
    ``GPT.configure_optimizers(train_config)``): the module to wrap is the one a
    caller calls the method on.  Shared by convert's wrap-model in the file and,
    through ``FileFacts.optimizer_methods``, in the files that call it."""
    found: Set[str] = set()
    for cls in src.of_type(ast.ClassDef):
        for method in cls.body:
            if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or calls_method(method, "backward"):
                continue
            optimizers = [
                c for c in ast.walk(method)
                if isinstance(c, ast.Call) and N.is_optimizer(src.qualname(c.func))
                and all(m == "self" or m.startswith("self.") for m in optimized_models(src, c) or ["?"])
            ]
            returned = {
                dotted(r.value) if not isinstance(r.value, ast.Call) else id(r.value)
                for r in ast.walk(method) if isinstance(r, ast.Return) and r.value is not None
            } - {""}
            if any(id(c) in returned or assigned_name(src, c) in returned for c in optimizers):
                found.add(method.name)
    return found


def values_bound_to(src: Source, name: str) -> List[ast.AST]:
    """Every value the dotted ``name`` (``model``, ``self.model``) is bound to."""
    index = src.cache.get("values_bound")
    if index is None:  # (once per file: asked for each name, a scan grew with its square)
        index = {}
        for node in src.of_type(ast.Assign, ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for item in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                    index.setdefault(dotted(item), []).append(node.value if item is target else None)
        src.cache["values_bound"] = index
    return list(index.get(name, ()))  # type: ignore[union-attr]

#: DDP (or the DataParallel convert would turn into it) wraps a part of a trained model
#: (DDP009, lint and convert)
PARTLY_WRAPPED_ADVICE = (
    "only {part} is wrapped, but the rest of {whole} trains too: DDP averages the gradients of "
    "{part} alone, and the other parameters of {whole} drift apart on every rank; wrap {whole} "
    "itself ({whole} = DDP({whole}); its parts are then {whole}.module.<part>)"
)


#: methods that return the same module (moved, compiled, switched to training)
SAME_MODULE_METHODS = frozenset(
    {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval", "requires_grad_", "to_empty"}
)


def wrapped_module(wrap: ast.Call) -> Optional[ast.AST]:
    """The module a wrapper call is handed (``DDP(core.to(device))``: ``core``),
    without the moves and switches that return the same module."""
    module = argument(wrap, 0, "module")
    while isinstance(module, ast.Call) and isinstance(module.func, ast.Attribute) and module.func.attr in SAME_MODULE_METHODS:
        module = module.func.value
    return module


def wrapped_models(src: Source, wrappers: FrozenSet[str]) -> Optional[Set[str]]:
    """The models the file wraps in one of ``wrappers`` -- DistributedDataParallel for
    lint's DDP009, DataParallel for convert -- (``DDP(netG.to(device))`` wraps
    ``netG``: a GAN may wrap one model and forget the other), and the names the
    wrappers are bound to; None when a wrapper is named where this cannot tell what
    it wraps (``DDP(build())``, ``wrapper=DDP``)."""
    if not any(w.rsplit(".", 1)[-1] in src.text for w in wrappers):
        return set()
    wrapped: Set[str] = set()
    for node in src.nodes:
        if not (isinstance(node, (ast.Name, ast.Attribute)) and src.qualname(node) in wrappers):
            continue
        parent = src.parent(node)
        if isinstance(parent, ast.Attribute) or isinstance(parent, ast.ImportFrom):
            continue  # (the module path of a longer name)
        if isinstance(parent, ast.Call) and parent.func is node:
            module = wrapped_module(parent)
            names = {assigned_name(src, _wrapper_value(src, parent))}  # the wrapper: SGD(ddp_model.parameters())
            if dotted(module):
                names.add(dotted(module))
            elif module is not None:  # DDP(build(head)): whatever it is handed may be in there
                names |= {dotted(n) for n in ast.walk(module) if isinstance(n, (ast.Name, ast.Attribute))}
            if names <= {""}:
                return None  # (return DDP(build()))
            wrapped |= names - {""}
        elif not _names_the_wrapper_only(src, node):
            return None
    return wrapped


def _wrapper_value(src: Source, call: ast.Call) -> ast.AST:
    """The expression a DDP call is the value of: ``DDP(m).to(device)``, ``DDP(m) if ddp else m``."""
    node: ast.AST = call
    while True:
        parent = src.parent(node)
        if isinstance(parent, ast.Attribute) and parent.attr in SAME_MODULE_METHODS:
            grand = src.parent(parent)
            if isinstance(grand, ast.Call) and grand.func is parent:
                node = grand
                continue
        if isinstance(parent, ast.IfExp) and node is not parent.test:
            node = parent
            continue
        return node


def _names_the_wrapper_only(src: Source, node: ast.AST) -> bool:
    """A wrapper named, nothing wrapped: ``isinstance(model, (DDP, DP))``, ``type(m) is DDP``,
    an annotation (``-> DDP``, ``model: DDP``)."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.Tuple):
            child = anc
            continue
        if isinstance(anc, ast.Call):
            return dotted(anc.func) in ("isinstance", "issubclass") and child is not anc.func
        if isinstance(anc, ast.Compare):
            return all(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in anc.ops)
        if isinstance(anc, ast.arg):
            return child is anc.annotation
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return child is anc.returns
        if isinstance(anc, ast.AnnAssign):
            return child is anc.annotation
        if isinstance(anc, ast.Subscript):  # Optional[DDP]
            child = anc
            continue
        return False
    return False


def trained_models(src: Source) -> Set[str]:
    """The models the file's optimizers step (``optimized_models`` of each), once per file."""
    if "trained_models" not in src.cache:
        src.cache["trained_models"] = {
            model for call in src.calls if N.is_optimizer(src.qualname(call.func)) for model in optimized_models(src, call)
        }
    return src.cache["trained_models"]  # type: ignore[return-value]


def optimizers_of_unwrapped_models(
    src: Source, wrapped: Set[str], wrappers: FrozenSet[str]
) -> List[Tuple[ast.Call, str]]:
    """(optimizer call, model) for each optimizer over a model built in this file
    (``Net()``, a torch factory; every binding of it), run here (``model(x)``) and
    not among ``wrapped`` (the names the file's DDP -- or, for convert, DataParallel
    -- wraps are bound to or built on).  A model handed in as a parameter may be
    wrapped by the caller and is not judged.  Lint's DDP009 (with DDP) and convert's
    DataParallel programs (a student trained beside a teacher in DataParallel)."""
    called = {dotted(call.func) for call in src.calls}
    found: List[Tuple[ast.Call, str]] = []
    for call in src.calls:
        if not N.is_optimizer(src.qualname(call.func)):
            continue
        func = src.function_of(call)
        params = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)} if isinstance(
            func, (ast.FunctionDef, ast.AsyncFunctionDef)
        ) else set()
        for name in optimized_models(src, call):
            if name.split(".")[0] in params - {"self"}:
                continue  # a model handed in (Hogwild's train(rank, model)): built, and maybe wrapped, elsewhere
            if name in called and name not in wrapped and _built_here(src, name, wrappers):
                found.append((call, name))
                break
    return found


def _built_here(src: Source, name: str, wrappers: FrozenSet[str]) -> bool:
    """Every binding of ``name`` in the file builds a model (a class, a torch or
    torchvision factory), maybe moved or compiled; none comes from elsewhere
    (a helper, a parameter, a tuple unpacked) where a wrapper may be hiding."""
    values = values_bound_to(src, name)
    if not values:
        return False
    return all(_builds_model(src, value, name, wrappers) for value in values)


def _builds_model(src: Source, value: Optional[ast.AST], name: str, wrappers: FrozenSet[str]) -> bool:
    while isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr in SAME_MODULE_METHODS:
            value = func.value  # Net().to(device), model.cuda()
            continue
        qualname = src.qualname(func)
        if qualname in wrappers or qualname in N.DDP:
            return False  # a wrapper (ddp_model = DDP(model)), not a model built here
        if qualname.startswith("torch.") and any(dotted(a) == name for a in value.args):
            return True  # torch.compile(model), SyncBatchNorm.convert_sync_batchnorm(model)
        last = qualname.rsplit(".", 1)[-1] or dotted(func).rsplit(".", 1)[-1]
        if qualname.startswith(("torch.nn.", "torchvision.models.")) or last[:1].isupper():
            return not any(dotted(a) == name for a in value.args)  # (not Wrapper(model))
        return False
    return dotted(value) == name if value is not None else False  # (model = model)


def partly_wrapped_models(src: Source, wrappers: FrozenSet[str]) -> List[Tuple[ast.Assign, str, str]]:
    """``(assignment, whole, part)`` for ``model.encoder = Wrapper(model.encoder)``
    (SupContrast) where the file trains more of ``model`` than the part: an
    optimizer over ``model.parameters()``, ``model`` handed to an optimizer-making
    helper (``set_optimizer(opt, model)``), or no optimizer in the file at all
    (built elsewhere, from the whole model as often as not).  Under DataParallel
    that was one model on one process; a DDP wrap of the part averages only its
    gradients, and the rest of the model (the projection head) drifts apart on
    every rank.  ``self.netG = DataParallel(self.netG)`` is a whole model: ``self``
    is the trainer.  Shared by lint (DDP009) and convert (data-parallel-to-ddp)."""
    found: List[Tuple[ast.Assign, str, str]] = []
    has_optimizer = any(N.is_optimizer(src.qualname(c.func)) for c in src.calls)
    for assign, part, _ in _wrapped_models(src, wrappers):
        whole = part.rsplit(".", 1)[0] if "." in part else ""
        if not whole or whole == "self":
            continue
        names = names_of_the_model(src, assign, whole)  # (net = set_model(): trained as net)
        helper = any(
            "optim" in last_name(call.func).lower() and any(dotted(a) in names for a in call.args)
            for call in src.calls
        )
        if names & trained_models(src) or helper or not has_optimizer:
            found.append((assign, whole, part))
    return found


def names_of_the_model(src: Source, stmt: ast.stmt, model: str) -> Set[str]:
    """``model`` and the names the callers of the function around ``stmt`` bind it to
    where the function returns it (``net, criterion = set_model(opt)`` of ``return
    model.cuda(), criterion``)."""
    function = src.function_of(stmt)
    names = {model}
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return names
    returns = [r for r in ast.walk(function) if isinstance(r, ast.Return) and r.value is not None]
    positions = {
        i for r in returns for i, e in enumerate(getattr(r.value, "elts", None) or [r.value])
        if dotted(_same_module(e)) == model
    }
    if not positions:
        return names
    for call in src.calls:
        if dotted(call.func) != function.name:
            continue
        bound = src.parent(call)
        if isinstance(bound, ast.Assign):
            for target in bound.targets:
                items = getattr(target, "elts", None) or [target]
                names |= {dotted(t) for i, t in enumerate(items) if i in positions or len(items) == 1} - {""}
    return names


#: what a whole-model DDP wrapper still answers as the bare model did (its state_dict()
#: only gains the ``module.`` prefix)
_WHOLE_WRAP_KEEPS = N.DDP_FORWARDS | {"state_dict"}


def whole_wrap_blocker(
    src: Source, assign: ast.Assign, whole: str, imported: Dict[str, Tuple[Tuple[str, ...], Tuple[Tuple[str, str], ...]]],
    importable: bool = True,
) -> str:
    """Why ``model.encoder = DataParallel(model.encoder)`` cannot become a DDP wrap of
    ``model`` as a whole (``""`` when it can): the program reads an attribute of
    ``model`` that the wrapper does not forward -- after the wrap, in another function
    of the file (``model.encoder(x)``, ``model.load_state_dict(ckpt)``: its keys would
    not match), through a function of the file or of another module that ``model``
    is handed to (``imported``: alias -> (its parameters, (parameter, attribute)
    read), or a class it is handed to (``Probe(model)``: its methods may) -- or, in a
    module another may import (``importable``: not the entry point), the function
    returns ``model`` to callers this file cannot see.  Shared by convert
    (data-parallel-to-ddp) and its report."""
    function = src.function_of(assign)
    names = names_of_the_model(src, assign, whole)
    if importable and isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        isinstance(r, ast.Return) and r.value is not None
        and whole in {dotted(_same_module(e)) for e in (getattr(r.value, "elts", None) or [r.value])}
        for r in ast.walk(function)
    ):
        return f"{function.name}() returns {whole} to callers in other modules, which may use its parts"
    own = {
        f.name: f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for node in src.nodes:
        if isinstance(node, ast.Attribute) and dotted(node.value) in names and node.attr not in _WHOLE_WRAP_KEEPS:
            if node.lineno < assign.lineno and src.function_of(node) is function or _part_of(src, node, assign):
                continue  # (set-up before the wrap, and the wrap itself)
            return f"{dotted(node)} is not an attribute of the DDP wrapper"
        if isinstance(node, ast.Call) and any(dotted(a) in names for a in (*node.args, *(k.value for k in node.keywords))):
            last = last_name(node.func)
            if last[:1].isupper() and not src.qualname(node.func).startswith("torch."):
                return f"{whole} is handed to {last}(), whose methods may use its parts"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            handed = [i for i, a in enumerate(node.args) if dotted(a) in names]
            if not handed:
                continue
            callee = node.func.id
            if callee in own:
                params = [a.arg for a in (*own[callee].args.posonlyargs, *own[callee].args.args)]
                reads = {
                    (n.value.id, n.attr) for n in ast.walk(own[callee])
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.attr not in _WHOLE_WRAP_KEEPS and not n.attr.startswith("__")
                }
            elif callee in imported:
                params = list(imported[callee][0])
                reads = {(p, a) for p, a in imported[callee][1] if a not in _WHOLE_WRAP_KEEPS}
            else:
                continue
            for at in handed:
                if at < len(params) and any(p == params[at] for p, _ in reads):
                    attribute = next(a for p, a in reads if p == params[at])
                    return f"{callee}() reads {params[at]}.{attribute} of it"
    return ""


def _same_module(node: ast.AST) -> ast.AST:
    """``model`` of ``model.cuda()``, ``model.to(device).train()``."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SAME_MODULE_METHODS:
        node = node.func.value
    return node


def _part_of(src: Source, node: ast.AST, container: ast.AST) -> bool:
    return node is container or any(a is container for a in src.ancestors(node))


def imported_functions_by_alias(src: Source, by_name: Dict[str, object]) -> Dict[str, object]:
    """The entries of ``by_name`` (functions of the modules this file imports, by their
    own names) under the names this file imports them as (``from generate import
    generate as gen``); ``from m import *`` gives the names the file does not bind itself."""
    imported = {
        alias: qualname for alias, qualname in src.aliases.items()
        if "." in qualname and not qualname.startswith(("torch.", "builtins."))
    }
    found = {alias: by_name[q.rsplit(".", 1)[1]] for alias, q in imported.items() if q.rsplit(".", 1)[1] in by_name}
    if "import *" in src.text:
        bound = set(src.aliases) | {d.name for d in src.of_type(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)}
        found.update((n, f) for n, f in by_name.items() if n not in bound)
    return found


def ddp_wrapped_names(src: Source, wrappers: FrozenSet[str] = N.DDP) -> Set[str]:
    """Names (``model``, ``self.model``) assigned a DistributedDataParallel (or
    another of ``wrappers``: DataParallel, for convert)."""
    key = f"wrapped:{','.join(sorted(wrappers))}"
    if key in src.cache:
        return src.cache[key]  # type: ignore[return-value]
    names = set()
    src.cache[key] = names
    for node in src.of_type(ast.Assign):
        value = node.value
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(
            value.func.value, ast.Call
        ):
            value = value.func.value  # DataParallel(model).cuda()
        if src.is_call(value, wrappers):
            for target in node.targets:
                name = dotted(target)
                if name:
                    names.add(name)
    return names


#: methods of a model that run no forward pass (saving, loading, set-up), by
#: their start -- and nn.Module's own, by name
NOT_FORWARD_PREFIXES = (
    "save", "load", "get_", "set_", "push_to_hub", "resize_", "tie_", "gradient_checkpointing",
    "init_", "num_", "count_", "reset_", "summary", "named_", "register_",
)
NOT_FORWARD_METHODS = frozenset({
    "state_dict", "parameters", "modules", "children", "buffers", "train", "eval", "to", "cuda", "cpu",
    "half", "float", "double", "bfloat16", "zero_grad", "apply", "requires_grad_", "extra_repr",
})


def runs_no_forward(method: str) -> bool:
    """(``configure_optimizers``, ``make_optimizer``: set-up, no forward pass either)"""
    return method in NOT_FORWARD_METHODS or method.startswith(NOT_FORWARD_PREFIXES) or "optim" in method.lower()


def forward_past_the_wrapper(src: Source, wrapped: Set[str]) -> List[Tuple[ast.AST, str]]:
    """``(statement, what)`` for ``model.module(x)`` / ``model.module.encoder(x)`` of a
    model named in ``wrapped`` whose result reaches a later ``backward()`` of its
    function (through the names it is assigned to): a training step that runs the
    model, or a part of it, past the DDP wrapper -- whose gradients DDP then never
    averages.  Not: calls under ``no_grad`` or taken off the graph (``.detach()``,
    ``.item()``), whose result no backward uses (``freeze_bn()``, an EMA update, a
    sample for the log), or that post-process the wrapped model's own output
    (``model.module.compute_loss(model(x), y)``)."""
    found = []
    for call in src.calls:
        name = dotted(call.func)
        owner = next((w for w in wrapped if name == f"{w}.module" or name.startswith(f"{w}.module.")), None)
        if owner is None:
            continue
        part = name[len(owner) + len(".module."):] if name != f"{owner}.module" else ""
        if part and runs_no_forward(part.rsplit(".", 1)[-1]):
            continue
        func = src.function_of(call)
        if _without_gradients(src, call, func):
            continue  # (targets computed under no_grad: no gradient to average)
        holder = src.parent(call)
        if isinstance(holder, ast.Attribute) and holder.attr in ("detach", "item", "tolist", "numpy", "detach_"):
            continue
        body = func.body if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else src.tree.body
        statements = sorted(
            (n for stmt in body for n in _walk_here(stmt) if isinstance(n, ast.stmt)),
            key=lambda n: (n.lineno, n.col_offset),
        )  # (the function's statements, nested ones too, in the order they are written)
        outputs = _assigned_from(statements, lambda e: any(
            isinstance(c, ast.Call) and dotted(c.func) == owner for c in ast.walk(e)
        ))
        if any(_references(a) & outputs for a in (*call.args, *(k.value for k in call.keywords))):
            continue  # post-processes the wrapped model's output (a loss of its own)
        if _reaches_backward(src, call, statements):
            stmt = _statement_of(src, call)
            if all(stmt is not seen for seen, _ in found):
                found.append((stmt, name))
    return found


def _references(node: ast.AST) -> Set[str]:
    return {dotted(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))} - {""}


def _targets(stmt: ast.stmt) -> Set[str]:
    if isinstance(stmt, ast.Assign):
        return {dotted(n) for t in stmt.targets for n in ast.walk(t) if isinstance(n, (ast.Name, ast.Attribute))} - {""}
    if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
        return {dotted(stmt.target)} - {""}
    return set()


def _assigned_from(statements, test) -> Set[str]:
    """The names assigned (directly or through later assignments) from a value
    that passes ``test``."""
    names: Set[str] = set()
    for stmt in statements:
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and value is not None:
            if test(value) or _references(value) & names:
                names |= _targets(stmt)
    return names


def _reaches_backward(src: Source, call: ast.Call, statements) -> bool:
    """The value of ``call`` flows into the receiver of a later ``backward()``."""
    start = _statement_of(src, call)
    tainted: Set[str] = set()
    for stmt in statements:
        if (stmt.lineno, stmt.col_offset) < (start.lineno, start.col_offset):
            continue
        compound = isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try))
        for node in () if compound else ast.walk(stmt):  # (a compound's statements come one by one)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "backward":
                receiver = node.func.value
                if _references(receiver) & tainted or any(n is call for n in ast.walk(receiver)):
                    return True
        value = getattr(stmt, "value", None)
        if stmt is start or value is not None and _references(value) & tainted:
            tainted |= _targets(stmt)
            if isinstance(stmt, ast.Expr) and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                if value.func.attr in ("append", "extend", "add", "update"):
                    tainted.add(dotted(value.func.value))  # losses.append(z)
    return False


# ------------------------------------------------------------------ ranks
_RANK_WORD = re.compile(r"(?i)(^|_)(global_?|world_?|node_?)?rank$|^rank")
_LOCAL_RANK_WORD = re.compile(r"(?i)local_?rank|gpu|device|local_?id")
_MAIN_FUNC = re.compile(
    r"(?i)^(is_)?(main_?process|master|main|primary|rank_?0|rank_?zero|leader|local_?master|"
    r"local_?main_?process|world_?process_?zero|chief)(_process)?$"
)
_MAIN_VAR = re.compile(
    r"(?i)^(is_)?(main|master|primary|rank_?0|rank_?zero|leader|chief|global_?zero|local_?zero)"
    r"(_?proc(ess)?|_?rank|_?node)?$"
)
#: calls that return a rank, by their last name
_RANK_CALLS = frozenset({"get_rank", "get_local_rank", "get_global_rank", "get_node_local_rank"})
_RANK_ENV = frozenset({"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "GROUP_RANK"})


def environ_key(src: Source, node: ast.AST) -> Optional[str]:
    """'RANK' for ``os.environ["RANK"]`` / ``os.environ.get("RANK")`` / ``os.getenv("RANK")``."""
    if isinstance(node, ast.Subscript) and src.qualname(node.value) == "os.environ":
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = src.qualname(node.func)
        if func in ("os.environ.get", "os.getenv") and isinstance(node.args[0].value, str):
            return node.args[0].value
    return None


def is_rank_expr(src: Source, node: ast.AST) -> bool:
    """An expression that holds a rank: ``dist.get_rank()``, ``rank``,
    ``args.local_rank``, ``int(os.environ["RANK"])``, ``args.rank % ngpus``."""
    if isinstance(node, ast.Call):
        name = src.qualname(node.func)
        if name.startswith("torch.distributed.") and name.endswith(("get_rank", "get_node_local_rank")):
            return True
        if last_name(node.func) in _RANK_CALLS:
            return True
        if name == "builtins.int" or last_name(node.func) == "int":
            return bool(node.args) and is_rank_expr(src, node.args[0])
        return environ_key(src, node) in _RANK_ENV
    if isinstance(node, ast.BinOp):
        return is_rank_expr(src, node.left)
    if isinstance(node, ast.Name):
        return bool(_RANK_WORD.search(node.id)) or node.id in _rank_valued_names(src)
    if isinstance(node, ast.Attribute):
        return bool(_RANK_WORD.search(node.attr)) or node.attr in _rank_valued_names(src)
    if isinstance(node, ast.Subscript):
        return environ_key(src, node) in _RANK_ENV
    return False


def _rank_valued_names(src: Source) -> frozenset:
    """Names assigned a rank under another name: ``self.gpu_id =
    int(os.environ["LOCAL_RANK"])`` (PyTorch's own DDP tutorial) -- then
    ``self.gpu_id == 0`` is a rank check.  Only what the assignment's value says
    directly counts (a rank call or the environment), not other such names."""
    cached = src.cache.get("rank_valued_names")
    if cached is None:
        names = set()
        for node in src.of_type(ast.Assign):
            value = node.value
            if isinstance(value, ast.Call) and last_name(value.func) == "int" and value.args:
                value = value.args[0]
            direct = (
                isinstance(value, (ast.Subscript, ast.Call)) and environ_key(src, value) in _RANK_ENV
            ) or (
                isinstance(value, ast.Call)
                and last_name(value.func) in _RANK_CALLS
            )
            if direct:
                for target in node.targets:
                    name = last_name(target)
                    if name:
                        names.add(name)
        cached = src.cache["rank_valued_names"] = frozenset(names)
    return cached  # type: ignore[return-value]


def is_global_rank_expr(src: Source, node: ast.AST) -> bool:
    """A rank that is global (``RANK``, ``dist.get_rank()``), not this node's local one."""
    if isinstance(node, ast.Call):
        name = src.qualname(node.func)
        if name == "torch.distributed.get_rank":
            return True
        if last_name(node.func) == "int" and node.args:
            return is_global_rank_expr(src, node.args[0])
        return environ_key(src, node) in ("RANK", "SLURM_PROCID")
    if isinstance(node, ast.Subscript):
        return environ_key(src, node) in ("RANK", "SLURM_PROCID")
    name = last_name(node)
    return bool(name) and bool(re.fullmatch(r"(?i)(global_?)?rank|world_?rank", name))


def is_main_process_check(src: Source, test: ast.AST) -> bool:
    """True on the main process only.  Recognised forms (documented in the rules):
    ``dist.get_rank() == 0``, ``rank == 0``, ``args.local_rank in [-1, 0]``,
    ``args.rank % ngpus_per_node == 0``, ``not rank``, ``is_main_process()``,
    ``is_master``, ``int(os.environ["RANK"]) == 0``, and ``and`` combinations."""
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And):
            return any(is_main_process_check(src, v) for v in test.values)
        # `not dist.is_initialized() or dist.get_rank() == 0`: a world of one, or rank 0
        # (also HF's `args.local_rank == -1 or get_rank() == 0`, the ImageNet example's
        # `not args.multiprocessing_distributed or (... and args.rank % ngpus == 0)`)
        values = [v for v in test.values if not _not_distributed(src, v)]
        return bool(values) and all(is_main_process_check(src, v) for v in values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_rank_expr(src, test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if _is_zero(right) and isinstance(op, (ast.Eq, ast.LtE, ast.Lt)):
            return is_rank_expr(src, left)
        if _is_zero(left) and isinstance(op, ast.Eq):
            return is_rank_expr(src, right)
        if isinstance(op, ast.In) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
            values = {_int_value(e) for e in right.elts}
            return 0 in values and values <= {0, -1} and is_rank_expr(src, left)
        return False
    if isinstance(test, ast.Call):
        return bool(_MAIN_FUNC.match(last_name(test.func)))
    if isinstance(test, (ast.Name, ast.Attribute)):
        return bool(_MAIN_VAR.match(last_name(test))) or dotted(test) in main_process_flags(src)
    return False


def main_process_flags(src: Source) -> Set[str]:
    """Names (``save_logs``, ``args.save_logs``) every assignment of which is a
    main-process check: open_clip's ``args.save_logs = args.logs and ... and
    is_master(args)``, then ``if args.save_logs: torch.save(...)``."""
    found = src.cache.get("main_process_flags")
    if found is not None:
        return found  # type: ignore[return-value]
    src.cache["main_process_flags"] = set()  # (while it is worked out: no flag yet)
    values: Dict[str, List[ast.AST]] = {}
    if "and" in src.text:
        assigns = src.of_type(ast.Assign)
        candidates = {dotted(t) for n in assigns if isinstance(n.value, ast.BoolOp) for t in n.targets} - {""}
        for node in assigns:
            for target in node.targets:
                if dotted(target) in candidates:
                    values.setdefault(dotted(target), []).append(node.value)
    rebound = {dotted(n.target) for n in src.of_type(ast.AugAssign, ast.AnnAssign)} if values else set()
    flags = {
        name for name, assigned in values.items()
        if all(isinstance(v, ast.BoolOp) and isinstance(v.op, ast.And) and is_main_process_check(src, v)
               for v in assigned)
        and name not in rebound
    }
    src.cache["main_process_flags"] = flags
    return flags


def _not_distributed(src: Source, node: ast.AST) -> bool:
    """True only in a run without a process group: ``not dist.is_initialized()``,
    ``args.local_rank == -1``, ``not args.distributed``, ``world_size == 1``."""
    if _not_initialized(node):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        word = last_name(node.operand).lower() if isinstance(node.operand, (ast.Name, ast.Attribute)) else ""
        return "distributed" in word or word in ("ddp", "use_ddp", "is_ddp")
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
        left, right = node.left, node.comparators[0]
        if _int_value(right) == -1:
            return is_rank_expr(src, left)
        if _int_value(right) == 1 and isinstance(left, (ast.Name, ast.Attribute, ast.Call)):
            return "world_size" in (last_name(left.func) if isinstance(left, ast.Call) else last_name(left))
    return False


def _distributed_mode_test(src: Source, node: ast.AST) -> bool:
    """``rank != -1``, ``args.local_rank == -1``, ``RANK > -1``, ``rank >= 0``: true
    on every rank of a distributed run or on none (-1: launched without one)."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return False
    left, op, right = node.left, node.ops[0], node.comparators[0]
    value = _int_value(right)
    mode = (
        value == -1 and isinstance(op, (ast.Eq, ast.NotEq, ast.Gt, ast.LtE))
        or value == 0 and isinstance(op, (ast.GtE, ast.Lt))
    )
    return mode and is_rank_expr(src, left)


def runs_without_a_process_group(src: Source, node: ast.AST) -> bool:
    """``node`` is in the body of ``if not dist.is_initialized():`` / ``if not
    dist.is_available():`` (or another test true only without a process group,
    ``_not_distributed``) in its function: where it runs there is no collective."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.If) and child in anc.body and (
            _not_distributed(src, anc.test)
            or isinstance(anc.test, ast.UnaryOp) and isinstance(anc.test.op, ast.Not)
            and isinstance(anc.test.operand, ast.Call) and last_name(anc.test.operand.func) == "is_available"
        ):
            return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child = anc
    return False


def _not_initialized(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.Not)
        and isinstance(node.operand, ast.Call)
        and last_name(node.operand.func) == "is_initialized"
    )


def is_rank_dependent(src: Source, test: ast.AST) -> bool:
    """A condition whose value may differ between ranks because it asks for the rank.
    ``RANK != -1`` / ``args.local_rank == -1`` asks whether the run is distributed
    at all (yolov5's ``if RANK != -1: dist.broadcast_object_list(...)``): the same on
    every rank of a run."""
    if _distributed_mode_test(src, test):
        return False
    if isinstance(test, ast.BoolOp) and not is_main_process_check(src, test):
        return any(is_rank_dependent(src, v) for v in test.values)
    if is_main_process_check(src, test):
        return True
    for sub in ast.walk(test):
        if isinstance(sub, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)) and is_rank_expr(src, sub):
            return True
    return False


def _is_zero(node: ast.AST) -> bool:
    """``0``, or ``"0"`` (a rank read from the environment as a string)."""
    return isinstance(node, ast.Constant) and (
        (node.value == 0 and not isinstance(node.value, bool)) or node.value == "0"
    )


def _int_value(node: ast.AST) -> Optional[int]:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value if isinstance(node.operand.value, int) else None
    return None


def rank_branch(src: Source, node: ast.AST) -> Optional[ast.If]:
    """The nearest ``if`` in the same function whose branch holding ``node`` runs
    on some ranks only (its test asks for the rank)."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(anc, ast.If) and child is not anc.test and is_rank_dependent(src, anc.test):
            return anc
        if isinstance(anc, ast.IfExp) and child is not anc.test and is_rank_dependent(src, anc.test):
            return anc  # type: ignore[return-value]
        child = anc
    return None


def is_pure(node: ast.AST) -> bool:
    """An expression that cannot reach a collective: no calls but harmless ones
    (``_patterns.is_pure``'s test, on ``ast``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Name) and func.id in N.HARMLESS_FUNCS:
                continue
            if isinstance(func, ast.Attribute) and func.attr in N.HARMLESS_METHODS:
                continue
            return False
    return True


def calls_of(src: Source, func: ast.AST) -> List[ast.Call]:
    """The calls of the function ``func`` in this file, by its name (``f(...)``,
    ``self.f(...)``)."""
    name = called_name(src, func)
    return calls_of_name(src, name) if name else []


def called_name(src: Source, func: ast.AST) -> Optional[str]:
    """The name calls of ``func`` use: its own, or its class's for an ``__init__``
    (``Labels(path)`` runs ``Labels.__init__``)."""
    name: Optional[str] = getattr(func, "name", None)
    if name == "__init__" and isinstance(src.parent(func), ast.ClassDef):
        return src.parent(func).name
    return name


def calls_of_name(src: Source, name: str) -> List[ast.Call]:
    """The calls in this file of whatever is called ``name`` (``f(...)``,
    ``self.f(...)``, ``utils.f(...)``)."""
    return list(_calls_by_last_name(src).get(name, ()))


def _calls_by_last_name(src: Source) -> Dict[str, List[ast.Call]]:
    """The file's calls by the last name of what they call, in the file's order
    (built once: asked for each function, a scan of every call grew with the
    square of the file)."""
    index = src.cache.get("calls_by_last_name")
    if index is None:
        index = {}
        for call in src.calls:
            index.setdefault(last_name(call.func), []).append(call)
        src.cache["calls_by_last_name"] = index
    return index  # type: ignore[return-value]


def called_unguarded(src: Source, func: ast.AST, seen: Optional[set] = None) -> bool:
    """Some call of ``func`` in this file runs on every rank.  A function this file
    never calls is an API for callers elsewhere, which decide."""
    name: Optional[str] = getattr(func, "name", None)
    seen = set() if seen is None else seen
    if name is None or func in seen:
        return False
    seen.add(func)
    calls = calls_of(src, func)
    if not calls:
        return False  # an API for callers elsewhere: they decide
    for call in calls:
        if on_main_process_only(src, call):
            continue
        outer = src.function_of(call)
        if outer is None or outer is func or called_unguarded(src, outer, seen):
            return True
    return False


def called_only_on_main(src: Source, func: ast.AST) -> bool:
    """``func`` is called in this file, and only where the main process alone runs
    (``if self.gpu_id == 0: self._save_snapshot(epoch)``)."""
    return bool(calls_of(src, func)) and not called_unguarded(src, func)


# ------------------------------------------------------------------ DataParallel by name
#: "DataParallel" in a text, not as part of "DistributedDataParallel"
DATA_PARALLEL_WORD = re.compile(r"(?<!Distributed)DataParallel")


def bare_data_parallel_references(src: Source) -> Iterator[ast.AST]:
    """``wrap = nn.DataParallel``, ``build(model, nn.DataParallel)``, a default
    ``parallel=nn.DataParallel``: DataParallel named where it may be called later.
    A type test is harmless -- ``isinstance``/``issubclass``, ``type(m) in (...)``,
    ``is``/``==``, a tuple, list or set of types (``DP_TYPES = (DataParallel, DDP)``),
    an annotation -- and so are a class's bases and imports (reported elsewhere).
    Shared by lint (DDP001) and convert (data-parallel-to-ddp reports it, wrap-model
    does not wrap a model that may go through it)."""
    if not DATA_PARALLEL_WORD.search(src.text):
        return
    # the local names bound to DataParallel by an import (``DataParallel``, ``DP``)
    names = {local for local, qualified in src.aliases.items() if qualified in N.DATA_PARALLEL}
    # the calls' and the classes' own names need no parent lookup (the usual case:
    # ``nn.DataParallel(model)``), so most files never build the parent index here
    explained = {id(c.func) for c in src.calls}
    explained |= {id(b) for c in src.of_type(ast.ClassDef) for b in c.bases}
    for node in src.of_type(ast.Attribute, ast.Name):
        if not (
            isinstance(node, ast.Attribute) and node.attr == "DataParallel"
            or isinstance(node, ast.Name) and node.id in names
        ) or id(node) in explained:
            continue
        if src.qualname(node) not in N.DATA_PARALLEL:
            continue
        parent = src.parent(node)
        if isinstance(parent, ast.Call) and parent.func is node or isinstance(parent, ast.ClassDef):
            continue
        if isinstance(parent, ast.Attribute):
            continue  # ``nn.DataParallel.forward``: an attribute of the class, not the class
        if not _type_use(src, node):
            yield node


def _type_use(src: Source, node: ast.AST) -> bool:
    """``node`` is used as a type: in a comparison (``type(m) is DataParallel``,
    ``type(m) in (...)``), an ``isinstance``/``issubclass`` test -- also through a
    tuple, list or set of types, or a name holding one that only such tests use
    (``DP_TYPES = (DataParallel, DDP)``) -- or an annotation.  A list of wrappers
    that is iterated or called (``for wrap in [nn.DataParallel]``) is not."""
    child = node
    in_collection = False
    for parent in src.ancestors(node):
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, (ast.Tuple, ast.List, ast.Set)) or (
            isinstance(parent, ast.Dict) and any(v is child for v in parent.values)
        ):  # (a dict: a registry of wrappers by name, MODEL_WRAPPERS = {"DataParallel": ...})
            in_collection, child = True, parent
            continue
        if isinstance(parent, ast.Call):
            return _type_test(parent)
        if in_collection and isinstance(parent, ast.Assign) and child is parent.value:
            names = {t.id for t in parent.targets if isinstance(t, ast.Name)}
            return _types_only(src, names)
        if isinstance(parent, (ast.arg, ast.AnnAssign)) and child is getattr(parent, "annotation", None):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is parent.returns:
            return True
        if isinstance(parent, (ast.Subscript, ast.BinOp)):  # Optional[DataParallel], A | B
            child = parent
            continue
        return False
    return False


def _types_only(src: Source, names: set) -> bool:
    """A collection held by ``names`` serves type tests: some use reaches an
    ``isinstance``/``issubclass`` or a comparison -- directly, through a loop or
    comprehension variable over it (``any(isinstance(m, t) for t in DP_TYPES)``),
    or through a parameter it is the default of -- and nothing calls its items
    (``for wrap in WRAPPERS: model = wrap(model)``, ``WRAPPERS[0](model)``)."""
    tested = called = False
    todo, seen = set(names), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for use in src.nodes:
            if not (isinstance(use, ast.Name) and use.id == name and isinstance(use.ctx, ast.Load)):
                continue
            parent = src.parent(use)
            # (through the registry's values: isinstance(m, tuple(MODEL_WRAPPERS.values())))
            held = use
            while isinstance(parent, ast.Attribute) and parent.attr in ("values", "get"):
                call = src.parent(parent)
                if not (isinstance(call, ast.Call) and call.func is parent):
                    break
                held, parent = call, src.parent(call)
            while (
                isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                and parent.func.id in ("tuple", "list", "set", "frozenset") and held in parent.args
            ):
                held, parent = parent, src.parent(parent)
            if _type_test(parent) or isinstance(parent, ast.Compare):
                tested = True
            elif held is not use and isinstance(parent, ast.Call) and parent.func is held:
                called = True  # (MODEL_WRAPPERS.get(name)(model))
            elif isinstance(parent, ast.Call) and parent.func is use:
                called = True
            elif isinstance(parent, ast.Subscript) and isinstance(src.parent(parent), ast.Call) and src.parent(parent).func is parent:
                called = True
            elif isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is use and isinstance(parent.target, ast.Name):
                todo |= {parent.target.id} - seen  # the items, one at a time
            elif isinstance(parent, ast.arguments):
                defaults = list(parent.defaults)
                params = (parent.posonlyargs + parent.args)[len(parent.posonlyargs + parent.args) - len(defaults):]
                todo |= {a.arg for a, d in zip(params, defaults) if d is use} - seen
                todo |= {a.arg for a, d in zip(parent.kwonlyargs, parent.kw_defaults) if d is use} - seen
    return tested and not called


def _type_test(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass")


#: ``bound_values``'s default scope: every function and the module
_ANYWHERE = object()


def bound_values(src: Source, name: str, scope=_ANYWHERE, with_items: bool = False) -> List[ast.AST]:
    """The values ``name`` is bound to by ``name = V`` -- and, with ``with_items``,
    by ``with V as name`` -- in the function ``scope`` (None: module level), or
    anywhere in the file."""
    values = []
    if scope is _ANYWHERE:
        nodes = src.of_type(ast.Assign, ast.withitem) if with_items else src.of_type(ast.Assign)
    else:
        nodes = bindings_in(src, scope, (ast.Assign, ast.withitem) if with_items else (ast.Assign,))
    for node in nodes:
        if isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                values.append(node.value)
        elif isinstance(node.optional_vars, ast.Name) and node.optional_vars.id == name:
            values.append(node.context_expr)
    return values


def bindings_in(src: Source, scope, types: tuple) -> List[ast.AST]:
    """The nodes of ``types`` whose function is ``scope`` (None: module level), in
    the file's order -- grouped once per file and types (asked once per name)."""
    key = ("bindings_in", types)
    by_scope = src.cache.get(key)
    if by_scope is None:
        by_scope = {}
        for node in src.of_type(*types):
            by_scope.setdefault(id(src.function_of(node)), []).append(node)
        src.cache[key] = by_scope  # type: ignore[index]
    return list(by_scope.get(id(scope), ()))  # type: ignore[union-attr]


def open_for_writing(src: Source, stmt: ast.With) -> List[ast.Call]:
    """The ``open(P, "w")`` calls of a ``with`` whose items all open a file to write
    (a literal mode with w, a, x or +) and whose body only writes it -- dumps,
    ``f.write(...)``, a csv writer and its rows; empty otherwise.  Shared by lint
    (DDP302) and convert (save-on-main, which puts such a block on rank 0)."""
    calls = []
    for item in stmt.items:
        call = item.context_expr
        if not _opens_to_write(call, "wax+"):
            return []
        calls.append(call)
    for line in stmt.body:
        if isinstance(line, ast.Assign) and len(line.targets) == 1 and isinstance(line.targets[0], ast.Name):
            if src.is_call(line.value, N.CSV_WRITERS):
                continue  # ``writer = csv.writer(f)``
            return []
        if not (isinstance(line, ast.Expr) and isinstance(line.value, ast.Call)):
            return []
        inner = line.value
        if not (
            src.qualname(inner.func) in N.WRITE_DUMPS
            or isinstance(inner.func, ast.Attribute) and inner.func.attr in N.WRITE_METHODS
        ):
            return []
    return calls


def _opens_to_write(call: ast.AST, modes: str) -> bool:
    """``open(P, mode)`` with a literal mode holding one of ``modes``."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "open" and call.args):
        return False
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in modes)


def write_target(src: Source, call: ast.Call) -> Optional[ast.AST]:
    """The file argument of a call that writes one: ``open(P, "w")``'s ``P``,
    ``torch.save(obj, f)``'s ``f``, ``json.dump(x, open(P, "w"))``'s ``P``,
    ``np.save(P, x)``'s and ``model.save_pretrained(P)``'s ``P``; None if not there."""
    opened = dumped_into_open(src, call)
    if opened is not None:
        call = opened
    name = src.qualname(call.func)
    if name in _OPEN or isinstance(call.func, ast.Attribute) and call.func.attr == "save_pretrained":
        index, keyword = 0, ("file", "save_directory")
    elif is_image_save(src, call):
        index, keyword = 0, ("fp",)
    else:
        index, keyword = N.ARTIFACT_PATH_ARG.get(name, 1), ("f", "fp", "file", "fname", "filename")
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        target = call.args[index]
    else:
        target = next((k.value for k in call.keywords if k.arg in keyword), None)
    if isinstance(target, ast.Call) and src.qualname(target.func) in _OPEN and target.args:
        return target.args[0]  # torch.save(state, open(path, "wb"))
    return target


_OPEN = frozenset({"open", "builtins.open", "io.open"})


_IN_MEMORY = frozenset({"io.BytesIO", "io.StringIO"})


def per_rank_target(src: Source, target: ast.AST, depth: int = 3) -> bool:
    """A file target that is not the same file on every rank: a path that names
    the rank (``f"samples_{rank}.png"``, ``queue_path = ... + str(args.rank)``), a
    ``tempfile`` path (this process's own folder), an in-memory buffer (``buf =
    io.BytesIO()``) -- also through the variables it is built from (``cfg_path =
    os.path.join(tmpdir, "cfg.json")``), ``depth`` assignments deep.  Lint's
    DDP302 and convert's save-on-main decide with this one test."""
    if any(is_rank_expr(src, n) for n in ast.walk(target) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))):
        return True
    if isinstance(target, ast.Call) and (
        src.qualname(target.func).startswith("tempfile.") or src.qualname(target.func) in _IN_MEMORY
    ):
        return True
    if depth == 0:
        return False
    objects = {id(n.value) for n in ast.walk(target) if isinstance(n, ast.Attribute)}
    # (the names the path is built from -- not an object it only reads an attribute
    # of: ``net.__class__.__name__`` does not make the path per rank because ``net``
    # was wrapped with ``device_ids=[local_rank]``)
    for name in {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and id(n) not in objects}:
        for value in bound_values(src, name, with_items=True) + _loop_sources(src, name):
            if value is not target and per_rank_target(src, value, depth - 1):
                return True
    return False


def _loop_sources(src: Source, name: str) -> List[ast.AST]:
    """What the loops that bind ``name`` iterate over: EDM's ``for batch in
    batches[rank::world]:`` makes each seed, and so each file named after it, this
    rank's own."""
    index = src.cache.get("loop_sources")
    if index is None:
        index = {}
        for loop in src.of_type(ast.For, ast.AsyncFor, ast.comprehension):
            for node in ast.walk(loop.target):
                if isinstance(node, ast.Name):
                    index.setdefault(node.id, []).append(loop.iter)
        src.cache["loop_sources"] = index
    return list(index.get(name, ()))  # type: ignore[union-attr]


_FILE_HANDLERS = ("logging.FileHandler", "logging.handlers.RotatingFileHandler")


def file_handler_added(src: Source, call: ast.Call) -> bool:
    """``logger.addHandler(logging.FileHandler(path))`` with a path that does not
    name the rank: the file is opened for appending by every rank that runs it.
    So does ``logging.basicConfig(filename=path, ...)`` (SimCLR's training.log):
    on the main process only, the other ranks log to stderr (warnings, errors).
    A file write for lint (DDP302) and convert (rank 0)."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "basicConfig" and src.qualname(call.func) == "logging.basicConfig":
        path = keyword(call, "filename")
        return path is not None and not per_rank_target(src, path) and is_pure(path)
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "addHandler" and len(call.args) == 1):
        return False
    return _shared_file_handler(src, call.args[0])


def _shared_file_handler(src: Source, handler: ast.AST) -> bool:
    if not (isinstance(handler, ast.Call) and src.qualname(handler.func) in _FILE_HANDLERS):
        return False
    path = argument(handler, 0, "filename")
    return path is not None and not per_rank_target(src, path) and is_pure(path)


#: writers made over an open file: ``wr = csv.writer(f)``
_FILE_WRITERS = frozenset({"csv.writer", "csv.DictWriter"})
#: what a file opened for writing, or its writer, is asked in the statements that fill it
_FILLING = frozenset({"write", "writelines", "writerow", "writerows", "writeheader", "close", "flush"})


def opened_file_statements(src: Source) -> Dict[ast.stmt, ast.Assign]:
    """``f = open(path, "a")`` (a path every rank shares, a mode that writes) and the
    statements of the same block that fill and close it -- ``wr = csv.writer(f)``,
    ``wr.writerow([...])``, ``f.write(s)``, ``f.close()``: {statement: the open} --
    where nothing else uses ``f`` or its writer and what they write is computed
    already (pure arguments): one rank appends the row (Image_Segmentation's
    result.csv), every rank would.  Shared by lint (DDP302) and convert (save-on-main)."""
    if "open(" not in src.text:
        return {}
    found: Dict[ast.stmt, ast.Assign] = {}
    for assign in src.of_type(ast.Assign):
        value = assign.value
        if not (
            len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name)
            and isinstance(value, ast.Call) and src.qualname(value.func) in ("builtins.open", "io.open")
            and value.args and all(is_pure(a) for a in (*value.args, *(k.value for k in value.keywords)))
        ):
            continue
        mode = value.args[1] if len(value.args) > 1 else keyword(value, "mode")
        if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wa")
                and "+" not in mode.value) or per_rank_target(src, value.args[0]):
            continue
        block = _block_of(src, assign)
        if block is None:
            continue
        names, statements, closed = {assign.targets[0].id}, [], False
        for stmt in block[block.index(assign) + 1:]:
            used = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)} & names
            if not used:
                continue
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and (
                isinstance(stmt.value, ast.Call) and src.qualname(stmt.value.func) in _FILE_WRITERS
                and [dotted(a) for a in stmt.value.args[:1]] == [assign.targets[0].id]
            ):
                names.add(stmt.targets[0].id)
                statements.append(stmt)
                continue
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            if not (
                isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name) and call.func.value.id in names
                and call.func.attr in _FILLING
                and all(is_pure(a) for a in (*call.args, *(k.value for k in call.keywords)))
            ):
                statements = []
                break
            statements.append(stmt)
            if call.func.attr == "close" and call.func.value.id == assign.targets[0].id:
                closed = True
                break
        if closed:
            for stmt in [assign, *statements]:
                found[stmt] = assign
    return found


def _block_of(src: Source, stmt: ast.stmt) -> Optional[List[ast.stmt]]:
    """The list of statements ``stmt`` is one of."""
    parent = src.parent(stmt)
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and any(s is stmt for s in block):
            return block
    return None


def file_handler_statements(src: Source) -> Dict[ast.stmt, ast.Assign]:
    """``fh = logging.FileHandler(path)`` (a path every rank shares) and the
    statements that use ``fh`` -- ``fh.setFormatter(f)``, ``logger.addHandler(fh)``,
    each a call statement of its own in the same function -- {statement: its
    assignment}: they open and feed one log file, and go to the main process
    together (pytorch-playground's Logger).  Not when ``fh`` is used otherwise
    (returned, stored, handed to anything else)."""
    if "FileHandler" not in src.text:
        return {}
    found: Dict[ast.stmt, ast.Assign] = {}
    for assign in src.of_type(ast.Assign):
        if len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name):
            continue
        if not _shared_file_handler(src, assign.value):
            continue
        name, scope = assign.targets[0].id, src.function_of(assign)
        nodes = ast.walk(scope) if scope is not None else iter(src.nodes)
        uses = [n for n in nodes if isinstance(n, ast.Name) and n.id == name and n is not assign.targets[0]]
        statements = []
        for use in uses:
            parent = src.parent(use)
            call = parent if isinstance(parent, ast.Call) and use in parent.args else (
                src.parent(parent) if isinstance(parent, ast.Attribute) and parent.value is use else None
            )
            statement = src.parent(call) if isinstance(call, ast.Call) else None
            if not (isinstance(statement, ast.Expr) and statement.value is call and src.function_of(statement) is scope):
                statements = []
                break
            statements.append(statement)
        if statements:
            found[assign] = assign
            found.update((st, assign) for st in statements)
    return found


#: what makes a Pillow image (whose ``.save(path)`` writes a file)
_PIL_IMAGE_MAKERS = ("PIL.Image.fromarray", "PIL.Image.open", "PIL.Image.new", "PIL.Image.frombytes", "PIL.Image.merge")


def is_image_save(src: Source, call: ast.Call) -> bool:
    """``Image.fromarray(a).save(path)``, or ``im.save(path)`` where the same
    function bound ``im`` to a Pillow image (``im = Image.fromarray(a)``, also
    through ``.convert(...)``/``.resize(...)``): a file write like ``np.save``;
    its path is the first argument."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "save" and call.args) or "PIL" not in src.text:
        return False
    receiver = call.func.value
    if isinstance(receiver, ast.Name):
        scope = src.function_of(call)
        values = [
            a.value for a in (ast.walk(scope) if scope is not None else src.tree.body)
            if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == receiver.id for t in a.targets)
        ]
        return bool(values) and all(_makes_an_image(src, v) for v in values)
    return _makes_an_image(src, receiver)


def _makes_an_image(src: Source, value: ast.AST) -> bool:
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in (
        "convert", "resize", "rotate", "crop", "transpose", "copy"
    ):
        value = value.func.value
    return isinstance(value, ast.Call) and src.qualname(value.func) in _PIL_IMAGE_MAKERS


def dumped_into_open(src: Source, call: ast.Call) -> Optional[ast.Call]:
    """The ``open(P, "w")`` of ``json.dump(obj, open(P, "w"))`` (a dump of
    ``WRITE_DUMPS`` into a file opened for writing in its own arguments)."""
    if src.qualname(call.func) not in N.WRITE_DUMPS - N.TORCH_SAVE:
        return None
    return next((a for a in (*call.args, *(k.value for k in call.keywords)) if _opens_to_write(a, "wax+")), None)


def long_lived_writer(src: Source, stmt: ast.With) -> Optional[ast.Call]:
    """The ``open(P, "w")`` of a ``with`` that keeps the file open around other
    work (the training loop) and writes to it there -- ``f.write``, a csv writer,
    ``json.dump(x, f)``, ``print(..., file=f)`` -- a block that cannot go behind
    a main-process check as a whole (``open_for_writing`` takes the pure ones)."""
    if len(stmt.items) != 1 or open_for_writing(src, stmt):
        return None
    item = stmt.items[0]
    call = item.context_expr
    if not _opens_to_write(call, "wax"):
        return None
    handle = item.optional_vars.id if isinstance(item.optional_vars, ast.Name) else None
    if handle is None:
        return None
    writers = {handle}
    for node in ast.walk(stmt):
        if isinstance(node, ast.Assign) and src.is_call(node.value, N.CSV_WRITERS) and any(
            isinstance(a, ast.Name) and a.id == handle for a in node.value.args
        ):
            writers |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(stmt):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in writers and (
            func.attr in N.WRITE_METHODS
        ):
            return call
        if src.qualname(func) in N.WRITE_DUMPS and any(isinstance(a, ast.Name) and a.id == handle for a in node.args):
            return call
        if any(k.arg == "file" and isinstance(k.value, ast.Name) and k.value.id == handle for k in node.keywords):
            return call
    return None


def prints_to_a_rank_file(src: Source, call: ast.Call) -> bool:
    """``print(..., file=f)`` where ``f`` may be this rank's own file: opened in the
    print's function (``with open(P) as f``, ``f = open(P)``, ``P.open()``) on a
    path that names the rank -- directly or through a variable of that function
    -- an in-memory buffer, or handed in (a parameter: the caller's file).
    ``sys.stdout``/``sys.stderr`` and a file opened on a shared path are output
    like any other."""
    handle = next((k.value for k in call.keywords if k.arg == "file"), None)
    if handle is None or dotted(handle) in ("sys.stdout", "sys.stderr"):
        return False
    if isinstance(handle, ast.Call):
        return last_name(handle.func) in ("StringIO", "BytesIO")
    if not isinstance(handle, ast.Name):
        return True  # ``file=self.log``: not known here
    scope = src.function_of(call)
    opens = bound_values(src, handle.id, scope, with_items=True)
    if not opens:
        return True  # a parameter: the caller's file
    return all(_rank_file(src, o, scope) for o in opens)


def _rank_file(src: Source, opened: ast.AST, scope) -> bool:
    """``open(P, ...)``, ``P.open(...)`` or a StringIO, with P naming the rank."""
    if not isinstance(opened, ast.Call):
        return False
    if last_name(opened.func) in ("StringIO", "BytesIO"):
        return True
    if isinstance(opened.func, ast.Name) and opened.func.id == "open" and opened.args:
        path = opened.args[0]
    elif isinstance(opened.func, ast.Attribute) and opened.func.attr == "open":
        path = opened.func.value  # pathlib: (out / f"log_{rank}.txt").open("a")
    else:
        return False

    def names_rank(expr: ast.AST, depth: int = 0) -> bool:
        for n in ast.walk(expr):
            if isinstance(n, (ast.Name, ast.Attribute, ast.Call)) and is_rank_expr(src, n):
                return True
            if isinstance(n, ast.Name) and depth < 2:
                if any(names_rank(value, depth + 1) for value in bound_values(src, n.id, scope)):
                    return True
        return False

    return names_rank(path)


def pure_writes(stmt: ast.With) -> bool:
    """What a writing ``with open(...)`` block writes, and where, computes nothing
    (no call but harmless ones): it may go behind a main-process check."""
    calls = [line.value for line in stmt.body if isinstance(line, ast.Expr)]
    calls += [item.context_expr for item in stmt.items if isinstance(item.context_expr, ast.Call)]
    return all(is_pure(a) for c in calls for a in (*c.args, *(k.value for k in c.keywords)))


def on_main_process_only(src: Source, node: ast.AST) -> bool:
    """``node`` runs on the main process only: under ``if rank == 0:``, or after an
    early ``if rank != 0: return`` in its function -- or where a run has one
    process only (``asserted_single_process``)."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.If) and child in anc.body and is_main_process_check(src, anc.test):
            return True
        if isinstance(anc, ast.If) and child in anc.orelse and is_not_main_check(src, anc.test):
            return True
        if isinstance(anc, ast.If) and child is not anc.test and asserted_single_process(src, anc, child):
            return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _main_only_decorated(anc) or _early_return_unless_main(src, anc, node) or _early_return_unless_flag(
                src, anc, node
            )
        child = anc
    return False


def _early_return_unless_flag(src: Source, func: ast.AST, node: ast.AST) -> bool:
    """After ``if not opt.evolve: return train(opt)`` of a function that asserts
    ``not opt.evolve`` in a distributed run: one process only."""
    return _after_an_early_exit(func, node, lambda test: (
        isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and bool(dotted(test.operand))
        and _asserted_unset_when_distributed(src, func, dotted(test.operand), test.lineno)
    ))


def asserted_single_process(src: Source, branch: ast.If, child: ast.AST) -> bool:
    """``child`` is the side of ``branch`` that runs only when a flag is set that the
    function asserts unset in a distributed run: yolov5's ``if LOCAL_RANK != -1:
    assert not opt.evolve, ...`` then ``if not opt.evolve: train(...) else:
    <evolve, one process>``."""
    test, negated = branch.test, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, True
    flag = dotted(test)
    if not flag or (child in branch.body) == negated:
        return False
    return _asserted_unset_when_distributed(src, src.function_of(branch), flag, branch.lineno)


def _asserted_unset_when_distributed(src: Source, func: Optional[ast.AST], flag: str, before: int) -> bool:
    """``func`` asserts ``not flag`` in a block that runs in a distributed run only
    (``if LOCAL_RANK != -1:``, ``if args.distributed:``), above line ``before``."""
    return any(line < before for line in _flags_asserted_unset_when_distributed(src).get((id(func), flag), ()))


def _flags_asserted_unset_when_distributed(src: Source) -> Dict[Tuple[int, str], List[int]]:
    """(id of the function, flag) -> the lines of the distributed-only blocks that
    assert ``not flag`` there; worked out once per file (``on_main_process_only``
    asks for every branch of every node it is given)."""
    index = src.cache.get("flags_asserted_unset")
    if index is None:
        index = {}
        if "assert" in src.text:
            for block in src.of_type(ast.If):
                if not (_distributed_mode_test(src, block.test) and isinstance(block.test.ops[0], (ast.NotEq, ast.Gt))
                        or "distributed" in dotted(block.test).lower()):
                    continue
                for stmt in block.body:
                    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.UnaryOp) and isinstance(
                        stmt.test.op, ast.Not
                    ) and dotted(stmt.test.operand):
                        key = (id(src.function_of(block)), dotted(stmt.test.operand))
                        index.setdefault(key, []).append(block.lineno)  # type: ignore[union-attr]
        src.cache["flags_asserted_unset"] = index
    return index  # type: ignore[return-value]


_MAIN_ONLY_DECORATOR = re.compile(r"(?i)^(rank_?zero|rank_?0|master|main|main_?process|leader)_?only$")


def _main_only_decorated(func: ast.AST) -> bool:
    """``@rank_zero_only`` (Lightning), ``@master_only`` (mmcv): the body runs on
    the main process only."""
    for decorator in getattr(func, "decorator_list", []):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if _MAIN_ONLY_DECORATOR.match(last_name(target)):
            return True
    return False


def is_not_main_check(src: Source, test: ast.AST) -> bool:
    """``rank != 0``, ``not is_main_process()``, ``local_rank not in [-1, 0]``."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_main_process_check(src, test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op = test.ops[0]
        if isinstance(op, (ast.NotEq, ast.Gt)) and _is_zero(test.comparators[0]):
            return is_rank_expr(src, test.left)
        if isinstance(op, ast.NotIn):
            flipped = ast.Compare(left=test.left, ops=[ast.In()], comparators=test.comparators)
            return is_main_process_check(src, flipped)
    return False


def _early_return_unless_main(src: Source, func: ast.AST, node: ast.AST) -> bool:
    return _after_an_early_exit(func, node, lambda test: is_not_main_check(src, test))


def _after_an_early_exit(func: ast.AST, node: ast.AST, test_holds) -> bool:
    """``node`` comes after a statement of ``func``'s body ``if TEST: ... return``
    (or ``raise``) whose ``TEST`` satisfies ``test_holds``."""
    line = getattr(node, "lineno", 0)
    for stmt in func.body:  # type: ignore[attr-defined]
        if getattr(stmt, "lineno", 0) >= line:
            break
        if (
            isinstance(stmt, ast.If)
            and test_holds(stmt.test)
            and stmt.body
            and isinstance(stmt.body[-1], (ast.Return, ast.Raise))
        ):
            return True
    return False


# ------------------------------------------------------------------ collectives
def is_collective(src: Source, call: ast.Call) -> bool:
    name = src.qualname(call.func)
    if name in N.COLLECTIVES:
        return True
    if isinstance(call.func, ast.Attribute) and call.func.attr == "state_dict" and "FullyShardedDataParallel" in src.text:
        return _gathers_a_full_state_dict(src, call)
    # dist.barrier() through an unusual alias, e.g. `from torch import distributed`
    return name.startswith("torch.distributed.") and name.rsplit(".", 1)[-1] in _COLLECTIVE_NAMES


_FSDP = "torch.distributed.fsdp.FullyShardedDataParallel"


def _gathers_a_full_state_dict(src: Source, call: ast.Call) -> bool:
    """``model.state_dict()`` of a model wrapped in FSDP: under FULL_STATE_DICT
    (FSDP's default) every rank's shards are gathered -- a collective every rank
    must run, even with ``rank0_only=True``; not inside a ``with
    FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT)`` (or LOCAL)."""
    owner = dotted(call.func.value)  # type: ignore[attr-defined]
    if not owner or owner not in {
        dotted(t) for a in src.of_type(ast.Assign) if src.is_call(a.value, frozenset({_FSDP, "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel"}))
        for t in a.targets
    }:
        return False
    for anc in src.ancestors(call):
        if isinstance(anc, ast.With):
            for item in anc.items:
                context = item.context_expr
                if isinstance(context, ast.Call) and last_name(context.func) == "state_dict_type":
                    kinds = {last_name(a) for a in context.args}
                    return "FULL_STATE_DICT" in kinds or not kinds & {"SHARDED_STATE_DICT", "LOCAL_STATE_DICT"}
    return True


_COLLECTIVE_NAMES = frozenset(n.rsplit(".", 1)[-1] for n in N.COLLECTIVES)


# ------------------------------------------------------------------ loaders
_EVAL_WORD = re.compile(
    r"(?i)(^|_|\b)(val|valid|validation|test|eval|evaluation|dev|holdout)(_|\b|$|\d|s|set|data|loader)"
)
_TRAIN_WORD = re.compile(r"(?i)train")


def is_eval_name(name: str) -> bool:
    return bool(_EVAL_WORD.search(name)) and not _TRAIN_WORD.search(name)


def is_train_name(name: str) -> bool:
    return bool(_TRAIN_WORD.search(name)) and not _EVAL_WORD.search(name.replace("train", ""))


def assigned_name(src: Source, node: ast.AST) -> str:
    parent = src.parent(node)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return dotted(parent.targets[0])
    if isinstance(parent, ast.AnnAssign):
        return dotted(parent.target)
    if isinstance(parent, ast.Tuple):
        assign = src.parent(parent)
        if isinstance(assign, ast.Assign) and len(assign.targets) == 1:
            target = assign.targets[0]
            if isinstance(target, ast.Tuple) and len(target.elts) == len(parent.elts):
                return dotted(target.elts[parent.elts.index(node)])
    if isinstance(parent, ast.keyword) and parent.arg:
        return parent.arg
    return ""


def classify_loader(src: Source, call: ast.Call) -> str:
    """'train', 'eval' or 'unknown' for a DataLoader(...) call, from its names
    (variable, dataset, function), ``shuffle=True`` and ``train=``/``split=``."""
    target = assigned_name(src, call)
    if target and is_eval_name(target.rsplit(".", 1)[-1]):
        return "eval"
    if target and is_train_name(target.rsplit(".", 1)[-1]):
        return "train"
    names = [target]
    dataset = argument(call, 0, "dataset")
    if dataset is not None:
        names.append(dotted(dataset))
        if isinstance(dataset, ast.Call):
            names.append(dotted(dataset.func))
            for kw in dataset.keywords:
                if kw.arg in ("train", "split", "mode", "subset") and isinstance(kw.value, ast.Constant):
                    value = kw.value.value
                    names.append("train" if value is True else "test" if value is False else str(value))
    func = src.function_of(call)
    if func is not None and not target and hasattr(func, "name"):
        names.append(func.name)  # type: ignore[attr-defined]
    names = [n for n in names if n]
    train = [n for n in names if is_train_name(n)]
    evals = [n for n in names if is_eval_name(n)]
    if train and not evals:
        return "train"
    if evals and not train:
        return "eval"
    if is_true(argument(call, 2, "shuffle")) and not evals:
        return "train"
    return "unknown"


def training_condition(src: Source, call: ast.Call) -> Optional[ast.AST]:
    """The condition under which a DataLoader of a factory feeds training, where its
    ``shuffle`` says so: ``shuffle=(mode == 'train')`` (StarGAN's and Image_Segmentation's
    ``get_loader(..., mode)``), ``shuffle=is_train``.  Sharded only when it holds: the
    same factory's evaluation loaders stay whole."""
    shuffle = argument(call, 2, "shuffle")
    if isinstance(shuffle, ast.Compare) and len(shuffle.ops) == 1 and isinstance(shuffle.ops[0], ast.Eq):
        sides = [shuffle.left, shuffle.comparators[0]]
        if any(isinstance(x, ast.Constant) and isinstance(x.value, str) and is_train_name(x.value) for x in sides) and all(
            isinstance(x, ast.Constant) or dotted(x) for x in sides
        ):
            return shuffle
    if isinstance(shuffle, (ast.Name, ast.Attribute)) and is_train_name(last_name(shuffle)):
        return shuffle
    return None


def loader_loops(src: Source, call: ast.Call) -> Optional[List[Tuple[ast.AST, ast.AST]]]:
    """(function, loop) pairs where the loader ``call`` builds is bound to a name
    (once, in a function or at module level) and every use of that name is the
    loader of a ``for`` there (also through ``enumerate``/``tqdm``), ``len()`` of
    it, its ``.dataset``, or an argument of a function of this file whose
    parameter is used so in turn (``test(net, memory_loader, test_loader)``:
    SimCLR's feature bank); None otherwise -- a loader handed to another call,
    put through ``iter()``, returned or stored may train elsewhere."""
    func = src.function_of(call)
    parent = src.parent(call)
    if func is not None and not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or not (
        isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)
    ):
        return None
    return _loops_of_name(src, func if func is not None else src.tree, parent.targets[0].id, bound_here=True)


def _loops_of_name(src: Source, scope: ast.AST, name: str, bound_here: bool, depth: int = 0):
    here = [n for stmt in scope.body for n in _walk_here(stmt) if isinstance(n, ast.Name) and n.id == name]
    if sum(not isinstance(n.ctx, ast.Load) for n in here) != (1 if bound_here else 0):
        return None  # (bound again, or deleted)
    if isinstance(scope, ast.Module):
        seen = {id(n) for n in here}
        for node in src.of_type(ast.Name):
            func = src.function_of(node) if node.id == name and id(node) not in seen else None
            if node.id == name and id(node) not in seen and not (
                isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                and name in {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}
            ):
                return None  # (a function reads the module's loader itself: it may train on it)
    uses = [n for n in here if isinstance(n.ctx, ast.Load)]
    loops: List[Tuple[ast.AST, ast.AST]] = []
    for use in uses:
        loop = next((a for a in src.ancestors(use) if isinstance(a, (ast.For, ast.AsyncFor))), None)
        if loop is not None and any(x is use for x in iterated(loop.iter)):
            loops.append((scope, loop))
            continue
        holder = src.parent(use)
        if isinstance(holder, ast.Call) and last_name(holder.func) == "len" and holder.args == [use]:
            continue
        if isinstance(holder, ast.Attribute) and holder.attr == "dataset":
            continue
        if isinstance(holder, ast.keyword):
            holder, handed = src.parent(holder), holder.arg
        else:
            handed = holder.args.index(use) if isinstance(holder, ast.Call) and use in holder.args else None
        callee = _file_function(src, holder.func) if isinstance(holder, ast.Call) and handed is not None else None
        if callee is None or depth >= 2:
            return None
        params = [a.arg for a in (*callee.args.posonlyargs, *callee.args.args)]
        param = handed if isinstance(handed, str) else (params[handed] if handed < len(params) else None)
        if param not in params:
            return None
        inner = _loops_of_name(src, callee, param, bound_here=False, depth=depth + 1)
        if inner is None:
            return None
        loops += inner
    return loops if uses else None


def _file_function(src: Source, func: ast.AST) -> Optional[ast.FunctionDef]:
    """The module-level function of this file that ``func`` (a plain name) calls,
    when the file defines it once."""
    if not isinstance(func, ast.Name):
        return None
    found = [f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == func.id]
    return found[0] if len(found) == 1 else None


def evaluated_only(src: Source, call: ast.Call) -> bool:
    """The loader ``call`` builds is only iterated (``loader_loops``: in its function,
    or in the functions of the file it is handed to) by loops under ``torch.no_grad()`` / ``inference_mode()`` (a ``with`` in the
    function, or its decorator) that never call ``backward()``: an evaluation
    loader, whatever its name."""
    loops = loader_loops(src, call)
    return bool(loops) and all(
        not calls_method(loop, "backward") and _without_gradients(src, loop, func) for func, loop in loops
    )


#: the context managers and decorators that turn gradients off (also convert's sampler)
NO_GRAD = frozenset({"no_grad", "inference_mode"})


def _without_gradients(src: Source, node: ast.AST, func: ast.AST) -> bool:
    """``node`` runs under ``torch.no_grad()``/``inference_mode()``: a ``with`` in
    ``func``, or a decorator of ``func``."""
    for anc in src.ancestors(node):
        if anc is func:
            break
        if isinstance(anc, (ast.With, ast.AsyncWith)) and any(
            isinstance(item.context_expr, ast.Call) and last_name(item.context_expr.func) in NO_GRAD
            for item in anc.items
        ):
            return True
    return any(
        last_name(d.func if isinstance(d, ast.Call) else d) in NO_GRAD for d in getattr(func, "decorator_list", ())
    )


def factory_kind(src: Source, call: ast.Call) -> Optional[str]:
    """``return DataLoader(...)`` of a module-level loader factory whose every
    reference in the file is a call assigned to a training name, or every one to
    an evaluation name (``val_loader = make_loader(...)``): "train" or "eval".
    None otherwise -- also when the factory is handed on as a value
    (``fit(model, make_loader)``), which may build a training loader with it."""
    func = src.function_of(call)
    if not isinstance(src.parent(call), ast.Return) or not isinstance(func, ast.FunctionDef):
        return None
    if src.parent(func) is not src.tree:
        return None
    kinds = set()
    for ref in src.nodes:
        if not (isinstance(ref, ast.Name) and ref.id == func.name):
            continue
        use = src.parent(ref)
        if not (isinstance(use, ast.Call) and use.func is ref):
            return None
        target = assigned_name(src, use).rsplit(".", 1)[-1]
        kinds.add("eval" if is_eval_name(target) else "train" if is_train_name(target) else "?")
    return kinds.pop() if len(kinds) == 1 and "?" not in kinds else None


def iterated(node: ast.AST) -> Iterator[ast.AST]:
    """What a ``for`` iterates: ``loader`` in ``enumerate(tqdm(loader))``."""
    if isinstance(node, ast.Call):
        if last_name(node.func) in ("enumerate", "tqdm", "iter", "zip", "islice", "track"):
            count = len(node.args) if last_name(node.func) == "zip" else 1
            for arg in node.args[:count]:
                yield from iterated(arg)
    elif isinstance(node, (ast.Name, ast.Attribute)):
        yield node


def calls_method(node: ast.AST, method: str) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method
        for n in ast.walk(node)
    )


_EPOCH = re.compile(r"(?i)^(epoch|ep|epoch_?(idx|id|num|i|no)|cur_?epoch|current_?epoch|i_?epoch)$")


def is_epoch_loop(node: ast.AST) -> bool:
    if not isinstance(node, (ast.For, ast.AsyncFor)) or not isinstance(node.target, ast.Name):
        return False
    if _EPOCH.match(node.target.id):
        return True
    return isinstance(node.iter, ast.Call) and last_name(node.iter.func) in ("range", "trange")


# ------------------------------------------------------------------ early stops
_METRIC = re.compile(r"(?i)loss|acc|correct")


def accumulates_metrics(src: Source) -> Optional[bool]:
    """Whether a training loop of this file (a loop that calls ``backward()``)
    accumulates a metric -- ``running_loss += loss.item()``, ``correct += ...``,
    ``meter.update(loss.item())`` -- None when the file has no training loop
    (the loop may be in another module)."""
    found: Optional[bool] = None
    for call in src.calls:
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "backward"):
            continue
        loop = next((a for a in src.ancestors(call) if isinstance(a, (ast.For, ast.While))), None)
        if loop is None:
            continue
        found = False
        for node in _walk_training(loop):
            if isinstance(node, ast.AugAssign) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update", "append", "add_")
            ):
                if calls_method(node, "item") or _METRIC.search(" ".join(_names(node))):
                    return True
    return found


def _walk_training(loop: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a training loop, without the evaluation nested in it (a loop
    over a validation loader, a ``with torch.no_grad():`` block): its sums cover
    the whole, unsharded evaluation set."""
    todo = [loop]
    while todo:
        node = todo.pop()
        if node is not loop:
            if isinstance(node, ast.For) and any(is_eval_name(dotted(i).rsplit(".", 1)[-1]) for i in iterated(node.iter)):
                continue
            if isinstance(node, ast.With) and any(
                isinstance(item.context_expr, ast.Call)
                and last_name(item.context_expr.func) in NO_GRAD
                for item in node.items
            ):
                continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def unseeded_random_splits(src: Source, with_kwargs: bool = False) -> List[ast.Call]:
    """``random_split(dataset, [n, m])`` without a ``generator=``, in a file that
    does not seed torch alike on every process first (``torch.manual_seed(0)``,
    ``seed_everything(seed)``; a seed that names the rank differs): under DDP each
    process draws its own split.  ``with_kwargs``: also those with ``**kwargs``
    (which may hold a generator)."""
    if "random_split" not in src.text:
        return []
    splits = [
        c for c in src.calls_to(N.RANDOM_SPLIT)
        if keyword(c, "generator") is None and len(c.args) < 3
        and (with_kwargs or not any(k.arg is None for k in c.keywords))  # (``**kwargs`` may hold it)
    ]
    if not splits:
        return []
    for call in src.calls:
        if src.qualname(call.func) in N.TORCH_SEED or last_name(call.func) in N.SEED_HELPERS:
            if not any(_RANK_WORD.search(dotted(n) or "") for a in call.args for n in ast.walk(a)):
                return []
    return splits


#: what builds a split from indices, and the draws of unseeded indices
_SUBSETS = frozenset(
    {
        "torch.utils.data.Subset", "torch.utils.data.dataset.Subset",
        "torch.utils.data.SubsetRandomSampler", "torch.utils.data.sampler.SubsetRandomSampler",
    }
)
INDEX_DRAWS = {
    "torch.randperm": N.TORCH_SEED,
    "numpy.random.permutation": frozenset({"numpy.random.seed"}),
    "numpy.random.shuffle": frozenset({"numpy.random.seed"}),
    "random.shuffle": frozenset({"random.seed"}),
}


def _reaches_a_subset(src: Source, draw: ast.Call, subsets: List[ast.Call]) -> bool:
    """The drawn indices (``idx = randperm(n)``; ``np.random.shuffle(idx)``: ``idx``), or
    a name computed from them (``train_idx = idx[split:]``), are handed to a Subset of
    the same function -- not a permutation that picks samples to show."""
    func = src.function_of(draw)
    if last_name(draw.func) == "shuffle":
        names = {dotted(draw.args[0])} if draw.args else set()
    else:
        names = {assigned_name(src, _outermost_value(src, draw))}
    names.discard("")
    assigns = [a for a in ast.walk(func or src.tree) if isinstance(a, ast.Assign)]
    for _ in range(3):  # a few steps of derivation
        for assign in assigns:
            if any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(assign.value)):
                for target in assign.targets:
                    for item in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
                        if dotted(item):
                            names.add(dotted(item))
    return any(
        src.function_of(subset) is func
        and any(isinstance(n, ast.Name) and n.id in names for arg in subset.args for n in ast.walk(arg))
        for subset in subsets
    )


def _outermost_value(src: Source, node: ast.AST) -> ast.AST:
    """``randperm(n).tolist()``: the whole chain an assignment gets."""
    while True:
        parent = src.parent(node)
        if isinstance(parent, ast.Attribute) or (isinstance(parent, ast.Call) and parent.func is node):
            node = parent
            continue
        if isinstance(parent, ast.Subscript) and parent.value is node:
            node = parent
            continue
        return node


def unseeded_index_splits(src: Source) -> List[ast.Call]:
    """``indices = torch.randperm(len(ds))`` (no ``generator=``), ``np.random.permutation``,
    ``np.random.shuffle``, ``random.shuffle`` in a function that also builds a ``Subset``
    or a ``SubsetRandomSampler``: a split made by hand, drawn from each process's own
    random state -- unless the file seeds that state alike first (a seed that names the
    rank differs)."""
    if "Subset" not in src.text:
        return []
    subsets = src.calls_to(_SUBSETS)
    owners = {id(src.function_of(c)) for c in subsets}
    if not owners:
        return []
    draws = [
        c for c in src.calls
        if src.qualname(c.func) in INDEX_DRAWS and id(src.function_of(c)) in owners
        and keyword(c, "generator") is None and _reaches_a_subset(src, c, subsets)
    ]
    seeded = set()
    for call in src.calls:
        name = src.qualname(call.func)
        if any(_RANK_WORD.search(dotted(n) or "") for a in call.args for n in ast.walk(a)):
            continue
        if last_name(call.func) in N.SEED_HELPERS:
            seeded |= set(INDEX_DRAWS)
        seeded |= {draw for draw, seeds in INDEX_DRAWS.items() if name in seeds}
    return [c for c in draws if src.qualname(c.func) not in seeded]


def iterable_dataset(src: Source, dataset: Optional[ast.AST]) -> bool:
    """``dataset`` (an argument of a DataLoader) is an object of an
    ``IterableDataset`` class -- torch's, or one of this file's classes deriving
    from it, maybe through another -- built there or assigned to the name once.
    (A stream: a DistributedSampler cannot shard it; DataLoader refuses one.)"""
    if isinstance(dataset, ast.Name):
        values = bound_values(src, dataset.id)
        dataset = values[0] if len(values) == 1 else dataset
    if not isinstance(dataset, ast.Call):
        return False
    if src.is_call(dataset, N.ITERABLE_DATASET):
        return True
    classes = {c.name: c for c in src.of_type(ast.ClassDef)}
    seen: Set[str] = set()

    def iterable(name: str) -> bool:
        cls = classes.get(name)
        if cls is None or name in seen:
            return False
        seen.add(name)
        return any(
            src.qualname(base) in N.ITERABLE_DATASET or isinstance(base, ast.Name) and iterable(base.id)
            for base in cls.bases
        )

    return isinstance(dataset.func, ast.Name) and iterable(dataset.func.id)


def in_batch_comparison(src: Source) -> Optional[ast.AST]:
    """A loss that compares the samples of a batch with each other -- InfoNCE,
    SimCLR, CLIP: a similarity matrix (``a @ b.t()``, ``torch.mm(a, b.T)``) scored
    against ``torch.arange(...)`` labels in the same function -- else None.  Under
    DDP each process builds it from its own share of the batch only."""
    for func in [*src.of_type(ast.FunctionDef, ast.AsyncFunctionDef), src.tree]:
        body = func.body if isinstance(func, ast.Module) else [func]
        nodes = [n for stmt in body for n in (ast.walk(stmt) if not isinstance(func, ast.Module) else _walk_here(stmt))]
        transposed = any(
            isinstance(n, ast.Attribute) and n.attr in ("t", "T", "transpose", "mT") for n in nodes
        )
        product = any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult)
            or isinstance(n, ast.Call) and last_name(n.func) in ("mm", "matmul", "einsum", "bmm")
            for n in nodes
        )
        arange = next(
            (n for n in nodes if isinstance(n, ast.Call) and src.qualname(n.func) == "torch.arange"), None
        )
        if transposed and product and arange is not None:
            return arange
    return None


#: the names a global batch size goes by (``args.batch_size``, ``opt.bs``)
GLOBAL_BATCH_NAME = re.compile(r"(?i)^(batch_?size|bs|batch)$")


def in_batch_labels_batch(src: Source, needs_a_loss: bool = False) -> Optional[Tuple[ast.AST, str]]:
    """``(labels call, batch expression)`` for the in-batch labels of
    ``in_batch_comparison``: the expression is the batch-size setting they are built
    from (``torch.arange(self.args.batch_size)``: SimCLR), "" when they are built
    from the batch's own size; None without such labels.  ``needs_a_loss``: (a module without loaders) only
    where the labels go into a loss -- attention's ``q @ k.transpose()`` beside
    ``torch.arange`` positions is not one.  Shared by the facts of a program
    (``FileFacts.in_batch_label_batches``) and the distributed-sampler transform."""
    node = in_batch_comparison(src)
    if node is None:
        return None
    if needs_a_loss:
        func = src.function_of(node) or src.tree
        if not any(
            isinstance(c, ast.Call) and re.search(r"(?i)cross_entropy|nll_loss|loss", last_name(c.func))
            for c in ast.walk(func)
        ) and not re.search(r"(?i)loss|nce|contrast", getattr(func, "name", "")):
            return None  # (nor is it a loss itself: SimCLR's info_nce_loss(features) returns the logits)
    batch = next(
        (
            dotted(n) for a in node.args for n in ast.walk(a)
            if isinstance(n, (ast.Name, ast.Attribute)) and GLOBAL_BATCH_NAME.search(last_name(n) or "")
        ),
        "",
    )
    return node, batch


def rank_local_stops(src: Source) -> List[Tuple[ast.If, Set[str]]]:
    """``if train_loss < target: break`` in a loop around a training loop, with the
    names of the test that hold a value computed from this rank's own batches: a
    name assigned in a loop that calls ``backward()`` from a loss, an accuracy or
    an ``.item()`` (``running += loss.item()``), or computed from such a name
    (``train_loss = running / len(loader)``).  Counters (``step += 1``) are not
    metrics: every rank takes the same number of steps.  Shared by lint (DDP307)
    and convert (set-epoch, which reports the spot)."""
    found: List[Tuple[ast.If, Set[str]]] = []
    seen: Set[int] = set()
    if "backward" not in src.text:
        return found  # nothing trains here
    # functions of the file that make a value agree across ranks (a ``reduce_tensor``
    # helper); what a training function returns is the rank's own, unless it is one
    agreeing: Set[str] = set()
    for call in src.calls:  # (one pass over the calls, not a walk of every function)
        if last_name(call.func) in _AGREEING:
            func = src.function_of(call)
            while func is not None:
                if not isinstance(func, ast.Lambda):
                    agreeing.add(func.name)
                func = src.function_of(func)
    trainers = {name for name, func in _training_functions(src).items() if not _returns_a_count(func)} - agreeing
    # ``loss = self.train_one_epoch(epoch)``: a method of the file's class that trains
    methods = set()
    for call in src.calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            func = src.function_of(call)
            while func is not None and not isinstance(src.parent(func), ast.ClassDef):
                func = src.function_of(func)
            if func is not None and not isinstance(func, ast.Lambda) and not _returns_a_count(func):
                methods.add(func.name)
    methods -= agreeing
    # loaders sharded by a DistributedSampler: what a function of the file computes
    # over one (a validation loss) is this rank's own too, unless it all-reduces
    sharded = _sharded_loaders(src)
    functions = {
        f.name for f in src.of_type(ast.FunctionDef, ast.AsyncFunctionDef)
    } - agreeing
    # objects of this file's classes (``early_stopping = EarlyStopping(...)``)
    classes = {n.name for n in src.tree.body if isinstance(n, ast.ClassDef)}
    instances = {
        t.id
        for n in src.of_type(ast.Assign)
        if isinstance(n.value, ast.Call) and (last_name(n.value.func) in classes or last_name(n.value.func)[:1].isupper())
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    # the loops that hold a backward() call, and those around them: one pass up
    # from each call (asking every loop about its subtree was quadratic)
    around_training: Set[ast.AST] = set()
    for call in src.calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            loops = [anc for anc in src.ancestors(call) if isinstance(anc, (ast.For, ast.While))]
            around_training.update(loops[1:])  # every loop around the innermost one
    for loop in src.of_type(ast.For, ast.While):
        trains_here = loop in around_training
        # ``train_loss = train_one_epoch(model, loader, opt)``: what a training function returns
        from_trainers = set()
        if trainers or methods:
            from_trainers = {
                dotted(t)
                for n in ast.walk(loop)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and (
                    isinstance(n.value.func, ast.Name) and n.value.func.id in trainers
                    or isinstance(n.value.func, ast.Attribute) and n.value.func.attr in methods
                    and isinstance(n.value.func.value, ast.Name) and n.value.func.value.id == "self"
                )
                for target in n.targets
                for t in ast.walk(target)
                if isinstance(t, (ast.Name, ast.Attribute))
            } - {""}
        # (``steps = self.train_steps()``: a count of steps is the same on every rank)
        from_trainers = {n for n in from_trainers if not _COUNT_NAME.match(n.rsplit(".", 1)[-1])}
        if sharded and (trains_here or from_trainers):
            from_trainers |= {
                dotted(t)
                for n in ast.walk(loop)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                and n.value.func.id in functions
                and any(dotted(a) in sharded for a in (*n.value.args, *(k.value for k in n.value.keywords)))
                for target in n.targets
                for t in ast.walk(target)
                if isinstance(t, (ast.Name, ast.Attribute))
            } - {""}
        if not trains_here and not from_trainers:
            continue  # not an epoch loop around a training loop
        agreed = _agreed(loop, agreeing)
        local = (_shard_values(loop, agreed) | _derived(loop, from_trainers, agreed)) - agreed
        if not local:
            continue
        # ``early_stopping(train_loss, model)`` ... ``if early_stopping.early_stop: break``
        objects = {
            n.func.id
            for n in ast.walk(loop)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in instances
            and any(_names(a) & local for a in n.args)
        }
        for node in ast.walk(loop):
            if not isinstance(node, ast.If) or id(node) in seen:
                continue
            names = {n for n in _names(node.test) if n in local or "." in n and n.split(".")[0] in objects}
            names = {n for n in names if not any(o.startswith(n + ".") for o in names)}
            if names and any(isinstance(n, (ast.Break, ast.Return)) for stmt in node.body for n in ast.walk(stmt)):
                seen.add(id(node))
                found.append((node, names))
    return found


def _returns_a_count(func: ast.AST) -> bool:
    """Every ``return`` of the training function gives a count of steps (a name
    only ever increased by a constant: ``self.step += 1`` ... ``return self.step``),
    the same on every rank whatever its caller calls it (``n = self.train_steps()``)."""
    returns = [n for n in _walk_here_body(func) if isinstance(n, ast.Return)]
    if not returns:
        return False
    counted: Dict[str, bool] = {}
    for node in _walk_here_body(func):
        if isinstance(node, ast.AugAssign):
            name = dotted(node.target)
            by_constant = isinstance(node.op, ast.Add) and isinstance(node.value, ast.Constant)
            counted[name] = counted.get(name, True) and by_constant
    return all(
        isinstance(r.value, ast.Constant) and isinstance(r.value.value, int)
        or dotted(r.value) and counted.get(dotted(r.value), False)
        for r in returns
        if r.value is not None
    ) and any(r.value is not None for r in returns)


#: names of counts (steps, iterations, epochs): every rank takes as many
_COUNT_NAME = re.compile(r"(?i)^(n_?|num_?|total_?|global_?)?(steps?|iters?|iterations?|it|counts?|epochs?|batches)$")

#: collectives after which every rank holds the same value (``reduce`` gives it to one)
_AGREEING = frozenset(
    ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast", "broadcast_object_list")
)


def _agreed(loop: ast.AST, agreeing: Set[str]) -> Set[str]:
    """Names in ``loop`` that hold the same value on every rank: the tensor (or
    output list) of a collective (``dist.all_reduce(mean)``), and what a function
    of the file that runs one returns (``loss = reduce_tensor(loss)``) -- the
    documented fix, which is no rank-local stop."""
    agreed: Set[str] = set()
    assigns = []
    for node in ast.walk(loop):
        if isinstance(node, ast.Call) and last_name(node.func) in _AGREEING and node.args:
            agreed.add(dotted(node.args[0]))
        elif isinstance(node, ast.Assign):
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(
                value.func.value, ast.Call
            ):
                value = value.func.value  # reduce_tensor(t).item()
            targets = {dotted(t) for t in node.targets if isinstance(t, ast.Name)}
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in agreeing:
                agreed |= targets
            else:
                assigns.append((node, targets))
    # what is computed from an agreed value is agreed (``train_loss = t.item() / world``)
    changed = True
    while changed:
        changed = False
        for node, targets in assigns:
            if targets - agreed and _names(node.value) & agreed:
                agreed |= targets
                changed = True
    return agreed - {""}


def _sharded_loaders(src: Source) -> Set[str]:
    """Names of DataLoaders given a ``DistributedSampler`` (``sampler=`` a call of it,
    or a name assigned from one)."""
    samplers = {
        dotted(t) for a in src.of_type(ast.Assign) if src.is_call(a.value, N.DISTRIBUTED_SAMPLER)
        for t in a.targets
    }
    loaders: Set[str] = set()
    for assign in src.of_type(ast.Assign):
        if not src.is_call(assign.value, N.DATA_LOADER):
            continue
        sampler = argument(assign.value, 3, "sampler")
        if sampler is not None and (src.is_call(sampler, N.DISTRIBUTED_SAMPLER) or dotted(sampler) in samplers):
            loaders |= {dotted(t) for t in assign.targets} - {""}
    return loaders


def _derived(loop: ast.AST, local: Set[str], agreed: Set[str] = frozenset()) -> Set[str]:
    """``local`` and the names computed from them in ``loop`` (not through the
    ``agreed`` ones: ``mean = torch.tensor([running]); dist.all_reduce(mean)``)."""
    local = set(local) - agreed
    changed = True
    while changed and local:
        changed = False
        for node in ast.walk(loop):
            if isinstance(node, ast.Assign) and _names(node.value) & local:
                for target in node.targets:
                    for name in {dotted(t) for t in ast.walk(target) if isinstance(t, ast.Name)} - local - agreed - {""}:
                        local.add(name)
                        changed = True
    return local


def _names(node: ast.AST) -> Set[str]:
    return {dotted(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n)}


def _shard_values(epoch_loop: ast.AST, agreed: Set[str] = frozenset()) -> Set[str]:
    """Names holding a value computed from the rank's own batches, in ``epoch_loop``."""
    local: Set[str] = set()
    for inner in ast.walk(epoch_loop):
        if inner is epoch_loop or not isinstance(inner, (ast.For, ast.While)) or not calls_method(inner, "backward"):
            continue
        for node in ast.walk(inner):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                value = node.value
                if calls_method(value, "item") or any(_METRIC.search(n) for n in _names(value)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        local |= {dotted(t) for t in ast.walk(target) if isinstance(t, (ast.Name, ast.Attribute))} - {""}
    return _derived(epoch_loop, local, agreed)


# ------------------------------------------------------------------ changes after the wrap
#: methods that change a module's parameters in place: dtype, initialisation, freezing
_CHANGING_METHODS = {
    "half": ".half()", "float": ".float()", "double": ".double()", "bfloat16": ".bfloat16()",
    "apply": ".apply()", "requires_grad_": ".requires_grad_()",
}


def changes_after_wrap(src: Source, wrappers: FrozenSet[str]) -> List[Tuple[ast.stmt, int, str, str]]:
    """``(statement, wrap line, model, what)`` where a model wrapped by one of
    ``wrappers`` (``model = DDP(model)``) has its parameters changed after the
    wrap, before training (the first statement that calls ``backward()``): a new
    layer assigned onto it, ``.half()``/``.apply(init)``/``.requires_grad_()``, or
    ``requires_grad`` set in a loop over its parameters.  DDP registers the
    parameters and copies rank 0's values to every rank when it is built: later
    changes are not synchronised.  Shared by lint (DDP202, on DDP wraps) and
    convert (on the DataParallel wraps it turns into DDP).  Changes after
    training (``.half()`` to export) are not reported."""
    found: List[Tuple[ast.stmt, int, str, str]] = []
    trainers = _training_functions(src)

    def trains(node: ast.AST) -> bool:  # (here, or in train_one_epoch(model, ...); a def runs nothing)
        return any(
            isinstance(call, ast.Call) and (
                isinstance(call.func, ast.Attribute) and call.func.attr == "backward"
                or isinstance(call.func, ast.Name) and call.func.id in trainers
            )
            for call in _walk_here(node)
        )

    for assign, name, later_statements in _wrapped_models(src, wrappers):
        reported: Set[ast.AST] = set()
        later_statements = iter(later_statements)
        # the module the wrap was built on, changed through its own name
        # (``net = DDP(core)``, then ``core.head.apply(weights_init)``: ssd.pytorch)
        inner = _wrapped_module_name(src, assign.value, wrappers)
        for later in later_statements:
            if trains(later):
                # training has started: from here on only a switch of requires_grad
                # that more training follows (gradual unfreezing) is reported
                if "requires_grad" in src.text:
                    found += _grad_switches_in_training(src, [later, *later_statements], name, assign.lineno, trains)
                break
            if inner and _rebinds(later, inner):
                inner = ""
            for owner in (name, inner) if inner and inner != name else (name,):
                for node, what in _parameter_changes(later, owner):
                    if what in ("requires_grad set", ".requires_grad_()") and _grad_values(node) == {False} and not (
                        {name, inner} & trained_models(src)
                    ):
                        continue  # a teacher frozen after the wrap: no optimizer steps it, no backward reaches it
                    stmt = _statement_of(src, node)
                    if stmt not in reported:
                        reported.add(stmt)
                        found.append((stmt, assign.lineno, owner, what))
    return found


def _wrapped_module_name(src: Source, value: ast.AST, wrappers: FrozenSet[str]) -> str:
    """``core`` for ``DDP(core.to(device), ...)`` / ``DataParallel(core).cuda()``."""
    while isinstance(value, ast.Call) and not src.is_call(value, wrappers) and isinstance(value.func, ast.Attribute):
        value = value.func.value
    module = wrapped_module(value) if isinstance(value, ast.Call) else None
    return dotted(module) if module is not None else ""


def wrap_destination(src: Source, assign: ast.Assign, changes: List[ast.stmt], wrappers: FrozenSet[str]) -> Optional[ast.stmt]:
    """The statement after which the wrap ``assign`` (``net = DDP(core.to(device))``)
    can be built instead, so that the model changes ``changes`` (statements that
    ``changes_after_wrap`` found for it) come before it -- or None when moving it
    would be a guess.  It moves within its own block only, past statements that
    neither need the wrapper nor could see a different object:

    * every change is in a later statement of the wrap's block (or nested in one);
    * those statements make no change through ``<name>.module`` (it would have to
      be rewritten), return nothing, and rebind none of the names the wrap reads;
    * they use the wrap's name only where it is the module itself before the wrap
      (``model = DDP(model)``, or ``net = core`` above ``net = DDP(core)``), never
      for its ``module``/``state_dict``, and rebind it only by a device move
      (``net = net.cuda()``: the same module).

    (ssd.pytorch: ``net = DataParallel(ssd_net)``, then ``ssd_net.extras.apply(weights_init)``
    unseeded: built first, DDP would broadcast rank 0's weights before each rank drew
    its own.)"""
    owner = src.parent(assign)
    block = next(
        (getattr(owner, field) for field in ("body", "orelse", "finalbody")
         if isinstance(getattr(owner, field, None), list) and assign in getattr(owner, field)),
        None,
    )
    if block is None or len(assign.targets) != 1:
        return None
    name = dotted(assign.targets[0])
    inner = _wrapped_module_name(src, assign.value, wrappers)
    if not name or not inner:
        return None
    at = block.index(assign)
    last = at
    for stmt in changes:
        top: Optional[ast.AST] = stmt
        while top is not None and top not in block:
            top = src.parent(top)
        if top is None or block.index(top) <= at:  # (``block.index``: by equality, which ast nodes have by identity)
            return None
        last = max(last, block.index(top))
    aliased = name == inner or any(
        isinstance(s, ast.Assign) and [dotted(t) for t in s.targets] == [name] and dotted(s.value) == inner
        for s in block[:at]
    )
    read = {n.id for n in ast.walk(assign.value) if isinstance(n, ast.Name)} - {inner.split(".")[0]}
    for stmt in block[at + 1:last + 1]:
        for node in _walk_here(stmt):
            if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
                return None
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in read:
                return None
            if isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets) and not (
                _same_model(node.value, name) and aliased
            ):
                return None
            if isinstance(node, ast.Attribute) and dotted(node.value) == name and (
                not aliased or node.attr in ("module", "state_dict")
            ):
                return None
            if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) and not aliased:
                return None
    return block[last]


#: what to do about a ``requires_grad`` switch while training (DDP202, lint and convert)
UNFREEZE_ADVICE = (
    "DDP averages only the parameters that required a gradient when it was built, so ones "
    "unfrozen later train apart on each rank (silently), and ones frozen later stop the next "
    "backward; wrap the model again after the switch (model = DDP(model.module, ...)), or keep "
    "them trainable from the start and out of the optimizer until then"
)


def _grad_switches_in_training(src: Source, statements, name: str, wrap_line: int, trains) -> list:
    """``requires_grad`` switched on the wrapped model while it trains (unfreezing
    a backbone at epoch N): in a loop that also trains, or before a later
    statement that trains.  DDP averages only the parameters that required a
    gradient when it was built: ones unfrozen later drift apart per rank, silently."""
    found = []
    for index, stmt in enumerate(statements):
        switches = [(n, w) for n, w in _parameter_changes(stmt, name) if w in ("requires_grad set", ".requires_grad_()")]
        if not switches:
            continue  # (most statements: the walks below only where a switch is)
        if {True, False} <= {v for n, _ in switches for v in _grad_values(n)}:
            continue  # switched off and on again (an evaluation pass, a GAN's alternating steps)
        more_training = any(trains(s) for s in statements[index + 1:])
        loops = [n for n in _walk_here(stmt) if isinstance(n, (ast.For, ast.While)) and trains(n)]
        for node, what in switches:
            if more_training or any(_inside(node, loop) for loop in loops):
                found.append((_statement_of(src, node), wrap_line, name, f"{what} during training"))
    return found


def _grad_values(node: ast.AST) -> Set[object]:
    """The values a ``requires_grad`` switch sets: ``x.requires_grad_()`` (True by
    default), ``x.requires_grad_(False)``, ``p.requires_grad = False`` in a loop;
    "?" for a value that is not a constant."""
    if isinstance(node, ast.Call):
        value = argument(node, 0, "requires_grad")
        return {True if value is None else value.value if isinstance(value, ast.Constant) else "?"}
    return {
        a.value.value if isinstance(a.value, ast.Constant) else "?"
        for a in ast.walk(node)
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad" for t in a.targets)
    }


def _inside(node: ast.AST, outer: ast.AST) -> bool:
    return node is not outer and any(n is node for n in _walk_here(outer))


def _training_functions(src: Source) -> Dict[str, ast.AST]:
    """The module's functions that call ``backward()`` (``train_one_epoch``): the
    outermost function around each ``backward()`` call, when it is the module's.
    Kept on the source: DDP202 and DDP307 both ask."""
    cached = src.cache.get("training_functions")
    if cached is not None:
        return cached  # type: ignore[return-value]
    functions: Dict[str, ast.AST] = {}
    src.cache["training_functions"] = functions
    for call in src.calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr == "backward":
            top = None
            for anc in src.ancestors(call):
                if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    top = anc
            if top is not None and src.parent(top) is src.tree:
                functions[top.name] = top
    return functions


def whole_model_saves(src: Source, wrappers: FrozenSet[str]) -> Dict[int, Tuple[int, str]]:
    """line of ``torch.save(model, ...)`` -> (wrap line, model), for a model that
    was wrapped by one of ``wrappers`` earlier in the same function: the wrapper
    object is pickled.  (Not followed into helper functions: convert decides on a
    wrap when it reaches it, after the helpers defined above it.)"""
    saves: Dict[int, Tuple[int, str]] = {}
    for assign, name, later_statements in _wrapped_models(src, wrappers):
        for later in later_statements:
            for call in _walk_here(later):
                if (
                    isinstance(call, ast.Call)
                    and src.qualname(call.func) == "torch.save"
                    and call.args
                    and pickles_whole(call.args[0], name)
                ):
                    saves[call.lineno] = (assign.lineno, name)
    return saves


def checkpoint_dicts_holding(src: Source, wrappers: FrozenSet[str]) -> Dict[int, Tuple[int, str]]:
    """line of a dict literal -> (wrap line, model), for ``state = {"net": net, ...}``
    handed to ``torch.save(state, ...)`` later in the same function, where ``net`` is
    a model wrapped by one of ``wrappers``: earlier in that function, or at module
    level with the function reading it as a global (a checkpoint helper of a script)."""
    found: Dict[int, Tuple[int, str]] = {}
    wraps = [(assign, name, src.function_of(assign)) for assign, name, _ in _wrapped_models(src, wrappers)]
    if not wraps:
        return found
    for assign in src.of_type(ast.Assign):
        if len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name) or not isinstance(
            assign.value, (ast.Dict, ast.List, ast.Tuple)
        ):
            continue
        holder, scope = assign.targets[0].id, src.function_of(assign)
        saved = any(
            isinstance(c, ast.Call) and src.qualname(c.func) == "torch.save" and c.args
            and isinstance(c.args[0], ast.Name) and c.args[0].id == holder and c.lineno > assign.lineno
            for c in _walk_here_body(scope) if scope is not None
        ) if scope is not None else any(
            src.qualname(c.func) == "torch.save" and c.args and isinstance(c.args[0], ast.Name)
            and c.args[0].id == holder and c.lineno > assign.lineno and src.function_of(c) is None
            for c in src.calls
        )
        if not saved:
            continue
        for wrap, name, wrapped_in in wraps:
            if not pickles_whole(assign.value, name):
                continue
            if wrapped_in is scope and wrap.lineno < assign.lineno:
                found[assign.value.lineno] = (wrap.lineno, name)
            elif wrapped_in is None and scope is not None and "." not in name and not any(
                isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(scope)
            ) and name not in {a.arg for a in scope.args.args}:
                found[assign.value.lineno] = (wrap.lineno, name)
    return found


def pickles_whole(saved: ast.AST, name: str) -> bool:
    """What ``torch.save`` gets holds the model object ``name`` itself: the model,
    a dict or list with it as a value (``{"net": net, "epoch": e}``), or the
    DataParallel idiom ``net.module if use_cuda else net``."""
    if dotted(saved) == name:
        return True
    if isinstance(saved, ast.Dict):
        return any(pickles_whole(v, name) for v in saved.values)
    if isinstance(saved, (ast.List, ast.Tuple)):
        return any(pickles_whole(e, name) for e in saved.elts)
    if isinstance(saved, ast.IfExp):
        return {dotted(saved.body), dotted(saved.orelse)} == {name, f"{name}.module"}
    return False


def loaded_back(src: Source, name: str) -> bool:
    """``name = torch.load(...)`` somewhere in the file: a model saved whole is
    read back into the name the code after it uses as the wrapped model."""
    return any(
        any(dotted(t) == name for t in assign.targets)
        and any(isinstance(c, ast.Call) and src.qualname(c.func) == "torch.load" for c in ast.walk(assign.value))
        for assign in src.of_type(ast.Assign)
    )


def helper_whole_model_saves(src: Source, wrappers: FrozenSet[str]) -> Dict[int, Tuple[int, str, str, str]]:
    """line of ``save_model(model, path)`` -> (wrap line, model, helper, parameter)
    for a model wrapped by one of ``wrappers`` earlier in the same function and
    handed to a function of this file that pickles that parameter whole
    (``def save_model(m, path): torch.save(m, path)``)."""
    helpers: Dict[str, Tuple[List[str], Set[str]]] = {}
    for func in src.tree.body:
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
            pickled = {
                call.args[0].id
                for call in _walk_here_body(func)
                if isinstance(call, ast.Call) and src.qualname(call.func) == "torch.save"
                and call.args and isinstance(call.args[0], ast.Name) and call.args[0].id in params
            }
            if pickled:
                helpers[func.name] = (params, pickled)
    calls: Dict[int, Tuple[int, str, str, int]] = {}
    if not helpers:
        return calls
    for assign, name, later_statements in _wrapped_models(src, wrappers):
        for later in later_statements:
            for call in _walk_here(later):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in helpers):
                    continue
                params, pickled = helpers[call.func.id]
                given = {params[i]: a for i, a in enumerate(call.args[: len(params)])}
                given.update({k.arg: k.value for k in call.keywords if k.arg})
                for param, arg in given.items():
                    if param in pickled and dotted(arg) == name:
                        calls[call.lineno] = (assign.lineno, name, call.func.id, param)
    return calls


def _wrapped_models(src: Source, wrappers: FrozenSet[str]) -> Iterator[Tuple[ast.Assign, str, Iterator[ast.stmt]]]:
    """``(assignment, model name, the statements after it)`` for each
    ``model = Wrapper(...)``; the statements stop where the name is bound to
    another object (``model = model.cpu()`` is the same one)."""
    for assign in src.of_type(ast.Assign):
        value = assign.value
        while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(
            value.func.value, ast.Call
        ):
            value = value.func.value  # DataParallel(model).cuda()
        if len(assign.targets) != 1 or not src.is_call(value, wrappers):
            continue
        name = dotted(assign.targets[0])
        if name:
            yield assign, name, _until_rebound(_statements_after(src, assign), name)


def _until_rebound(statements: Iterator[ast.stmt], name: str) -> Iterator[ast.stmt]:
    for stmt in statements:
        if _rebinds(stmt, name):
            return
        yield stmt


def _walk_here(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` that does not enter nested functions, lambdas and classes (their
    ``model`` is another name)."""
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    todo = [] if isinstance(node, scopes) else [node]
    while todo:
        current = todo.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, scopes):
                todo.append(child)


def _statements_after(src: Source, stmt: ast.stmt) -> Iterator[ast.stmt]:
    """The statements that run after ``stmt`` in its function (or module): its
    later siblings, then those after the ``if``/``with``/``try`` around it."""
    current: ast.AST = stmt
    while True:
        parent = src.parent(current)
        if parent is None:
            return
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and current in block:
                yield from block[block.index(current) + 1 :]
                break
        if isinstance(parent, ast.ExceptHandler):
            parent = src.parent(parent)
        if not isinstance(parent, (ast.If, ast.With, ast.Try)):
            return
        current = parent


def _statement_of(src: Source, node: ast.AST) -> ast.AST:
    current = node
    while not isinstance(current, ast.stmt):
        parent = src.parent(current)
        if parent is None:
            return current
        current = parent
    return current


def _same_model(value: ast.AST, name: str) -> bool:
    """``model.cpu()``, ``model.to(device).eval()``: the same module object."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        value = value.func.value
    return not isinstance(value, ast.Call) and dotted(value) == name


def _rebinds(stmt: ast.AST, name: str) -> bool:
    return any(
        isinstance(node, ast.Assign)
        and any(dotted(t) == name for t in node.targets)
        and not _same_model(node.value, name)
        for node in _walk_here(stmt)
    )


#: a helper that initialises a model's weights (``init_weights(net)``, ``weights_init``)
_INIT_FUNCTION = re.compile(r"(?i)^(init|initiali[sz]e|reset)_?(weights?|params|parameters)$|^weights?_?init$")


def _parameter_changes(stmt: ast.AST, name: str) -> Iterator[Tuple[ast.AST, str]]:
    """Where ``stmt`` changes the parameters of the model called ``name`` or of
    one of its parts (``model.module.features``)."""

    def owned(node: ast.AST) -> bool:
        owner = dotted(node)
        return owner == name or owner.startswith(f"{name}.")

    for node in _walk_here(stmt):
        if isinstance(node, ast.Call) and node.args and owned(node.args[0]) and _INIT_FUNCTION.search(last_name(node.func)):
            # pix2pix's init_net: ``init_weights(net, init_type)`` after the wrap
            yield node, f"{last_name(node.func)}() re-initialises its weights"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _CHANGING_METHODS and owned(node.func.value):
                yield node, _CHANGING_METHODS[node.func.attr]
        elif isinstance(node, ast.Assign):
            # a new layer (a class is called): ``model.module.fc = nn.Linear(8, 3)``,
            # also moved on: ``nn.Linear(8, 3).to(device)``
            value = node.value
            while (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("to", "cuda", "cpu", "float", "half", "double")
                and isinstance(value.func.value, ast.Call)
            ):
                value = value.func.value
            callee = dotted(value.func) if isinstance(value, ast.Call) else ""
            for target in node.targets:
                if dotted(target).startswith(f"{name}.") and callee.rsplit(".", 1)[-1][:1].isupper():
                    yield node, f"{dotted(target)} replaced"
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.Call):
            func = node.iter.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("parameters", "named_parameters")
                and owned(func.value)
                and any(
                    isinstance(t, ast.Attribute) and t.attr == "requires_grad"
                    for a in ast.walk(node)
                    if isinstance(a, ast.Assign)
                    for t in a.targets
                )
            ):
                yield node, "requires_grad set"


# ------------------------------------------------------------------ GPU indices
def literal_gpu_indices(src: Source) -> List[Tuple[ast.Assign, str, int]]:
    """``(assignment, name, index)`` for ``gpu_id = 0`` whose name is then used as
    a device -- ``.to(gpu_id)``, ``.cuda(gpu_id)``, ``device=gpu_id`` -- in its
    scope, or in the functions and classes of the file it is passed to, a few
    calls deep (PyTorch's own single-GPU tutorial: ``device = 0; main(device)``,
    ``Trainer(..., device, ...)``, ``self.gpu_id = gpu_id``,
    ``self.model = model.to(gpu_id)``).  Shared by lint (DDP005) and convert
    (rank-device, which reports it)."""
    found: List[Tuple[ast.Assign, str, int]] = []
    # a device use of some name first: most files have none, and are done here
    if not any(_device_use(call, None) for call in src.calls):
        return found
    flow = _DeviceFlow(src)
    for assign in src.of_type(ast.Assign):
        value = assign.value
        if (
            len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)
            and isinstance(value, ast.Constant)
            and type(value.value) is int
        ):
            name = assign.targets[0].id
            scope = src.function_of(assign) or src.tree
            if flow.assigned_once(scope, name) and flow.reaches(scope, name, None, 0):
                found.append((assign, name, value.value))
    return found


class _DeviceFlow:
    """Whether a name reaches a device use (``literal_gpu_indices``), with each
    scope's calls and answers kept: a file has many ``i = 0``."""

    def __init__(self, src: Source) -> None:
        self.defs = {
            n.name: n for n in src.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }
        self._calls: Dict[int, List[ast.Call]] = {}
        self._known: Dict[Tuple[int, str], bool] = {}

    def assigned_once(self, scope: ast.AST, name: str, initial: int = 1) -> bool:
        """``name`` is bound ``initial`` times in the scope's own code (a default that
        a later ``local_rank = int(os.environ[...])`` replaces is no fixed GPU)."""
        bound = sum(
            1
            for node in _walk_here_body(scope)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.withitem))
            for target in (node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None) or getattr(node, "optional_vars", None)])
            if target is not None
            for t in ast.walk(target)
            if isinstance(t, ast.Name) and t.id == name
        )
        return bound == initial

    def calls(self, scope: ast.AST) -> List[ast.Call]:
        calls = self._calls.get(id(scope))
        if calls is None:
            calls = self._calls[id(scope)] = [c for c in _walk_here_body(scope) if isinstance(c, ast.Call)]
        return calls

    def reaches(self, scope: ast.AST, name: str, cls: Optional[ast.ClassDef], depth: int) -> bool:
        key = (id(scope), name)
        if key not in self._known:
            self._known[key] = False  # (recursion: not until shown)
            self._known[key] = self._reaches(scope, name, cls, depth)
        return self._known[key]

    def _reaches(self, scope: ast.AST, name: str, cls: Optional[ast.ClassDef], depth: int) -> bool:
        calls = self.calls(scope)
        if any(_device_use(c, name) for c in calls):
            return True
        if depth >= 3:
            return False
        if cls is not None:  # self.gpu_id = gpu_id: the attribute, in every method of the class
            for node in _walk_here_body(scope):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == name:
                    attributes = [dotted(t) for t in node.targets if dotted(t).startswith("self.")]
                    for method in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                        if any(self.reaches(method, a, cls, depth + 1) for a in attributes):
                            return True
        for call in calls:
            callee = self.defs.get(call.func.id) if isinstance(call.func, ast.Name) else None
            if callee is None:
                continue
            passed_args = [i for i, a in enumerate(call.args) if dotted(a) == name]
            passed_keywords = [k.arg for k in call.keywords if k.arg and dotted(k.value) == name]
            if not passed_args and not passed_keywords:
                continue
            owner = None
            if isinstance(callee, ast.ClassDef):  # Trainer(model, data, optimizer, gpu_id)
                owner = callee
                callee = next((n for n in callee.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
                if callee is None:
                    continue
            params = [a.arg for a in callee.args.posonlyargs + callee.args.args][1 if owner else 0 :]
            passed = [params[i] for i in passed_args if i < len(params)] + passed_keywords
            passed = [p for p in passed if self.assigned_once(callee, p, initial=0)]  # never reassigned
            if any(self.reaches(callee, param, owner, depth + 1) for param in passed):
                return True
        return False


def _walk_here_body(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's (or module's) own code, not of the functions in it."""
    for stmt in getattr(scope, "body", []):
        yield from _walk_here(stmt)


def _device_use(call: ast.Call, name: Optional[str]) -> bool:
    """``call`` uses ``name`` as a device (None: any name or ``self.attr``)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda") and call.args:
        used = dotted(call.args[0])
        if used and (name is None or used == name):
            return True
    for k in call.keywords:
        if k.arg in ("device", "map_location"):
            used = dotted(k.value)
            if used and (name is None or used == name):
                return True
    return False


def forward_tests_a_parameter_for_none(src: Source) -> bool:
    """A ``forward`` of the file tests one of its parameters for None (``if y is not
    None: h = h + self.label_emb(y)``): see ``inputs_dropped_in_training``."""
    return "None" in src.text and any(
        f.name == "forward" and _tests_a_parameter_for_none(f) for f in src.of_type(ast.FunctionDef, ast.AsyncFunctionDef)
    )


def inputs_dropped_in_training(src: Source, model: str, forward_elsewhere: bool = False) -> List[ast.Assign]:
    """``labels = None`` under a condition in a training step that then calls
    ``model(x, labels)``, in a file whose ``forward`` tests a parameter for None
    (``if y is not None: h = h + self.label_emb(y)``): classifier-free guidance
    drops the labels on a random share of the steps, so the layers behind them get
    no gradient there -- per rank -- and DDP needs ``find_unused_parameters=True``.
    One decision for convert's wraps (DataParallel's and single-device ones)."""
    if not model or f"{model}(" not in src.text or "None" not in src.text:
        return []
    if not (forward_elsewhere or forward_tests_a_parameter_for_none(src)):
        return []  # (forward_elsewhere: a module of the program has such a forward -- the model's)
    found: List[ast.Assign] = []
    for call in src.calls:
        if dotted(call.func) != model:
            continue
        scope = src.function_of(call) or src.tree
        if not calls_method(scope, "backward"):
            continue
        handed = {a.id for a in call.args if isinstance(a, ast.Name)} | {
            k.value.id for k in call.keywords if isinstance(k.value, ast.Name)
        }
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Assign) and node not in found
                and isinstance(node.value, ast.Constant) and node.value.value is None
                and any(isinstance(t, ast.Name) and t.id in handed for t in node.targets)
                and node.lineno < call.lineno
                and any(isinstance(a, ast.If) for a in src.ancestors(node))
                and src.function_of(node) is src.function_of(call)
            ):
                found.append(node)
    return found


def dropped_inputs_note(model: str, assign: ast.Assign) -> str:
    """Why convert passes ``find_unused_parameters=True`` (``inputs_dropped_in_training``)."""
    name = dotted(assign.targets[0])
    return (
        f"{model} gets find_unused_parameters=True: a training step may hand it {name} = None (line "
        f"{assign.lineno}), and its forward then skips the layers that use {name}, in a different step on "
        "each rank: DDP would stop at the next step (\"Expected to have finished reduction\")"
    )


def _tests_a_parameter_for_none(forward: ast.AST) -> bool:
    params = {a.arg for a in (*forward.args.posonlyargs, *forward.args.args, *forward.args.kwonlyargs)} - {"self"}
    for node in ast.walk(forward):
        if isinstance(node, (ast.If, ast.IfExp)) and isinstance(node.test, ast.Compare):
            test = node.test
            if (
                isinstance(test.left, ast.Name) and test.left.id in params and len(test.ops) == 1
                and isinstance(test.ops[0], (ast.Is, ast.IsNot))
                and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
            ):
                return True
    return False


def discarded_outputs(src: Source, model: str) -> List[ast.Call]:
    """Calls of ``model`` (its forward) in a training step -- a scope that calls
    ``backward()`` -- that drop outputs which only some of its layers compute:
    ``validity, _ = d(x)`` where ``forward`` returns ``self.adv(h), self.aux(h)``.
    The layers behind a dropped output get no gradient in that step, and DDP needs
    ``find_unused_parameters=True`` (the next step stops with "Expected to have
    finished reduction" otherwise).  A dropped output that the kept ones share
    layers with (an RNN's hidden state) is no such case, nor a model whose class is
    not in this file (cannot tell).  One decision for convert's wraps and DDP204."""
    if not model or f"{model}(" not in src.text:
        return []
    heads = _output_layers(src, model)
    if not heads:
        return []
    found = []
    for call in src.calls:
        if dotted(call.func) != model:
            continue
        scope = src.function_of(call) or src.tree
        if not calls_method(scope, "backward"):
            continue
        parent = src.parent(call)
        kept: List[int] = []
        if isinstance(parent, ast.Subscript) and parent.value is call:
            index = parent.slice
            if not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
                continue
            kept = [index.value]
        elif isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Tuple):
            elements = parent.targets[0].elts
            if any(isinstance(e, ast.Starred) for e in elements) or len(elements) != len(heads):
                continue
            read_later = {
                n.id for n in ast.walk(scope)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and getattr(n, "lineno", 0) >= parent.lineno
            }
            kept = [
                i for i, e in enumerate(elements)
                if isinstance(e, ast.Name) and not e.id.startswith("_") and e.id in read_later
            ]
        else:
            continue
        if any(0 <= i < len(heads) for i in kept):
            used = set().union(*(heads[i] for i in kept if 0 <= i < len(heads)))
            dropped = set().union(*(heads[i] for i in range(len(heads)) if i not in kept))
            if dropped - used:
                found.append(call)
    return found


def _output_layers(src: Source, model: str) -> List[Set[str]]:
    """For a model built from a class of this file whose ``forward`` returns a
    tuple: the layers (``self.<attr>`` calls) each element of it depends on,
    through the names ``forward`` assigns.  [] when that cannot be told."""
    classes = {c.name: c for c in src.of_type(ast.ClassDef)}
    cls = None
    for value in bound_values(src, model):
        while isinstance(value, ast.Call):  # (through .to(device), .cuda(), DataParallel(...), DDP(...))
            if isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda"):
                value = value.func.value
            elif src.qualname(value.func) in N.DATA_PARALLEL | N.DDP and value.args:
                value = value.args[0]
            else:
                break
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in classes:
            cls = classes[value.func.id]
    forward = next((f for f in getattr(cls, "body", []) if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None:
        return []
    returns = [r for r in ast.walk(forward) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)]
    if len(returns) != 1:
        return []
    assigned: Dict[str, List[ast.AST]] = {}
    for node in ast.walk(forward):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        assigned.setdefault(name.id, []).append(node.value)

    def layers(expr: ast.AST, seen: Set[str]) -> Set[str]:
        found = set()
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and dotted(node.func.value) == "self":
                found.add(node.func.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in seen:
                seen.add(node.id)
                for value in assigned.get(node.id, []):
                    found |= layers(value, seen)
        return found

    return [layers(e, set()) for e in returns[0].value.elts]
