"""Lint rules: fixtures, documentation, registry.

``fixtures/rules/<CODE>/bad_*.py`` must produce exactly the findings of that code
marked by ``# expect: CODE`` comments on their lines; ``good_*.py`` none of that
code.  ``fixtures/rules/clean/*.py`` are correct DDP scripts: no rule may report a
warning or an error on them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT
from dp2ddp.codemods.rules import BY_CODE, RULES, SECTIONS, SEVERITIES
from dp2ddp.config import LintConfig
from dp2ddp.lint import lint_sources

RULE_DIR = FIXTURES / "rules"
BAD = sorted(RULE_DIR.glob("DDP*/bad_*.py"))
GOOD = sorted(RULE_DIR.glob("DDP*/good_*.py"))
CLEAN = sorted((RULE_DIR / "clean").glob("*.py"))
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


def _lint(path: Path):
    # (every rule: a rule off by default is checked by its fixtures too)
    result = lint_sources({str(path): path.read_bytes()}, LintConfig(select=("ALL",)))
    assert result.crashes == [], result.crashes[0]
    return result.diagnostics


def _expected(path: Path, code: str):
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = _EXPECT.search(line)
        if match:
            found += [(number, c.strip()) for c in match.group(1).split(",") if c.strip() == code]
    return sorted(found)


@pytest.mark.parametrize("path", BAD, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_rule_fires_on_bad_fixture_at_the_right_lines(path):
    code = path.parent.name
    got = sorted((d.line, d.code) for d in _lint(path) if d.code == code)
    expected = _expected(path, code)
    assert expected, "a bad fixture needs `# expect: CODE` markers"
    assert got == expected


@pytest.mark.parametrize("path", GOOD, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_rule_is_silent_on_good_fixture(path):
    code = path.parent.name
    assert [d for d in _lint(path) if d.code == code] == []


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.stem)
def test_clean_ddp_scripts_get_no_warning_or_error(path):
    noisy = [f"{d.line}: {d.code} {d.message}" for d in _lint(path) if d.severity != "info"]
    assert noisy == []


#: what dp2ddp itself writes: the converted fixtures and the e2e scripts' "after"
CONVERTED = sorted([*FIXTURES.glob("*/*.out.py"), *FIXTURES.glob("e2e/*/after/**/*.py")])


def test_what_convert_writes_is_never_reported_as_training_unwrapped():
    """DDP009 on dp2ddp's own output would be a false alarm (it wraps what it
    trains, or reports it): the tutorial's ``ddp_model = DDP(model)``, a wrap chained
    with ``.to()``, an attribute wrapped in a method."""
    assert len(CONVERTED) > 100
    # (not those where a wrap is left for a human: DDP009 is right about them)
    sources = {str(p): p.read_bytes() for p in CONVERTED if b"# dp2ddp: DDP001" not in p.read_bytes()}
    found = [f"{d.path}:{d.line}: {d.message}" for d in lint_sources(sources).diagnostics if d.code == "DDP009"]
    assert found == []


def test_codes_are_unique_and_well_formed():
    codes = [r.CODE for r in RULES]
    assert len(codes) == len(set(codes)), "duplicate rule code"
    names = [r.NAME for r in RULES]
    assert len(names) == len(set(names)), "duplicate rule name"
    for rule in RULES:
        assert re.fullmatch(r"DDP\d{3}", rule.CODE)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.NAME)
        assert rule.SEVERITY in SEVERITIES
        assert rule.FIX in (None, "safe", "unsafe")
        assert rule.MESSAGE


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.CODE)
def test_rule_has_docs_and_fixtures(rule):
    docs = rule.docs()
    for section in SECTIONS:
        assert f"## {section}" in docs, f"{rule.CODE} lacks the section {section!r}"
    assert list((RULE_DIR / rule.CODE).glob("bad_*.py")), f"{rule.CODE} has no positive fixture"
    assert list((RULE_DIR / rule.CODE).glob("good_*.py")), f"{rule.CODE} has no negative fixture"
    if rule.FIX:
        from dp2ddp.codemods import TRANSFORMS

        names = {t.NAME for t in TRANSFORMS} | {"*"}
        assert set(rule.FIX_TRANSFORMS) <= names and rule.FIX_TRANSFORMS


def test_generated_rule_docs_are_up_to_date():
    from dp2ddp import rule_docs

    page = ROOT / "docs" / "rules.md"
    assert page.read_text() == rule_docs.markdown(), "run `dp2ddp rule --markdown > docs/rules.md`"


def test_rules_without_findings_on_files_the_prefilter_rejects():
    """The prefilter is only an optimisation: a rule run anyway on a file where its
    trigger words do not occur (or that never mentions torch) finds nothing."""
    from dp2ddp.lint import lint_source, selected_rules

    rules = [r for r in selected_rules(LintConfig()) if r.CODE not in ("DDP900", "DDP901")]
    corpus = sorted(FIXTURES.rglob("*.py")) + sorted((ROOT / "dp2ddp").rglob("*.py"))
    rejected = 0
    for path in corpus:
        data = path.read_bytes()
        text = data.decode("utf-8", "replace")
        skipped = [r for r in rules if "torch" not in text or not r.can_fire(text)]
        if not skipped:
            continue
        rejected += len(skipped)
        found, _, crashes, _ = lint_source(str(path), data, skipped, LintConfig(), use_trigger=False)
        assert crashes == [], crashes
        assert found == [], (path, [f"{d.line}: {d.code}" for d in found])
    assert rejected > 100


def test_data_parallel_through_a_star_import_offers_no_fix():
    """convert resolves names through explicit imports only: a DataParallel whose
    `torch` comes through `from X import *` is reported without a fix ([*] was
    shown, and `lint --fix` then changed nothing)."""
    from dp2ddp.codemods._analysis import Source

    path = FIXTURES / "rules" / "DDP001" / "bad_through_star_import.py"
    (found,) = BY_CODE["DDP001"]().check(Source(str(path), path.read_text()))
    assert found.fix is None and "import *" in found.message
    plain = "import torch\nmodel = torch.nn.DataParallel(net)\n"
    (found,) = BY_CODE["DDP001"]().check(Source("plain.py", plain))
    assert found.fix is not None


def test_a_rule_off_by_default_runs_only_when_a_selector_names_it(monkeypatch):
    from dp2ddp.lint import selected_rules

    monkeypatch.setattr(BY_CODE["DDP301"], "DEFAULT", False)
    codes = lambda config: {r.CODE for r in selected_rules(config)}  # noqa: E731
    assert "DDP301" not in codes(LintConfig()) and "DDP302" in codes(LintConfig())
    for select in (("DDP301",), ("DDP3",), ("ALL",)):
        assert "DDP301" in codes(LintConfig(select=select)), select
    assert "DDP301" not in codes(LintConfig(select=("DDP302",)))
    # extend-select adds it to the default set (or to a selection), as ruff's does
    assert {"DDP301", "DDP302"} <= codes(LintConfig(extend_select=("DDP301",)))
    assert codes(LintConfig(select=("DDP302",), extend_select=("DDP301",))) == {"DDP301", "DDP302"}
    assert "DDP301" not in codes(LintConfig(extend_select=("DDP301",), ignore=("DDP301",)))


def test_each_rules_default_is_what_its_figures_on_real_code_earn():
    """``Rule.DEFAULT`` follows the policy over the committed lint-set figures
    (``lint_set_figures.json``, written by benchmarks/realworld/lint_precision.py):
    no false error and, once DEFAULT_MIN_JUDGED findings are judged, at least
    DEFAULT_PRECISION of them true."""
    from dp2ddp.codemods.rules import default_earned, lint_set_figures

    figures = lint_set_figures()
    assert len(figures["repositories"]) >= 10 and set(figures["rules"]) <= set(BY_CODE)
    for rule in RULES:
        counts = figures["rules"].get(rule.CODE)
        assert rule.DEFAULT == default_earned(counts), (rule.CODE, counts)
        assert ("on by default" if rule.DEFAULT else "off by default") in rule_docs_line(rule)


def rule_docs_line(rule) -> str:
    from dp2ddp import rule_docs

    return rule_docs.default_set(rule)


def test_the_default_set_policy_over_figures():
    from dp2ddp.codemods.rules import default_earned

    figures = lambda true, false, errors=0: dict(true=true, false=false, false_errors=errors)  # noqa: E731
    assert default_earned(None) and default_earned(figures(9, 1)) and default_earned(figures(0, 1))
    assert not default_earned(figures(8, 2)) and not default_earned(figures(20, 1, errors=1))
