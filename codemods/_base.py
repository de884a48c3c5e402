"""What every transform shares: settings, the file's role, findings, imports, rank context.

A transform is a LibCST ``VisitorBasedCodemodCommand``: it declares its metadata,
resolves torch APIs by qualified name, and schedules imports through
``AddImportsVisitor`` / ``RemoveImportsVisitor``, which the command applies once at
the end.  On top of that this base class gives each transform:

* ``changed`` / ``manual``: findings (what was rewritten, what is left for a human),
  recorded at the node's position; ``manual`` also puts a ``# dp2ddp:`` marker
  comment above the statement so that the reviewer sees it in the diff.
* ``rank_name``: the name of this process's ``local_rank`` / ``device`` at a node;
  when the scope has none, a two-line preamble that derives it from ``LOCAL_RANK``
  is scheduled at the top of that function (or after the module's imports).
* ``module_alias`` / ``object_alias``: the local name of ``torch.distributed``,
  ``DistributedDataParallel``... reusing the file's own import when there is one.
* ``replace_statement``: replace a whole statement (by its original node) with
  zero or more statements, applied when the transformer leaves it.
"""

from __future__ import annotations

import dataclasses
import re
from contextlib import contextmanager
from types import MappingProxyType
from typing import ClassVar, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.codemod import Codemod, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import (
    BaseMetadataProvider,
    BatchableMetadataProvider,
    FunctionScope,
    GlobalScope,
    MetadataWrapper,
    PositionProvider,
    ScopeProvider,
)

from . import _names as N
from . import _patterns as P
from ._model import MARKER, SPELLED_MARKS, FileRole, Finding, Settings  # noqa: F401 (the transforms' vocabulary)
from ._facts import BATCHNORM_LAYER
from ._analysis import last_name
from ._bridge import byte_offset


Stmt = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


_NO_DEFAULT = object()


class ParentProvider(BaseMetadataProvider[cst.CSTNode]):
    """Each node's parent, as LibCST's ``ParentNodeProvider`` gives it, from a
    plain walk over the nodes' fields instead of a visitor (about ten times
    faster; every transform that changes the module needs it afresh)."""

    _FIELDS: ClassVar[Dict[type, tuple]] = {}

    def _gen_impl(self, module: cst.Module) -> None:
        computed = self._computed
        fields = self._FIELDS
        node_type = cst.CSTNode
        stack: List[cst.CSTNode] = [module]
        while stack:
            node = stack.pop()
            names = fields.get(type(node))
            if names is None:
                names = fields[type(node)] = tuple(f.name for f in dataclasses.fields(node))
            for name in names:
                value = getattr(node, name)
                if isinstance(value, node_type):
                    computed[value] = node
                    stack.append(value)
                elif isinstance(value, (list, tuple)):
                    for child in value:
                        if isinstance(child, node_type):
                            computed[child] = node
                            stack.append(child)


class _Wrapper(MetadataWrapper):
    """A ``MetadataWrapper`` that builds a provider which is neither batchable nor
    dependent on another (positions, parents) by itself: LibCST's resolve then
    also walks the whole module with an empty batch of visitors, which doubled
    the cost of positions and made most of the cost of parents.  Same tables."""

    def resolve(self, provider):
        tables = getattr(self, "_metadata", None)
        if (
            isinstance(tables, dict)
            and provider not in tables
            and not issubclass(provider, BatchableMetadataProvider)
            and not provider.METADATA_DEPENDENCIES
            and not provider.gen_cache
        ):
            instance = provider()
            instance._gen_impl(self.module)
            tables[provider] = MappingProxyType(instance._computed)
        return super().resolve(provider)


class Transform(Codemod, cst.CSTTransformer):
    """Base class of the convert transforms (one per module in ``codemods/``).

    A LibCST codemod (a plain ``CSTTransformer``: no matcher decorators, which
    cost a third of a pass) that applies the imports it scheduled through
    ``AddImportsVisitor``/``RemoveImportsVisitor`` at the end, like LibCST's
    ``VisitorBasedCodemodCommand``."""

    #: Stable code, shared with the matching lint rule (e.g. "DDP001").
    CODE: ClassVar[str] = ""
    #: Short kebab-case name of the transform.
    NAME: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""
    #: words without which the transform cannot change a file (empty: always run)
    TRIGGERS: ClassVar[tuple] = ()

    #: resolved on first use (``get_metadata``), not before the visit: a
    #: transform that finds nothing to do never pays for positions or parents,
    #: and the tables stay on the shared wrapper for the next transform
    LAZY_METADATA = (
        ScopeProvider,
        PositionProvider,
        ParentProvider,
    )

    def __init__(
        self,
        context: CodemodContext,
        settings: Settings = Settings(),
        role: FileRole = FileRole(),
    ) -> None:
        Codemod.__init__(self, context)
        cst.CSTTransformer.__init__(self)
        #: metadata of the module being transformed; the engine hands it from one
        #: transform to the next while the module does not change
        self.shared_wrapper: Optional[MetadataWrapper] = None
        self._qnames: Dict[cst.CSTNode, Set[str]] = {}
        self.settings = settings
        self.role = role
        self.findings: List[Finding] = []
        self._markers: Dict[cst.CSTNode, List[str]] = {}
        self._replacements: Dict[cst.CSTNode, Sequence[cst.BaseStatement]] = {}
        self._before: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self._after: Dict[cst.CSTNode, List[cst.BaseStatement]] = {}
        self._preambles: Dict[cst.CSTNode, List[str]] = {}
        self._aliases: Dict[tuple, str] = {}
        self._helpers: Dict[str, str] = {}
        #: blocks whose statements were all removed (given a ``pass``)
        self._emptied: Set[int] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        """dp2ddp's own helpers (``init_distributed``, ``per_rank_batch_size``, added
        by an earlier run) are never converted again."""
        if isinstance(node, cst.FunctionDef) and "(added by dp2ddp)" in (node.get_docstring() or ""):
            return False
        return super().on_visit(node)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        """Whether this transform runs on a file with this role at all."""
        return not role.already_distributed

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        return tree.visit(self)

    def transform_module(self, tree: cst.Module, apply_imports: bool = True) -> cst.Module:
        """Transform, then apply the scheduled imports -- unless the caller runs
        several transforms on one context and applies them once at the end."""
        tree = Codemod.transform_module(self, tree)
        return apply_scheduled_imports(self.context, tree) if apply_imports else tree

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module):
        """As LibCST's, without deep-copying the module first (the engine parses
        every module afresh and the transforms never put one node object in two
        places), and reusing the metadata of the previous transform when it left
        the module as it was."""
        oldwrapper = self.context.wrapper
        wrapper = self.shared_wrapper
        if wrapper is None or wrapper.module is not module:
            wrapper = _Wrapper(module, unsafe_skip_copy=True)
        self.shared_wrapper = wrapper
        with self.resolve(wrapper):
            self.context = dataclasses.replace(self.context, wrapper=wrapper)
            try:
                yield wrapper.module
            finally:
                self.context = dataclasses.replace(self.context, wrapper=oldwrapper)

    def get_metadata(self, key, node, default=_NO_DEFAULT):
        if key not in self.LAZY_METADATA:
            raise KeyError(f"{type(self).__name__} does not declare {key.__name__}")
        table = self.metadata.get(key)
        if table is None:
            table = self.shared_wrapper.resolve(key)  # cached on the wrapper
            self.metadata = {**self.metadata, key: table}
        if default is _NO_DEFAULT:
            return table[node]
        return table.get(node, default)

    # ------------------------------------------------------------------ the module, once
    # (the transforms ask these per node -- per wrap, per loader: generated or
    # walked each time, a file's conversion grew with the square of its size)
    @property
    def module_code(self) -> str:
        """``self.module_code``, generated once per module."""
        module = self.module
        cached = getattr(self, "_module_code", None)
        if cached is None or cached[0] is not module:
            cached = self._module_code = (module, module.code)
        return cached[1]

    @property
    def module_calls(self) -> List[cst.Call]:
        """Every call of the module, in source order, found once per module."""
        module = self.module
        cached = getattr(self, "_module_calls", None)
        if cached is None or cached[0] is not module:
            cached = self._module_calls = (module, P.find(module, cst.Call))
        return cached[1]

    # ------------------------------------------------------------------ names
    @property
    def ast_source(self):
        """The module as ``ast`` (for the recognisers shared with lint), built once."""
        if getattr(self, "_ast_source", None) is None:
            from ._analysis import Source

            source = Source(self.context.filename or "<module>", self.module_code)
            # the imports an earlier transform scheduled (applied once, at the end)
            # name what it wrote: ``DistributedDataParallel`` is torch's already
            for local, full in self._scheduled_imports():
                source.aliases.setdefault(local, full)
            self._ast_source = source
        return self._ast_source

    def qnames(self, node: cst.CSTNode) -> Set[str]:
        # what QualifiedNameProvider computes for every name, asked for only the
        # nodes a transform looks at (the scope's own lookup, cached per node)
        cached = self._qnames.get(node)
        if cached is None:
            scope = self.get_metadata(ScopeProvider, node, None)
            try:
                names = scope.get_qualified_names_for(node) if scope is not None else set()
            except Exception:  # not a name the scope knows (a call result, a subscript)
                names = set()
            cached = {q.name for q in names}
            if not cached:
                cached = self._scheduled_qname(node)
            self._qnames[node] = cached
        return cached

    def _scheduled_qname(self, node: cst.CSTNode) -> Set[str]:
        """Names that an earlier transform imports (the imports are applied once,
        at the end): ``DistributedDataParallel`` -> torch.nn.parallel.Distrib..."""
        dotted = P.dotted_name(node)
        if not dotted:
            return set()
        head, _, rest = dotted.partition(".")
        for local, full in self._scheduled_imports():
            if local == head:
                return {f"{full}.{rest}" if rest else full}
        return set()

    def _scheduled_imports(self) -> Iterator[Tuple[str, str]]:
        """(local name, what it stands for) of each import scheduled so far:
        ``from torch.nn.parallel import DistributedDataParallel`` ->
        (DistributedDataParallel, torch.nn.parallel.DistributedDataParallel);
        ``import torch.distributed as dist`` -> (dist, torch.distributed)."""
        for item in self.context.scratch.get(AddImportsVisitor.CONTEXT_KEY, []):
            if item.relative:
                continue
            if item.obj_name:
                yield item.alias or item.obj_name, f"{item.module_name}.{item.obj_name}"
            elif item.alias:
                yield item.alias, item.module_name
            else:
                head = item.module_name.split(".")[0]
                yield head, head

    def is_ref(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        """``node`` (a Name or Attribute) refers to one of ``names``.  (The scope
        also names a call by its callee -- ``DataParallel(net)`` -- which is not a
        reference to it: ``DataParallel(net)(x)`` does not call DataParallel.)"""
        return isinstance(node, (cst.Name, cst.Attribute)) and not self.qnames(node).isdisjoint(names)

    def is_call(self, node: cst.CSTNode, names: Iterable[str]) -> bool:
        return isinstance(node, cst.Call) and self.is_ref(node.func, names)

    def call_qname(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Call):
            names = self.qnames(node.func)
            if names:
                return sorted(names)[0]
        return None

    # --------------------------------------------------------------- findings
    def position(self, node: cst.CSTNode) -> tuple:
        pos = self.get_metadata(PositionProvider, node, None)
        if pos is None:
            return (0, 0)
        return (pos.start.line, pos.start.column + 1)

    def changed(self, node: cst.CSTNode, message: str, code: Optional[str] = None) -> None:
        line, col = self.position(node)
        self.findings.append(
            Finding(code or self.CODE, "change", line, col, _one_line(message), self.NAME)
        )

    def note(self, node: cst.CSTNode, message: str, code: Optional[str] = None) -> None:
        line, col = self.position(node)
        self.findings.append(
            Finding(code or self.CODE, "note", line, col, _one_line(message), self.NAME)
        )

    def manual(
        self,
        node: cst.CSTNode,
        message: str,
        code: Optional[str] = None,
        marker: bool = True,
    ) -> None:
        """Leave ``node`` as it is and report it for a human, with a marker comment."""
        line, col = self.position(node)
        code = code or self.CODE
        message = _one_line(message)  # (a message quoting code that spans lines: one comment line)
        self.findings.append(Finding(code, "manual", line, col, message, self.NAME))
        if marker and self.settings.markers:
            stmt = self.statement_of(node)
            if stmt is not None:
                self._markers.setdefault(stmt, []).append(f"{MARKER} {code} {message}")

    # ----------------------------------------------------------------- parents
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.get_metadata(ParentProvider, node, None)

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def ast_call(self, call: cst.Call):
        """The ``ast.Call`` of ``ast_source`` at the place of ``call`` (for the
        recognisers shared with lint), or None.  Calls chained on a call start at
        the same place (``Image.fromarray(a).save(p)``): the one whose function has
        ``call``'s last name is it."""
        line, column = self.position(call)
        offset = byte_offset(self.ast_source.lines, line, column)
        name = call.func.attr.value if isinstance(call.func, cst.Attribute) else getattr(call.func, "value", None)
        here = [node for node in self.ast_source.calls if node.lineno == line and node.col_offset == offset]
        return next((node for node in here if last_name(node.func) == name), here[0] if here else None)

    def statement_at(self, line: int) -> Optional[Stmt]:
        """The (outermost) statement that starts at ``line`` of the module being
        transformed: where a finding of an ``ast`` recogniser (``_analysis``) lands."""
        if getattr(self, "_statements_by_line", None) is None:
            self._statements_by_line: Dict[int, Stmt] = {}
            for stmt in P.find(self.module, cst.SimpleStatementLine, cst.BaseCompoundStatement):
                self._statements_by_line.setdefault(self.position(stmt)[0], stmt)
        return self._statements_by_line.get(line)

    def statement_of(self, node: cst.CSTNode) -> Optional[Stmt]:
        """The statement that holds ``node`` (a compound one for a node in its header)."""
        current: Optional[cst.CSTNode] = node
        while current is not None:
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return current
            current = self.parent(current)
        return None

    def before_process_group(self, node: cst.CSTNode) -> Optional[str]:
        """Why ``node`` runs before the process group is up, and what to do (None
        when it runs after): code at import time (module or class level, outside
        any function and the ``__main__`` block) in a ``__main__``-block program
        -- another module of the program is imported by the entry point before
        its ``__main__`` block starts the group -- or, in a script whose training
        runs at module level, code above the point where the setup goes in
        (``header_end``: after the imports)."""
        top = None
        for anc in self.ancestors(node):
            if anc is self.module:
                break
            top = anc
        if self.role.is_entry and self.role.entry_kind == "module":
            body = list(self.module.body)
            if top in body and body.index(top) < header_end(body):
                return "above the script's `import torch`, after which the process group is started: move it below"
            return None
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
                return None
            if isinstance(anc, cst.If) and P.is_main_guard(anc):
                return None
        where = "in the __main__ block" if self.role.is_entry else "by the entry point"
        return (
            f"at import time, before the process group is started {where}: move it into the "
            "code that __main__ runs (e.g. main()), then convert"
        )

    def enclosing_function(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        for anc in self.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return anc
        return None

    # ----------------------------------------------------------------- imports
    def module_alias(self, module: str, preferred: str) -> str:
        """Local name for ``module`` (e.g. ``dist`` for ``torch.distributed``)."""
        key = ("module", module)
        if key in self._aliases:
            return self._aliases[key]
        name = self._existing_import(module, None)
        if name is not None and name != module and self._bound_locally(name):
            # ``dist = Categorical(logits)`` in a function: the file's own alias is
            # another object there; the code added goes through the dotted path
            AddImportsVisitor.add_needed_import(self.context, module)
            name = module
        if name is None:
            if self._free_global(preferred) and not self._bound_locally(preferred):
                AddImportsVisitor.add_needed_import(
                    self.context, module, asname=preferred if preferred != module else None
                )  # (``import torch``, not ``import torch as torch``)
                name = preferred
            else:
                AddImportsVisitor.add_needed_import(self.context, module)
                name = module
        self._aliases[key] = name
        return name

    def drop_imports_if_unused(self, wanted) -> None:
        """Schedule the removal of the module's ``from x import y [as z]`` names for
        which ``wanted(qualified name, bound name)`` holds -- removed at the end only
        if nothing uses them any more (``_RemoveImports``)."""
        for stmt in self.module.body:
            if not m.matches(stmt, m.SimpleStatementLine(body=[m.ImportFrom()])):
                continue
            imp = stmt.body[0]
            if imp.relative or isinstance(imp.names, cst.ImportStar) or imp.module is None:
                continue
            module = P.dotted_module(imp.module)
            for alias in imp.names:
                asname = alias.asname.name.value if alias.asname else None
                if wanted(f"{module}.{alias.name.value}", asname or alias.name.value):
                    RemoveImportsVisitor.remove_unused_import(self.context, module, alias.name.value, asname)

    def _bound_locally(self, name: str) -> bool:
        """``name`` is bound in a function, lambda, class or comprehension of the
        module (a local ``dist = Categorical(...)``, a parameter ``dist``)."""
        self.get_metadata(ScopeProvider, self.module, None)
        table = self.metadata.get(ScopeProvider) or {}
        scopes = {id(scope): scope for scope in table.values() if scope is not None}
        return any(
            not isinstance(scope, GlobalScope) and any(a.name == name for a in scope.assignments)
            for scope in scopes.values()
        )

    def object_alias(self, module: str, obj: str, qualified: Iterable[str] = ()) -> str:
        """Local name for ``from module import obj`` (reusing an existing import)."""
        key = ("object", module, obj)
        if key in self._aliases:
            return self._aliases[key]
        name = self._existing_import(module, obj, qualified)
        if name is None:
            if self._free_global(obj):
                AddImportsVisitor.add_needed_import(self.context, module, obj)
                name = obj
            else:  # the name is taken by something else: spell it out
                torch_name = self.module_alias("torch", "torch")
                name = f"{torch_name}{module[len('torch'):]}.{obj}"
        self._aliases[key] = name
        return name

    def _existing_import(
        self, module: str, obj: Optional[str], qualified: Iterable[str] = ()
    ) -> Optional[str]:
        wanted = {f"{module}.{obj}" if obj else module, *qualified}
        scope = self._global_scope()
        if scope is None:
            return None
        for assignment in scope.assignments:
            node = getattr(assignment, "node", None)
            if not isinstance(node, (cst.Import, cst.ImportFrom)):
                continue
            for qname in scope.get_qualified_names_for(assignment.name):
                if qname.name in wanted and assignment.name.isidentifier():
                    return assignment.name
        if obj is None:
            # ``import torch.distributed`` binds ``torch`` and makes the dotted path valid
            for assignment in scope.assignments:
                node = getattr(assignment, "node", None)
                if isinstance(node, cst.Import):
                    for alias in node.names:
                        if alias.asname is None and _dotted(alias.name) == module:
                            return module
        return None

    def _global_scope(self) -> Optional[GlobalScope]:
        scope = self.get_metadata(ScopeProvider, self.module, None)
        return scope if isinstance(scope, GlobalScope) else None

    def _free_global(self, name: str) -> bool:
        scope = self._global_scope()
        return scope is None or name not in scope.assignments

    def dist(self) -> str:
        return self.module_alias("torch.distributed", "dist")

    def torch(self) -> str:
        return self.module_alias("torch", "torch")

    def main_process_test(self) -> cst.BaseExpression:
        """True on exactly one process of the job: ``dist.get_rank() == 0`` in the
        entry file (the process group is always up there); in other modules, which
        a notebook or a test may import without one, also true when there is no
        process group: ``not dist.is_initialized() or dist.get_rank() == 0``."""
        dist = self.dist()
        if self.role.is_entry and self.role.group_always_up:
            return cst.parse_expression(f"{dist}.get_rank() == 0")
        return cst.parse_expression(f"not {dist}.is_initialized() or {dist}.get_rank() == 0")

    def other_process_test(self) -> cst.BaseExpression:
        """The negation of ``main_process_test`` (for ``tqdm(disable=...)``)."""
        dist = self.dist()
        if self.role.is_entry and self.role.group_always_up:
            return cst.parse_expression(f"{dist}.get_rank() != 0")
        return cst.parse_expression(f"{dist}.is_initialized() and {dist}.get_rank() != 0")

    # ------------------------------------------------------------ rank context
    def rank_name(self, node: cst.CSTNode, what: str) -> Optional[str]:
        """Name of this process's ``local_rank`` or ``device`` where ``node`` is.

        Returns None where no preamble can be placed (a lambda, a class body):
        the caller then reports the spot instead of guessing.
        """
        scope = self.get_metadata(ScopeProvider, node, None)
        while scope is not None and not isinstance(scope, (FunctionScope, GlobalScope)):
            scope = scope.parent
        if scope is None:
            return None
        owner = self.module if isinstance(scope, GlobalScope) else scope.node
        if isinstance(owner, cst.Lambda):
            return None
        if what == "device":
            if self._usable_device(scope):
                if self._bound_before(scope, "device", node):
                    return "device"
                if isinstance(scope, GlobalScope):
                    return None  # (a module-level script: the setup's lines go elsewhere)
                # (set only further down: ours at the top, the same value it gets there)
                self._need(owner, "local_rank", scope)
                self._need(owner, "device", scope)
                return "device"
            if "device" in scope and not self._preamble_has(owner, "device") and not self._unused_here(scope, "device"):
                return None  # a different "device" is in scope: don't guess
            self._need(owner, "local_rank", scope)
            self._need(owner, "device", scope)
            return "device"
        if what == "local_rank":
            self._need(owner, "local_rank", scope)
            return "local_rank"
        raise ValueError(what)

    def no_rank_device(self, node: cst.CSTNode) -> str:
        """Why ``rank_name(node, "device")`` found no per-rank device, and what to
        do -- for the report of a spot left as it is."""
        scope = self.get_metadata(ScopeProvider, node, None)
        while scope is not None and not isinstance(scope, (FunctionScope, GlobalScope)):
            scope = scope.parent
        if scope is None or isinstance(getattr(scope, "node", None), cst.Lambda):
            return "in a lambda, where this process's device cannot be defined: move the code into a function"
        if self._usable_device(scope) and not self._bound_before(scope, "device", node):
            return (
                "the script's `device` is set only further down, at module level: move this line below "
                "it (or the device line above it) and convert again"
            )
        values = []  # (line, code), in the file's order
        for assignment in scope.assignments["device"] if "device" in scope else ():
            target = getattr(assignment, "node", None)
            assign = self._assign_of(target) if isinstance(target, cst.Name) else None
            if assign is not None:
                values.append((self.position(assign), _one_line(self.module.code_for_node(assign.value))))
            elif isinstance(target, cst.Param) or isinstance(self.parent(target), cst.Param):
                values.append((self.position(target), "a parameter"))
        quoted = dict.fromkeys(code for _, code in sorted(values))
        what = f" ({', '.join(quoted)})" if values else ""
        return (
            f"the script's own `device`{what} is not this process's GPU and dp2ddp does not guess "
            "what it means: set it to torch.device(f\"cuda:{local_rank}\") (local_rank = "
            "int(os.environ[\"LOCAL_RANK\"]); CPU when CUDA is missing) and convert again"
        )

    @staticmethod
    def _unused_here(scope, name: str) -> bool:
        """A function that neither reads nor assigns ``name`` itself (a module-level
        ``device = 0`` is in scope, unused): a local one of ours shadows nothing it uses."""
        return (
            isinstance(scope, FunctionScope)
            and not list(scope.accesses[name])
            and not list(scope.assignments[name])
        )

    def free_name(self, base: str, at: cst.CSTNode, taken=(), sep: str = "") -> str:
        """``base``, or ``base2``, ``base3``... (``sep`` between): the first name that
        nothing in scope at ``at`` uses, nor ``taken``."""
        scope = self.get_metadata(ScopeProvider, at, None)
        name, counter = base, 2
        while scope is not None and (name in scope or name in taken):
            name, counter = f"{base}{sep}{counter}", counter + 1
        return name

    def _bound_before(self, scope, name: str, node: cst.CSTNode) -> bool:
        """``name`` has a value where ``node`` is: a parameter, a binding of an
        outer scope, or one of this scope on an earlier line."""
        line = self.position(node)[0]
        for assignment in scope[name]:
            target = getattr(assignment, "node", None)
            if assignment.scope is not scope or isinstance(target, cst.Param):
                return True
            if target is not None and 0 < self.position(target)[0] < line:
                return True
        return False

    def _usable_device(self, scope) -> bool:
        """A ``device`` in scope that holds this rank's device (or is passed in)."""
        if "device" not in scope:
            return False
        gpu = False  # (a device that is only ever the CPU is not this rank's GPU)
        for assignment in scope["device"]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.Param):
                gpu = True
                continue
            if isinstance(node, cst.Name):
                assign = self._assign_of(node)
                if assign is not None and (
                    P.is_rank_device(self, assign.value) or P.is_device_spec(self, assign.value)
                ):
                    gpu = True
                    continue
                if assign is not None and P.is_cpu_spec(self, assign.value):
                    # the CPU branch of `if cuda: device = cuda else: device = cpu`,
                    # like `"cuda" if ... else "cpu"` in one expression
                    continue
            return False
        return gpu

    def only_value(self, name: cst.Name, pure: bool = True) -> Optional[cst.BaseExpression]:
        """The value of a name assigned exactly once in its scope (a pure expression,
        unless ``pure`` is False)."""
        scope = self.get_metadata(ScopeProvider, name, None)
        if scope is None or name.value not in scope:
            return None
        assignments = list(scope[name.value])
        node = getattr(assignments[0], "node", None) if len(assignments) == 1 else None
        assign = self._assign_of(node) if isinstance(node, cst.Name) else None
        if assign is None or len(assign.targets) != 1 or pure and not P.is_pure(assign.value):
            return None
        return assign.value

    def _assign_of(self, name: cst.Name) -> Optional[cst.Assign]:
        target = self.parent(name)
        if isinstance(target, cst.AssignTarget):
            assign = self.parent(target)
            if isinstance(assign, cst.Assign):
                return assign
        return None

    def _preamble_has(self, owner: cst.CSTNode, what: str) -> bool:
        return what in self._preambles.get(owner, [])

    def _need(self, owner: cst.CSTNode, what: str, scope) -> None:
        if what == "local_rank" and "local_rank" in scope and not self._preamble_has(
            owner, "local_rank"
        ):
            return  # the function already has (or receives) its local rank
        needed = self._preambles.setdefault(owner, [])
        if what not in needed:
            needed.append(what)
            if what == "local_rank":
                AddImportsVisitor.add_needed_import(self.context, "os")

    def _preamble_statements(self, needs: List[str]) -> List[cst.BaseStatement]:
        torch_name = self.torch()
        code = []
        if "local_rank" in needs:
            code.append('local_rank = int(os.environ.get("LOCAL_RANK", 0))\n')
        if "device" in needs:
            code.append(
                f'device = {torch_name}.device(f"cuda:{{local_rank}}" if '
                f'{torch_name}.cuda.is_available() else "cpu")\n'
            )
        return list(cst.parse_module("".join(code)).body)

    # ------------------------------------------------------- statement edits
    def replace_statement(self, original: Stmt, new: Sequence[cst.BaseStatement]) -> None:
        self._replacements[original] = list(new)

    def insert_after(self, original: Stmt, new: Sequence[cst.BaseStatement]) -> None:
        """Put ``new`` right after the statement ``original`` (when leaving it)."""
        self._after.setdefault(original, []).extend(new)

    def insert_before(self, original: Stmt, new: Sequence[cst.BaseStatement]) -> None:
        """Put ``new`` right before the statement ``original`` (when leaving it)."""
        self._before.setdefault(original, []).extend(new)

    def already_moved(self, expr: cst.CSTNode, at: cst.CSTNode) -> bool:
        """``expr`` names a module that was put on a device before ``at``
        (``model = Net().to(device)`` or ``model.to(device)`` earlier in the scope)."""
        if isinstance(expr, cst.Attribute):
            return self._attribute_moved(expr, at)
        if not isinstance(expr, cst.Name):
            return False
        scope = self.get_metadata(ScopeProvider, at, None)
        if scope is None:
            return False
        for assignment in scope[expr.value]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.Name):
                assign = self._assign_of(node)
                if assign is not None and m.matches(assign.value, P.DEVICE_MOVE) and (
                    self._ran_before(assign, at) or self._moved_on_every_branch(assign, expr.value, at)
                ):
                    return True
        for access in scope.accesses[expr.value]:
            attr = self.parent(access.node)
            if isinstance(attr, cst.Attribute) and attr.value is access.node and attr.attr.value in ("to", "cuda"):
                call = self.parent(attr)
                if isinstance(call, cst.Call) and isinstance(self.parent(call), cst.Expr):
                    if self._ran_before(call, at):
                        return True
        return False

    def _moved_on_every_branch(self, assign: cst.Assign, name: str, at: cst.CSTNode) -> bool:
        """``if big: model = Big().to(device) else: model = Small().to(device)`` before
        ``at``: whichever branch ran, the model was moved."""
        stmt = self.statement_of(assign)
        branch = self.parent(self.parent(stmt)) if stmt is not None else None
        if isinstance(branch, cst.Else):
            branch = self.parent(branch)
        if not isinstance(branch, cst.If) or not isinstance(branch.orelse, cst.Else):
            return False

        def moves(block: cst.BaseSuite) -> bool:
            return any(
                isinstance(s, cst.SimpleStatementLine)
                and any(
                    isinstance(a, cst.Assign) and len(a.targets) == 1
                    and P.dotted_name(a.targets[0].target) == name and m.matches(a.value, P.DEVICE_MOVE)
                    for a in s.body
                )
                for s in getattr(block, "body", ())
            )

        return moves(branch.body) and moves(branch.orelse.body) and self._ran_before(branch, at)

    def _ran_before(self, earlier: cst.CSTNode, at: cst.CSTNode) -> bool:
        """``earlier`` is on an earlier line, in a block that holds ``at`` too: it
        has run when ``at`` runs (not in the other branch of an ``if``)."""
        if not 0 < self.position(earlier)[0] < self.position(at)[0]:
            return False
        stmt = self.statement_of(earlier)
        block = self.parent(stmt) if stmt is not None else None
        return block is not None and any(a is block for a in self.ancestors(at))

    def _attribute_moved(self, expr: cst.Attribute, at: cst.CSTNode) -> bool:
        """``self.model = model.to(self.device)`` earlier in the same function."""
        if self.enclosing_function(at) is None:
            return False
        return any(
            m.matches(assign.value, P.DEVICE_MOVE) and self._ran_before(assign, at)
            for assign in self.assignments_to(P.dotted_name(expr), at)
        )

    def assignments_to(self, name: str, at: cst.CSTNode) -> List[cst.Assign]:
        """The assignments to the dotted ``name`` (``model``, ``self.model``) in the
        function holding ``at``, or in the module."""
        if not name:
            return []
        return [
            assign
            for assign in P.find(self.enclosing_function(at) or self.module, cst.Assign)
            if any(P.dotted_name(t.target) == name for t in assign.targets)
        ]

    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = super().on_leave(original_node, updated_node)
        if isinstance(result, cst.IndentedBlock) and not result.body:
            # every statement of the block was removed: keep it valid
            result = result.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            self._emptied.add(id(result))
        elif (
            isinstance(result, cst.If)
            and result.orelse is None
            and id(result.body) in self._emptied
            and P.is_pure(result.test)
            and not P.find(result.test, cst.NamedExpr)  # (``if (n := ...)``: binds a name)
            and not any(line.comment for line in result.body.footer)
            and (result.body.header.comment is None or SPELLED_MARKS.fullmatch(result.body.header.comment.value))
        ):
            # ``if torch.cuda.is_available(): torch.cuda.set_device(0)`` with its
            # statement removed: the check has nothing left to guard
            return cst.RemoveFromParent()
        if original_node in self._preambles and isinstance(result, cst.FunctionDef):
            result = self._insert_into_function(result, self._preambles[original_node])
        if isinstance(original_node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            if original_node in self._replacements:
                new = list(self._replacements[original_node])
                if new and isinstance(result, cst.CSTNode):
                    # keep the comments above the statement on its replacement
                    first = new[0]
                    lead = list(getattr(result, "leading_lines", ()))
                    new[0] = first.with_changes(leading_lines=[*lead, *first.leading_lines])
                result = cst.FlattenSentinel(new) if new else cst.RemoveFromParent()
            if original_node in self._markers:
                result = self._add_markers(result, self._markers[original_node])
            if original_node in self._before:
                result = self._prepend(result, self._before[original_node])
            if original_node in self._after:
                nodes = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]
                result = cst.FlattenSentinel([*nodes, *self._after[original_node]])
        return result

    def marker_lines(self, original: cst.CSTNode) -> List[cst.EmptyLine]:
        """Marker comments registered for ``original`` that were not placed yet."""
        return [cst.EmptyLine(comment=cst.Comment(text)) for text in self._markers.pop(original, [])]

    @staticmethod
    def _prepend(result, new: List[cst.BaseStatement]):
        if isinstance(result, cst.RemovalSentinel):
            return cst.FlattenSentinel(new)
        nodes = list(result.nodes) if isinstance(result, cst.FlattenSentinel) else [result]
        if nodes and new:
            # the blank lines above the statement go above the inserted code; the
            # comment lines right above it stay with it (they say what it does)
            lead = list(nodes[0].leading_lines)
            attached = len(lead)
            while attached > 0 and lead[attached - 1].comment is not None:
                attached -= 1
            nodes[0] = nodes[0].with_changes(leading_lines=lead[attached:])
            new = list(new)
            new[0] = new[0].with_changes(leading_lines=[*lead[:attached], *new[0].leading_lines])
        return cst.FlattenSentinel([*new, *nodes])

    def ddp_module(self, module: cst.BaseExpression, at: cst.CSTNode) -> cst.BaseExpression:
        """The module handed to DDP: with ``--sync-bn`` its BatchNorm layers become
        SyncBatchNorm first (through a helper that keeps them on CPU).  Without
        it, a file that builds BatchNorm layers gets a note at its first wrap."""
        if not self.settings.sync_bn:
            if not getattr(self, "_batchnorm_noted", False) and (
                BATCHNORM_LAYER.search(self.module_code) or self.role.program_batchnorm
            ):
                self._batchnorm_noted = True
                self.note(
                    at,
                    "BatchNorm layers now normalise over each process's share of the batch "
                    "(DataParallel did so per GPU; a one-device run used the whole batch): "
                    "convert with --sync-bn for SyncBatchNorm over the global batch on GPUs",
                    code="DDP001",
                )
            return module
        name = self.helper("sync_batchnorm", SYNC_BATCHNORM.replace("torch.", f"{self.torch()}."))
        return cst.Call(func=cst.Name(name), args=[cst.Arg(module)])

    def helper(self, preferred: str, code: str) -> str:
        """Name of a module-level helper function that dp2ddp adds once per file.

        ``code`` is the function's source with ``{name}`` where its name goes.  A
        helper added by an earlier run (its docstring says dp2ddp) is reused.
        """
        if preferred in self._helpers:
            return preferred
        for candidate in (preferred, f"dp2ddp_{preferred}"):
            existing = self._module_function(candidate)
            if existing is not None:
                if "(added by dp2ddp)" in (existing.get_docstring() or ""):
                    return candidate
                continue
            if self._free_global(candidate):
                self._helpers[candidate] = code.format(name=candidate)
                return candidate
        raise ValueError(f"no free name for helper {preferred}")

    def parse_code(self, code: str) -> cst.Module:
        """Parse code we generate, with the file's line ending also inside its
        multi-line strings (a docstring would otherwise bring LF into a CRLF file)."""
        newline = self.module.default_newline
        if newline != "\n":
            code = code.replace("\n", newline)
        return cst.parse_module(code)

    def _module_function(self, name: str) -> Optional[cst.FunctionDef]:
        for stmt in self.module.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return stmt
        return None

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        at = header_end(body)
        new: List[cst.BaseStatement] = []
        for code in self._helpers.values():
            func = self.parse_code(code).body[0]
            new.append(func.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
        if original_node in self._preambles:
            new.extend(self._preamble_statements(self._preambles[original_node]))
        if not new:
            return updated_node
        rest = body[at:]
        if rest and self._helpers:
            rest[0] = rest[0].with_changes(leading_lines=at_least_two_blank(rest[0].leading_lines))
        return updated_node.with_changes(body=[*body[:at], *new, *rest])

    def is_rank_preamble(self, stmt: cst.CSTNode) -> bool:
        """``local_rank = int(os.environ.get("LOCAL_RANK", 0))`` or ``device =
        torch.device(f"cuda:{local_rank}" ...)``, as ``_preamble_statements`` writes them."""
        name = _preamble_name(stmt)
        if name == "local_rank":
            return "LOCAL_RANK" in cst.Module(body=[]).code_for_node(stmt.body[0].value)
        return name == "device" and P.is_rank_device(self, stmt.body[0].value)

    def _insert_into_function(self, func: cst.FunctionDef, needs: List[str]) -> cst.FunctionDef:
        body = func.body
        if not isinstance(body, cst.IndentedBlock):
            return func
        stmts = list(body.body)
        at = 0
        # after the docstring, ``global`` declarations and the function's own imports
        # (``import torch`` there makes ``torch`` local to the function: the preamble
        # above it would read it unbound -- pytorch-playground's eval_model)
        while at < len(stmts) and (
            _is_docstring(stmts[at]) and at == 0 or _is_global_decl(stmts[at]) or _is_import(stmts[at])
        ):
            at += 1
        # together with the rank preamble an earlier transform put there, local_rank
        # first: ``device`` is computed from it
        end = at
        while end < len(stmts) and self.is_rank_preamble(stmts[end]):
            end += 1
        block = [*stmts[at:end], *self._preamble_statements(needs)]
        ordered = sorted(block, key=lambda st: 0 if _preamble_name(st) == "local_rank" else 1)
        if end > at:  # the comments above the old first statement stay on top
            lead = stmts[at].leading_lines
            ordered = [st.with_changes(leading_lines=[]) for st in ordered]
            ordered[0] = ordered[0].with_changes(leading_lines=lead)
        return func.with_changes(body=body.with_changes(body=[*stmts[:at], *ordered, *stmts[end:]]))

    def _add_markers(self, result, messages: List[str]):
        def mark(stmt):
            lead = list(stmt.leading_lines)
            existing = {line.comment.value for line in lead if line.comment is not None}
            for text in messages:
                if text not in existing:
                    existing.add(text)
                    lead.append(cst.EmptyLine(comment=cst.Comment(text)))
            return stmt.with_changes(leading_lines=lead)

        if isinstance(result, cst.FlattenSentinel):
            nodes = list(result.nodes)
            if nodes:
                nodes[0] = mark(nodes[0])
            return cst.FlattenSentinel(nodes)
        if isinstance(result, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return mark(result)
        return result


# --------------------------------------------------------------- helpers
_dotted = P.dotted_name


class _AddImports(AddImportsVisitor):
    """LibCST's ``AddImportsVisitor`` without the deep copy of the module that
    ``Codemod.transform_module`` makes for metadata (it declares none), and
    without descending into compound statements: it only changes the module's
    body and the ``from`` imports at its top."""

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module):
        yield module

    def on_visit(self, node: cst.CSTNode) -> bool:
        return super().on_visit(node) and not isinstance(node, cst.BaseCompoundStatement)

    def visit_Module(self, node: cst.Module) -> None:
        # LibCST's gatherer walks the whole module to read the imports at its top
        # (after a docstring or ``__strict__``): hand it the module cut after its
        # first statement that is not an import -- the same statement objects, so
        # the imports it records are the ones this visit meets
        end = 0
        for index, stmt in enumerate(node.body):
            end = index + 1
            if index > 0 and not _is_import(stmt):
                break
        super().visit_Module(node.with_changes(body=node.body[:end]))


_ANNOTATION_LIKE = re.compile(r"[\w.\[\], |]+")


class _RemoveImports(RemoveImportsVisitor):
    """LibCST's ``RemoveImportsVisitor`` for what the transforms schedule (a
    ``from torch.nn import DataParallel`` after its last use was converted), with a
    cheaper test of "unused" than its scope analysis (half a second a file): the
    bound name occurs nowhere outside the imports -- no name, attribute or string
    (an annotation, ``__all__``) -- which keeps an import LibCST might drop, never
    the reverse.  Same edits of the import statements otherwise."""

    METADATA_DEPENDENCIES = ()

    @contextmanager
    def _handle_metadata_reference(self, module: cst.Module):
        yield module

    def visit_Module(self, node: cst.Module) -> None:
        wanted = {alias or obj for objs in self.unused_obj_imports.values() for obj, alias in objs}
        wanted |= {alias or module for module, alias in self.unused_module_imports.items()}
        used: Set[str] = set()
        imports: List[Union[cst.Import, cst.ImportFrom]] = []
        stack: List[cst.CSTNode] = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, (cst.Import, cst.ImportFrom)):
                imports.append(current)
                continue
            if isinstance(current, cst.Name):
                used.add(current.value)
            elif isinstance(current, cst.SimpleString):
                # a string annotation or an ``__all__`` entry names it; prose does not
                text = current.evaluated_value if isinstance(current.evaluated_value, str) else ""
                if _ANNOTATION_LIKE.fullmatch(text) and not re.search(r"\w\s+\w", text):
                    used.update(w for w in wanted if re.search(rf"\b{re.escape(w)}\b", text))
            stack.extend(current.children)
        self._unused_imports = {}
        for imp in imports:
            if isinstance(imp.names, cst.ImportStar):
                continue
            for alias in imp.names:
                bound = alias.evaluated_alias or alias.evaluated_name
                if isinstance(imp, cst.Import) and alias.evaluated_alias is None:
                    bound = alias.evaluated_name.split(".")[0]
                if bound in wanted and bound not in used:
                    self._unused_imports[alias] = imp


def apply_scheduled_imports(context: CodemodContext, tree: cst.Module) -> cst.Module:
    """Add and remove the imports the transforms scheduled on ``context``."""
    for key, visitor in (
        (AddImportsVisitor.CONTEXT_KEY, _AddImports),
        (RemoveImportsVisitor.CONTEXT_KEY, _RemoveImports),
    ):
        if context.scratch.get(key):
            tree = visitor(context).transform_module(tree)
            context.scratch.pop(key, None)
    return tree


def blank_lines(count: int) -> List[cst.EmptyLine]:
    return [cst.EmptyLine() for _ in range(count)]


def at_least_two_blank(lines: Sequence[cst.EmptyLine]) -> List[cst.EmptyLine]:
    """Leading lines with at least two blank lines first (PEP 8 after a function)."""
    lines = list(lines)
    blanks = 0
    for line in lines:
        if line.comment is not None:
            break
        blanks += 1
    return blank_lines(max(0, 2 - blanks)) + lines


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return m.matches(
        stmt,
        m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]),
    )


def _preamble_name(stmt: cst.CSTNode) -> str:
    """``x`` of a one-name assignment statement ``x = ...``, else ""."""
    if m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])):
        return stmt.body[0].targets[0].target.value
    return ""


def _is_global_decl(stmt: cst.CSTNode) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Global() | m.Nonlocal()]))


def _is_import(stmt: cst.CSTNode) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))


def header_end(body: Sequence[cst.CSTNode]) -> int:
    """Where dp2ddp's helpers, the rank preamble and a module-level script's
    process-group setup go: after the module's leading docstring and imports,
    before its first code -- so that code between imports (``loader = ...``,
    then ``import torchvision``) already finds them.  When torch itself is only
    imported after some code, after that import (the setup needs torch)."""
    at = 0
    for index, stmt in enumerate(body):
        if _is_import(stmt) or (index == 0 and _is_docstring(stmt)) or _is_guarded_import(stmt):
            at = index + 1
        elif _is_path_setup(stmt) and any(_is_import(s) for s in body[index + 1 :]):
            continue  # ``sys.path.insert(0, ...)`` between imports: part of them
        else:
            break
    if not any(_binds_torch(stmt) for stmt in body[:at]):
        for index in range(at, len(body)):
            if isinstance(body[index], (cst.FunctionDef, cst.ClassDef)):
                break
            if _binds_torch(body[index]):
                return index + 1
    return at


def _is_path_setup(stmt: cst.CSTNode) -> bool:
    """``sys.path.insert(0, "lib")``, ``sys.path.append(...)``, ``site.addsitedir(...)``,
    ``sys.path += [...]``: what scripts do between their imports."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return P.dotted_name(small.value.func) in N.SYS_PATH_EDITS
    return isinstance(small, cst.AugAssign) and P.dotted_name(small.target) == "sys.path"


def _is_guarded_import(stmt: cst.CSTNode) -> bool:
    """``try: import x`` / ``except ImportError: ...``."""
    return isinstance(stmt, cst.Try) and all(_is_import(s) for s in stmt.body.body)


def _binds_torch(stmt: cst.CSTNode) -> bool:
    """``import torch`` (or ``import torch.nn``, ``import torch as T``) at this statement."""
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Import()])) and any(
        P.dotted_name(alias.name).split(".")[0] == "torch" for alias in stmt.body[0].names
    )


SYNC_BATCHNORM = '''
def {name}(model):
    """The model with SyncBatchNorm layers (added by dp2ddp --sync-bn).

    Each BatchNorm layer normalises over the whole global batch instead of this
    process's share.  SyncBatchNorm has no CPU kernel: on CPU (Gloo) the model
    keeps its BatchNorm layers.
    """
    if torch.cuda.is_available():
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model
'''.lstrip("\n")


def _one_line(message: str) -> str:
    """``message`` with the line breaks of the code it quotes folded (as the code
    would read on one line: no space inside brackets, no trailing comma)."""
    if "\n" not in message and "\r" not in message:
        return message
    message = re.sub(r",?\s*[\r\n]\s*([)\]}])", r"\1", message)
    message = re.sub(r"([(\[{])\s*[\r\n]\s*", r"\1", message)
    return re.sub(r"\s*[\r\n]+\s*", " ", message)
