"""The hand-made tree indexes equal what the libraries compute.

Both are speed-ups over a library walk (lint's ``Source`` index over
``ast.iter_child_nodes``; convert's ``ParentProvider`` over LibCST's
``ParentNodeProvider``): a field they skip by mistake would silently hide
nodes from every rule or transform, so they are checked on every fixture and
on constructs the fixtures lack.
"""

from __future__ import annotations

import ast
import sys

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from conftest import FIXTURES
from dp2ddp.codemods._analysis import Source
from dp2ddp.codemods._base import ParentProvider

SINGLETONS = (ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)

EXTRA = '''
from . import x as y
import a.b as c
global_ = [i async for i in f()] if (n := 3) else {**d}
@dec(k=1)
async def g(a, /, b: int = 2, *args, c, **kw) -> None:
    global z
    async with m() as (p, q):
        x: int = -a + b ** 2 if not a and b else a < b <= c
        print(f"{x!r:>{w}}", *args, sep="")
    try:
        pass
    except* ValueError as e:
        raise RuntimeError from e
    match p:
        case [1, *rest] | {"k": v, **others} if v:
            pass
        case Point(x=0, y=_) as pt:
            del pt
        case None | True:
            pass
    lambda s=1: s[1:2:3, ...]
    yield from (yield)
class K(B, metaclass=M):
    t: "str"
'''

SOURCES = sorted(FIXTURES.rglob("*.py"))


def _reference(tree: ast.AST):
    nodes, parents = [tree], {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, SINGLETONS):
                parents[child] = node
                nodes.append(child)
    return nodes, parents


@pytest.mark.parametrize("text", [EXTRA] + [p.read_text() for p in SOURCES], ids=["extra"] + [str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_lint_index_is_ast_walk(text: str) -> None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        pytest.skip("not valid Python (a DDP900 fixture)")
    src = Source("f.py", text, tree)
    nodes, parents = _reference(tree)
    assert {id(n) for n in src.nodes} == {id(n) for n in nodes}
    assert {id(k): id(v) for k, v in src.parents.items()} == {id(k): id(v) for k, v in parents.items()}


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type statements are Python 3.12+")
def test_lint_index_has_type_alias_names() -> None:
    text = "type Batch[T] = list[T]\nclass K[T: int]:\n    pass\n"
    tree = ast.parse(text)
    src = Source("f.py", text, tree)
    nodes, parents = _reference(tree)
    assert {id(n) for n in src.nodes} == {id(n) for n in nodes}
    assert {id(k): id(v) for k, v in src.parents.items()} == {id(k): id(v) for k, v in parents.items()}


@pytest.mark.parametrize("text", [EXTRA] + [p.read_text() for p in SOURCES[::4]], ids=["extra"] + [str(p.relative_to(FIXTURES)) for p in SOURCES[::4]])
def test_convert_parent_map_is_libcst_parents(text: str) -> None:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        pytest.skip("not valid Python (a DDP900 fixture)")
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    ours, theirs = wrapper.resolve(ParentProvider), wrapper.resolve(ParentNodeProvider)
    assert len(ours) == len(theirs) > 0
    assert all(ours[node] is parent for node, parent in theirs.items())


ALIASED = '''
import torch.nn as tnn
from torch.nn import DataParallel as DP
from torch.nn.parallel import data_parallel
from torch.nn import parallel
import torch.distributed as dist
net = DP(m); tnn.DataParallel(m); parallel.DataParallel(m); data_parallel(m, x)
getattr(tnn, "DataParallel")(m); DataParallel(m); dist.init_process_group("gloo")
print(len([]))
'''


@pytest.mark.parametrize("text", [ALIASED] + [p.read_text() for p in SOURCES], ids=["aliased"] + [str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_calls_to_is_a_qualified_name_filter(text: str) -> None:
    """``calls_to`` rules calls out by their last name before building the
    qualified one: it must find exactly what the qualified names find."""
    from dp2ddp.codemods import _names as N

    try:
        tree = ast.parse(text)
    except SyntaxError:
        pytest.skip("not valid Python (a DDP900 fixture)")
    src = Source("f.py", text, tree)
    for names in (N.ANY_DATA_PARALLEL, N.INIT_PROCESS_GROUP, frozenset({"builtins.print"})):
        assert src.calls_to(names) == [c for c in src.calls if src.qualname(c.func) in names]
    if text is ALIASED:
        assert len(src.calls_to(N.ANY_DATA_PARALLEL)) == 4
