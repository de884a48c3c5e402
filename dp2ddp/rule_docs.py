"""Rule documentation, generated from the rules themselves (docs/rules.md, `dp2ddp rule`)."""

from __future__ import annotations

from typing import Optional

from dp2ddp.codemods.rules import DEFAULT_MIN_JUDGED, DEFAULT_PRECISION, RULES, lint_set_figures


def one(rule) -> str:
    fix = {"safe": "safe fix available", "unsafe": "unsafe fix available (--unsafe-fixes)"}.get(
        rule.FIX or "", "no automatic fix"
    )
    tests = "" if rule.IN_TESTS else " · not reported in test files (`test_*.py`, `tests/`)"
    head = f"# {rule.CODE} {rule.NAME}\n\nSeverity: {rule.SEVERITY} · {fix}{tests}\n\n{default_set(rule)}\n\n"
    return head + rule.docs() + "\n"


def default_set(rule) -> str:
    """Whether the rule is in the default set, and why: its figures on the lint set
    of real DDP repositories (``lint_set_figures.json``, written by the benchmark)."""
    figures = lint_set_figures()
    where = "the lint set of {n} real DDP repositories (`benchmarks/realworld/`, at {at})".format(
        n=len(figures.get("repositories", ())), at=figures.get("measured_at", "?")
    )
    counts = figures.get("rules", {}).get(rule.CODE) if figures else None
    if not figures:
        measured = "not measured here (no lint_set_figures.json)"
    elif not counts:
        measured = f"no finding (so no false alarm) on {where}"
    else:
        judged = counts["true"] + counts["false"]
        share = f"{100 * counts['true'] / judged:.0f}% true" if judged else "none judged true or false"
        measured = (
            f"on {where}: {counts['found']} found, {counts['true']} true, {counts['false']} false, "
            f"{counts['debatable']} debatable ({share}; {counts['false_errors']} false errors)"
        )
    state = "on by default" if rule.DEFAULT else "off by default (select it by code)"
    policy = (
        f"the default set takes a rule with no false error and, once {DEFAULT_MIN_JUDGED} of its findings "
        f"are judged, at least {DEFAULT_PRECISION:.0%} true"
    )
    return f"Default set: {state} -- {measured}; {policy}."


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
