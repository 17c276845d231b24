"""The main job's report (plugins/filter/report.py): a rig is ok only when every stage passed."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.rigops.fleet.plugins.filter import report as rigops_report

ROOT = Path(__file__).resolve().parents[2]


STAGES = ["driver", "topology", "runtime", "weights", "services", "health", "gpu_health"]
DRIVER = {"version": "595.45.04", "source": "ubuntu", "gpu_count": "8"}
TOPO = {"passed": True, "gpus": 8, "worst_link": "SYS", "problems": []}
RUNTIME = {"release": "cpu-vllm0.32.0-abc", "vllm_version": "0.32.0"}
SERVICE = {"chat": {"served_name": "qwen3.5-9b", "url": "http://127.0.0.1:8000/v1", "ready_s": 1.2, "ttft_s": 0.21}}
SUMMARIES = {
    "driver": DRIVER,
    "topology": TOPO,
    "runtime": RUNTIME,
    "weights": {},
    "services": SERVICE,
    "health": SERVICE,
    "gpu_health": {"healthy": True, "problems": [], "warnings": [], "unhealthy_gpus": [], "host": "rig", "gpus": 8},
}


def passed(seconds=1.0):
    return {"status": "passed", "seconds": seconds, "check_mode": False}


def record(status, summary=None, time="2026-11-30T09:00:00+00:00"):
    return {"stage": "x", "status": status, "time": time, "summary": summary or {}}


def test_every_stage_passed_in_this_run_is_ok():
    entry = rigops_report.rig_report("rig", {s: passed() for s in STAGES}, {}, SUMMARIES, STAGES)
    assert entry["status"] == "ok"
    assert (entry["driver"], entry["gpus"], entry["topology"], entry["runtime_release"]) == (
        "595.45.04",
        8,
        "pass",
        "cpu-vllm0.32.0-abc",
    )
    line = rigops_report.report_line(entry)
    assert line.startswith("rig: ok; driver=595.45.04 gpus=8 topology=pass runtime=cpu-vllm0.32.0-abc instances=chat")
    assert "first token 0.21 s" in line
    assert line.endswith(" gpu_health=healthy")


def test_a_rig_with_an_unhealthy_gpu_says_which_and_why():
    sick = {"healthy": False, "problems": ["GPU 0 (0000:01:00.0): xid: Xid 79; reboot"], "warnings": []}
    summaries = dict(SUMMARIES, gpu_health=sick)
    entry = rigops_report.rig_report("rig", {s: passed() for s in STAGES}, {}, summaries, STAGES)
    assert entry["gpu_health"]["healthy"] is False
    assert rigops_report.report_line(entry).endswith(
        " gpu_health=UNHEALTHY (GPU 0 (0000:01:00.0): xid: Xid 79; reboot)"
    )


def test_tagged_run_takes_skipped_stages_from_the_rig_records():
    this_run = {"services": passed(), "health": passed()}
    records = {s: record("passed", SUMMARIES[s]) for s in ["driver", "topology", "runtime", "weights", "gpu_health"]}
    entry = rigops_report.rig_report("rig", this_run, records, {"services": SERVICE, "health": SERVICE}, STAGES)
    assert entry["status"] == "ok"
    assert entry["driver"] == "595.45.04"
    assert entry["stages"]["driver"]["source"] == "recorded 2026-11-30T09:00:00+00:00"
    assert entry["stages"]["services"]["source"] == "this run"


def test_tagged_run_on_a_rig_whose_driver_stage_never_ran_is_not_ok():
    """The old report said ok with driver=- for `--tags services`."""
    this_run = {"services": passed(), "health": passed()}
    entry = rigops_report.rig_report("rig", this_run, {}, {"services": SERVICE, "health": SERVICE}, STAGES)
    assert entry["status"].startswith("incomplete: driver never run; topology never run")
    assert "driver=-" in rigops_report.report_line(entry)


def test_a_stage_a_run_never_finished_is_named():
    records = {s: record("passed") for s in STAGES}
    records["runtime"] = record("started", time="2026-11-29T23:00:00+00:00")
    entry = rigops_report.rig_report("rig", {"health": passed()}, records, {}, STAGES)
    assert entry["status"] == "incomplete: runtime not finished (recorded 2026-11-29T23:00:00+00:00)"


def test_failure_in_this_run_names_the_stage_and_why():
    failed = {"status": "failed", "msg": "GPU topology check failed", "task": "Check"}
    this_run = {"driver": passed(), "topology": failed}
    entry = rigops_report.rig_report("rig", this_run, {}, SUMMARIES, STAGES)
    assert entry["status"] == "failed in topology"
    assert entry["reason"] == "Check: GPU topology check failed"
    assert rigops_report.report_line(entry).endswith("| why: Check: GPU topology check failed")


def test_preflight_refusal_unreachable_and_stopped_rigs():
    refused = rigops_report.rig_report("r", {"preflight": {"status": "failed", "msg": "bad"}}, {}, {}, STAGES)
    assert refused["status"] == "failed in preflight"
    gone = rigops_report.rig_report("r", {"driver": passed()}, {}, {}, STAGES, reached=False, current_stage="runtime")
    assert gone["status"] == "unreachable or failed in runtime"
    stopped = rigops_report.rig_report("r", {}, {}, {}, STAGES, stopped_by="rig-a failed in driver")
    assert stopped["status"] == "stopped: rig-a failed in driver"


def test_check_mode_results_say_so():
    entry = rigops_report.rig_report("rig", {"driver": dict(passed(), check_mode=True)}, {}, {}, STAGES)
    assert entry["stages"]["driver"]["source"] == "this run (check mode)"
    assert entry["status"].startswith("incomplete: topology never run")


def test_instances_removed_in_this_run_are_listed():
    entry = rigops_report.rig_report(
        "rig", {s: passed() for s in STAGES}, {}, SUMMARIES, STAGES, removed=[{"name": "old", "moved_to": "/x"}]
    )
    assert entry["removed"] == ["old"]
    assert " removed=old" in rigops_report.report_line(entry)


def test_the_gateway_line_names_what_is_drained():
    stages = ["gateway"]
    summary = {"url": "https://gw:8443/v1", "clients": {"dev": ["tiny"]}, "not_gated": {}, "drained": ["rig2/chat"]}
    entry = rigops_report.rig_report("gw", {"gateway": passed()}, {}, {"gateway": summary}, stages)
    line = rigops_report.report_line(entry)
    assert line.endswith(" gateway=https://gw:8443/v1 clients: dev -> tiny drained: rig2/chat")
    entry = rigops_report.rig_report("gw", {"gateway": passed()}, {}, {"gateway": dict(summary, drained=[])}, stages)
    assert "drained" not in rigops_report.report_line(entry)


def test_selected_stages_follow_ansibles_own_tag_rules():
    """Each stage's play is tagged with the stage's name; Ansible's own Taggable decides which run."""
    from ansible.playbook.block import Block  # noqa: PLC0415 (Ansible's tag rules, as the run applies them)
    from ansible.playbook.task import Task  # noqa: PLC0415

    stages = ["driver", "topology", "services", "gpu_health"]
    cases = [
        ([], []), (["all"], []), (["services"], []), (["driver", "gpu_health"], []), (["tagged"], []),
        (["always"], []), (["nvidia_driver_install"], []), (["all"], ["driver"]), (["all"], ["all"]),
        (["services"], ["tagged"]), (["untagged"], []),
    ]  # fmt: skip
    for run_tags, skip_tags in cases:
        ansible_says = []
        for stage in stages:
            task = Task(block=Block())
            task.tags = [stage]
            if task.evaluate_tags(run_tags or ["all"], skip_tags, all_vars={}):
                ansible_says.append(stage)
        assert rigops_report.selected_stages(stages, run_tags, skip_tags) == ansible_says, (run_tags, skip_tags)
    assert rigops_report.selected_stages(stages, ["services"], []) == ["services"]
