"""Before/after fixtures, discovered automatically (TorchFix/black style).

``fixtures/<transform>/<case>.in.py`` is converted on its own (a one-file
program) and must equal ``<case>.out.py``; a case without ``.out.py`` must stay
byte-for-byte unchanged.  A first line ``# fixture: key=value, ...`` sets
options (``batch_size=per-process``) and the expected manual spots
(``manual=DDP102``).  Every output must also be a fixed point: converting it
again changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from conftest import FIXTURES, UPDATE_GOLDEN
from dp2ddp.codemods._base import Settings
from dp2ddp.engine import convert_sources

CASES = sorted(p for p in FIXTURES.glob("*/*.in.py") if p.parent.name != "e2e")


def _options(source: str) -> Dict[str, str]:
    first = source.splitlines()[0] if source else ""
    if not first.startswith("# fixture:"):
        return {}
    pairs = [p.strip() for p in first[len("# fixture:"):].split(",") if p.strip()]
    return dict(p.split("=", 1) for p in pairs)


def _convert(source: bytes, options: Dict[str, str]):
    settings = Settings(batch_size=options.get("batch_size", "global"))
    result = convert_sources({"script.py": source}, settings)
    (file,) = result.files
    assert file.error is None, file.error
    return file


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name[:-6]}" for p in CASES])
def test_fixture(case: Path):
    source = case.read_bytes()
    options = _options(source.decode())
    file = _convert(source, options)
    output = file.output if file.output is not None else source
    expected_path = case.with_name(case.name[: -len(".in.py")] + ".out.py")
    if UPDATE_GOLDEN and output != source:
        expected_path.write_bytes(output)
    if expected_path.exists():
        assert output.decode() == expected_path.read_text(), f"differs from {expected_path.name}"
        assert output != source, "an .out.py that equals its input: delete it"
    else:
        assert output == source, "expected no change (no .out.py)"
    manual = sorted(f.code for f in file.findings if f.kind == "manual")
    expected_manual = sorted(c for c in options.get("manual", "").split("+") if c)
    assert manual == expected_manual, [f"{f.line}: {f.code} {f.message}" for f in file.findings if f.kind == "manual"]
    # a fixed point: converting the result again changes nothing
    again = _convert(output, options)
    assert again.output is None or again.output == output


def test_every_transform_has_fixtures():
    from dp2ddp.codemods import TRANSFORMS

    folders = {p.parent.name for p in CASES}
    missing = [t.NAME for t in TRANSFORMS if t.NAME not in folders]
    assert not missing, f"transforms without fixtures: {missing}"
