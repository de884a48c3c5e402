"""Per-file facts that decide each file's role in the program (see ``FileRole``).

Computed on the standard library's ``ast`` (fast, and CPython's own verdict on
whether the file is valid): does the file train, wrap with DataParallel, build
DataLoaders, set up DDP already, have a ``__main__`` block or module-level
training, and which modules does it import.  Only the files that a conversion
will touch are then parsed with LibCST.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from . import _names as N
from ._analysis import (
    Source, argument, dotted, forward_tests_a_parameter_for_none, in_batch_labels_batch, last_name, optimizer_methods,
)
from ._loaders import scales_the_learning_rate
from ._model import ModelAttributeFunction


@dataclass
class FileFacts:
    uses_torch: bool = False
    has_data_parallel: bool = False
    #: any reference to DataParallel (a call, a base class, an isinstance check)
    mentions_data_parallel: bool = False
    has_data_loader: bool = False
    already_distributed: bool = False
    #: calls DistributedDataParallel itself
    wraps_ddp: bool = False
    #: who starts the process group here: "dp2ddp" (only its own
    #: ``init_distributed()`` helper: a file converted earlier, where a DataParallel
    #: left then may be finished now), "hand" (the script's own
    #: ``init_process_group``, ``mp.spawn``), "" (neither)
    setup: str = ""
    trains: bool = False
    #: builds a torch.optim optimizer
    builds_optimizer: bool = False
    #: builds BatchNorm layers (``nn.BatchNorm2d(...)``, not SyncBatchNorm)
    builds_batchnorm: bool = False
    #: saves or loads a ``state_dict`` (checkpoints whose keys the wrap changes)
    uses_state_dict: bool = False
    has_main_guard: bool = False
    main_guard_line: int = 0
    main_guard_trains: bool = False
    module_level_trains: bool = False
    #: absolute module names imported, and (level, module) for relative imports
    imports: Set[str] = field(default_factory=set)
    relative_imports: Set[Tuple[int, str]] = field(default_factory=set)
    #: (line, column, qualified name) of calls to a ``DataParallel`` that is not torch's
    local_data_parallel: List[Tuple[int, int, str]] = field(default_factory=list)
    #: (line, module) of ``from module import *`` in a file that uses torch's usual
    #: names (torch, nn, DataLoader...) without binding them itself: they may come
    #: through the star, where name resolution cannot follow
    torch_through_star: List[Tuple[int, str]] = field(default_factory=list)
    #: folders the file puts on ``sys.path`` (``sys.path.insert(0, "lib")``,
    #: HRNet's ``_init_paths``: ``osp.join(osp.dirname(__file__), "..", "lib")``),
    #: relative to the file's folder: imports resolve there too
    path_roots: Set[str] = field(default_factory=set)
    #: top-level functions that read an attribute of a parameter that DDP does not
    #: forward (``def generate(decoder, s): hidden = decoder.init_hidden(1)``), by
    #: name: handed the DDP model from another file, they need its ``.module``
    model_attribute_functions: Dict[str, ModelAttributeFunction] = field(default_factory=dict)
    #: top-level functions and classes that save the state_dict() of a model they
    #: are handed (``def save(model, p): torch.save(model.state_dict(), p)``, a trainer
    #: whose ``__init__`` keeps ``self.model = model`` and saves ``self.model.state_dict()``):
    #: name -> (its positional parameters, the ones whose state_dict() it takes --
    #: for a class, of ``__init__``, also a ``kwargs["model"]``)
    state_dict_savers: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = field(default_factory=dict)
    #: top-level functions that only write files (``save_checkpoint(state, is_best,
    #: filename)``, ``save_config_file(folder, args)``): every call in them is a
    #: file-system, serialisation or logging call, ``torch.save``, or asks the rank --
    #: no collective, no model forward, no other function of the project
    writing_functions: Set[str] = field(default_factory=set)
    #: a ``forward`` of the file tests one of its parameters for None
    #: (``_analysis.forward_tests_a_parameter_for_none``: classifier-free guidance)
    forward_tests_none: bool = False
    #: methods of the file's classes that build and return an optimizer over their own
    #: module's parameters (``GPT.configure_optimizers``: ``_analysis.optimizer_methods``)
    optimizer_methods: Set[str] = field(default_factory=set)
    #: the last names of the batch-size settings a loss of the file builds its
    #: in-batch labels from (``torch.arange(self.args.batch_size)``: "batch_size")
    in_batch_label_batches: Set[str] = field(default_factory=set)
    #: the last names of the ``batch_size`` settings of the file's DataLoaders (not
    #: one the file computes a learning rate from: that one means the global batch)
    loader_batch_names: Set[str] = field(default_factory=set)


#: a BatchNorm layer built in the file (nn.BatchNorm2d, BatchNorm1d(...), not SyncBatchNorm)
BATCHNORM_LAYER = re.compile(r"(?<!Sync)\bBatchNorm[123]d\(")

#: names a training script takes from torch (``import torch.nn as nn``, ...)
_TORCH_NAMES = frozenset({"torch", "nn", "DataParallel", "DataLoader", "optim"})


def _unbound(src: Source) -> Set[str]:
    """Names the file reads but never binds (no import, assignment, def or parameter)."""
    bound = set(src.aliases)
    read = set()
    for node in src.nodes:
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return read - bound


def is_main_guard(node: ast.AST) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    values = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names) and bool(values)


def collect_facts(src: Source) -> FileFacts:
    facts = FileFacts()
    facts.uses_torch = any(q == "torch" or q.startswith("torch.") for q in src.aliases.values())
    facts.builds_batchnorm = "BatchNorm" in src.text and bool(BATCHNORM_LAYER.search(src.text))
    facts.uses_state_dict = "state_dict" in src.text
    for node in src.nodes:
        if isinstance(node, ast.Import):
            facts.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [a.name for a in node.names if a.name != "*"]
            if node.level:
                facts.relative_imports.add((node.level, module))
                for name in names:
                    facts.relative_imports.add((node.level, f"{module}.{name}" if module else name))
            else:
                facts.imports.add(module)
                facts.imports.update(f"{module}.{name}" for name in names)
    if "sys.path" in src.text or "addsitedir" in src.text:
        facts.path_roots = _path_roots(src)
    if "import *" in src.text:
        stars = [
            (node.lineno, "." * node.level + (node.module or ""))
            for node in src.nodes
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
        ]
        if stars and _unbound(src) & _TORCH_NAMES:
            facts.torch_through_star = stars
    if "DataParallel" in src.text or "data_parallel" in src.text:
        facts.mentions_data_parallel = any(
            isinstance(node, (ast.Name, ast.Attribute)) and src.qualname(node) in N.ANY_DATA_PARALLEL
            for node in src.nodes
        )
    if "DataParallel" in src.text:
        for call in src.calls:
            func = call.func
            last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if last == "DataParallel" and src.qualname(func) not in N.DATA_PARALLEL:
                facts.local_data_parallel.append(
                    (call.lineno, call.col_offset + 1, src.qualname(func))
                )
    training_functions: Set[str] = set()
    inits: List[ast.Call] = []
    main_blocks = [s for s in src.tree.body if is_main_guard(s)]
    facts.has_main_guard = bool(main_blocks)
    facts.main_guard_line = main_blocks[0].lineno if main_blocks else 0
    for call in src.calls:
        name = src.qualname(call.func)
        if name in N.DATA_PARALLEL:
            facts.has_data_parallel = True
        if name in N.DATA_LOADER:
            facts.has_data_loader = True
        if name in N.INIT_PROCESS_GROUP and _in_dp2ddp_helper(src, call) and not _helper_called(src, call):
            continue  # dp2ddp's setup helper, never called (a review that quit early): no setup
        if name in N.INIT_PROCESS_GROUP or name in N.DDP or name in N.SPAWN:
            facts.already_distributed = True
        if name in N.INIT_PROCESS_GROUP or name in N.SPAWN:
            inits.append(call)
        if name in N.DDP:
            facts.wraps_ddp = True
        trains = N.is_optimizer(name) or (
            isinstance(call.func, ast.Attribute) and call.func.attr == "backward"
        )
        if not trains:
            continue
        facts.trains = True
        if N.is_optimizer(name):
            facts.builds_optimizer = True
        owner = _top_level_owner(src, call)
        if owner is None:
            facts.module_level_trains = True
        elif owner in main_blocks:
            facts.main_guard_trains = True
        elif isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            training_functions.add(owner.name)
    if not facts.module_level_trains and training_functions:
        # module-level code that calls this file's training function (pytorch/examples'
        # word_language_model: `for epoch in ...: train()` at module level)
        facts.module_level_trains = any(
            isinstance(call.func, ast.Name)
            and call.func.id in training_functions
            and _top_level_owner(src, call) is None
            for call in src.calls
        )
    if inits:
        facts.setup = "dp2ddp" if all(_in_dp2ddp_helper(src, call) for call in inits) else "hand"
    facts.model_attribute_functions = _model_attribute_functions(src)
    if "state_dict" in src.text:
        facts.state_dict_savers = _state_dict_savers(src)
    facts.writing_functions = _writing_functions(src)
    if facts.builds_optimizer:
        facts.optimizer_methods = optimizer_methods(src)
    facts.forward_tests_none = forward_tests_a_parameter_for_none(src)
    if "arange" in src.text:
        labels = in_batch_labels_batch(src, needs_a_loss=True)
        if labels is not None and labels[1]:
            facts.in_batch_label_batches.add(last_name_of(labels[1]))
    if facts.has_data_loader:
        for call in src.calls:
            if src.qualname(call.func) in N.DATA_LOADER:
                batch = argument(call, 1, "batch_size")
                if batch is not None and dotted(batch) and not scales_the_learning_rate(src, dotted(batch)):
                    facts.loader_batch_names.add(last_name_of(dotted(batch)))
    return facts


#: modules whose calls only touch files, serialise or log
_WRITING_MODULES = ("os.", "shutil.", "json.", "yaml.", "pickle.", "csv.", "pathlib.", "logging.", "time.", "datetime.", "io.")
_WRITING_CALLS = frozenset({
    "torch.save", "torch.distributed.is_initialized", "torch.distributed.is_available",
    "torch.distributed.get_rank", "torch.distributed.get_world_size",
})
_HARMLESS_BUILTINS = frozenset({
    "open", "print", "str", "int", "float", "bool", "len", "dict", "list", "tuple", "set", "sorted", "vars",
    "isinstance", "range", "enumerate", "zip", "format", "repr", "getattr", "hasattr", "min", "max", "sum",
    "round", "abs",
})
WRITING_METHODS = frozenset({
    "write", "writelines", "dump", "dumps", "close", "flush", "items", "keys", "values", "get", "format",
    "join", "mkdir", "exists", "append", "copy", "state_dict", "cpu", "tolist", "item",  # (not update: ema.update(model))
})


def _writing_functions(src: Source) -> Set[str]:
    found = set()
    for func in src.tree.body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [c for c in ast.walk(func) if isinstance(c, ast.Call)]
        writes = False
        for call in calls:
            name = src.qualname(call.func)
            builtin = name.split(".", 1)[1] if name.startswith("builtins.") else name
            if name in _WRITING_CALLS or name.startswith(_WRITING_MODULES) or builtin in _HARMLESS_BUILTINS:
                writes = writes or name == "torch.save" or name.startswith(("shutil.", "json.", "yaml.", "pickle.")) or (
                    name == "builtins.open"
                )
                continue
            if isinstance(call.func, ast.Attribute) and call.func.attr in WRITING_METHODS and not name.startswith("torch."):
                continue
            break
        else:
            if writes:
                found.add(func.name)
    return found


def _state_dict_savers(src: Source) -> Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]]:
    found = {}
    for node in src.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = tuple(a.arg for a in (*node.args.posonlyargs, *node.args.args))
            saved = {
                c.func.value.id for c in ast.walk(node)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "state_dict"
                and isinstance(c.func.value, ast.Name) and c.func.value.id in params
            }
        elif isinstance(node, ast.ClassDef):
            init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            params = tuple(a.arg for a in (*init.args.posonlyargs, *init.args.args))[1:]
            kept: Dict[str, str] = {}  # self.model -> the parameter (or kwargs key) it holds
            for assign in ast.walk(init):
                if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1):
                    continue
                target, value = dotted(assign.targets[0]), assign.value
                while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in ("to", "cuda", "cpu"):
                    value = value.func.value  # self.model = model.to(device)
                if isinstance(value, ast.Name) and value.id in params:
                    kept[target] = value.id
                elif (
                    isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name)
                    and value.value.id == (init.args.kwarg.arg if init.args.kwarg else None)
                    and isinstance(value.slice, ast.Constant) and isinstance(value.slice.value, str)
                ):
                    kept[target] = value.slice.value  # self.model = kwargs["model"]
            saved = {
                kept[dotted(c.func.value)] for c in ast.walk(node)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "state_dict"
                and dotted(c.func.value) in kept and dotted(c.func.value).startswith("self.")
            }
        else:
            continue
        if saved:
            found[node.name] = (params, tuple(sorted(saved)))
    return found


def last_name_of(dotted_name: str) -> str:
    """``batch_size`` of ``self.args.batch_size``."""
    return dotted_name.rsplit(".", 1)[-1]


def _model_attribute_functions(src: Source) -> Dict[str, ModelAttributeFunction]:
    found = {}
    for func in src.tree.body:
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = tuple(a.arg for a in (*func.args.posonlyargs, *func.args.args))
        attributes: Dict[str, str] = {}
        trains = False
        for node in ast.walk(func):
            if (
                isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in params
                and node.attr not in N.DDP_FORWARDS and not node.attr.startswith("__")
            ):
                if attributes.get(node.value.id, "state_dict") == "state_dict":
                    attributes[node.value.id] = node.attr  # (the first one; one DDP lacks outright before state_dict)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "backward", "step"
            ):
                trains = True
        loaded = _loaded_keyword_values(func)
        if loaded:
            attributes.setdefault(KEYWORDS_LOADED, "load_state_dict")
        if attributes:
            found[func.name] = ModelAttributeFunction(params, tuple(sorted(attributes.items())), trains)
    return found


#: the "parameter" of a ``ModelAttributeFunction`` that stands for its ``**kwargs``
#: values, each loaded from a checkpoint (``restart_from_checkpoint(path, model=m)``)
KEYWORDS_LOADED = "**"


def _loaded_keyword_values(func: ast.AST) -> bool:
    """``func`` calls ``load_state_dict`` on the values of its ``**kwargs``: DINO's
    ``for key, value in kwargs.items(): value.load_state_dict(checkpoint[key])``."""
    kwarg = func.args.kwarg.arg if func.args.kwarg else None  # type: ignore[attr-defined]
    if kwarg is None:
        return False
    values: Set[str] = set()
    for loop in ast.walk(func):
        if not (isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call)
                and isinstance(loop.iter.func, ast.Attribute) and dotted(loop.iter.func.value) == kwarg):
            continue
        if loop.iter.func.attr == "items" and isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2:
            values.add(dotted(loop.target.elts[1]))
        elif loop.iter.func.attr == "values":
            values.add(dotted(loop.target))
    return any(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "load_state_dict"
        and (dotted(c.func.value) in values - {""}
             or isinstance(c.func.value, ast.Subscript) and dotted(c.func.value.value) == kwarg)
        for c in ast.walk(func)
    )


_FILE = "<__file__>"


def _path_roots(src: Source) -> Set[str]:
    """The folders, relative to the file's own, that a file puts on ``sys.path``:
    the arguments of ``sys.path.insert``/``append``, ``site.addsitedir`` or of a
    helper of the file that calls one (HRNet's ``add_path(lib_path)``) -- literal
    strings and ``os.path``/``pathlib`` arithmetic on ``__file__``, through simple
    assignments (``this_dir = osp.dirname(__file__)``)."""
    import posixpath

    env: Dict[str, str] = {}

    def ev(node: ast.AST) -> Optional[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return None if posixpath.isabs(node.value) else node.value
        if isinstance(node, ast.Name):
            return _FILE if node.id == "__file__" else env.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            inner = ev(node.value)
            return None if inner is None else ("." if inner == _FILE else posixpath.join(inner, ".."))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = ev(node.left), ev(node.right)
            return None if None in (left, right) or _FILE in (left, right) else posixpath.join(left, right)
        if not isinstance(node, ast.Call):
            return None
        name = last_name(node.func)
        args = [ev(a) for a in node.args]
        if name in ("abspath", "realpath", "normpath", "str", "Path", "expanduser", "fspath") and len(args) == 1:
            return args[0]
        if name in ("resolve", "absolute") and isinstance(node.func, ast.Attribute):
            return ev(node.func.value)
        if name == "dirname" and len(args) == 1 and args[0] is not None:
            return "." if args[0] == _FILE else posixpath.join(args[0], "..")
        if name == "join" and args and None not in args and _FILE not in args:
            return posixpath.join(*args)
        return None

    def edits_path(call: ast.Call) -> bool:
        return dotted(call.func) in N.SYS_PATH_EDITS

    roots: Set[str] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = ev(node.value)
            if value is not None:
                env[node.targets[0].id] = value
    # a helper of the file that puts its parameter on sys.path (HRNet's add_path)
    adders = {
        f.name for f in src.of_type(ast.FunctionDef)
        if any(isinstance(c, ast.Call) and edits_path(c) for c in ast.walk(f))
    }
    for call in src.calls:
        if not (edits_path(call) or isinstance(call.func, ast.Name) and call.func.id in adders):
            continue
        for arg in call.args:
            value = ev(arg)
            if value not in (None, _FILE):
                roots.add(posixpath.normpath(value))
    return roots


def _in_dp2ddp_helper(src: Source, node: ast.AST) -> bool:
    """``node`` is in a function that dp2ddp added (its docstring says so)."""
    func = src.function_of(node)
    doc = ast.get_docstring(func) if func is not None else None
    return bool(doc) and "(added by dp2ddp)" in doc


def _helper_called(src: Source, node: ast.AST) -> bool:
    """The function holding ``node`` is called somewhere in the file."""
    func = src.function_of(node)
    name = getattr(func, "name", None)
    return any(isinstance(call.func, ast.Name) and call.func.id == name for call in src.calls)


def _top_level_owner(src: Source, node: ast.AST):
    """The module-level statement holding ``node`` -- None when it is at module
    level outside any def/class/__main__ block (module-level training)."""
    top = node
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            return anc
        if isinstance(anc, ast.Module):
            break
        top = anc
    return top if is_main_guard(top) else None


_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.M)
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.M)


def import_facts(text: str) -> FileFacts:
    """Only the imports of a file the prefilter keeps from being parsed (it never
    mentions torch), read from its text: such a file can still be a link of the
    program's import graph -- a package ``__init__.py`` that re-exports
    (``from .builder import wrap``), a ``common.py`` between two torch modules."""
    facts = FileFacts()
    for match in _IMPORT.finditer(text):
        for part in match.group(1).split(","):
            name = part.split(" as ")[0].strip()
            if name:
                facts.imports.add(name)
    for match in _FROM_IMPORT.finditer(text):
        dots, module, names = match.groups()
        names = [n.split(" as ")[0].strip() for n in names.strip("()").replace("\\", " ").split(",")]
        names = [n for n in names if n and n != "*" and n.isidentifier()]
        if dots:
            facts.relative_imports.add((len(dots), module))
            facts.relative_imports.update((len(dots), f"{module}.{n}" if module else n) for n in names)
        elif module:
            facts.imports.add(module)
            facts.imports.update(f"{module}.{n}" for n in names)
    if "sys.path" in text or "addsitedir" in text:  # (HRNet's _init_paths.py: no torch in it)
        try:
            facts.path_roots = _path_roots(Source("<imports>", text))
        except (SyntaxError, ValueError, RecursionError):
            pass
    return facts
