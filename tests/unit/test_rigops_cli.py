"""The ./rigops entry point: production commands install no sandbox packages; unknown words are refused."""

from __future__ import annotations

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


def test_benchmark_without_a_known_name_lists_them(tmp_path):
    env, _ = _stub_path(tmp_path)
    proc = run(["benchmark", "nope"], env)
    assert proc.returncode == 2
    assert "main_job" in proc.stderr


def test_rollout_is_a_production_command(tmp_path):
    """`./rigops rollout` runs tools/rollout.py with the production virtualenv (no sandbox packages)."""
    env, calls = _stub_path(tmp_path)
    proc = run(["help"], env)
    assert "./rigops rollout [ARGS]" in proc.stdout and "tools/rollout.py" in proc.stdout
    script = (ROOT / "rigops").read_text()
    case = script[script.index("  rollout)") : script.index(";;", script.index("  rollout)"))]
    assert "production" in case and "development" not in case and "tools/rollout.py" in case
    assert not calls.exists()
