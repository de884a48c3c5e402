"""Before/after fixtures, discovered automatically (TorchFix/black style).

``fixtures/<transform>/<case>.in.py`` is converted on its own (a one-file
program) and must equal ``<case>.out.py``; a case without ``.out.py`` must stay
byte-for-byte unchanged.  A first line ``# fixture: key=value, ...`` sets
options (``batch_size=per-process``, ``sync_bn=true``), the expected manual spots
(``manual=DDP102``) and, for a whole script, ``run=torchrun``: its output is run
on two processes and judged -- exit 0, only rank 0 writes, every optimizer's
parameters equal on both ranks at the end, and the training epochs' indices
disjoint between the ranks (``sharded=false``: a script without a DataLoader); ``<case>.notes`` lists the notes it gets ("line code" per
line; none without the file).  Every output must also be a fixed point:
converting it again changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from conftest import FIXTURES, UPDATE_GOLDEN
from dp2ddp import self_check
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
    settings = Settings(batch_size=options.get("batch_size", "global"), sync_bn=options.get("sync_bn") == "true")
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
    # convert and lint decide alike: lint on the output finds no error (nor a wrap under a
    # GPU condition, nor a missing set_epoch) that the transforms did not report themselves
    # -- convert's post-condition (self_check) would add it as a spot; here it never has to
    disagreements = [f"{f.line}: {f.code} {f.message}" for f in file.findings if f.transform == self_check.TRANSFORM]
    assert disagreements == []
    manual = sorted(f.code for f in file.findings if f.kind == "manual")
    expected_manual = sorted(c for c in options.get("manual", "").split("+") if c)
    assert manual == expected_manual, [f"{f.line}: {f.code} {f.message}" for f in file.findings if f.kind == "manual"]
    # the notes (consequences to know) by line and code: ``<case>.notes``, none without one
    notes_path = case.with_name(case.name[: -len(".in.py")] + ".notes")
    notes = sorted({f"{f.line} {f.code}" for f in file.findings if f.kind == "note"}, key=lambda n: (int(n.split()[0]), n))
    if UPDATE_GOLDEN:
        if notes:
            notes_path.write_text("".join(f"{n}\n" for n in notes))
        elif notes_path.exists():
            notes_path.unlink()
    expected_notes = notes_path.read_text().splitlines() if notes_path.exists() else []
    assert notes == expected_notes, [f"{f.line}: {f.code} {f.message}" for f in file.findings if f.kind == "note"]
    # a fixed point: converting the result again changes nothing
    again = _convert(output, options)
    assert again.output is None or again.output == output


def test_every_transform_has_fixtures():
    from dp2ddp.codemods import TRANSFORMS

    folders = {p.parent.name for p in CASES}
    missing = [t.NAME for t in TRANSFORMS if t.NAME not in folders]
    assert not missing, f"transforms without fixtures: {missing}"


def test_a_wrap_left_for_a_human_is_finished_by_converting_again():
    """A DataParallel left as is (its device was the script's own) in a file dp2ddp
    converted -- its process group comes from dp2ddp's helper -- is converted once the
    user fixes the device: the file is not taken for one that sets up DDP by hand."""
    case = FIXTURES / "data-parallel-to-ddp" / "device_from_args_reported.out.py"
    fixed = case.read_text().replace(
        "    device = args.device  # a string the user chose: not this process's GPU\n",
        '    local_rank = int(os.environ["LOCAL_RANK"])\n'
        '    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")\n',
    )
    assert fixed != case.read_text()
    if "import os\n" not in fixed:
        fixed = fixed.replace("import torch.nn as nn\n", "import torch.nn as nn\nimport os\n", 1)
    fixed = fixed.replace("import os\n", "import os\nimport torch.distributed as dist\n", 1)
    fixed = fixed.replace("def fit(", 'def init_distributed():\n    """Join (added by dp2ddp)."""\n'
                          '    dist.init_process_group("gloo")\n\n\ndef fit(', 1)
    fixed += '\n\nif __name__ == "__main__":\n    init_distributed()\n'
    file = _convert(fixed.encode(), {})
    assert file.role.already_distributed and file.role.set_up_by_dp2ddp
    assert file.output is not None
    out = file.output.decode()
    assert "nn.DataParallel" not in out and "DistributedDataParallel(" in out
    # a file that starts its process group by hand keeps its DataParallel branch
    by_hand = fixed.replace('    """Join (added by dp2ddp)."""\n', "")
    assert "nn.DataParallel" in (_convert(by_hand.encode(), {}).output or by_hand.encode()).decode()


GUARDED_WRAP = b'''import torch
import torch.nn as nn


def fit(model, loader, optimizer, device):
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    model.to(device)
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
    torch.save(SAVED, "model.pt")
'''


@pytest.mark.parametrize(
    "saved, noted",
    [
        (b"model.state_dict()", True),  # 'module.' keys now, not in the original's CPU runs
        (b'model.module.state_dict() if hasattr(model, "module") else model.state_dict()', False),
    ],
)
def test_prefix_note_for_a_wrap_taken_out_of_its_gpu_condition(saved, noted):
    file = _convert(GUARDED_WRAP.replace(b"SAVED", saved), {})
    notes = [f.message for f in file.findings if f.kind == "note" and f.code == "DDP001"]
    assert any("'module.' prefix" in n for n in notes) == noted, notes


def test_a_summed_loss_is_noted_in_global_batch_mode_only():
    source = (FIXTURES / "distributed-sampler" / "summed_loss_noted.in.py").read_bytes()
    for mode, noted in (("global", True), ("per-process", False)):
        file = _convert(source, {"batch_size": mode})
        notes = [f for f in file.findings if f.kind == "note" and "summed loss" in f.message]
        assert bool(notes) == noted, (mode, notes)
        if noted:
            assert notes[0].line == 11 and notes[0].code == "DDP103"


@pytest.mark.parametrize(
    "metric",
    [
        # a validation sum under no_grad, taken to a number, in an evaluation function
        "    with torch.no_grad():\n        total = F.mse_loss(model(x), x, reduction=\"sum\")\n",
        "    total = F.mse_loss(model(x), x, reduction=\"sum\").item()\n",
        "    if True:\n        total = F.mse_loss(model(x), x, reduction=\"sum\")\n",
    ],
)
def test_a_summed_metric_that_never_reaches_backward_is_not_noted(metric):
    source = (FIXTURES / "distributed-sampler" / "summed_loss_noted.in.py").read_text()
    source = source.replace('reduction="sum"', 'reduction="mean"')
    function = "validate" if "if True" in metric else "report"
    source += f"\n\ndef {function}(model, x):\n{metric}    return total\n"
    file = _convert(source.encode(), {})
    assert not [f for f in file.findings if "summed loss" in f.message]
    trained = source.replace('reduction="mean"', 'reduction="sum"')
    file = _convert(trained.encode(), {})
    assert [f.line for f in file.findings if "summed loss" in f.message] == [11]


def test_the_shard_metrics_note_only_where_a_training_loop_accumulates_one():
    source = (FIXTURES / "distributed-sampler" / "summed_loss_noted.in.py").read_text()
    accumulating = source.replace(
        "            optimizer.step()\n", "            optimizer.step()\n            running_loss += loss.item()\n"
    )
    # validation every N steps, nested in the training loop: over the whole, unsharded set
    validating = source.replace(
        "            optimizer.step()\n",
        "            optimizer.step()\n            correct = 0\n            with torch.no_grad():\n"
        "                for vx, vy in val_loader:\n                    correct += (model(vx) == vy).sum().item()\n",
    )
    assert validating != source
    for text, noted in ((source, False), (accumulating, True), (validating, False)):
        file = _convert(text.encode(), {})
        notes = [f for f in file.findings if "cover each rank's shard" in f.message]
        assert bool(notes) == noted, notes


CONTRASTIVE = b'''import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader


def info_nce(z1, z2, t=0.1):
    logits = F.normalize(z1, dim=1) @ F.normalize(z2, dim=1).t() / t
    return F.cross_entropy(logits, torch.arange(len(z1), device=z1.device))


def fit(model, views, optimizer):
    loader = DataLoader(views, batch_size=256, shuffle=True)
    for epoch in range(10):
        for v1, v2 in loader:
            loss = LOSS
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''


@pytest.mark.parametrize(
    "loss, mode, noted",
    [
        (b"info_nce(model(v1), model(v2))", "global", True),
        (b"info_nce(model(v1), model(v2))", "per-process", False),  # each process keeps the batch
        (b"F.mse_loss(model(v1), model(v2))", "global", False),
    ],
)
def test_in_batch_negatives_are_noted(loss, mode, noted):
    source = CONTRASTIVE.replace(b"LOSS", loss)
    if not noted and b"mse" in loss:
        source = source.replace(source[source.index(b"def info_nce"):source.index(b"def fit")], b"")
    file = _convert(source, {"batch_size": mode})
    found = [f for f in file.findings if "in-batch negatives" in f.message]
    assert bool(found) == noted, found
    if noted:
        assert found[0].line == 8 and found[0].kind == "note"


@pytest.mark.parametrize(
    "rest, removed",
    [
        ("x = 1  # DataParallel in a comment\n", True),
        ('"""DataParallel in prose."""\n', True),
        ("model = DataParallel(model)\n", False),
        ('__all__ = ["DataParallel"]\n', False),
        ('def f(m: "DataParallel"):\n    return m\n', False),
        ("y = nn.DataParallel\n", False),  # an attribute of that name: kept (cautious)
    ],
)
def test_an_import_scheduled_for_removal_goes_only_when_unused(rest, removed):
    import libcst as cst
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    from dp2ddp.codemods._base import apply_scheduled_imports

    source = "import torch\nfrom torch.nn.parallel import DataParallel, DistributedDataParallel\n" + rest
    context = CodemodContext(filename="t.py")
    RemoveImportsVisitor.remove_unused_import(context, "torch.nn.parallel", "DataParallel")
    out = apply_scheduled_imports(context, cst.parse_module(source)).code
    first = out.splitlines()[1]
    assert ("DataParallel," not in first) == removed, out
    assert "DistributedDataParallel" in first


def test_a_whole_model_saved_in_another_module_is_noted():
    source = (FIXTURES / "save-on-main" / "whole_model_wrapped_elsewhere_noted.in.py").read_bytes()
    file = _convert(source, {})
    notes = [f for f in file.findings if f.kind == "note" and "pickles the whole object" in f.message]
    assert [(n.line, n.code) for n in notes] == [(16, "DDP302")]


def test_a_saver_of_another_module_is_noted_once_and_torch_save_is_not():
    source = (FIXTURES / "module-access" / "saver_of_another_module_noted.in.py").read_bytes()
    file = _convert(source, {})
    notes = [f for f in file.findings if "(not in this file)" in f.message]
    # early_stopping(loss.item(), model) of EarlyStopping, then save_model(model, ...)
    assert [(n.line, n.code) for n in notes] == [(22, "DDP303"), (24, "DDP303")]
    assert "early_stopping() of EarlyStopping (not in this file)" in notes[0].message


def test_layers_forward_calls_only_under_a_condition_are_noted():
    """``# note: DDP204`` marks the lines that get the unused-parameters note."""
    case = FIXTURES / "unused-parameters" / "conditional_layers_noted.in.py"
    source = case.read_text()
    expected = [n for n, line in enumerate(source.splitlines(), 1) if "# note: DDP204" in line]
    file = _convert(source.encode(), {})
    got = sorted(f.line for f in file.findings if f.kind == "note" and f.code == "DDP204")
    assert got == expected


@pytest.mark.parametrize("size, noted", [(15, "not 2, 4, 8"), (12, "not 8"), (64, None)])
def test_a_literal_batch_size_processes_cannot_share_is_noted(size, noted):
    source = (FIXTURES / "distributed-sampler" / "summed_loss_noted.in.py").read_text()
    source = source.replace("batch_size=128", f"batch_size={size}")
    file = _convert(source.encode(), {})
    notes = [f.message for f in file.findings if "is the global batch" in f.message]
    if noted is None:
        assert notes == []
    else:
        assert len(notes) == 1 and noted in notes[0], notes


GAN_STEP = b'''import torch
import torch.nn as nn
from torch.utils.data import DataLoader


def fit(netG, netD, data, opt, seed):
    torch.manual_seed(SEED_VALUE)
    loader = DataLoader(data, batch_size=64, shuffle=True)
    for epoch in range(2):
        for real, _ in loader:
            noise = torch.randn(real.size(0), 16)
            loss = netD(netG(noise)).mean() - netD(real).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
'''


@pytest.mark.parametrize("seed, noted", [(b"seed", True), (b"seed + dist.get_rank()", False)])
def test_random_draws_seeded_alike_on_every_rank_are_noted(seed, noted):
    file = _convert(GAN_STEP.replace(b"SEED_VALUE", seed), {})
    notes = [f for f in file.findings if "same random numbers" in f.message]
    assert bool(notes) == noted
    if noted:
        assert notes[0].line == 11


#: fixtures whose header says ``run=torchrun``: whole scripts, run converted
RUNNABLE = [c for c in CASES if _options(c.read_text()).get("run") == "torchrun"]


@pytest.mark.parametrize("case", RUNNABLE, ids=[f"{p.parent.name}/{p.name[:-6]}" for p in RUNNABLE])
def test_converted_fixture_runs_under_torchrun(case: Path, tmp_path):
    """Not only the text: the converted script trains on two processes (Gloo), and
    no rank but 0 writes a file."""
    from conftest import run_script

    expected = case.with_name(case.name[: -len(".in.py")] + ".out.py")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_bytes(expected.read_bytes())
    run = run_script(work, "train.py", [], distributed=True)
    assert run.returncode == 0, run.output[-3000:]
    assert [w for w in run.writes if w["rank"] != "0"] == [], run.writes
    assert run.ranks_in_sync() is None, run.ranks_in_sync()
    if _options(case.read_text()).get("sharded", "true") != "false":
        assert run.training_sharded() is None, run.training_sharded()


def test_some_fixtures_are_run():
    assert len(RUNNABLE) >= 4

