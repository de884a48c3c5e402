"""DDP002 process-group-setup: join the process group at the entry point, leave it at the end.

``torchrun`` starts one process per GPU and sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE`` and the rendezvous address in their environment; each process must
join the process group before DDP, ``DistributedSampler`` or any collective is
used (A2), and pin its GPU with ``torch.cuda.set_device(local_rank)`` so that it
does not allocate on GPU 0 (A3).  At the end it leaves the group (A8).

This transform adds one helper to the entry file::

    def init_distributed():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:  # plain `python script.py`: a world of one
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))

and calls it first thing in the ``if __name__ == "__main__":`` block (or right
after the imports of a module-level script), with ``dist.barrier()`` and
``dist.destroy_process_group()`` at the end of that block (or of the script); a
``sys.exit(main())`` block, or one that ends calling a click command or a Typer app
(they exit the process themselves), leaves the group in a ``finally`` (no barrier
there: on an error the other ranks may never get to it).  Without torchrun the script still
runs as before, as a world of one.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from . import _patterns as P
from ._base import FileRole, Transform, at_least_two_blank, blank_lines, header_end

#: (the barrier: the ranks leave together -- destroying a group is collective on NCCL,
#: and a rank gone early can leave another in its last all-reduce.  It does not cure
#: a rarer abort at interpreter exit on Gloo, after the script is done -- "terminate
#: called without an active exception", SIGABRT, about one short run in twenty here,
#: with or without it: a Gloo worker thread frees a backward pass's last work, which
#: holds a Python object, while the interpreter finalizes; PyTorch's bug,
#: pytorch/pytorch#190489.  README, "Known issues".)
DESTROY_MESSAGE = (
    "destroy the process group at the end, after a barrier (no rank leaves while another "
    "still finishes its last all-reduce)"
)

HELPER = '''

def {name}():
    """Join the process group that torchrun set up (added by dp2ddp).

    NCCL on GPUs, Gloo on CPU.  Started without torchrun (plain `python`), the
    script runs as a world of one, as before.
    """
    backend = "nccl" if {torch}.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        {dist}.init_process_group(backend)
    else:
        {dist}.init_process_group(backend, store={dist}.HashStore(), rank=0, world_size=1)
    if {torch}.cuda.is_available():
        {torch}.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
'''


class ProcessGroupSetup(Transform):
    CODE = "DDP002"
    NAME = "process-group-setup"
    DESCRIPTION = "Initialise the process group (nccl/gloo) at the entry point and destroy it at the end."

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.is_entry and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._helper = "init_distributed"
        self._done = False

    def visit_Module(self, node: cst.Module) -> None:
        self._reuse = False
        for stmt in node.body:
            if _is_our_helper(stmt) and "init_process_group" in cst.Module(body=[stmt]).code:
                # added by an earlier run whose call was not kept (a review that quit early)
                self._helper, self._reuse = stmt.name.value, True
                return
        for candidate in ("init_distributed", "setup_distributed", "dp2ddp_init_distributed"):
            if self._free_global(candidate):
                self._helper = candidate
                break

    def _names(self) -> dict:
        AddImportsVisitor.add_needed_import(self.context, "os")
        return {"name": self._helper, "torch": self.torch(), "dist": self.dist()}

    def _helper_def(self) -> cst.FunctionDef:
        code = HELPER.format(**self._names())
        module = self.parse_code(code)
        func = module.body[0]
        assert isinstance(func, cst.FunctionDef)
        return func

    def _stmt(self, code: str) -> cst.BaseStatement:
        return cst.parse_statement(code)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if self.role.entry_kind != "main-block" or self._done or not P.is_main_guard(original_node):
            return updated_node
        if self.parent(original_node) is not self.module:
            return updated_node
        self._done = True
        names = self._names()
        body = list(updated_node.body.body)
        init = self._stmt(f"{names['name']}()")
        last = body[-1]
        if _exits(last) or self._exiting_command(last):
            # sys.exit(main()): leave the group on the way out
            destroy = self._stmt(f"{names['dist']}.destroy_process_group()")
            try_stmt = cst.Try(
                body=cst.IndentedBlock(body=body),
                finalbody=cst.Finally(body=cst.IndentedBlock(body=[destroy])),
            )
            new_body = [init, try_stmt]
            leaving = (
                "destroy the process group on the way out, in a finally (no barrier: on an error "
                "the other ranks may never reach it)"
            )
        else:
            # after ``args = parser.parse_args()`` when nothing before needs the group:
            # ``--help`` and a bad argument leave without joining one
            parsed = _after_argument_parsing(body, 0)
            parsed = parsed if parsed < len(body) else 0  # (nothing after the parsing: first, as before)
            new_body = [*body[:parsed], init, *body[parsed:], *self._leave_group(names)]
            leaving = DESTROY_MESSAGE
        self.changed(original_node, "join the process group first thing (nccl on GPU, gloo on CPU)")
        self.changed(original_node, leaving, code="DDP008")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=new_body))

    def _exiting_command(self, stmt: cst.BaseStatement) -> bool:
        """``cli()`` of a click command or group (``@click.group()``), or of a Typer
        app (``app = typer.Typer()``): it ends the process with ``sys.exit`` itself,
        so code after the call never runs."""
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Name()))])):
            return False
        name = stmt.body[0].value.func.value
        for top in self.module.body:
            if isinstance(top, cst.FunctionDef) and top.name.value == name:
                return any(
                    self.is_ref(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator, _CLICK_COMMANDS)
                    for d in top.decorators
                )
            if m.matches(top, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name(name))])])):
                value = top.body[0].value
                return isinstance(value, cst.Call) and self.is_ref(value.func, {"typer.Typer", "typer.main.Typer"})
        return False

    def _leave_group(self, names) -> list:
        """``dist.barrier()`` then ``dist.destroy_process_group()`` (see DESTROY_MESSAGE)."""
        return [self._stmt(f"{names['dist']}.barrier()"), self._stmt(f"{names['dist']}.destroy_process_group()")]

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        updated_node = super().leave_Module(original_node, updated_node)
        body = list(updated_node.body)
        at = header_end(body)
        while at < len(body) and _is_our_helper(body[at]):
            at += 1  # after the other helpers dp2ddp added
        helper = [] if self._reuse else [self._helper_def().with_changes(leading_lines=_blank(2))]
        if self.role.entry_kind == "module":
            names = self._names()
            call = self._stmt(f"{names['name']}()").with_changes(leading_lines=_blank(2))
            self.changed(original_node, "join the process group after the imports (nccl on GPU, gloo on CPU)")
            self.changed(original_node, DESTROY_MESSAGE, code="DDP008")
            tail = self._leave_group(names)
            # after ``args = parser.parse_args()`` when nothing before needs the group:
            # ``--help`` joins no process group
            parsed = _after_argument_parsing(body, at)
            new = [*helper] if parsed else [*helper, call]
        elif self._done:
            new, tail, parsed = helper, [], 0
        else:
            return updated_node
        rest = body[at:]
        if rest:
            rest[0] = rest[0].with_changes(leading_lines=at_least_two_blank(rest[0].leading_lines))
        if parsed:
            rest.insert(parsed - at, call.with_changes(leading_lines=[]))
        return updated_node.with_changes(body=[*body[:at], *new, *rest, *tail])


#: decorators that make a function a command line that exits the process itself
_CLICK_COMMANDS = frozenset({"click.command", "click.group", "click.decorators.command", "click.decorators.group"})


#: what needs the process group already (or tells ranks apart): the setup goes before it
_NEEDS_THE_GROUP = (
    "dist.", "distributed", "Distributed", "per_rank_batch_size", "get_rank", "barrier",
    "DataLoader", "DataParallel", "main_process", "is_main", "rank ==", "rank !=", "rank==",
)
#: the rank preamble dp2ddp adds (read from the environment: no group needed)
_PREAMBLE = ('int(os.environ.get("LOCAL_RANK", 0))', 'f"cuda:{local_rank}"')


def _after_argument_parsing(body, start: int) -> int:
    """The index right after ``args = parser.parse_args()`` among ``body[start:]`` when
    nothing before it needs the process group (argument definitions, constants), else
    0: the setup then goes first, as before."""
    for index in range(start, len(body)):
        stmt = body[index]
        if not isinstance(stmt, cst.SimpleStatementLine):
            return 0
        code = cst.Module(body=[stmt]).code
        if m.findall(stmt, m.Call(func=m.Attribute(attr=m.Name("parse_args") | m.Name("parse_known_args")))):
            return index + 1
        if any(word in code for word in _NEEDS_THE_GROUP) and not any(p in code for p in _PREAMBLE):
            return 0
    return 0


def _is_our_helper(stmt) -> bool:
    if not isinstance(stmt, cst.FunctionDef):
        return False
    return "(added by dp2ddp)" in cst.Module(body=[stmt]).code


def _blank(count: int) -> list:
    return blank_lines(count)


def _exits(stmt: cst.BaseStatement) -> bool:
    exit_call = m.Call(func=m.Name("exit") | m.Attribute(value=m.Name("sys"), attr=m.Name("exit")))
    return m.matches(
        stmt,
        m.SimpleStatementLine(
            body=[m.Expr(value=exit_call) | m.Raise(exc=m.Call(func=m.Name("SystemExit")))]
        ),
    )
