"""The command line contract: modes, exit codes, errors, what is (not) imported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from dp2ddp.cli import cli

DP_SCRIPT = (FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py").read_bytes()
PY2_SCRIPT = b'import torch\nmodel = torch.nn.DataParallel(net)\nprint "training"\n'
CLEAN = b'"""Nothing to convert."""\nimport os\n\nprint(os.getcwd())\n'


def run(*args, cwd=None):
    runner = CliRunner()
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "train.py").write_bytes(DP_SCRIPT)
    (tmp_path / "util.py").write_bytes(CLEAN)
    return tmp_path


def test_default_prints_a_diff_and_writes_nothing(project):
    result = run("convert", str(project))
    assert result.exit_code == 0, result.output
    assert f"--- a/{project / 'train.py'}" in result.stdout
    assert "+from torch.nn.parallel import DistributedDataParallel" in result.stdout
    assert (project / "train.py").read_bytes() == DP_SCRIPT
    # how to launch it: one machine and several
    assert "torchrun --standalone --nproc_per_node=gpu" in result.stderr
    assert "--nnodes=2" in result.stderr and "--rdzv_endpoint=HOST:29400" in result.stderr


def test_check_exits_1_when_a_file_would_change(project):
    result = run("convert", "--check", str(project))
    assert result.exit_code == 1
    assert result.stdout == ""  # no diff unless asked
    assert (project / "train.py").read_bytes() == DP_SCRIPT


def test_check_names_the_files_that_would_change_also_quietly(project):
    result = run("convert", "--check", str(project))
    assert f"would convert {project / 'train.py'}" in result.stderr.splitlines()
    assert "util.py" not in result.stderr
    quiet = run("convert", "--check", "-q", str(project))
    assert quiet.exit_code == 1
    assert quiet.stderr.splitlines() == [f"would convert {project / 'train.py'}"]
    clean = run("convert", "--check", "-q", str(project / "util.py"))
    assert clean.exit_code == 0 and clean.stderr == ""


def test_write_then_check_is_clean(project):
    result = run("convert", "--write", str(project))
    assert result.exit_code == 0, result.output
    converted = (project / "train.py").read_bytes()
    assert converted != DP_SCRIPT and b"DistributedDataParallel(" in converted
    assert (project / "util.py").read_bytes() == CLEAN
    again = run("convert", "--check", str(project))
    assert again.exit_code == 0, again.output
    assert "0 files would be converted" in again.stderr


SPOT = b"""import torch
import torch.nn as nn


def main(args):
    model = nn.Linear(4, 2)
    model = nn.DataParallel(*[model])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()


if __name__ == "__main__":
    main(None)
"""


def test_the_spots_of_a_written_file_are_named_at_their_lines_in_it(tmp_path):
    # the diff names the lines of the file as it is; once it is written, the lines of the new file
    script = tmp_path / "train.py"
    script.write_bytes(SPOT)
    shown = run("convert", str(script))
    (spot,) = [line for line in shown.stderr.splitlines() if ": DDP001 DataParallel called with" in line]
    assert spot.strip().startswith(f"{script}:7:")
    written = run("convert", "--write", str(script))
    (spot,) = [line for line in written.stderr.splitlines() if ": DDP001 DataParallel called with" in line]
    line = int(spot.strip().split(":")[1])
    lines = script.read_text().splitlines()
    assert lines[line - 1].strip() == "model = nn.DataParallel(*[model])"
    assert lines[line - 2].strip().startswith("# dp2ddp: DDP001")


def test_check_and_diff_together(project):
    result = run("convert", "--check", "--diff", str(project))
    assert result.exit_code == 1
    assert "+++ b/" in result.stdout


def test_write_and_check_is_a_usage_error(project):
    result = run("convert", "--write", "--check", str(project))
    assert result.exit_code == 2
    assert "exclude each other" in result.output


def test_missing_path_is_a_usage_error(tmp_path):
    result = run("convert", str(tmp_path / "nope.py"))
    assert result.exit_code == 2
    assert "nope.py" in result.output


def test_unknown_option_is_a_usage_error(project):
    assert run("convert", "--frobnicate", str(project)).exit_code == 2


def test_unparseable_file_is_named_untouched_and_others_converted(project):
    bad = project / "legacy.py"
    bad.write_bytes(PY2_SCRIPT)
    result = run("convert", "--write", str(project))
    assert result.exit_code == 1
    assert f"{bad}:3:" in result.stderr and "cannot parse" in result.stderr
    assert bad.read_bytes() == PY2_SCRIPT
    assert b"DistributedDataParallel(" in (project / "train.py").read_bytes()


def test_internal_error_exits_123_with_a_message(project, monkeypatch):
    from dp2ddp import codemods
    from dp2ddp.codemods._base import Transform

    class Broken(Transform):
        NAME = "broken"

        def visit_Module(self, node):
            raise RuntimeError("boom")

    monkeypatch.setattr(codemods, "TRANSFORMS", (Broken,))
    result = run("convert", "--write", str(project))
    assert result.exit_code == 123
    assert "internal error" in result.stderr and "boom" in result.stderr
    assert (project / "train.py").read_bytes() == DP_SCRIPT


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_transform_that_crashes_on_one_file_leaves_it_untouched_and_converts_the_others(project, monkeypatch, jobs):
    """An internal error on one file (as LibCST's refusal of a FlattenSentinel in
    an ``elif`` once was) names that file, leaves it byte for byte, and the other
    programs are still converted; the exit is 123."""
    from dp2ddp import codemods
    from dp2ddp.codemods._base import Transform

    class CrashesOnOneFile(Transform):
        NAME = "crashes-on-one-file"

        def visit_Module(self, node):
            if "CRASH HERE" in node.code:
                raise RuntimeError("boom on one file")

    monkeypatch.setattr(codemods, "TRANSFORMS", (CrashesOnOneFile,) + tuple(codemods.TRANSFORMS))
    crashing = DP_SCRIPT.replace(b"import torch\n", b"import torch  # CRASH HERE\n", 1)
    assert crashing != DP_SCRIPT
    (project / "other.py").write_bytes(crashing)
    result = run("convert", "--write", "-j", jobs, str(project))
    assert result.exit_code == 123
    assert f"internal error: {project / 'other.py'}: transform crashes-on-one-file crashed" in result.stderr
    assert "boom on one file" in result.stderr
    assert (project / "other.py").read_bytes() == crashing
    assert b"DistributedDataParallel(" in (project / "train.py").read_bytes()
    assert (project / "util.py").read_bytes() == CLEAN


def test_an_entry_point_that_fails_leaves_the_modules_of_its_program_unchanged(tmp_path, monkeypatch):
    """The model and the loader modules converted without their entry point would
    need a process group nobody sets up: the program stays as it was."""
    from dp2ddp import engine

    shutil.copytree(FIXTURES / "e2e" / "multi_file" / "before", tmp_path / "prog")
    (tmp_path / "solo.py").write_bytes(DP_SCRIPT)  # another program: converted
    # a second entry point sharing the loader module: converted without the loader's
    # sampler it would train every rank on all the data -- left as it was too
    (tmp_path / "prog" / "finetune.py").write_text(
        (tmp_path / "prog" / "train.py").read_text().replace("def main", "def finetune_main").replace(
            "main()", "finetune_main()"
        )
    )
    before = {p: p.read_bytes() for p in (tmp_path / "prog").iterdir()}
    real = engine._convert_one

    def entry_fails(job):
        if job[0].endswith("train.py"):
            return job[0], None, [], f"{job[0]}: internal error: transform x crashed", True, False
        return real(job)

    monkeypatch.setattr(engine, "_convert_one", entry_fails)
    result = run("convert", "--write", "-j", "1", str(tmp_path))
    assert result.exit_code == 123
    assert {p: p.read_bytes() for p in (tmp_path / "prog").iterdir()} == before
    for name in ("data.py", "model.py", "finetune.py"):
        assert f"prog/{name}:1:1: not converted: the entry point" in result.stderr
    assert b"DistributedDataParallel" in (tmp_path / "solo.py").read_bytes()


def test_crash_outside_the_engine_is_123_not_a_bare_traceback(project, monkeypatch):
    from dp2ddp import runner

    def explode(self, *args, **kwargs):
        raise KeyError("unexpected")

    monkeypatch.setattr(runner.ConvertRun, "convert", explode)
    result = run("convert", str(project))
    assert result.exit_code == 123
    assert result.stderr.startswith("dp2ddp: internal error: KeyError('unexpected')")
    assert "This is a bug in dp2ddp" in result.stderr


def test_python_dash_m_and_no_torch_import(project):
    code = (
        "import sys, runpy\n"
        "sys.argv = ['dp2ddp', 'convert', '--check', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('dp2ddp', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "assert 'torch' not in sys.modules, 'convert imported torch'\n"
        "print('exit', code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(project)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "exit 1"
    version = subprocess.run([sys.executable, "-m", "dp2ddp", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "dp2ddp" in version.stdout


def test_reader_gone_is_quiet_and_writes_nothing(project):
    """``dp2ddp convert --write --diff . | head``: head leaves after a few lines.
    Exit 141 (as for a tool that SIGPIPE ends), no internal-error traceback, and
    no file written: the diff is printed before anything is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dp2ddp", "convert", "--write", "--diff", "--no-cache", str(project)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 141, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr
    assert (project / "train.py").read_bytes() == DP_SCRIPT


def test_folder_walk_skips_venvs_hidden_build_and_gitignored(tmp_path):
    for rel in ["src/train.py", ".hidden/train.py", "venv/lib/train.py", "build/train.py",
                "ignored/train.py", "env2/train.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(DP_SCRIPT)
    (tmp_path / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / ".git").mkdir()
    result = run("convert", "--check", str(tmp_path))
    assert result.exit_code == 1
    assert "1 file would be converted" in result.stderr, result.stderr
    # a file given by name is always taken
    result = run("convert", "--check", str(tmp_path / "ignored" / "train.py"))
    assert "1 file would be converted" in result.stderr


def test_report_lists_spots_left_for_a_human(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass MyDP(nn.DataParallel):\n    pass\n"
    )
    result = run("convert", str(script))
    # a spot left for a human: the conversion is incomplete, and says so
    assert result.exit_code == 1
    assert f"{script}:5:1: DDP001" in result.stderr
    assert "+# dp2ddp: DDP001" in result.stdout
    assert "0 files would be converted, 1 incomplete (1 spot left for you)" in result.stderr


def test_a_local_dataparallel_in_a_folder_is_reported_not_converted(tmp_path):
    # the class lives in one file, the call in another that never imports torch
    (tmp_path / "mylib.py").write_text("class DataParallel:\n    def __init__(self, model):\n        self.model = model\n")
    run_py = "from mylib import DataParallel\n\nwrapped = DataParallel(object())\n"
    (tmp_path / "run.py").write_text(run_py)
    result = run("convert", "--write", str(tmp_path))
    assert result.exit_code == 0
    assert "run.py:3:11: DDP001 DataParallel here is not torch's (it resolves to mylib.DataParallel)" in result.stderr
    assert (tmp_path / "run.py").read_text() == run_py


def test_an_entry_point_without_torch_is_reported_not_changed(tmp_path):
    # run.py starts training through the project's trainer but never names torch:
    # it is found as the entry point, left as it is, and the setup is asked for
    (tmp_path / "trainer.py").write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
        "def fit():\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4, shuffle=True)\n"
        "    for epoch in range(2):\n"
        "        for x, y in loader:\n"
        "            opt.zero_grad()\n"
        "            torch.nn.functional.mse_loss(model(x), y).backward()\n"
        "            opt.step()\n"
    )
    run_py = "from trainer import fit\n\nif __name__ == \"__main__\":\n    fit()\n"
    (tmp_path / "run.py").write_text(run_py)
    result = run("convert", "--check", str(tmp_path))
    assert result.exit_code == 1  # trainer.py would change
    assert "run.py:3:1: DDP002 entry point of the training program, but it does not use torch" in result.stderr
    assert (tmp_path / "run.py").read_text() == run_py


def test_an_entry_converted_without_its_modules_says_which_were_left_out(tmp_path):
    import shutil

    for name in ("train.py", "data.py", "model.py"):
        shutil.copy(FIXTURES / "e2e" / "multi_file" / "before" / name, tmp_path / name)
    alone = run("convert", "--no-cache", "train.py", cwd=tmp_path)
    assert "which were not given" in alone.output and "data.py" in alone.output
    whole = run("convert", "--no-cache", ".", cwd=tmp_path)
    assert "which were not given" not in whole.output


def test_an_entry_converted_alone_reads_the_modules_it_imports_but_leaves_them(tmp_path):
    """``convert train.py`` beside ``sample.py``: sample.py is not converted (and
    said so), but what its ``generate(model, ...)`` does with the model -- reads
    ``model.init_hidden``, which DDP does not forward -- decides the call in train.py."""
    import shutil

    before = FIXTURES / "e2e" / "model_read_by_another_module" / "before"
    for path in before.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    untouched = {p.name: p.read_bytes() for p in tmp_path.glob("*.py") if p.name != "train.py"}
    alone = run("convert", "--no-cache", "--write", "train.py", cwd=tmp_path)
    assert "which were not given" in alone.output and "sample.py" in alone.output
    assert "generate(model.module, 1, 5)" in (tmp_path / "train.py").read_text()
    assert {name: (tmp_path / name).read_bytes() for name in untouched} == untouched


def test_sync_bn_option_converts_batchnorm_before_the_wrap_and_runs_on_cpu(tmp_path):
    """--sync-bn hands DDP the model through the sync_batchnorm helper (which keeps
    BatchNorm on CPU, where SyncBatchNorm has no kernel); without it, a note."""
    from conftest import run_script

    source = (FIXTURES / "wrap-model" / "sync_batchnorm_option.in.py").read_text()
    script = tmp_path / "work" / "train.py"
    script.parent.mkdir()
    script.write_text(source)
    runner = CliRunner()
    plain = runner.invoke(cli, ["convert", str(script)], catch_exceptions=False)
    assert "sync_batchnorm" not in plain.output and "--sync-bn for SyncBatchNorm" in plain.output
    result = runner.invoke(cli, ["convert", "--sync-bn", "--write", "-q", str(script)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    converted = script.read_text()
    assert "DistributedDataParallel(\n        sync_batchnorm(model)," in converted
    run = run_script(script.parent, "train.py", [], distributed=True)
    assert run.returncode == 0, run.output
    assert run.output.count("trained") == 1, run.output  # rank 0 prints


def test_one_file_named_two_ways_is_converted_once(tmp_path):
    """A symlink to a file and a path through '..' name the file already given:
    it is read, converted and written once (twice was a 'changed on disk' error)."""
    (tmp_path / "tree").mkdir()
    real = tmp_path / "tree" / "real.py"
    real.write_bytes(DP_SCRIPT)
    os.symlink("real.py", tmp_path / "tree" / "alias.py")
    result = run("convert", "--write", "-q", "tree/alias.py", "tree/real.py", "./tree/../tree/real.py", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert "DistributedDataParallel" in real.read_text()
    assert os.path.islink(tmp_path / "tree" / "alias.py")
    lint = run("lint", "--no-cache", "tree/real.py", "tree/alias.py", cwd=tmp_path)
    assert "(1 file)" in lint.output, lint.output


def test_colour_diff_on_request_and_plain_when_piped(tmp_path):
    (tmp_path / "train.py").write_bytes(DP_SCRIPT)
    coloured = run("convert", "--color", "train.py", cwd=tmp_path).stdout
    assert "\x1b[32m+" in coloured
    # each styled line ends with its reset code, before the line break
    assert all(line.endswith("\x1b[0m") for line in coloured.splitlines() if line.startswith("\x1b[3"))
    plain = run("convert", "train.py", cwd=tmp_path).stdout
    assert "\x1b[" not in plain and "+" in plain


@pytest.mark.parametrize("tool", ["patch", "git"])
def test_the_printed_diff_applies_with_patch_and_git_also_under_a_folder_with_a_space(tmp_path, tool):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    folder = tmp_path / "my project"
    folder.mkdir()
    (folder / "train.py").write_bytes(DP_SCRIPT)
    result = run("convert", "my project", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("--- a/my project/train.py\t\n+++ b/my project/train.py\t\n")
    converted = tmp_path / "converted"
    shutil.copytree(tmp_path / "my project", converted / "my project")
    command = ["patch", "-p1", "--quiet"] if tool == "patch" else ["git", "apply", "-p1", "-"]
    applied = subprocess.run(command, input=result.stdout, text=True, cwd=converted, capture_output=True)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    run("convert", "--write", "--allow-dirty", "my project", cwd=tmp_path)
    assert (converted / "my project" / "train.py").read_bytes() == (folder / "train.py").read_bytes()
    assert (folder / "train.py").read_bytes() != DP_SCRIPT


def test_a_training_helper_of_another_module_reading_the_models_attributes_is_reported():
    """``loss = compute_loss(model, x, y)`` of another module reads
    ``model.criterion``: passing ``model.module`` would train past DDP's gradient
    sync, so the call is a spot (the file is incomplete), not rewritten."""
    from dp2ddp.engine import convert_sources

    losses = b"import torch\n\n\ndef compute_loss(model, x, y):\n    return model.criterion(model(x), y)\n"
    train = b"""import torch
from torch.utils.data import DataLoader, TensorDataset

from losses import compute_loss


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)
        self.criterion = torch.nn.MSELoss()

    def forward(self, x):
        return self.fc(x)


def main():
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    for epoch in range(2):
        for x, y in loader:
            loss = compute_loss(model, x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""
    result = convert_sources({"train.py": train, "losses.py": losses})
    (entry,) = [f for f in result.files if f.path == "train.py"]
    spots = [f for f in entry.findings if f.kind == "manual" and f.code == "DDP303"]
    assert spots and "compute_loss()" in spots[0].message and "model.criterion" in spots[0].message
    assert b"compute_loss(model, x, y)" in entry.output


def test_in_batch_labels_from_the_batch_size_in_another_module_keep_it_per_process():
    """SimCLR's shape: the loader is built in train.py, the InfoNCE loss of another
    module builds its labels from ``args.batch_size``.  Divided among the processes,
    the batches would not match the labels (a shape mismatch): the loader keeps the
    number per process, both files say so.  A learning rate computed from the same
    setting means the global batch: then the labels are a spot instead."""
    from dp2ddp.engine import convert_sources

    loss = b"""import torch
import torch.nn.functional as F


class Contrast:
    def __init__(self, args):
        self.args = args

    def info_nce_loss(self, features):
        labels = torch.cat([torch.arange(self.args.batch_size) for _ in range(2)])
        features = F.normalize(features, dim=1)
        similarity = torch.matmul(features, features.T)
        return similarity, labels
"""
    train = b"""import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from contrast import Contrast


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=args.batch_size, shuffle=True)
    contrast = Contrast(args)
    for epoch in range(2):
        for (x,) in loader:
            logits, labels = contrast.info_nce_loss(model(torch.cat([x, x])))
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""
    result = convert_sources({"train.py": train, "contrast.py": loss})
    files = {f.path: f for f in result.files}
    assert not [f for f in files["contrast.py"].findings if f.kind == "manual"]
    notes = [f for f in files["contrast.py"].findings if f.kind == "note" and f.code == "DDP103"]
    assert notes and notes[0].line == 10 and "keeps self.args.batch_size samples per process" in notes[0].message
    output = files["train.py"].output.decode()
    assert "batch_size=args.batch_size," in output and "per_rank_batch_size" not in output
    assert any(f.code == "DDP103" and "stays per process" in f.message for f in files["train.py"].findings)

    scaled = train.replace(b"lr=0.1", b"lr=0.1 * args.batch_size / 256")
    result = convert_sources({"train.py": scaled, "contrast.py": loss})
    files = {f.path: f for f in result.files}
    spots = [f for f in files["contrast.py"].findings if f.kind == "manual" and f.code == "DDP103"]
    assert spots and "self.args.batch_size" in spots[0].message and spots[0].line == 10
    assert "per_rank_batch_size(args.batch_size)" in files["train.py"].output.decode()


def test_convert_says_what_lint_will_still_report_on_its_output(tmp_path):
    """A DataParallel script that saves model.state_dict(): the converted one keeps
    the 'module.' keys on purpose, and lint (default --fail-on warning) reports
    DDP303 there -- convert's summary says so, and why, at the line lint shows."""
    import shutil

    shutil.copy(FIXTURES / "e2e" / "grad_accum" / "before" / "train.py", tmp_path / "train.py")
    converted = run("convert", "--no-cache", "--write", "train.py", cwd=tmp_path)
    assert "dp2ddp lint will still report on the converted code" in converted.output
    said = [line.strip() for line in converted.output.splitlines() if "DDP303" in line and "kept on purpose" in line]
    linted = run("lint", "train.py", cwd=tmp_path)
    assert linted.exit_code == 1
    found = [line for line in linted.output.splitlines() if "DDP303" in line]
    assert said and found and said[0].startswith(found[0].split(" ", 1)[0])  # (the same path:line:col)


def test_facts_read_back_from_the_cache_decide_as_fresh_ones(tmp_path, monkeypatch):
    """The second run answers the files' ``ast`` facts from the cache: what a module
    does with the model handed to it (reads ``model.init_hidden``; a trainer class
    that saves ``self.model.state_dict()``) must decide the entry's conversion as
    on the first run."""
    import shutil

    monkeypatch.delenv("DP2DDP_NO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path.parent / f"{tmp_path.name}-cache"))
    before = FIXTURES / "e2e" / "model_read_by_another_module" / "before"
    for path in before.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "trainer.py").write_text(
        "import torch\n\n\n"
        "class Keeper:\n"
        "    def __init__(self, model, path):\n"
        "        self.model = model.to('cpu')\n"
        "        self.path = path\n\n"
        "    def keep(self):\n"
        "        torch.save(self.model.state_dict(), self.path)\n"
    )
    train = (tmp_path / "train.py").read_text()
    assert "\ndef main" in train or "\ndef train" in train
    train = train.replace("import torch\n", "import torch\nfrom trainer import Keeper\n", 1)
    (tmp_path / "train.py").write_text(train)
    first = run("convert", ".", cwd=tmp_path)
    # train.py changed: converted again, with its modules' facts read back from the cache
    (tmp_path / "train.py").write_text(train + "# edited\n")
    second = run("convert", ".", cwd=tmp_path)
    fresh = run("convert", "--no-cache", ".", cwd=tmp_path)
    assert "generate(model.module, 1, 5)" in first.output
    assert second.output == fresh.output
    assert second.exit_code == fresh.exit_code


def test_a_model_handed_to_another_modules_saving_class_is_noted_at_the_call(tmp_path):
    """``SimCLR(model=model, ...)`` of another module keeps ``self.model =
    kwargs["model"]`` and saves ``self.model.state_dict()``: it now gets the DDP
    wrapper, whose keys carry ``module.`` -- said at the call (DDP303 note)."""
    (tmp_path / "learner.py").write_text(
        "import torch\n\n\n"
        "class Learner:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        self.model = kwargs['model']\n"
        "        self.optimizer = kwargs['optimizer']\n\n"
        "    def fit(self, loader):\n"
        "        for x, y in loader:\n"
        "            loss = torch.nn.functional.mse_loss(self.model(x), y)\n"
        "            self.optimizer.zero_grad()\n"
        "            loss.backward()\n"
        "            self.optimizer.step()\n"
        "        torch.save({'state_dict': self.model.state_dict()}, 'last.pt')\n"
    )
    (tmp_path / "run.py").write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n\n"
        "from learner import Learner\n\n\n"
        "def main():\n"
        "    model = torch.nn.Linear(4, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)\n"
        "    for epoch in range(2):\n"
        "        Learner(model=model, optimizer=optimizer).fit(loader)\n\n\n"
        "if __name__ == \"__main__\":\n"
        "    main()\n"
    )
    result = run("convert", "--no-cache", ".", cwd=tmp_path)
    notes = [line for line in result.output.splitlines() if "DDP303" in line]
    assert len(notes) == 1, result.output
    assert "run.py:12:" in notes[0] and "Learner (another module) saves the state_dict() of the model" in notes[0]


def test_a_message_that_still_names_dataparallel_is_noted(tmp_path):
    """``logger.info("Using %d GPUs with DataParallel", n)`` says, once converted,
    what the program no longer does: named in the notes at its line (the code is
    the author's to reword), not a message that merely names DDP."""
    script = tmp_path / "train.py"
    script.write_text(
        "import logging\n\nimport torch\nimport torch.nn as nn\n\nlogger = logging.getLogger(__name__)\n\n\n"
        "def main():\n    model = nn.Linear(2, 2)\n    if torch.cuda.device_count() > 1:\n"
        "        logger.info('Using %d GPUs with DataParallel', torch.cuda.device_count())\n"
        "        model = nn.DataParallel(model)\n"
        "    print('DistributedDataParallel is what we want')\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = CliRunner().invoke(cli, ["convert", str(script)], catch_exceptions=False)
    notes = [line for line in result.output.splitlines() if "still says DataParallel" in line]
    assert len(notes) == 1 and f"{script}:12:9: DDP001" in notes[0], result.output
