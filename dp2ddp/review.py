"""``convert --interactive``: review each change (hunk) with its reasons, accept
or reject it, write what was accepted -- if the selection is consistent.

A selection is refused (nothing written, a message says why) when:

* a file no longer parses;
* accepted code uses a name that only a rejected hunk defines (``dist`` from
  ``import torch.distributed as dist``, the ``init_distributed`` helper, the
  per-rank ``device``...);
* a conversion step is kept without the step it depends on: ``set_epoch`` on a
  loader whose ``DistributedSampler`` was rejected, a DDP wrap or a sampler
  without the process-group setup, and the like (``DEPENDS``).
"""

from __future__ import annotations

import ast
import dataclasses
import builtins
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from dp2ddp import linediff
from dp2ddp.engine import ConvertResult, FileResult

#: a kept change of code X needs the changes of these codes (in the same program)
DEPENDS = {
    "DDP102": {"DDP101"},  # set_epoch needs the DistributedSampler
    # DistributedSampler needs the process group, and the wrap: sharded data
    # without it trains unsynchronised copies of the model
    "DDP101": {"DDP002", "DDP001", "DDP009"},
    "DDP001": {"DDP002"},  # DDP needs the process group
    "DDP009": {"DDP002"},
    "DDP203": {"DDP001", "DDP009"},  # no_sync needs a DDP model (either)
    "DDP303": {"DDP009"},  # .module needs the wrap
    # the main-process guards ask dist.get_rank(), and the group must be up to
    # be destroyed: all of them need the process-group setup
    "DDP301": {"DDP002"},
    "DDP302": {"DDP002"},
    "DDP008": {"DDP002"},
}
_ANY_OF = {"DDP203"}  # codes whose dependencies are alternatives


@dataclass
class Hunk:
    path: str
    index: int
    #: original lines [start, end) replaced by ``new``
    start: int
    end: int
    old: List[str]
    new: List[str]
    codes: Set[str] = field(default_factory=set)
    reasons: List[str] = field(default_factory=list)
    accepted: bool = False
    #: unchanged lines shown around the change (as ``git add -p`` does)
    context_before: List[str] = field(default_factory=list)
    context_after: List[str] = field(default_factory=list)


#: unchanged lines shown before and after each change
CONTEXT_LINES = 3


def hunks_of(file: FileResult) -> List[Hunk]:
    before = _lines(file.source)
    after = _lines(file.output or b"")
    hunks = []
    for tag, i1, i2, j1, j2 in linediff.opcodes(before, after):
        if tag == "equal":
            continue
        hunk = Hunk(
            file.path, len(hunks), i1, i2, before[i1:i2], after[j1:j2],
            context_before=before[max(0, i1 - CONTEXT_LINES) : i1],
            context_after=before[i2 : i2 + CONTEXT_LINES],
        )
        for finding in file.findings:
            if finding.kind == "note":
                continue
            # findings carry original line numbers (1-based)
            if i1 + 1 <= finding.line <= max(i2, i1 + 1) or (i1 == i2 and finding.line == i1):
                hunk.codes.add(finding.code)
                hunk.reasons.append(f"{finding.code} {finding.message}")
        hunks.append(hunk)
    _attach_orphans(file, hunks)
    return hunks


def _attach_orphans(file: FileResult, hunks: List[Hunk]) -> None:
    """Hunks far from their finding (imports, helpers): say what they support."""
    for hunk in hunks:
        if hunk.codes:
            continue
        text = "".join(hunk.new)
        if "import " in text:
            hunk.reasons.append("imports used by the converted code")
        elif "def init_distributed" in text or "init_process_group" in text:
            hunk.reasons.append("the process-group setup helper (DDP002)")
            hunk.codes.add("DDP002")
        elif "def per_rank_batch_size" in text:
            hunk.reasons.append("the per-process batch-size helper (DDP103)")
        elif "LOCAL_RANK" in text or "local_rank" in text:
            hunk.reasons.append("this process's local rank and device")
        else:
            hunk.reasons.append("supports the changes around it")


def _lines(data: bytes) -> List[str]:
    from dp2ddp.codemods._analysis import decode

    try:
        return decode(data).splitlines(keepends=True)
    except Exception:
        return data.decode("utf-8", "replace").splitlines(keepends=True)


def apply(file: FileResult, hunks: Sequence[Hunk]) -> str:
    before = _lines(file.source)
    out: List[str] = []
    position = 0
    for hunk in sorted(hunks, key=lambda h: h.start):
        out.extend(before[position : hunk.start])
        out.extend(hunk.new if hunk.accepted else hunk.old)
        position = hunk.end
    out.extend(before[position:])
    return "".join(out)


def encode_selection(file: FileResult, hunks: Sequence[Hunk]) -> bytes:
    """The file with the accepted hunks applied, in the file's own encoding."""
    return _encode(file, apply(file, hunks))


def _encode(file: FileResult, text: str) -> bytes:
    import io
    import tokenize

    encoding, _ = tokenize.detect_encoding(io.BytesIO(file.source).readline)
    data = text.encode("utf-8" if encoding == "utf-8-sig" else encoding)
    if encoding == "utf-8-sig" and not data.startswith(b"\xef\xbb\xbf"):
        data = b"\xef\xbb\xbf" + data
    return data


def check_selection(files: Dict[str, Tuple[FileResult, List[Hunk]]]) -> List[str]:
    """Why the selection is inconsistent (empty: it is fine)."""
    problems: List[str] = []
    kept: Set[str] = set()
    rejected: Set[str] = set()
    for _, hunks in files.values():
        for hunk in hunks:
            (kept if hunk.accepted else rejected).update(hunk.codes)
    produced = kept | rejected
    whole = kept - rejected  # every hunk of the change kept (the setup is several hunks)
    for code in sorted(kept):
        needs = DEPENDS.get(code, set()) & produced  # only what this conversion changed
        if not needs:
            continue
        missing = needs - whole
        if code in _ANY_OF:
            if needs and not needs & whole:
                problems.append(f"{code} is kept but none of {sorted(needs)} it relies on")
        elif missing:
            problems.append(f"{code} is kept but {', '.join(sorted(missing))}, which it relies on, was rejected")
    for path, (file, hunks) in files.items():
        text = apply(file, hunks)
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            problems.append(f"{path}:{exc.lineno}: the selection does not parse ({exc.msg})")
            continue
        original = ast.parse(file.source)
        newly_undefined = _undefined(tree) - _undefined(original)
        for name in sorted(newly_undefined):
            problems.append(f"{path}: `{name}` is used but only a rejected change defines it")
        if not all(h.accepted for h in hunks):
            # dead code: what a kept change defines for a rejected one (an added
            # `import os`, `local_rank = ...`, `device = ...`, a helper function)
            whole = ast.parse(apply(file, [dataclasses.replace(h, accepted=True) for h in hunks]))
            dead = _unused(tree) - _unused(original) - _unused(whole)
            for name in sorted(dead):
                problems.append(f"{path}: `{name}` is defined by a kept change but only a rejected change uses it")
    return problems


def _unused(tree: ast.AST) -> Set[str]:
    """Names bound (assigned, imported, defined) but never loaded in the module
    (a coarse check, as ``_undefined``)."""
    bound: Set[str] = set()
    loaded: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            loaded.update(node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            loaded.add(node.value)  # (``__all__``, ``getattr(module, "name")``)
    return bound - loaded


def _undefined(tree: ast.AST) -> Set[str]:
    """Names loaded somewhere but bound nowhere in the module (a coarse check)."""
    bound: Set[str] = set(dir(builtins)) | {"__file__", "__name__", "__doc__"}
    loaded: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return loaded - bound


def review(
    result: ConvertResult,
    ask: Callable[[Hunk, str, Optional[str]], str],
    show: Callable[[str], None],
    go_back: Optional[Callable[[List[str]], bool]] = None,
) -> Tuple[Dict[str, bytes], List[str]]:
    """Ask about every hunk; return ({path: accepted bytes}, problems).

    ``ask(hunk, question, default)`` answers y, n, a (accept the rest) or q (keep
    the rest as they are: rejected on the first pass); ``default`` is the answer
    already given (None on the first pass).  ``q`` ends the questions, not the
    checks: the selection is tested as at the end.  Where it is inconsistent and
    ``go_back(problems)`` says so, every change is asked again with its answer as
    the default -- nothing answered is lost; otherwise nothing is written."""
    files: Dict[str, Tuple[FileResult, List[Hunk]]] = {}
    for file in sorted(result.changed, key=lambda f: f.path):
        files[file.path] = (file, hunks_of(file))
    _ask_each(files, ask, show, first=True)
    problems = check_selection(files)
    while problems and go_back is not None and go_back(problems):
        _ask_each(files, ask, show, first=False)
        problems = check_selection(files)
    outputs = {}
    if not problems:
        for path, (file, hunks) in files.items():
            if any(h.accepted for h in hunks):
                outputs[path] = _encode(file, apply(file, hunks))
    return outputs, problems


def _ask_each(files: Dict[str, Tuple[FileResult, List[Hunk]]], ask, show, first: bool) -> None:
    decision: Optional[str] = None
    for path, (_, hunks) in files.items():
        for hunk in hunks:
            if decision == "a":
                hunk.accepted = True
                continue
            if decision == "q":
                continue
            show(render(hunk))
            default = None if first else ("y" if hunk.accepted else "n")
            now = "" if first else f" (now {'accepted' if hunk.accepted else 'rejected'})"
            answer = ask(hunk, f"accept this change ({hunk.index + 1}/{len(hunks)} in {path}){now}?", default)
            if answer in ("y", "a"):
                hunk.accepted = True
            elif answer == "n":
                hunk.accepted = False
            if answer in ("a", "q"):
                decision = answer


def render(hunk: Hunk) -> str:
    head = f"@@ {hunk.path}:{hunk.start + 1} @@"
    lines = [head]
    lines += [f"  why: {r}" for r in hunk.reasons[:6]]
    lines += [" " + line.rstrip("\r\n") for line in hunk.context_before]
    lines += ["-" + line.rstrip("\r\n") for line in hunk.old]
    lines += ["+" + line.rstrip("\r\n") for line in hunk.new]
    lines += [" " + line.rstrip("\r\n") for line in hunk.context_after]
    return "\n".join(lines)
