"""Rolling changes across the three converged boards, through the runner (commands/rollout.py) and its
ansible-runner event stream: a new runtime pin with a planted failure, a failed canary, a rerun.

The planted failure is the sandbox inventory's (inventories/sandbox/group_vars/all/rollout.yml): a
board named in rollout_fault_hosts gets, in the configuration the rollout renders, an environment
that kills vLLM's engine at start. Each case runs after the previous one, in this order."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rigops_testinfra import get_host

pytestmark = pytest.mark.changes_state

ROOT = Path(__file__).resolve().parents[3]
BOARDS = ["jet-1", "jet-2", "jet-3"]
RUNTIME = "/opt/rigops/vllm"


def lock_line(name):
    """The lock's entry for ``name`` as one requirement line: the lock plus a repeated entry is a new pin set
    (another release, the same wheels), as molecule/vllm_runtime's second release."""
    lock = (ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
    m = re.search(rf"^({re.escape(name)}==\S+)\s*\\\s*\n\s*(--hash=sha256:[0-9a-f]{{64}})", lock, re.M)
    assert m, name
    return f"{m.group(1)} {m.group(2)}"


NEW_PIN = {"vllm_runtime_extra_requirements": [lock_line("idna")]}


def board(name):
    return get_host(name)


def rollout(tmp_path, *args, faults=(), regressions=(), conformance=True):
    """Run the runner as a user would; its exit code, its output and its JSON report."""
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    cmd = [
        sys.executable, str(ROOT / "commands" / "rollout.py"), "--plain",
        "-i", str(inventory), "-i", str(ROOT / "inventories" / "sandbox" / "groups.yml"),
        "-e", json.dumps(dict(NEW_PIN, rollout_fault_hosts=list(faults), rollout_regression_hosts=list(regressions),
                              rollout_conformance=conformance)),
        "--report-dir", str(tmp_path), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    (report_file,) = tmp_path.glob("*/report.json")
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report_file.read_text())


def serving(host):
    """What a board serves: the release current points at and the one its config names, and a real completion."""
    current = host.file(f"{RUNTIME}/current").linked_to
    config = host.file("/etc/vllm/chat/config.toml").content_string
    python = re.search(r'^python = "(.*)/venv/bin/python"', config, re.M).group(1)
    key = host.check_output("cat /etc/vllm/chat/api_key").strip()
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    answer = host.run(
        "curl -sS --noproxy '*' -w '\\n%{http_code}' -H 'Content-Type: application/json' "
        f"-H 'Authorization: Bearer {key}' -d '{body}' http://127.0.0.1:8000/v1/chat/completions"
    )
    status = answer.stdout.rsplit("\n", 1)[-1]
    return {"current": current, "config_release": python, "completion": status}


def state(host):
    """What must not move on a board a rollout leaves alone."""
    return {
        "current": host.file(f"{RUNTIME}/current").linked_to,
        "config": host.file("/etc/vllm/chat/config.toml").sha256sum,
        "unit": host.file("/etc/systemd/system/vllm@.service").sha256sum,
        "started": host.check_output("systemctl show -p ActiveEnterTimestampMonotonic --value vllm@chat"),
        "pid": host.check_output("systemctl show -p MainPID --value vllm@chat"),
    }


@pytest.fixture(scope="module")
def before():
    return {name: serving(board(name)) for name in BOARDS}


def test_a_new_runtime_pin_with_a_planted_failure(before, tmp_path):
    """Canary jet-1, then jet-2 and jet-3: jet-2 fails its gate on the new release and is rolled back, its
    batch-mate jet-3 goes on to the new release."""
    assert all(s["completion"] == "200" for s in before.values())
    # (without the canary's conformance gate, for time: its pass is the rerun's, its failure the failed canary's)
    rc, out, report = rollout(tmp_path, "--batches", "1,100%", "--max-fail-percentage", "70", faults=["jet-2"],
                              conformance=False)  # fmt: skip
    assert rc == 1, out[-4000:]
    hosts = {h["host"]: h for h in report["hosts"]}
    assert {h: e["status"] for h, e in hosts.items()} == {
        "jet-1": "updated", "jet-2": "rolled_back", "jet-3": "updated",
    }, out[-4000:]  # fmt: skip
    assert report["batches"] == [["jet-1"], ["jet-2", "jet-3"]] and report["canary"] == "jet-1"
    old = {name: before[name]["current"] for name in BOARDS}
    new = hosts["jet-1"]["after"]["runtime"]
    assert new != hosts["jet-1"]["before"]["runtime"] and hosts["jet-3"]["after"]["runtime"] == new
    for name in BOARDS:
        now = serving(board(name))
        assert now["completion"] == "200", (name, now)  # a real completion on whatever serves now
        if name == "jet-2":
            assert now["current"] == old[name] and now["config_release"] == old[name]
            assert hosts[name]["rolled_back"] and hosts[name]["after"] == hosts[name]["before"]
            # the step and the gate's finding: the planted setting makes vLLM exit while loading
            reason = hosts[name]["reason"]
            assert reason.startswith("restart: Gate | Verdict on chat:") and "crashed" in reason, reason
            assert hosts[name]["rollback_gate"]["chat"]["chat_s"] is not None
            assert "rigops-planted-fault" not in board(name).file("/etc/systemd/system/vllm@.service").content_string
            # the rollout rolls the whole release back itself: the role put no config.toml aside
            assert not board(name).file("/etc/vllm/chat/config.toml.rejected").exists
        else:
            assert now["current"].endswith(new) and now["config_release"].endswith(new)
            assert hosts[name]["gate"]["chat"]["ttft_s"] is not None
        # the new release was staged beside the old one on every board; the old one is kept for rollback
        releases = board(name).check_output(f"ls {RUNTIME}/releases").split()
        assert new in releases and Path(old[name]).name in releases
        steps = hosts[name]["stage_seconds"]
        assert {"backup", "stage", "switch", "restart"} <= set(steps)
    assert "2 updated, 1 rolled_back" in out and "exit 1" in out
    assert (tmp_path / report["rollout"] / "summary.txt").exists()


def test_a_failed_canary_leaves_every_other_board_untouched(tmp_path):
    """jet-2 (the new release already staged there: a switch, no install) fails as the canary: jet-3 stays.
    Its new configuration is the planted regression: without the tool-call parser, vLLM starts and answers the
    endpoint gate's chat, and refuses the tool calls it answered before, which the conformance gate finds."""
    untouched = {name: state(board(name)) for name in ("jet-3",)}
    rc, out, report = rollout(tmp_path, "-l", "jet-2,jet-3", regressions=["jet-2"])
    assert rc == 1, out[-4000:]
    hosts = {h["host"]: h for h in report["hosts"]}
    assert hosts["jet-2"]["status"] == "rolled_back" and hosts["jet-2"]["canary"]
    reason = hosts["jet-2"]["reason"]
    # (the first of the cases it broke: tool_required, then tool_named, ..., tool_auto)
    assert reason.startswith("conformance: ") and "tiny tool_required: pass -> unsupported" in reason, reason
    assert "requires --tool-call-parser" in reason and hosts["jet-2"]["rollback_gate"]["chat"]["chat_s"] is not None
    # what served before is back: the parser in the command line, a tool call answered
    assert "--tool-call-parser" in board("jet-2").file("/etc/vllm/chat/config.toml").content_string
    assert hosts["jet-3"]["status"] == "not_started"
    assert report["stopped"] == "the canary jet-2 failed: no other host was touched"
    for name, was in untouched.items():
        assert state(board(name)) == was, name
        assert not board(name).file(f"/var/lib/rigops/rollout/{report['rollout']}").exists
    assert serving(board("jet-2"))["completion"] == "200"


def test_a_rerun_of_a_finished_rollout_changes_nothing(tmp_path):
    """jet-1 and jet-3 finished on the new pin: the same rollout again stages, switches and restarts nothing."""
    was = {name: state(board(name)) for name in ("jet-1", "jet-3")}
    rc, out, report = rollout(tmp_path, "-l", "jet-1,jet-3")
    assert rc == 0, out[-4000:]
    assert [h["status"] for h in report["hosts"]] == ["unchanged", "unchanged"]
    assert all(not h["rolled_back"] and h["before"] == h["after"] for h in report["hosts"])
    assert [h["changed_tasks"] for h in report["hosts"]] == [0, 0]
    # the canary's conformance gate ran, on jet-1 only, and found nothing the (empty) change broke
    steps = {h["host"]: h["stage_seconds"] for h in report["hosts"]}
    assert "conformance" in steps["jet-1"] and "conformance" not in steps["jet-3"], steps
    for name, snapshot in was.items():
        assert state(board(name)) == snapshot, name
    assert "2 unchanged" in out and "exit 0" in out
