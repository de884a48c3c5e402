"""Recognisers for the code shapes the transforms look for.

Each takes the transform (for qualified-name metadata) and a node.  They only
answer questions; editing lives in the transforms.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Iterator, Optional

import libcst as cst
import libcst.matchers as m

from . import _analysis as A
from . import _names as N

if TYPE_CHECKING:  # pragma: no cover
    from ._base import Transform

_CUDA_STRING = re.compile(r"^cuda(:\d+)?$")
_GPU_WORD = re.compile(r"(?i)(cuda|gpu|n_?gpu|ngpus?|num_?gpus|multi|parallel|device|dp$)")


def string_value(node: cst.CSTNode) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # pragma: no cover - odd literal
            return None
        return value if isinstance(value, str) else None
    return None


def is_cuda_string(node: cst.CSTNode) -> bool:
    value = string_value(node)
    if value is not None:
        return bool(_CUDA_STRING.match(value))
    if isinstance(node, cst.FormattedString):
        # f"cuda:{args.gpu}"
        text = "".join(
            part.value for part in node.parts if isinstance(part, cst.FormattedStringText)
        )
        return text.startswith("cuda:") or text == "cuda"
    return cuda_string_indices(node) is not None


def cuda_string_indices(node: cst.CSTNode) -> Optional[list]:
    """The GPU index expressions of a CUDA device string built at run time:
    ``f"cuda:{gpu}"``, ``"cuda:{}".format(gpu)``, ``"cuda:%d" % gpu``,
    ``"cuda:" + str(gpu)``; None for anything else."""
    if isinstance(node, cst.FormattedString):
        if not is_cuda_string(node):
            return None
        return [p.expression for p in node.parts if isinstance(p, cst.FormattedStringExpression)]
    if (
        isinstance(node, cst.Call)
        and m.matches(node.func, m.Attribute(attr=m.Name("format")))
        and re.fullmatch(r"cuda:\{[0-9]*\}", string_value(node.func.value) or "")
    ):
        return [a.value for a in node.args]
    if isinstance(node, cst.BinaryOperation):
        left = string_value(node.left) or ""
        if isinstance(node.operator, cst.Modulo) and re.fullmatch(r"cuda:%[ds]", left):
            right = node.right
            return list(e.value for e in right.elements) if isinstance(right, cst.Tuple) else [right]
        if isinstance(node.operator, cst.Add) and left == "cuda:":
            right = node.right
            if isinstance(right, cst.Call) and m.matches(right.func, m.Name("str")) and len(right.args) == 1:
                return [right.args[0].value]
            return [right]
    return None


def is_cpu_spec(t: "Transform", node: cst.CSTNode) -> bool:
    if string_value(node) == "cpu":
        return True
    return (
        t.is_call(node, N.TORCH_DEVICE)
        and len(node.args) == 1
        and string_value(node.args[0].value) == "cpu"
    )


def is_cuda_spec(t: "Transform", node: cst.CSTNode) -> bool:
    """``"cuda"``, ``"cuda:0"``, ``f"cuda:{i}"``, ``torch.device("cuda", 0)``..."""
    if is_cuda_string(node):
        return True
    if t.is_call(node, N.TORCH_DEVICE) and node.args:
        first = node.args[0].value
        return is_cuda_string(first) or is_device_spec(t, first)
    return False


def is_device_spec(t: "Transform", node: cst.CSTNode) -> bool:
    """A GPU device, optionally with a CPU fallback (``"cuda" if ... else "cpu"``)."""
    if is_cuda_spec(t, node):
        return True
    if isinstance(node, cst.IfExp):
        return is_cuda_spec(t, node.body) and is_cpu_spec(t, node.orelse)
    if t.is_call(node, N.TORCH_DEVICE) and len(node.args) == 1:
        return is_device_spec(t, node.args[0].value)
    return False


def device_fallback_test(t: "Transform", node: cst.CSTNode) -> Optional[cst.BaseExpression]:
    """The condition of ``"cuda" if COND else "cpu"`` (also inside torch.device)."""
    if isinstance(node, cst.IfExp):
        return node.test
    if t.is_call(node, N.TORCH_DEVICE) and len(node.args) == 1:
        return device_fallback_test(t, node.args[0].value)
    return None


def is_rank_device(t: "Transform", node: cst.CSTNode) -> bool:
    """This process's device, as the transforms write it:
    ``torch.device(f"cuda:{local_rank}" if ... else "cpu")``, the same as a string,
    or ``torch.device("cuda", local_rank)``."""
    if isinstance(node, cst.IfExp):
        node = node.body
    if t.is_call(node, N.TORCH_DEVICE) and node.args:
        if len(node.args) == 2:
            return string_value(node.args[0].value) == "cuda" and m.matches(
                node.args[1].value, m.Name("local_rank")
            )
        first = node.args[0].value
        node = first.body if isinstance(first, cst.IfExp) else first
    return isinstance(node, cst.FormattedString) and any(
        isinstance(part, cst.FormattedStringExpression) and m.matches(part.expression, m.Name("local_rank"))
        for part in node.parts
    )


#: the ``=`` of a keyword argument as black writes it (no spaces)
TIGHT_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value``, written as black writes a keyword argument."""
    return cst.Arg(keyword=cst.Name(name), value=value, equal=TIGHT_EQUAL)


def append_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``call`` with ``new`` as its last argument, in the call's own layout: on a
    line of its own (and a trailing comma, as black writes it) when the closing
    parenthesis is on its own line, else after ``, ``."""
    args = list(call.args)
    if not args:
        return _first_arg(call, new)
    last = args[-1]
    comma = last.comma
    closing = comma.whitespace_after if isinstance(comma, cst.Comma) else last.whitespace_after_arg
    opening = args[-2].comma.whitespace_after if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else call.whitespace_before_args
    if isinstance(closing, cst.ParenthesizedWhitespace) and isinstance(opening, cst.ParenthesizedWhitespace):
        # one argument a line: the last one's line ends with a comma (and its comment)
        line_end = closing.with_changes(last_line=opening.last_line, indent=opening.indent)
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_after=line_end), whitespace_after_arg=cst.SimpleWhitespace("")
        )
        end = cst.ParenthesizedWhitespace(indent=closing.indent, last_line=closing.last_line)
        return call.with_changes(args=[*args, new.with_changes(comma=cst.Comma(whitespace_after=end))])
    # after ``, ``; what stood before the parenthesis (a line break) goes after the new one
    args[-1] = last.with_changes(
        comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")), whitespace_after_arg=cst.SimpleWhitespace("")
    )
    return call.with_changes(args=[*args, new.with_changes(comma=comma, whitespace_after_arg=last.whitespace_after_arg)])


def _first_arg(call: cst.Call, new: cst.Arg) -> cst.Call:
    """``f(\n)`` given its first argument: ``f(arg)``, or, when a comment follows the
    parenthesis (``f(  # c``), the argument on a line of its own."""
    opening = call.whitespace_before_args
    if not isinstance(opening, cst.ParenthesizedWhitespace):
        return call.with_changes(args=[new])
    if opening.first_line.comment is None and not any(line.comment for line in opening.empty_lines):
        return call.with_changes(args=[new], whitespace_before_args=cst.SimpleWhitespace(""))
    inner = opening.with_changes(last_line=cst.SimpleWhitespace(opening.last_line.value + "    "))
    end = cst.ParenthesizedWhitespace(indent=opening.indent, last_line=opening.last_line)
    return call.with_changes(
        args=[new.with_changes(comma=cst.Comma(whitespace_after=end))], whitespace_before_args=inner
    )


def dotted_name(node: cst.CSTNode) -> str:
    """``a.b.c`` for a Name/Attribute chain, '' otherwise."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted_name(node.value)
        return f"{inner}.{node.attr.value}" if inner else ""
    return ""


dotted_module = dotted_name


def names_in(node: cst.CSTNode) -> Iterator[str]:
    """Identifiers (Name values and attribute names) used in an expression."""
    for sub in _walk(node):
        if isinstance(sub, cst.Name):
            yield sub.value


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), without rebuilding the tree
    as ``node.visit(visitor)`` does -- much cheaper for read-only scans."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


_walk = walk


def find(node: cst.CSTNode, *types: type) -> list:
    """The nodes of the given types under ``node``, in source order."""
    return [n for n in walk(node) if isinstance(n, types)]


def calls_method(node: cst.CSTNode, name: str) -> bool:
    """``node`` holds a call ``<something>.name(...)``."""
    return any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == name
        for n in walk(node)
    )


def is_gpu_guard(t: "Transform", test: cst.BaseExpression) -> bool:
    """A condition that only asks about GPUs: ``torch.cuda.device_count() > 1``,
    ``n_gpu > 1``, ``len(args.gpu_ids) > 1``, ``torch.cuda.is_available()``,
    ``device == "cuda"``, ``args.cuda``, and ``and``/``or`` of those."""
    if isinstance(test, cst.BooleanOperation):
        return is_gpu_guard(t, test.left) and is_gpu_guard(t, test.right)
    if isinstance(test, cst.UnaryOperation):
        return False  # "not cuda": the CPU branch
    if isinstance(test, cst.Comparison):
        operands = [test.left, *(c.comparator for c in test.comparisons)]
        saw_gpu = False
        for operand in operands:
            if isinstance(operand, cst.Integer) or string_value(operand) in ("cuda", "cpu"):
                continue
            if _is_gpu_term(t, operand):
                saw_gpu = True
                continue
            return False
        return saw_gpu
    return _is_gpu_term(t, test)


def _is_gpu_term(t: "Transform", node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Call):
        if t.is_ref(node.func, N.CUDA_DEVICE_COUNT | N.CUDA_IS_AVAILABLE):
            return True
        if m.matches(node.func, m.Name("len")) and len(node.args) == 1:
            return _is_gpu_term(t, node.args[0].value)
        return False
    if isinstance(node, cst.Attribute):
        if node.attr.value == "type":  # device.type
            return _is_gpu_term(t, node.value)
        return bool(_GPU_WORD.search(node.attr.value))
    if isinstance(node, cst.Name):
        return bool(_GPU_WORD.search(node.value))
    return False


is_eval_name = A.is_eval_name
is_train_name = A.is_train_name


def is_pure(node: cst.CSTNode) -> bool:
    """An expression that cannot reach a collective: no calls except harmless ones.

    Used before putting code behind ``if rank == 0:``: anything that might call the
    model (a DDP forward) or a collective must run on every rank.
    """
    for sub in _walk(node):
        if isinstance(sub, cst.Call):
            if not _harmless_call(sub):
                return False
    return True


def _harmless_call(call: cst.Call) -> bool:
    func = call.func
    if isinstance(func, cst.Name):
        return func.value in N.HARMLESS_FUNCS
    if isinstance(func, cst.Attribute):
        return func.attr.value in N.HARMLESS_METHODS
    return False


#: ``x.to(...)`` / ``x.cuda(...)``: a module or tensor put on a device
DEVICE_MOVE = m.Call(func=m.Attribute(attr=m.Name("to") | m.Name("cuda")))


def target_names(target: cst.BaseExpression) -> Iterator[str]:
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from target_names(element.value)
    elif isinstance(target, cst.Attribute):
        yield target.attr.value


# ------------------------------------------------------------------ rank checks
# One implementation, on ``ast`` (``_analysis``), shared with the lint rules: a
# LibCST expression is handed over as its source text, parsed on its own, with
# the file's imports for qualified names.
def _as_ast(t: "Transform", node: cst.CSTNode):
    code = t.module.code_for_node(node)
    try:
        return ast.parse(f"(\n{code}\n)", mode="eval").body
    except SyntaxError:
        return None


def is_main_process_check(t: "Transform", test: cst.BaseExpression) -> bool:
    """A test true on the main process only (see ``_analysis.is_main_process_check``)."""
    expr = _as_ast(t, test)
    return expr is not None and A.is_main_process_check(t.ast_source, expr)


def is_rank_dependent(t: "Transform", test: cst.BaseExpression) -> bool:
    """A test whose value may differ between ranks (``_analysis.is_rank_dependent``)."""
    expr = _as_ast(t, test)
    return expr is not None and A.is_rank_dependent(t.ast_source, expr)


def under_main_process_check(t: "Transform", node: cst.CSTNode) -> bool:
    """``node`` only runs on the main process (inside ``if rank == 0:`` and the like)."""
    child = node
    for anc in t.ancestors(node):
        if isinstance(anc, cst.If) and child is anc.body and is_main_process_check(t, anc.test):
            return True
        if isinstance(anc, cst.IfExp) and child is anc.body and is_main_process_check(t, anc.test):
            return True
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
            return False
        child = anc
    return False


def is_main_guard(node: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` (either way round, as ``_facts.is_main_guard``)."""
    if not isinstance(node, cst.If) or not m.matches(
        node.test, m.Comparison(comparisons=[m.ComparisonTarget(m.Equal())])
    ):
        return False
    sides = (node.test.left, node.test.comparisons[0].comparator)
    return any(m.matches(side, m.Name("__name__")) for side in sides) and any(
        string_value(side) == "__main__" for side in sides
    )
