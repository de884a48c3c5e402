"""End-to-end: convert whole training scripts, run both, compare.

Every folder ``fixtures/e2e/<name>/`` holds ``before/`` (the original, a real
training script on small synthetic data), ``after/`` (the expected conversion,
reviewed by a human) and ``case.json`` (entry point, arguments, checkpoint).
For each, once per session:

1. the original runs with ``python`` (``--cuda-shim`` for scripts that call
   ``.cuda()`` unconditionally);
2. the folder is converted by the engine and compared with ``after/``;
3. the converted folder runs with ``torchrun --standalone --nproc_per_node=2``
   (gloo on this CPU machine).

Then the tests assert: both runs exit 0, only rank 0 wrote the checkpoint, the
checkpoint keeps the original's key format and, for deterministic scripts
(``shuffle=False``), the final weights match the original's within 1e-4.
A case with ``"runs": 2`` runs both programs twice in their folders (the second
run resumes from the first one's checkpoint) and judges the second.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict

import pytest

from conftest import FIXTURES, UPDATE_GOLDEN, Run, copy_tree, run_script
from dp2ddp.engine import convert_sources

CASES = sorted(p.parent for p in (FIXTURES / "e2e").glob("*/case.json"))


@dataclass
class Outcome:
    case: dict
    original: Run
    converted: Run
    orig_dir: Path
    conv_dir: Path
    outputs: Dict[str, bytes]
    golden_dir: Path


def _convert_folder(src: Path) -> Dict[str, bytes]:
    sources = {str(p.relative_to(src)): p.read_bytes() for p in sorted(src.rglob("*.py"))}
    result = convert_sources(sources)
    errors = [f.error for f in result.files if f.error]
    assert not errors, errors
    return {f.path: (f.output if f.output is not None else f.source) for f in result.files}


@pytest.fixture(scope="session")
def e2e(tmp_path_factory) -> Dict[str, Outcome]:
    """Run every e2e case once (two at a time), share the results with the tests."""
    base = tmp_path_factory.mktemp("e2e")

    # convert first, in this thread; then run the scripts two at a time
    outputs_by_case = {case_dir: _convert_folder(case_dir / "before") for case_dir in CASES}

    def one(case_dir: Path) -> Outcome:
        case = json.loads((case_dir / "case.json").read_text())
        work = base / case_dir.name
        orig_dir, conv_dir = work / "original", work / "converted"
        copy_tree(case_dir / "before", orig_dir)
        outputs = outputs_by_case[case_dir]
        conv_dir.mkdir(parents=True)
        for rel, data in outputs.items():
            (conv_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (conv_dir / rel).write_bytes(data)
        # ``"runs": 2``: run again in the same folder (a second run resumes from the
        # first one's checkpoint); the last run is the one judged
        for _ in range(case.get("runs", 1)):
            original = run_script(orig_dir, case["entry"], case["args"], False, case.get("cuda_shim", False))
            if original.returncode:
                break
        for _ in range(case.get("runs", 1)):
            converted = run_script(conv_dir, case["entry"], case["args"], True)
            if converted.returncode:
                break
        return Outcome(case, original, converted, orig_dir, conv_dir, outputs, case_dir / "after")

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = dict(zip((c.name for c in CASES), pool.map(one, CASES)))
    return outcomes


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_matches_reviewed_conversion(e2e, name):
    from dp2ddp.formatting import FORMAT_FAILURES

    assert FORMAT_FAILURES == []
    outcome = e2e[name]
    if UPDATE_GOLDEN:
        shutil.rmtree(outcome.golden_dir, ignore_errors=True)
        for rel, data in outcome.outputs.items():
            (outcome.golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (outcome.golden_dir / rel).write_bytes(data)
    expected = {
        str(p.relative_to(outcome.golden_dir)): p.read_bytes()
        for p in sorted(outcome.golden_dir.rglob("*.py"))
    }
    assert set(expected) == set(outcome.outputs)
    for rel, data in outcome.outputs.items():
        assert data.decode() == expected[rel].decode(), f"{name}/{rel} differs from after/{rel}"


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_original_and_converted_run(e2e, name):
    outcome = e2e[name]
    assert outcome.original.returncode == 0, outcome.original.output[-3000:]
    assert outcome.converted.returncode == 0, outcome.converted.output[-3000:]


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_converted_ranks_stay_in_sync_on_disjoint_shards(e2e, name):
    """The converted program really is distributed: at the end every rank holds
    the same parameters in every optimizer, and in each training epoch the ranks
    drew disjoint samples."""
    converted = e2e[name].converted
    assert converted.ranks_in_sync() is None, converted.ranks_in_sync()
    assert converted.training_sharded() is None, converted.training_sharded()


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_only_rank_zero_writes_checkpoint(e2e, name):
    outcome = e2e[name]
    checkpoint = outcome.conv_dir / outcome.case["checkpoint"]
    assert checkpoint.is_file(), outcome.converted.output[-2000:]
    writers = set(outcome.converted.writers_of(checkpoint))
    assert writers == {"0"}, f"checkpoint written by ranks {writers}"
    # and no file at all was written by another rank (torch.save, open() to write,
    # shutil.copyfile to model_best, os.replace: all logged)
    others = [w for w in outcome.converted.writes if w["rank"] != "0"]
    assert not others, others
    if name == "imagenet_style":  # (its best checkpoint is a copy: seen as a write too)
        assert any(w["path"].endswith("model_best.pth.tar") for w in outcome.converted.writes)


def _weights(path: Path, key):
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)
    return state[key] if key else state


def _as_on_gpus(case: dict, state: dict) -> dict:
    """The original's checkpoint as a multi-GPU run writes it.

    Scripts that wrap in DataParallel only when they see GPUs write keys without
    the ``module.`` prefix on this CPU machine and with it on the GPUs they were
    written for; DDP always wraps, so it matches the GPU run.
    """
    if case.get("dp_only_on_gpus"):
        return {f"module.{k}": v for k, v in state.items()}
    return state


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_checkpoint_keeps_key_format(e2e, name):
    outcome = e2e[name]
    key = outcome.case.get("weights_key")
    before = _as_on_gpus(outcome.case, _weights(outcome.orig_dir / outcome.case["checkpoint"], key))
    after = _weights(outcome.conv_dir / outcome.case["checkpoint"], key)
    assert sorted(before) == sorted(after)


@pytest.mark.parametrize(
    "name", [c.name for c in CASES if json.loads((c / "case.json").read_text())["compare_weights"]]
)
def test_final_weights_match_original(e2e, name):
    import torch

    outcome = e2e[name]
    key = outcome.case.get("weights_key")
    before = _as_on_gpus(outcome.case, _weights(outcome.orig_dir / outcome.case["checkpoint"], key))
    after = _weights(outcome.conv_dir / outcome.case["checkpoint"], key)
    assert sorted(before) == sorted(after)
    worst = max((before[k].double() - after[k].double()).abs().max().item() for k in before)
    assert worst < 1e-4, f"max weight difference {worst}"


def test_converted_script_still_runs_as_plain_python(tmp_path):
    """Without torchrun the converted script is a world of one and trains as before."""
    case = FIXTURES / "e2e" / "dp_classifier"
    work = tmp_path / "plain"
    copy_tree(case / "after", work)
    args = json.loads((case / "case.json").read_text())["args"]
    run = run_script(work, "train.py", args, distributed=False)
    assert run.returncode == 0, run.output[-3000:]
    assert (work / "checkpoint.pt").exists()
    assert {w["rank"] for w in run.writes} == {None}
