"""Rule documentation, generated from the rules themselves (docs/rules.md, `dp2ddp rule`)."""

from __future__ import annotations

from dp2ddp.codemods.rules import RULES


def one(rule) -> str:
    fix = {"safe": "safe fix available", "unsafe": "unsafe fix available (--unsafe-fixes)"}.get(
        rule.FIX or "", "no automatic fix"
    )
    head = f"# {rule.CODE} {rule.NAME}\n\nSeverity: {rule.SEVERITY} · {fix}\n\n"
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
