"""DDP102 set-epoch: call ``sampler.set_epoch(epoch)`` at the top of every epoch.

A ``DistributedSampler`` seeds its shuffle with the epoch number; without
``set_epoch`` every epoch replays the same order, silently hurting the model
(B2).  For each loop over a training loader this finds the epoch loop around it
(``for epoch in range(...)``), or the function's ``epoch`` parameter, or the
epoch loop of the caller that passes the loader in, and inserts::

    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)

When the loader comes from elsewhere (a parameter, another module's factory)
the call is guarded, since only a ``DistributedSampler`` has ``set_epoch``::

        if isinstance(train_loader.sampler, DistributedSampler):
            train_loader.sampler.set_epoch(epoch)

A ``DataLoader(...)`` built in the header of a loop inside the epoch loop gets its
``DistributedSampler`` built before that loop, as ``train_sampler``, with
``train_sampler.set_epoch(epoch)`` (a new sampler every epoch starts at epoch 0).

Loops counted in iterations (``while step < max_steps``) are reported instead.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from . import _analysis as A
from . import _names as N
from . import _loaders as L
from . import _patterns as P
from ._bridge import byte_offset
from ._base import FileRole, Transform, _is_docstring
from .sampler import _arg, _calls_backward, _inside_wrappers, _iterated

_COLLECTIONS = (cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_EPOCH = re.compile(r"(?i)^(epoch|ep|e|epoch_?(idx|id|num|i|no)|cur_?epoch|current_?epoch|i_?epoch)$")


class SetEpoch(Transform):
    CODE = "DDP102"
    NAME = "set-epoch"
    DESCRIPTION = "Call sampler.set_epoch(epoch) at the top of every epoch loop."
    TRIGGERS = ("for ", "iter(")

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: (statement or function to insert into, loader code) already planned
        self._planned: Set[Tuple[cst.CSTNode, str]] = set()
        self._at_top: Dict[cst.CSTNode, List[str]] = {}
        self._before_stmt: Dict[cst.CSTNode, List[str]] = {}
        self._all_calls: Optional[List[cst.Call]] = None
        self._iter_reported: Set[str] = set()
        #: sampler built in a loop header -> the name it is built under before the loop
        self._hoisted: Dict[cst.CSTNode, cst.Name] = {}
        self._hoisted_names: Set[str] = set()

    # ------------------------------------------------------------------ finding
    def _ast_loop(self, loop: cst.For) -> Optional[ast.For]:
        """The ``ast`` loop at the place of ``loop`` (for the recognisers shared with lint)."""
        line, column = self.position(loop)
        src = self.ast_source
        found = L.node_at(src, (ast.For, ast.AsyncFor), line, byte_offset(src.lines, line, column))
        return found if isinstance(found, (ast.For, ast.AsyncFor)) else None

    def _loaders_of(self, loop: cst.For) -> List[str]:
        """The loaders behind what ``loop`` iterates (``_loaders.loaders_behind``):
        ``loader`` of ``bar = tqdm(loader)`` or of ``prefetcher = Prefetcher(loader)``."""
        found = self._ast_loop(loop)
        if found is None:
            return [P.dotted_name(x) for x in _iterated(loop.iter)]
        return L.loaders_behind(self.ast_source, found.iter, self.ast_source.function_of(found))

    def visit_Module(self, node: cst.Module) -> None:
        self._report_all_rank_local_stops()

    def visit_For(self, node: cst.For) -> None:
        for call in _inside_wrappers(node.iter):
            if isinstance(call, cst.Call) and self.is_call(call, N.DATA_LOADER):
                self._loader_in_the_header(node, call)
        for name in self._loaders_of(node):
            if name == L.UNRESOLVED:
                if _calls_backward(node.body) and not _calls_set_epoch(self.module):
                    what = self.module.code_for_node(node.iter)
                    self.manual(
                        node,
                        f"this training loop iterates {what}, an object built around a DataLoader that "
                        "cannot be told here: call set_epoch(epoch) on that DataLoader's sampler "
                        "(loader.sampler.set_epoch(epoch)) at the start of every epoch",
                    )
                continue
            if not name:
                continue
            loader = cst.parse_expression(name)
            known = self._known_loader(loader, node)
            if known == "eval" or known == "other":
                continue
            if known is None and not (
                P.is_train_name(name.rsplit(".", 1)[-1]) or _calls_backward(node.body)
            ):
                continue
            found = self._ast_loop(node)
            if found is not None and L.statistics_pass(self.ast_source, found):
                self.manual(
                    node,
                    f"this pass over the sharded training loader ({name}) computes statistics from this "
                    "rank's shard only; iterate the dataset (unsharded) or all_reduce the sums",
                    code="DDP101",
                )
                continue
            self._place(node, name, guarded=known != "ours")

    def visit_Call(self, node: cst.Call) -> None:
        """``it = iter(train_loader)`` ... ``next(it)``: passes over the data start
        wherever the iterator runs out, which only the author knows."""
        if not (m.matches(node.func, m.Name("iter")) and len(node.args) == 1):
            return
        loader = node.args[0].value
        name = P.dotted_name(loader)
        if not name or name in self._iter_reported:
            return
        arg = self.parent(node)
        if isinstance(arg, cst.Arg) and m.matches(self.parent(arg), m.Call(func=m.Name("next"))):
            return  # next(iter(loader)): one batch peeked (its size), not a pass over the data
        known = self._known_loader(loader, node)
        scope = self.enclosing_function(node)
        if known != "ours" and not (known is None and (
            P.is_train_name(name.rsplit(".", 1)[-1]) or scope is not None and _calls_backward(scope)
        )):
            return  # (a loader of another module read in a function that trains: StarGAN's Solver.train)
        if _calls_set_epoch(self.enclosing_function(node) or self.module):
            return
        self._iter_reported.add(name)
        restarts = self._restarts(node, name)
        if restarts:
            # ``except StopIteration: it = iter(loader)``: each restart is a new pass --
            # the sampler counts its own passes (its ``epoch`` attribute)
            sampler = f"{name}.sampler"
            for stmt in restarts:
                self._plan(
                    stmt, name, f"{sampler}.epoch + 1", guarded=known != "ours", where=("before", stmt)
                )
            return
        self.manual(
            node,
            f"{name} is consumed through iter()/next(): call {name}.sampler.set_epoch(n) "
            "each time a new pass over the data starts, or every pass repeats the same order",
        )

    def _catches_the_end(self, handler: cst.ExceptHandler) -> bool:
        """``except StopIteration:`` -- or a bare ``except:`` / ``except Exception:`` around
        a ``next(it)`` (StarGAN's): the iterator ran out."""
        if handler.type is None or P.dotted_name(handler.type) in ("Exception", "BaseException"):
            attempt = self.parent(handler)
            return isinstance(attempt, cst.Try) and any(
                m.matches(c.func, m.Name("next")) for c in P.find(attempt.body, cst.Call)
            )
        types = [e.value for e in handler.type.elements] if isinstance(handler.type, cst.Tuple) else [handler.type]
        return any(P.dotted_name(n).rsplit(".", 1)[-1] == "StopIteration" for n in types)

    def _restarts(self, first: cst.Call, name: str) -> List[cst.BaseStatement]:
        """The statements that start a new pass over ``name`` when its iterator runs
        out -- ``it = iter(loader)`` in an ``except StopIteration:`` handler -- where
        every other ``iter(name)`` of the function starts the first pass, outside any
        loop (an iteration-based loop's shape: ssd.pytorch, many GAN trainers).  Empty
        when the passes start elsewhere (then the author places set_epoch)."""
        scope = self.enclosing_function(first) or self.module
        restarts, others = [], []
        for call in P.find(scope, cst.Call):
            if not (m.matches(call.func, m.Name("iter")) and len(call.args) == 1
                    and P.dotted_name(call.args[0].value) == name):
                continue
            handler = next((a for a in self.ancestors(call) if isinstance(a, (cst.ExceptHandler, cst.FunctionDef))), None)
            if isinstance(handler, cst.ExceptHandler) and self._catches_the_end(handler):
                stmt = self.statement_of(call)
                if stmt is not None:
                    restarts.append(stmt)
                continue
            others.append(call)
        in_a_loop = any(
            isinstance(a, (cst.For, cst.While)) for call in others for a in self.ancestors(call)
            if self.enclosing_function(a) is self.enclosing_function(first)
        )
        return [] if in_a_loop else restarts

    def _loader_in_the_header(self, batch_loop: cst.For, loader: cst.Call) -> None:
        """``for x, y in DataLoader(ds, sampler=DistributedSampler(ds)):`` inside an
        epoch loop: a new sampler every epoch, each at epoch 0 -- the same order every
        epoch.  The sampler is built before the loop, and set to the epoch::

            train_sampler = DistributedSampler(ds)
            train_sampler.set_epoch(epoch)
            for x, y in DataLoader(ds, sampler=train_sampler):
        """
        sampler = _arg(loader, 3, "sampler")
        if sampler is None or not self.is_call(sampler, N.DISTRIBUTED_SAMPLER):
            return
        given = any(arg.value is sampler for arg in loader.args)  # (not in a **{"sampler": ...})
        for around in self.ancestors(batch_loop):
            if around is batch_loop:
                continue
            if isinstance(around, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                return  # one pass over the data: a fresh sampler is right
            if isinstance(around, (cst.For, cst.While)):
                break
        epoch_loop = self._epoch_loop(batch_loop)
        if epoch_loop is None or _calls_set_epoch(epoch_loop.body) or not given:
            self.manual(
                batch_loop,
                "DataLoader built in the loop header: a new DistributedSampler on every pass, each "
                "at epoch 0, so every pass has the same order; build the sampler before the loop "
                "and call its set_epoch(epoch) at the start of every pass",
            )
            return
        assert isinstance(epoch_loop.target, cst.Name)
        name = self.free_name("train_sampler", batch_loop, taken=self._hoisted_names, sep="_")
        self._hoisted_names.add(name)
        self._hoisted[sampler] = cst.Name(name)
        self.insert_before(
            batch_loop,
            [
                cst.parse_statement(f"{name} = {self.module.code_for_node(sampler)}\n"),
                cst.parse_statement(f"{name}.set_epoch({epoch_loop.target.value})\n"),
            ],
        )
        self.changed(
            batch_loop,
            f"the DataLoader's DistributedSampler built before the loop, as {name}, with "
            f"{name}.set_epoch({epoch_loop.target.value}): built in the loop header, it would "
            "shuffle every epoch the same way",
        )

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node.value in self._hoisted:
            return updated_node.with_changes(value=self._hoisted[original_node.value])
        return updated_node

    def _known_loader(self, loader: cst.BaseExpression, at: cst.CSTNode) -> Optional[str]:
        """"ours" (a DataLoader with a DistributedSampler built here), "eval", "other", None."""
        if not isinstance(loader, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, at, None)
        if scope is None:
            return None
        kinds = set()
        for assignment in scope[loader.value]:
            node = getattr(assignment, "node", None)
            if not isinstance(node, cst.Name):
                return None
            assign = self._assign_of(node)
            if assign is not None and isinstance(assign.value, _COLLECTIONS):
                kinds.add("other")  # a list of loaders, not a loader
                continue
            if assign is None or not self.is_call(assign.value, N.DATA_LOADER):
                return None
            sampler = _arg(assign.value, 3, "sampler")
            if isinstance(sampler, cst.Name):  # train_sampler = DistributedSampler(...)
                sampler = self.only_value(sampler, pure=False) or sampler
            if sampler is not None and self.is_call(sampler, N.DISTRIBUTED_SAMPLER):
                kinds.add("ours")
            elif sampler is not None or _arg(assign.value, 4, "batch_sampler") is not None:
                kinds.add("other")
            elif P.is_eval_name(loader.value):
                kinds.add("eval")
            else:
                kinds.add("other")
        return kinds.pop() if len(kinds) == 1 else None

    def _place(self, batch_loop: cst.For, loader: str, guarded: bool) -> None:
        epoch_loop = self._epoch_loop(batch_loop)
        if epoch_loop is not None:
            epoch = epoch_loop.target
            assert isinstance(epoch, cst.Name)
            if _calls_set_epoch(epoch_loop.body):
                return
            self._plan_in_loop(epoch_loop, batch_loop, loader, epoch.value, guarded)
            return
        func = self.enclosing_function(batch_loop)
        if func is not None:
            if _calls_set_epoch(func.body):
                return
            param = _epoch_param(func)
            if param is not None:
                self._plan(func, loader, param, guarded, where=self._top_or_before(func, batch_loop, loader))
                return
            if (
                self._plan_in_callers(func, batch_loop, loader)
                or self._plan_in_method_callers(func, loader)
                or self._plan_in_global_callers(func, loader)
            ):
                return
        if self._in_while(batch_loop):
            self.manual(
                batch_loop,
                "training loop counted in iterations, not epochs: call "
                f"{loader}.sampler.set_epoch(n) each time a pass over the data starts",
            )
        elif func is not None and not any(
            m.matches(c.func, m.Name(func.name.value)) for c in self.module_calls
        ) and not any(isinstance(anc, cst.ClassDef) for anc in self.ancestors(func)):
            # a per-epoch function that another module calls (``for epoch in ...:
            # train_one_epoch(loader, model, opt)`` in train.py)
            self.manual(
                batch_loop,
                f"{func.name.value}() runs one pass over {loader}, and its epoch loop is not in this "
                f"file: call {loader}.sampler.set_epoch(epoch) where it is called, at the start "
                "of every epoch (or give it an epoch parameter and convert again)",
            )
        else:
            self.manual(
                batch_loop,
                f"no epoch loop found around this training loop: call "
                f"{loader}.sampler.set_epoch(epoch) at the start of every epoch",
            )

    def _report_all_rank_local_stops(self) -> None:
        """Every rank-local stop of the file (the epoch loop may be in a method that
        calls the training one, or in a function that is handed the loader)."""
        if "backward" not in self.module_code or not ("break" in self.module_code or "return" in self.module_code):
            return
        for stop, names in sorted(A.rank_local_stops(self.ast_source), key=lambda found: found[0].lineno):
            stmt = self.statement_at(stop.lineno)
            if stmt is not None:
                self.manual(
                    stmt,
                    f"the loop stops on a value computed from this rank's shard ({', '.join(sorted(names))}): "
                    "ranks may stop at different times and the others wait forever in their next "
                    "all-reduce; all_reduce the value (or decide on rank 0 and broadcast) first",
                    code="DDP307",  # lint's code for it (`dp2ddp rule DDP307`)
                )

    def _epoch_loop(self, batch_loop: cst.For) -> Optional[cst.For]:
        candidates = []
        for anc in self.ancestors(batch_loop):
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.While)):
                break
            if isinstance(anc, cst.For) and isinstance(anc.target, cst.Name):
                candidates.append(anc)
        for loop in candidates:
            if _EPOCH.match(loop.target.value):
                return loop
        for loop in candidates:
            if m.matches(loop.iter, m.Call(func=m.Name("range") | m.Name("trange"))):
                return loop
        return None

    def _in_while(self, node: cst.CSTNode) -> bool:
        for anc in self.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return False
            if isinstance(anc, cst.While):
                return True
        return False

    def _plan_in_loop(self, epoch_loop: cst.For, batch_loop: cst.For, loader: str, epoch: str, guarded: bool) -> None:
        where = self._top_or_before(epoch_loop, batch_loop, loader)
        self._plan(epoch_loop, loader, epoch, guarded, where)

    def _top_or_before(self, owner: cst.CSTNode, batch_loop: cst.For, loader: str):
        """Top of ``owner``'s body; right before the statement holding the batch
        loop when the loader is (re)built inside ``owner``; right before the batch
        loop itself when the name is bound on the way to it (``for loader in
        (a, b):``, an ``if`` that picks one), where the top would not know it."""
        body = owner.body
        assert isinstance(body, cst.IndentedBlock)
        holder = None
        for stmt in body.body:
            if _contains(stmt, batch_loop):
                holder = stmt
                break
        if holder is None:
            return ("top", owner)
        root = loader.split(".", 1)[0]
        if holder is not batch_loop and root in _bound_on_the_way(holder, batch_loop):
            return ("before", batch_loop)
        assigned_inside = any(loader in _assigned_names(stmt) for stmt in body.body[: body.body.index(holder)])
        return ("before", holder) if assigned_inside else ("top", owner)

    def _plan(self, owner: cst.CSTNode, loader: str, epoch: str, guarded: bool, where) -> None:
        key = (where[1], loader)
        if key in self._planned:
            return
        self._planned.add(key)
        code = self._code(loader, epoch, guarded)
        if where[0] == "top":
            self._at_top.setdefault(where[1], []).append(code)
        else:
            self.insert_before(where[1], [cst.parse_statement(code)])
        self.changed(owner, f"{loader}.sampler.set_epoch({epoch}) at the start of every epoch")

    def _code(self, loader: str, epoch: str, guarded: bool) -> str:
        call = f"{loader}.sampler.set_epoch({epoch})\n"
        if not guarded:
            return call
        sampler_cls = self.object_alias(
            "torch.utils.data.distributed", "DistributedSampler", N.DISTRIBUTED_SAMPLER
        )
        return f"if isinstance({loader}.sampler, {sampler_cls}):\n    {call}"

    def _plan_in_callers(self, func: cst.FunctionDef, batch_loop: cst.For, loader: str) -> bool:
        """The loader is a parameter of ``func``: find the epoch loops that call it."""
        params = [p.name.value for p in func.params.params]
        if loader not in params:
            return False
        index = params.index(loader)
        is_method = bool(params) and params[0] == "self"
        placed = False
        for call, arg in self._calls_to(func.name.value, index - (1 if is_method else 0), loader, is_method):
            arg_name = P.dotted_name(arg)
            if not arg_name:
                continue
            loop = self._epoch_loop_around(call)
            if loop is None:
                continue
            if _calls_set_epoch(loop.body):
                placed = True  # done already (an earlier run)
                continue
            known = self._known_loader(arg, call)
            if known in ("eval", "other") or known != "ours" and P.is_eval_name(arg_name.rsplit(".", 1)[-1]):
                continue  # (``run_epoch(model, val_loader)``: the same function evaluates)
            self._plan(loop, arg_name, loop.target.value, known != "ours", ("top", loop))
            placed = True
        return placed

    def _plan_in_global_callers(self, func: cst.FunctionDef, loader: str) -> bool:
        """``def train(): for x, y in loader: ...`` over a module-level loader, called
        as ``train()`` in an epoch loop (pytorch/examples' word_language_model):
        ``loader.sampler.set_epoch(epoch)`` at the top of that loop."""
        if "." in loader or loader in [p.name.value for p in func.params.params]:
            return False
        if any(P.dotted_name(t.target) == loader for a in P.find(func, cst.Assign) for t in a.targets):
            return False  # (a loader of the function's own)
        placed = False
        for call in self.module_calls:
            if not m.matches(call.func, m.Name(func.name.value)):
                continue
            loop = self._epoch_loop_around(call)
            if loop is None:
                continue
            if _calls_set_epoch(loop.body):
                placed = True
                continue
            known = self._known_loader(cst.Name(loader), call)
            if known in ("eval", "other"):
                continue
            self._plan(loop, loader, loop.target.value, known != "ours", ("top", loop))
            placed = True
        return placed

    def _epoch_loop_around(self, call: cst.Call) -> Optional[cst.For]:
        """The epoch loop (``for epoch in ...``, ``for _ in range(...)``) around a call
        in its function."""
        for anc in self.ancestors(call):
            if isinstance(anc, (cst.FunctionDef, cst.While)):
                return None
            if isinstance(anc, cst.For) and isinstance(anc.target, cst.Name) and (
                _EPOCH.match(anc.target.value) or m.matches(anc.iter, m.Call(func=m.Name("range")))
            ):
                return anc
        return None

    def _plan_in_method_callers(self, func: cst.FunctionDef, loader: str) -> bool:
        """``def train_epoch(self): for x, y in self.loader: ...`` called as
        ``self.train_epoch()`` in an epoch loop of another method of the class:
        ``self.loader.sampler.set_epoch(epoch)`` at the top of that loop."""
        params = [p.name.value for p in func.params.params]
        if not loader.startswith("self.") or not params or params[0] != "self":
            return False
        cls = next((a for a in self.ancestors(func) if isinstance(a, cst.ClassDef)), None)
        if cls is None:
            return False
        placed = False
        for call in P.find(cls, cst.Call):
            if not m.matches(call.func, m.Attribute(value=m.Name("self"), attr=m.Name(func.name.value))):
                continue
            loop = self._epoch_loop_around(call)
            if loop is None:
                continue
            if not _calls_set_epoch(loop.body):
                self._plan(loop, loader, loop.target.value, True, ("top", loop))
            placed = True
        return placed

    def _calls_to(self, name: str, index: int, keyword: str, is_method: bool):
        if self._all_calls is None:
            self._all_calls = self.module_calls
        found = []
        for call in self._all_calls:
            func = call.func
            called = func.attr.value if is_method and isinstance(func, cst.Attribute) else (
                func.value if isinstance(func, cst.Name) else None
            )
            if called != name:
                continue
            positional = [a for a in call.args if a.keyword is None and not a.star]
            by_keyword = [a.value for a in call.args if a.keyword is not None and a.keyword.value == keyword]
            if by_keyword:
                found.append((call, by_keyword[0]))
            elif 0 <= index < len(positional):
                found.append((call, positional[index].value))
        return found

    # ------------------------------------------------------------------ editing
    def on_leave(self, original_node, updated_node):  # type: ignore[override]
        result = super().on_leave(original_node, updated_node)
        if original_node in self._at_top and isinstance(result, (cst.For, cst.FunctionDef)):
            stmts = [cst.parse_statement(code) for code in self._at_top[original_node]]
            body = result.body
            assert isinstance(body, cst.IndentedBlock)
            items = list(body.body)
            at = 1 if isinstance(result, cst.FunctionDef) and items and _is_docstring(items[0]) else 0
            while at < len(items) and self.is_rank_preamble(items[at]):
                at += 1
            result = result.with_changes(body=body.with_changes(body=[*items[:at], *stmts, *items[at:]]))
        return result


def _epoch_param(func: cst.FunctionDef) -> Optional[str]:
    for param in [*func.params.params, *func.params.kwonly_params]:
        if _EPOCH.match(param.name.value) and param.name.value not in ("e",):
            return param.name.value
    return None


def _calls_set_epoch(node: cst.CSTNode) -> bool:
    return P.calls_method(node, "set_epoch")


def _contains(haystack: cst.CSTNode, needle: cst.CSTNode) -> bool:
    return any(n is needle for n in P.walk(haystack))


def _bound_on_the_way(holder: cst.CSTNode, batch_loop: cst.For) -> Set[str]:
    """Names that ``holder`` binds outside ``batch_loop``: loop targets, ``with ...
    as``, assignments -- a name the top of the epoch loop does not know yet."""
    names: Set[str] = set()

    def visit(node: cst.CSTNode) -> None:
        if node is batch_loop:
            return
        if isinstance(node, (cst.For, cst.CompFor)):
            names.update(P.dotted_name(e).split(".", 1)[0] for e in _flatten(node.target))
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            names.update(P.dotted_name(e).split(".", 1)[0] for e in _flatten(node.asname.name))
        elif isinstance(node, cst.AssignTarget):
            names.update(P.dotted_name(e).split(".", 1)[0] for e in _flatten(node.target))
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            names.add(P.dotted_name(node.target).split(".", 1)[0])
        elif isinstance(node, cst.NamedExpr):
            names.add(P.dotted_name(node.target).split(".", 1)[0])
        for child in node.children:
            visit(child)

    visit(holder)
    names.discard("")
    return names


def _assigned_names(stmt: cst.CSTNode) -> Set[str]:
    names: Set[str] = set()
    for target in P.find(stmt, cst.AssignTarget):
        names.update(P.dotted_name(e) for e in _flatten(target.target))
    return names


def _flatten(target):
    if isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _flatten(element.value)
    else:
        yield target
