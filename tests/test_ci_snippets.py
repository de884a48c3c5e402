"""The README's pre-commit and GitHub Actions snippets work when pasted.

Each snippet is taken from README.md as written; only the repository URL is
pointed at a git copy of this working tree (a local path instead of GitHub).
pre-commit and dp2ddp's dependencies come from the package registry: the tests
skip, saying so, when it cannot be reached.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

URL = "https://github.com/dp2ddp/dp2ddp"
DATA_PARALLEL = "import torch\nimport torch.nn as nn\n\nmodel = nn.DataParallel(nn.Linear(2, 2))\n"


def _yaml_blocks():
    return re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _snippet(marker: str) -> str:
    found = [block for block in _yaml_blocks() if marker in block]
    assert len(found) == 1, f"README.md: one yaml block with {marker!r} expected, found {len(found)}"
    return found[0]


def _run(cmd, **kwargs):
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, **kwargs)


def _git(repo: Path, *args):
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """Skip when the package registry cannot be reached (what the snippets install from)."""
    folder = tmp_path_factory.mktemp("download")
    proc = _run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder), "pathspec"],
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.skip(f"the package registry cannot be reached (pip download failed): {proc.stderr[-300:]}")


@pytest.fixture(scope="session")
def snapshot(tmp_path_factory):
    """A git repository holding this working tree's files (committed or not) at one
    commit: what a `repo:` URL at a commit gives pre-commit and pip."""
    repo = tmp_path_factory.mktemp("dp2ddp-repo")
    listed = _run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"], check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, repo / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "snapshot")
    return repo, _git(repo, "rev-parse", "HEAD").stdout.strip()


@pytest.fixture(scope="session")
def pre_commit(registry, tmp_path_factory):
    """The pre-commit executable: this environment's, else one installed from the registry."""
    here = Path(sys.executable).parent / "pre-commit"
    if here.exists():
        return str(here)
    venv = tmp_path_factory.mktemp("pre-commit-venv")
    _run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = _run([str(venv / "bin" / "pip"), "install", "-q", "pre-commit"], timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"pre-commit could not be installed from the registry: {proc.stderr[-300:]}")
    return str(venv / "bin" / "pre-commit")


def _project(tmp: Path, config: str) -> Path:
    project = tmp / "project"
    project.mkdir()
    (project / "train.py").write_text(DATA_PARALLEL)
    (project / "clean.py").write_text("import torch\n\nx = torch.zeros(2)\n")
    (project / ".pre-commit-config.yaml").write_text(config)
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    return project


def test_the_hook_manifest_names_the_hook_of_the_snippets():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = [h for h in hooks if h["id"] == "dp2ddp-lint"]
    assert hook["entry"].split()[:2] == ["dp2ddp", "lint"]
    for marker in (f"repo: {URL}", "repo: local"):
        config = yaml.safe_load(_snippet(marker))
        assert [h["id"] for r in config["repos"] for h in r["hooks"]] == ["dp2ddp-lint"]


def test_pre_commit_runs_the_hook_from_a_repo_at_a_commit(pre_commit, snapshot, tmp_path):
    repo, commit = snapshot
    config = _snippet(f"repo: {URL}").replace(URL, str(repo))
    project = _project(tmp_path, config)
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    env.pop("DP2DDP_NO_CACHE", None)
    # as the README says: pin `rev: HEAD` to the commit the repository is at
    update = _run([pre_commit, "autoupdate"], cwd=project, env=env, timeout=120)
    assert update.returncode == 0, update.stdout + update.stderr
    pinned = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())["repos"][0]["rev"]
    assert pinned == commit
    proc = _run([pre_commit, "run", "--all-files"], cwd=project, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    if proc.returncode == 3 and "pip" in output:  # (pre-commit: an error installing the hook)
        pytest.skip(f"the hook's environment could not be installed: {output[-500:]}")
    assert proc.returncode == 1, output
    assert "dp2ddp lint" in output and "Failed" in output
    assert "train.py:4:9: DDP001" in output
    assert "clean.py" not in output
    # the fixed file passes
    (project / "train.py").write_text("import torch\n\nx = torch.zeros(2)\n")
    proc = _run([pre_commit, "run", "--all-files"], cwd=project, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Passed" in proc.stdout


def test_pre_commit_runs_the_local_hook(pre_commit, tmp_path):
    project = _project(tmp_path, _snippet("repo: local"))
    # the environment that runs `git commit` has dp2ddp installed (this one's bin/ first)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = dict(os.environ, PATH=path, PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"))
    proc = _run([pre_commit, "run", "--all-files"], cwd=project, env=env, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "train.py:4:9: DDP001" in output
    assert "clean.py" not in output


def test_the_actions_step_installs_and_lints_from_a_clean_venv(registry, snapshot, tmp_path):
    repo, _ = snapshot
    (step,) = yaml.safe_load(_snippet("- run: pip install"))
    command = step["run"]
    assert URL in command
    command = command.replace(URL, f"file://{repo}")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], check=True)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "train.py").write_text(DATA_PARALLEL)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DP2DDP_NO_CACHE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"
    proc = _run(["bash", "-c", command], cwd=workspace, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    if proc.returncode != 1 and "Could not" in output and "pip" in output:
        pytest.skip(f"the step's dependencies could not be installed: {output[-500:]}")
    assert proc.returncode == 1, output
    assert "::error file=train.py,line=4,col=9," in proc.stdout
    assert "DDP001" in proc.stdout
    assert (venv / "bin" / "dp2ddp").exists()
