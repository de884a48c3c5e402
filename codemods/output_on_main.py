"""DDP301 output-on-main: print, log and report from the main process only.

Every DDP process runs the same loop, so every ``print`` and progress log shows
up N times, TensorBoard gets N event files and wandb N runs (D1).  This puts:

* runs of ``print(...)``, ``logging.info/debug`` and ``logger.info/debug`` calls,
  ``writer.add_*()`` on a TensorBoard ``SummaryWriter`` and ``wandb.*`` calls behind
  one ``if dist.get_rank() == 0:``;
* ``SummaryWriter(...)`` itself on the main process:
  ``writer = SummaryWriter(log_dir) if dist.get_rank() == 0 else None``; a wandb
  run object likewise (``run = wandb.init(...) if dist.get_rank() == 0 else None``,
  its ``run.log(...)`` calls behind the check) -- when the run is used only
  through such calls; otherwise the ``wandb.init`` is reported for a human;
* ``tqdm(...)`` progress bars off on the other ranks: ``tqdm(loader, disable=dist.get_rank() != 0)``.

A writer made on the main process only is None on the others: every other use of
it that every rank runs (``_writes.unguarded_uses``, lint's DDP301 decision) --
``log_dir = writer.log_dir``, ``self.writer.add_scalar("lr", sched.get_lr()[0], step)``
in a trainer's method, a call in a loop over ``named_parameters()``, in the function
it is handed to -- goes behind the check too (the whole statement: a call, or an
assignment nothing else reads), or is reported.

Warnings and errors keep coming from every rank (a rank's own problem matters).
A print whose arguments call into user code (``print(evaluate(model))``) is not
guarded: the call may run the DDP model, which every rank must reach.
"""

from __future__ import annotations

import ast
from typing import Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from . import _writes as W
from ._bridge import byte_offset
from ._program import runs_only_on_main_by_its_callers
from ._facts import WRITING_METHODS
from ._guard import MainProcessGuard, single_call


class OutputOnMainProcess(MainProcessGuard):
    CODE = "DDP301"
    NAME = "output-on-main"
    DESCRIPTION = "Print, log, TensorBoard and wandb output from the main process only."
    TRIGGERS = ("print", "echo", "info", "debug", "tqdm", "SummaryWriter", "wandb")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._writers: Set[str] = set()
        #: progress bars (``bar = tqdm(loader, disable=...)``): ``bar.write()`` prints
        #: whatever ``disable`` says
        self._bars: Set[str] = set()
        #: wandb run objects (``run = wandb.init()``) used only as ``run.log(...)`` statements
        self._runs: Set[str] = set()
        #: the ``wandb.init`` assignments whose run is used otherwise (``run.name``)
        self._runs_elsewhere: Set[cst.Assign] = set()
        self._noted: Set[cst.CSTNode] = set()
        #: the writers this makes main-process-only (and the parameters they are handed to)
        self._main_only: Set[str] = set()
        #: (line, byte column) of the statements holding a use of one of them that every rank runs
        self._use_statements: Set[Tuple[int, int]] = set()

    def visit_Module(self, node: cst.Module) -> None:
        for assign in P.find(node, cst.Assign):
            value = assign.value.body if isinstance(assign.value, cst.IfExp) else assign.value
            if self.is_call(value, N.SUMMARY_WRITER):
                for target in assign.targets:
                    name = P.dotted_name(target.target)
                    if name:
                        self._writers.add(name)
                        if self._region_ok(assign.value):
                            self._main_only.add(name)  # (None on the other ranks once converted)
            elif self.is_call(value, N.TQDM):
                for target in assign.targets:
                    name = P.dotted_name(target.target)
                    if name:
                        self._bars.add(name)
            elif self.is_call(value, N.WANDB_INIT):
                names = [t.target.value for t in assign.targets if isinstance(t.target, cst.Name)]
                if len(names) == len(assign.targets) and all(self._only_logged(node, n) for n in names):
                    self._runs.update(names)
                else:
                    self._runs_elsewhere.add(assign)
        if self._main_only:
            self._find_writer_uses()

    # -- the other uses of a writer made on the main process only ---------------
    def _key(self, node: cst.CSTNode) -> Tuple[int, int]:
        line, column = self.position(node)
        return line, byte_offset(self.ast_source.lines, line, column)

    def _find_writer_uses(self) -> None:
        """Each use of a main-process-only writer that every rank runs (lint's
        ``unguarded_uses``): its statement is guarded (``_writer_use``) -- or, where
        that cannot be done, reported here."""
        src = self.ast_source
        self._main_only = W.main_only_names(src, self._main_only)
        self._writers |= self._main_only
        statements = {}
        for stmt in P.find(self.module, cst.SimpleStatementLine, cst.BaseCompoundStatement):
            statements.setdefault(self._key(stmt), stmt)
        for use in W.unguarded_uses(src, self._main_only):
            stmt = next(
                (statements[(a.lineno, a.col_offset)] for a in [use, *src.ancestors(use)]
                 if isinstance(a, ast.stmt) and (a.lineno, a.col_offset) in statements),
                None,
            )
            if stmt is None:
                continue
            key = self._key(stmt)
            if key in self._use_statements:
                continue
            self._use_statements.add(key)
            block = self.parent(stmt)
            if block is None or not self.guardable_block(block) or self._starts(stmt) is None:
                name = A.dotted(use)
                self.manual(
                    stmt,
                    W.MAIN_ONLY_USE_MESSAGE.format(name=name).replace(
                        "(made there only)", "(dp2ddp makes it there only)"
                    ),
                    code="DDP309",
                )

    def _writer_use(self, stmt: cst.BaseStatement) -> Optional[str]:
        """Why a statement that uses a main-process-only writer may go behind the
        check: an assignment of a value that computes nothing (a tensor's statistics
        and the learning rate at most) to names nothing else in the file reads."""
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and self._key(stmt) in self._use_statements):
            return None
        small = stmt.body[0]
        if not isinstance(small, cst.Assign) or not self._loggable(small.value):
            return None
        targets = {P.dotted_name(t.target) for t in small.targets}
        if "" in targets:
            return None
        own = {id(t.target) for t in small.targets}
        for target in small.targets:
            if isinstance(target.target, cst.Name):
                # a plain name: its scope's reads of this binding (another function's
                # parameter of the same name is another variable)
                scope = self.get_metadata(ScopeProvider, target.target, None)
                name = target.target.value
                assignments = list(scope.assignments[name]) if scope is not None else []
                if len(assignments) != 1 or assignments[0].references:
                    return None  # read (or bound again) elsewhere: it would be missing on the other ranks
            elif any(
                id(node) not in own and P.dotted_name(node) == P.dotted_name(target.target)
                for node in P.find(self.module, cst.Attribute)
            ):
                return None  # (``self.log_file`` read in another method)
        return "the TensorBoard writer exists on the main process only: so does what is read from it"

    def _loggable(self, expr: cst.BaseExpression) -> bool:
        """Computes nothing that every rank must run: harmless calls, a tensor's
        statistics, the learning rate, the writer's own methods."""
        for call in P.find(expr, cst.Call):
            func = call.func
            if isinstance(func, cst.Name) and func.value in N.HARMLESS_FUNCS:
                continue
            if isinstance(func, cst.Attribute) and (
                func.attr.value in N.HARMLESS_METHODS or func.attr.value in W.LOGGED_VALUE_METHODS
                or P.dotted_name(func.value) in self._writers
            ):
                continue
            return False
        return True

    @staticmethod
    def _only_logged(module: cst.Module, name: str) -> bool:
        """``name`` is used only as the receiver of whole-statement calls
        (``run.log({...})``, ``run.finish()``) and assigned only from ``wandb.init``:
        ``None`` on the other ranks then never reaches anything."""
        uses = sum(1 for n in P.find(module, cst.Name) if n.value == name)
        targets = sum(
            1 for a in P.find(module, cst.Assign) for t in a.targets
            if isinstance(t.target, cst.Name) and t.target.value == name
        )
        calls = sum(
            1 for e in P.find(module, cst.Expr)
            if isinstance(e.value, cst.Call) and isinstance(e.value.func, cst.Attribute)
            and isinstance(e.value.func.value, cst.Name) and e.value.func.value.value == name
        )
        # ``if run is not None:`` / ``if run:``: None-safe already
        checks = sum(
            1 for c in P.find(module, cst.Comparison)
            if m.matches(c.left, m.Name(name)) and len(c.comparisons) == 1
            and isinstance(c.comparisons[0].operator, (cst.Is, cst.IsNot))
            and m.matches(c.comparisons[0].comparator, m.Name("None"))
        ) + sum(1 for i in P.find(module, cst.If) if m.matches(i.test, m.Name(name)))
        return uses == targets + calls + checks

    def starts(self, stmt: cst.BaseStatement) -> Optional[str]:
        why = self._starts(stmt)
        if why is None:
            self._note_impure(stmt)
        return why

    def _to_a_rank_file(self, call: cst.Call) -> bool:
        """``print(..., file=f)`` to this rank's own file (``_analysis.prints_to_a_rank_file``,
        lint's DDP301 test)."""
        if not any(a.keyword is not None and a.keyword.value == "file" for a in call.args):
            return False
        node = self.ast_call(call)
        return node is not None and A.prints_to_a_rank_file(self.ast_source, node)

    def _note_impure(self, stmt: cst.BaseStatement) -> None:
        """Output whose arguments compute (``print(evaluate(model, loader))``) stays
        on every rank -- the computation may be a collective or a DDP forward that
        every rank must run -- and is said so, once."""
        call = single_call(stmt)
        if call is None or stmt in self._noted:
            return
        output = self.is_call(call, N.PRINT) and not self._to_a_rank_file(call) or self._logging_chatter(call) or any(
            N.is_wandb(n) for n in self.qnames(call.func)
        )
        if output and not all(P.is_pure(a.value) for a in call.args):
            self._noted.add(stmt)
            self.note(
                call,
                "output left on every rank: its arguments compute something every rank may need "
                "to run; compute the value first, then print it under a main-process check",
            )

    def _starts(self, stmt: cst.BaseStatement) -> Optional[str]:
        call = single_call(stmt)
        if call is None:
            return self._writer_use(stmt)
        if self._writes_from_the_writer(stmt, call):
            return (
                f"{P.dotted_name(call.func)}() (another module) only writes files, at a path read from the "
                "TensorBoard writer, which exists on the main process only: so does this call"
            )
        if self._names_the_rank(call):
            return None
        if self.is_call(call, N.PRINT) and self._to_a_rank_file(call):
            return None  # print(..., file=f) to this rank's own file: every rank writes its own
        if self.is_call(call, N.PRINT) and all(P.is_pure(a.value) for a in call.args):
            return "print from the main process only"
        if self._logging_chatter(call) and all(P.is_pure(a.value) for a in call.args):
            return "log progress from the main process only"
        if self._bar_write(call) and all(P.is_pure(a.value) for a in call.args):
            return "tqdm's write() prints on every rank (disable= does not stop it): main process only"
        if isinstance(call.func, cst.Attribute) and P.dotted_name(call.func.value) in self._writers:
            if all(self._loggable(a.value) for a in call.args):
                return "TensorBoard writes from the main process only"
        wandb = any(N.is_wandb(n) for n in self.qnames(call.func)) or (
            isinstance(call.func, cst.Attribute) and P.dotted_name(call.func.value) in self._runs
        )
        if wandb and all(P.is_pure(a.value) for a in call.args):
            return "wandb from the main process only"
        return None

    def _writes_from_the_writer(self, stmt: cst.BaseStatement, call: cst.Call) -> bool:
        """``save_config_file(self.writer.log_dir, self.args)``: a use of a writer made
        on the main process only, in a call of another module's function that only
        writes files (``FileRole.imported_writing_functions``), whose arguments compute
        nothing but paths and state dicts (SimCLR's checkpoint in the writer's folder)."""
        if self._key(stmt) not in self._use_statements or not isinstance(call.func, cst.Name):
            return False
        name = call.func.value
        if name not in self.role.imported_writing_functions or not any(
            q.rsplit(".", 1)[-1] == name and "." in q for q in self.qnames(call.func)
        ):
            return False
        for inner in P.find(call, cst.Call):
            if inner is call:
                continue
            func = inner.func
            if isinstance(func, cst.Attribute) and func.attr.value in WRITING_METHODS:
                continue
            if any(q.startswith("os.path.") for q in self.qnames(func)):
                continue
            return False
        return True

    def _names_the_rank(self, call: cst.Call) -> bool:
        """``print(f"[GPU{gpu_id}] epoch {epoch}")``: meant per rank (lint's DDP301
        does not report it either: the same ``_analysis.is_rank_expr``)."""
        text = self.module.code_for_node(call).lower()
        if "rank" not in text and "gpu" not in text:
            return False  # (the cheap test first)
        node = self.ast_call(call)
        src = self.ast_source
        return node is not None and any(
            A.is_rank_expr(src, n) for arg in (*node.args, *(k.value for k in node.keywords)) for n in ast.walk(arg)
        )

    def _bar_write(self, call: cst.Call) -> bool:
        """``tqdm.write(msg)`` or ``bar.write(msg)`` of a bar made here."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "write"):
            return False
        return P.dotted_name(func.value) in self._bars or self.is_ref(func.value, N.TQDM)

    def _logging_chatter(self, call: cst.Call) -> bool:
        if self.is_ref(call.func, N.LOGGING_CHATTER):
            return True
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in N.LOGGER_CHATTER_METHODS):
            return False
        if N.is_logger_name(P.dotted_name(func.value)):
            return True  # a project's own logger (``logger = create_logger(cfg)``)
        if not isinstance(func.value, cst.Name):
            return False
        scope = self.get_metadata(ScopeProvider, call, None)
        if scope is None or func.value.value not in scope:
            return False
        assignments = scope[func.value.value]
        for assignment in assignments:
            node = getattr(assignment, "node", None)
            assign = self._assign_of(node) if isinstance(node, cst.Name) else None
            if assign is None or not self.is_call(assign.value, N.LOGGER_FACTORY):
                return False
        return bool(assignments)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.is_call(original_node, N.TQDM) and not any(
            a.keyword is not None and a.keyword.value == "disable" for a in original_node.args
        ) and self._region_ok(original_node):
            self.changed(original_node, "progress bar on the main process only")
            test = self.other_process_test()
            arg = P.keyword_arg("disable", test)
            args = list(updated_node.args)
            if args:
                last = args[-1]
                trailing = last.comma
                args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                arg = arg.with_changes(comma=trailing)
            return updated_node.with_changes(args=[*args, arg])
        if self.is_call(original_node, N.SUMMARY_WRITER) and self._region_ok(original_node):
            parent = self.parent(original_node)
            if isinstance(parent, cst.Assign):
                self.changed(original_node, "TensorBoard writer on the main process only")
                return cst.IfExp(
                    test=self.main_process_test(),
                    body=updated_node,
                    orelse=cst.Name("None"),
                )
        if self.is_call(original_node, N.WANDB_INIT):
            parent = self.parent(original_node)
            if isinstance(parent, cst.IfExp) and parent.body is original_node:
                parent = self.parent(parent)  # run = wandb.init(...) if use_wandb else None
                if parent not in self._runs_elsewhere:
                    return updated_node  # (the condition gets the main-process test)
            if parent in self._runs_elsewhere:
                self.manual(
                    original_node,
                    "every rank starts its own wandb run here and the run object is used beyond "
                    "run.log() calls; start it on rank 0 only (wandb.init(mode=\"disabled\") on the others)",
                )
            elif isinstance(parent, cst.Assign) and self._region_ok(original_node):
                self.changed(original_node, "wandb run on the main process only")
                return cst.IfExp(
                    test=self.main_process_test(),
                    body=updated_node,
                    orelse=cst.Name("None"),
                )
        return updated_node

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """``writer = SummaryWriter(d) if SummaryWriter is not None else None`` (an
        optional tensorboard): the main-process test joins the condition."""
        body = original_node.body
        if not (
            isinstance(self.parent(original_node), cst.Assign)
            and m.matches(original_node.orelse, m.Name("None"))
            and isinstance(body, cst.Call)
            and (self.is_call(body, N.SUMMARY_WRITER) or self.is_call(body, N.WANDB_INIT) and self._parent_assign_ok(original_node))
            and self._region_ok(original_node)
            and not P.is_main_process_check(self, original_node.test)
        ):
            return updated_node
        what = "TensorBoard writer" if self.is_call(body, N.SUMMARY_WRITER) else "wandb run"
        self.changed(original_node, f"{what} on the main process only")
        test = updated_node.test
        if isinstance(test, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)) and not test.lpar:
            test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        main = self.main_process_test()
        if isinstance(main, cst.BooleanOperation):
            main = main.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node.with_changes(test=cst.BooleanOperation(left=test, operator=cst.And(), right=main))

    def _parent_assign_ok(self, node: cst.CSTNode) -> bool:
        return self.parent(node) not in self._runs_elsewhere and all(
            isinstance(t.target, cst.Name) and t.target.value in self._runs for t in self.parent(node).targets
        )

    def _region_ok(self, node: cst.CSTNode) -> bool:
        stmt = self.statement_of(node)
        block = self.parent(stmt) if stmt is not None else None
        return (
            block is not None
            and self.guardable_block(block)
            and not P.under_main_process_check(self, node)
            and not self._made_on_main_by_callers(node)
        )

    def _made_on_main_by_callers(self, node: cst.CSTNode) -> bool:
        """The writer or run ``node`` makes is made in a function (a class's
        ``__init__``) that only the main process calls, here or in the files that
        import this one: lint's decision (``runs_only_on_main_by_its_callers``)."""
        call = node.body if isinstance(node, cst.IfExp) else node
        if not isinstance(call, cst.Call):
            return False
        found = self.ast_call(call)
        return found is not None and runs_only_on_main_by_its_callers(self.ast_source, found)

