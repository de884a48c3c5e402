"""Rule documentation, generated from the rules themselves (docs/rules.md, `dp2ddp rule`)."""

from __future__ import annotations

from typing import Optional

from dp2ddp.codemods.rules import RULES


def one(rule) -> str:
    fix = {"safe": "safe fix available", "unsafe": "unsafe fix available (--unsafe-fixes)"}.get(
        rule.FIX or "", "no automatic fix"
    )
    tests = "" if rule.IN_TESTS else " · not reported in test files (`test_*.py`, `tests/`)"
    head = f"# {rule.CODE} {rule.NAME}\n\nSeverity: {rule.SEVERITY} · {fix}{tests}\n\n"
    return head + rule.docs() + "\n"


def markdown() -> str:
    lines = [
        "# dp2ddp lint rules",
        "",
        "Generated from the rules in `codemods/rules/` (`dp2ddp rule --markdown`); do not edit.",
        "",
        "| code | name | severity | fix |",
        "| --- | --- | --- | --- |",
    ]
    for rule in RULES:
        lines.append(f"| [{rule.CODE}](#{rule.CODE.lower()}-{rule.NAME}) | {rule.NAME} | {rule.SEVERITY} | {rule.FIX or '—'} |")
    lines.append("")
    for rule in RULES:
        body = one(rule).replace("\n# ", "\n## ").replace("\n## ", "\n### ")
        body = body.replace(f"# {rule.CODE} {rule.NAME}", f"## {rule.CODE} {rule.NAME}", 1)
        lines.append(body)
    return "\n".join(lines)


#: codes convert reports that are not a transform's own (a transform reports them too)
_CONVERT_ALSO = {"DDP103": "distributed-sampler", "DDP008": "process-group-setup"}


def convert_code(code: str) -> Optional[str]:
    """What a code that ``convert`` reports but no lint rule has means (DDP103,
    the batch-size notes): its transform's documentation."""
    import inspect
    import sys

    from dp2ddp.codemods import TRANSFORMS

    for transform in TRANSFORMS:
        doc = inspect.getdoc(sys.modules[transform.__module__]) or ""
        if transform.CODE == code:
            return (
                f"# {code} (reported by `dp2ddp convert`, transform {transform.NAME})\n\n"
                f"{transform.DESCRIPTION}\n\n{doc}\n"
            )
        if _CONVERT_ALSO.get(code) == transform.NAME:
            # a code of a part of the transform: that part's paragraphs, not the
            # transform's own (DDP103 is the batch size, not DDP101's sampler)
            own = [p for p in doc.split("\n\n") if code in p]
            return (
                f"# {code} (reported by `dp2ddp convert`, part of transform {transform.NAME})\n\n"
                + "\n\n".join(own or [doc])
                + "\n"
            )
    return None
