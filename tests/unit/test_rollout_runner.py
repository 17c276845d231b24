"""The rollout runner (commands/rollout.py): its state, report, table and exit code come from ansible-runner's
events only. The events in tests/unit/fixtures/rollout/ were recorded from a real ansible-runner run
(commands/rollout.py --save-events) of a tiny rollout on four local hosts made of the rollout's own task
files (playbook.yml there); one test runs it again live."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "unit" / "fixtures" / "rollout"
sys.path.insert(0, str(ROOT / "commands"))

import rollout  # noqa: E402


def replay(name: str) -> rollout.Rollout:
    state = rollout.Rollout("fixture", clock=iter(range(0, 10**6, 5)).__next__)
    for line in (FIX / name).read_text().splitlines():
        state.handle(json.loads(line))
    state.finish(2, "failed")
    return state


def by_host(report: dict) -> dict:
    return {h["host"]: h for h in report["hosts"]}


def test_a_rollout_with_a_rollback_and_a_failure():
    report = replay("events-batches.jsonl").report()
    hosts = by_host(report)
    assert {h: e["status"] for h, e in hosts.items()} == {
        "jet-1": "updated",
        "jet-2": "rolled_back",
        "jet-3": "unchanged",
        "jet-4": "failed",
    }
    assert report["batches"] == [["jet-1"], ["jet-2", "jet-3", "jet-4"]] and report["canary"] == "jet-1"
    assert [h["host"] for h in report["hosts"]] == ["jet-1", "jet-2", "jet-3", "jet-4"]
    assert report["exit_code"] == 1 and not report["ok"] and report["stopped"] is None
    assert report["counts"] == {"updated": 1, "unchanged": 1, "rolled_back": 1, "failed": 1}
    updated, rolled = hosts["jet-1"], hosts["jet-2"]
    assert updated["canary"] and updated["before"]["runtime"].endswith("0a816e8303e6")
    assert updated["after"]["runtime"].endswith("77d2c0ffee42") and not updated["rolled_back"]
    assert list(updated["stage_seconds"]) == ["backup", "stage", "switch", "restart", "done"]
    assert updated["gate"]["chat"]["chat_s"] == 0.41 and updated["gate"]["chat"]["ttft_s"] == 0.21
    assert rolled["rolled_back"] and rolled["after"] == rolled["before"]
    assert list(rolled["stage_seconds"])[-2:] == ["rollback", "rollback_gate"]
    assert rolled["rollback_gate"]["chat"]["chat_s"] == 0.38
    assert "failed its gate (unit_failed)" in rolled["reason"] and rolled["reason"].startswith("restart: ")
    assert hosts["jet-4"]["reason"].startswith("stage: ") and not hosts["jet-4"]["rolled_back"]
    assert hosts["jet-3"]["before"] == hosts["jet-3"]["after"]
    assert report["host_seconds_sum"] == round(sum(h["host_seconds"] for h in report["hosts"]), 1)
    assert all(isinstance(h["changed_tasks"], int) for h in report["hosts"])  # from the recap event


def test_a_failed_canary_leaves_every_other_host_untouched():
    report = replay("events-canary.jsonl").report()
    hosts = by_host(report)
    assert report["batches"] == [["jet-2"]] and report["canary"] == "jet-2"
    assert hosts["jet-2"]["status"] == "rolled_back" and hosts["jet-2"]["canary"]
    assert {hosts["jet-3"]["status"], hosts["jet-4"]["status"]} == {"not_started"}
    assert hosts["jet-3"]["after"] == hosts["jet-3"]["before"] and hosts["jet-3"]["stage_seconds"] == {}
    assert report["stopped"] == "the canary jet-2 failed: no other host was touched"
    assert report["exit_code"] == 1


def test_the_summary_table():
    table = rollout.summary_table(replay("events-batches.jsonl").report())
    lines = table.splitlines()
    assert lines[0].split() == [
        "host", "batch", "status", "runtime", "before", "->", "after", "models", "before", "->", "after",
        "steps", "(s)", "gate", "rolled", "back",
    ]  # fmt: skip
    row = next(ln for ln in lines if ln.startswith("jet-2"))
    assert "rolled_back" in row and "0a816e8303e6 -> 0a816e8303e6" in row and row.rstrip().endswith("yes")
    assert "chat: chat 0.38s, first token 0.19s" in row  # the gate the old release passed again
    assert next(ln for ln in lines if ln.startswith("jet-1 (canary)")).rstrip().endswith("no")
    assert "1 updated, 1 unchanged, 1 rolled_back, 1 failed; wall" in table and "exit 1" in table
    assert any(ln.startswith("jet-4: stage: ") for ln in lines)


def _event(kind, host, task, res, action="ansible.builtin.set_fact"):
    return {"event": kind, "event_data": {"host": host, "task": task, "task_action": action, "res": res}}


def test_gates_unreachable_hosts_and_lines_shown():
    state = rollout.Rollout("x", clock=iter(range(100)).__next__)
    plan = {"ansible_facts": {"rollout_plan": {"host": "jet-9", "job": "jetson", "before": {"runtime": "a-b-c0ffee"}}}}
    assert state.handle(_event("runner_on_ok", "jet-9", "Rollout | Plan of the host", plan)) == [
        "jet-9: planned (jetson), serving runtime c0ffee"
    ]
    batch = {"ansible_facts": {"rollout__batches_seen": [["jet-9"]]}}
    assert state.handle(_event("runner_on_ok", "jet-9", "Rollout | Batch", batch)) == ["canary 1: jet-9"]
    gate = {"ready_s": 40.0, "chat_s": 0.4, "ttft_s": 0.2}
    shown = state.handle(_event("runner_on_ok", "jet-9", "Gate | vllm_endpoint on chat", gate, "vllm_endpoint"))
    assert shown == ["jet-9: chat gate ok: chat 0.4s ttft 0.2s"]
    failed = {"kind": "unit_failed", "msg": "the unit failed while loading"}
    shown = state.handle(_event("runner_on_failed", "jet-9", "Gate | vllm_endpoint on chat", failed, "vllm_endpoint"))
    assert shown[0].startswith("jet-9: chat gate FAILED (unit_failed)")
    unreachable = {"msg": "Failed to connect to the host via ssh"}
    state.handle(_event("runner_on_unreachable", "jet-9", "Rollout | Step", unreachable))
    entry = state.report()["hosts"][0]
    assert entry["status"] == "unreachable" and "Failed to connect" in entry["reason"]
    assert state.report()["exit_code"] == 1


def test_exit_codes():
    assert rollout.exit_code([{"status": "updated"}, {"status": "unchanged"}], 0) == 0
    assert rollout.exit_code([{"status": "updated"}, {"status": "rolled_back"}], 2) == 1
    assert rollout.exit_code([{"status": "not_started"}], 0) == 1
    assert rollout.exit_code([], 0) == 2


def test_arguments_become_extra_vars():
    args = rollout.parse_args(
        ["--batches", "1,25%,100%", "--max-fail-percentage", "30", "-e", "a=1 b=2", "-e", '{"c": [3]}']
    )
    assert rollout.extra_vars(args, "ID") == {
        "rollout_id": "ID", "a": "1", "b": "2", "c": [3], "rollout_batches": [1, "25%", "100%"],
        "rollout_max_fail_percentage": 30,
    }  # fmt: skip


def test_displays():
    state = replay("events-canary.jsonl")
    out = io.StringIO()
    plain = rollout.PlainDisplay(state, out)
    plain.show(["jet-2: restart", "jet-2: rollback"])
    assert out.getvalue().splitlines()[1].endswith("] jet-2: rollback")
    out = io.StringIO()
    live = rollout.LiveDisplay(state, out)
    live.show(["jet-2: rollback"])
    live.show(["jet-2: rolled_back"])
    text = out.getvalue()
    assert text.count("\x1b[2K") == 2 * (1 + len(state.hosts)) and "\x1b[4F" in text  # redrawn in place
    assert "jet-2" in text and "rolled back" in text


@pytest.mark.parametrize(
    "limit, statuses",
    [
        (None, ["updated", "rolled_back", "unchanged", "failed"]),
        ("jet-2,jet-3,jet-4", ["rolled_back", "not_started", "not_started"]),
    ],
)
def test_a_live_run_through_ansible_runner(tmp_path, limit, statuses):
    """The recorded events are what ansible-runner gives today: the same run, live, reports the same."""
    cmd = [
        sys.executable, str(ROOT / "commands" / "rollout.py"), "--plain",
        "--playbook", str(FIX / "playbook.yml"), "-i", str(FIX / "inventory.yml"),
        "-e", json.dumps({"fixture_root": str(tmp_path / "hosts")}), "--report-dir", str(tmp_path / "reports"),
        "--save-events", str(tmp_path / "events.jsonl"),
    ] + (["-l", limit] if limit else [])  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (report_file,) = (tmp_path / "reports").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert [h["status"] for h in report["hosts"]] == statuses
    assert (report_file.parent / "summary.txt").read_text() in proc.stdout
    assert "] canary 1: " in proc.stdout  # the plain display, one line per change
    # the record each host keeps
    assert json.loads((tmp_path / "hosts" / "last.json").read_text())["rollout"] == report["rollout"]
    recorded = rollout.Rollout("r")
    for line in (tmp_path / "events.jsonl").read_text().splitlines():
        recorded.handle(json.loads(line))
    assert [h["status"] for h in recorded.report()["hosts"]] == statuses
