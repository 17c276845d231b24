"""The ./rigops entry point: production commands install no sandbox packages; unknown words are refused."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _stub_path(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose dpkg-query, apt-get and sudo only record that they were called."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dpkg-query", "apt-get", "sudo"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return env, calls


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [str(ROOT / "rigops"), *args]
    return subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_unknown_word_is_refused_with_the_usage(tmp_path):
    env, calls = _stub_path(tmp_path)
    proc = run(["deploy-everything"], env)
    assert proc.returncode == 2
    assert "unknown command: deploy-everything" in proc.stderr
    assert "./rigops ansible-playbook" in proc.stderr and "./rigops test" in proc.stderr
    assert not calls.exists(), "an unknown word must install nothing"


def test_production_tool_does_not_touch_system_packages(tmp_path):
    env, calls = _stub_path(tmp_path)
    proc = run(["ansible-inventory", "-i", "inventories/example", "--graph"], env)
    assert proc.returncode == 0, proc.stderr
    assert "@gpu-rigs:" in proc.stdout and "rig-5090-01" in proc.stdout
    assert not calls.exists(), f"a production command called: {calls.read_text() if calls.exists() else ''}"


def test_measure_without_a_known_name_lists_them(tmp_path):
    env, _ = _stub_path(tmp_path)
    proc = run(["measure", "nope"], env)
    assert proc.returncode == 2
    assert "main_job" in proc.stderr


def test_rollout_is_a_production_command(tmp_path):
    """`./rigops rollout` runs commands/rollout.py with the production virtualenv (no sandbox packages)."""
    env, calls = _stub_path(tmp_path)
    proc = run(["help"], env)
    assert "./rigops rollout [ARGS]" in proc.stdout and "commands/rollout.py" in proc.stdout
    script = (ROOT / "rigops").read_text()
    case = script[script.index("  rollout)") : script.index(";;", script.index("  rollout)"))]
    assert "production" in case and "development" not in case and "commands/rollout.py" in case
    assert not calls.exists()


def test_the_virtualenv_is_built_once_per_requirements_in_the_cache(tmp_path):
    """.venv links to $RIGOPS_CACHE/controller/<kind>-<hash>: one left without its stamp (an interrupted build)
    is built again, and a second clone reuses it. Requirements here are empty: the mechanism is tested, not pip."""
    cache = tmp_path / "cache"
    env = dict(os.environ, RIGOPS_CACHE=str(cache))
    env.pop("VIRTUAL_ENV", None)
    requirements = "# nothing\n"
    venv = cache / "controller" / f"prod-{hashlib.sha256(requirements.encode()).hexdigest()[:16]}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "half-installed").write_text("")  # what an interrupted build left: no stamp

    def bootstrap(name):
        project = tmp_path / name
        project.mkdir()
        (project / "rigops").write_text((ROOT / "rigops").read_text())
        (project / "rigops").chmod(0o755)
        (project / "requirements.txt").write_text(requirements)
        (project / "requirements-bench.txt").write_text("-r requirements.txt\n")
        (project / "requirements-dev.txt").write_text("-r requirements-bench.txt\n")
        proc = subprocess.run(
            [str(project / "rigops"), "bootstrap"],
            check=False,
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert (project / ".venv").is_symlink() and (project / ".venv").resolve() == venv
        return proc.stderr

    assert f"building the virtualenv {venv} from requirements.txt" in bootstrap("first")
    assert not (venv / "bin" / "half-installed").exists() and (venv / "bin" / "python").exists()
    assert (venv / ".requirements.sha256").read_text().strip() == venv.name
    assert "building" not in bootstrap("second")
