"""Checks over dp2ddp's own code and over real PyTorch code, run offline.

A rule that calls a name it never imported crashed only on the real repository
whose code reached that branch (DDP305 on fairseq): these tests reach every
module without waiting for the input that runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES, ROOT

#: pyflakes' checks, through ruff, that are always a bug: an undefined name
#: (F821), one in ``__all__`` (F822), a local read before it is assigned (F823),
#: and code that does not compile (E9)
_ALWAYS_A_BUG = "F821,F822,F823,E9"


def test_no_module_of_the_project_uses_an_undefined_name():
    checked = [str(ROOT / d) for d in ("dp2ddp", "codemods", "tests", "benchmarks")]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", _ALWAYS_A_BUG,
         "--output-format", "concise", "--no-cache", *checked],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_static_check_finds_an_undefined_name(tmp_path):
    """(The check above is not vacuous: it fails on the bug it is there for.)"""
    bad = tmp_path / "rule.py"
    bad.write_text("def check(node):\n    return last_name(node.func)\n")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", _ALWAYS_A_BUG,
         "--output-format", "concise", "--no-cache", str(bad)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1 and "F821" in result.stdout and "last_name" in result.stdout


def test_every_rule_runs_without_crashing_on_the_torch_sources_and_the_fixtures():
    """Every rule on every file of the installed torch package (thousands of files
    of real PyTorch code, distributed code included) and of the fixtures -- with
    the trigger-word prefilter off, so that each rule reaches files it would
    normally skip: no rule may crash (a crash is an internal error, exit 123)."""
    import torch

    from dp2ddp.config import LintConfig
    from dp2ddp.lint import lint_sources

    corpus = sorted(Path(torch.__file__).parent.rglob("*.py")) + sorted(FIXTURES.rglob("*.py"))
    sources = {}
    for path in corpus:
        try:
            sources[str(path)] = path.read_bytes()
        except OSError:
            pass
    assert len(sources) > 2000
    result = lint_sources(sources, LintConfig(), use_trigger=False, workers=2)
    assert result.files == len(sources)
    assert result.crashes == [], "\n\n".join(result.crashes[:3])
    assert result.parsed > 2000  # the rules really ran on the files
    assert any(d.code == "DDP305" for d in result.diagnostics)
