"""The collection rigops.fleet as people get it: the artifact `ansible-galaxy collection build` makes, installed
from it, used from a folder that is not the checkout.

Shared by the collection's tests (test_collection.py, test_ansible_test_sanity.py, test_execution_environment.py),
which lab/run_tests.py runs as steps of the lint stage. A tool they need that is missing fails the test (it is
in requirements.txt or requirements-dev.txt): never a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COLLECTION = ("rigops", "fleet")


def tool(name: str) -> str:
    """A command of the virtualenv the tests run in (else of PATH); missing: the test fails."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed (next to {sys.executable} or on PATH): ./rigops bootstrap --dev")
    return found


def outside_env(collections_path: Path | None = None) -> dict[str, str]:
    """The environment of someone who installed the collection: none of the checkout's Ansible settings (no
    ANSIBLE_CONFIG, nor the strategy the test runner sets), no PYTHONPATH; ANSIBLE_COLLECTIONS_PATH is the
    install folder only. The tools of this virtualenv come first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    if collections_path is not None:
        env["ANSIBLE_COLLECTIONS_PATH"] = str(collections_path)
    return env


def run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _ok(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def build(out_dir: Path) -> Path:
    """`ansible-galaxy collection build` of the checkout into out_dir: the artifact's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [tool("ansible-galaxy"), "collection", "build", "--output-path", out_dir]
    _ok(run(cmd, cwd=ROOT, env=outside_env()), "ansible-galaxy collection build")
    (artifact,) = out_dir.glob("rigops-fleet-*.tar.gz")
    return artifact


def install(artifact: Path, collections_path: Path) -> Path:
    """The artifact installed into collections_path (empty): the collection's folder.

    --offline: Ansible Galaxy is not asked for anything (it is unreachable from here, and the artifact is at
    hand). The collection's dependency (community.general, galaxy.yml) must then be installed already, and is:
    from the PyPI package `ansible` of requirements.txt, which ansible-galaxy finds on Python's path. A missing
    or too old community.general fails the install instead of being fetched (what --no-deps would not check).
    """
    collections_path.mkdir(parents=True, exist_ok=True)
    cmd = [tool("ansible-galaxy"), "collection", "install", "--offline", "-p", collections_path, artifact]
    _ok(run(cmd, cwd=collections_path, env=outside_env(collections_path)), "ansible-galaxy collection install")
    folder = collections_path.joinpath("ansible_collections", *COLLECTION)
    assert (folder / "MANIFEST.json").is_file(), f"nothing installed in {folder}"
    return folder
