"""The maintenance job: its filters (plugins/filter/maintain.py) on real vLLM captures, and its runner
(commands/maintain.py): batches, state from ansible-runner's events, report, table and exit code."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.filter import maintain as mf

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "fixtures" / "bench"
sys.path.insert(0, str(ROOT / "commands"))

import maintain  # noqa: E402


def test_settings_defaults_and_refusals_name_the_variable():
    ok = mf.maintain_settings({"hosts": "rig-1, rig-2"}, ["rig-1", "rig-2"])
    assert ok["problems"] == []
    assert ok["settings"] == dict(mf.DEFAULTS, hosts=["rig-1", "rig-2"])
    bad = mf.maintain_settings(
        {"hosts": ["rig-1", "nope"], "change": "wipe", "tasks": "rel.yml", "bench": "perhaps", "bench_tolerance": 1.5,
         "idle_timeout": 0, "bench_concurrency": "four"},
        ["rig-1"],
    )  # fmt: skip
    assert bad["problems"] == [
        "maintain_hosts: nope not in the inventory's gpu-rigs",
        "maintain_change must be one of none, tasks, driver, reboot (got 'wipe')",
        "maintain_tasks is read only with maintain_change=tasks",
        "maintain_idle_timeout must be 1 or more (got 0)",
        "maintain_bench_concurrency must be a number (got 'four')",
        "maintain_bench_tolerance must be 0 to 1 (got 1.5)",
        "maintain_bench must be true or false (got 'perhaps')",
    ]
    assert mf.maintain_settings({"hosts": "rig-1", "bench": "false"}, ["rig-1"])["settings"]["bench"] is False
    tasks = mf.maintain_settings({"hosts": ["rig-1"], "change": "tasks", "tasks": "rel.yml"}, ["rig-1"])
    assert tasks["problems"] == [
        "maintain_tasks must be the absolute path of a tasks file with maintain_change=tasks (got 'rel.yml')"
    ]
    assert mf.maintain_settings({}, ["rig-1"])["problems"] == [
        "maintain_hosts must name the rigs of the batch: a list or a comma-separated string"
    ]


def test_busy_from_real_vllm_metrics():
    idle = (BENCH / "metrics" / "vllm-0.32.0-cpu-idle.txt").read_text()
    running = (BENCH / "metrics" / "vllm-0.32.0-cpu-16-running.txt").read_text()
    assert mf.maintain_busy(idle) == {"running": 0, "waiting": 0}
    # the 16 requests of the capture; vllm:num_requests_waiting_by_reason is not the gauge
    assert mf.maintain_busy(running) == {"running": 16, "waiting": 0}
    two_engines = running + 'vllm:num_requests_waiting{engine="1",model_name="tiny-a"} 3.0\n'
    assert mf.maintain_busy(two_engines) == {"running": 16, "waiting": 3}
    with pytest.raises(AnsibleFilterError, match="no vllm:num_requests_running"):
        mf.maintain_busy("<html>a proxy's page</html>")
    results = {
        "results": [
            {"status": 200, "content": running, "item": {"server": {"instance": "chat"}}},
            {"status": 200, "content": idle, "item": {"server": {"instance": "code"}}},
            {"status": -1, "msg": "Connection refused", "item": {"server": {"instance": "down"}}},
        ]
    }
    assert mf.maintain_still_busy(results) == ["chat: 16 running, 0 waiting"]


def test_metrics_url_of_an_instance():
    assert mf.maintain_metrics_url({"server": {"host": "0.0.0.0", "port": 8000}}) == "http://127.0.0.1:8000/metrics"
    assert mf.maintain_metrics_url({"server": {"host": "::", "port": 8001}}) == "http://[::1]:8001/metrics"
    with pytest.raises(AnsibleFilterError, match="port"):
        mf.maintain_metrics_url({"server": {}})


def test_not_drained_reads_each_gateways_summary_of_this_run():
    hostvars = {
        "gw-1": {"llm_gateway_summary": {"drained": ["rig-1", "rig-2/chat"]}},
        "gw-2": {"llm_gateway_summary": {"drained": ["rig-2/chat"]}},
        "gw-3": {},  # its gateway stage failed: no summary
    }
    assert mf.maintain_not_drained(["gw-1", "gw-2", "gw-3"], hostvars, "rig-1") == ["gw-2", "gw-3"]
    assert mf.maintain_not_drained([], hostvars, "rig-1") == []


def test_throughput_from_real_bench_results_and_the_comparison():
    before = mf.maintain_throughput(str(BENCH / "run-before" / "localrig"))
    after = mf.maintain_throughput(str(BENCH / "run-after" / "localrig"))
    assert before == {"alpha": 461.28}  # c001 then c004: the last one read
    # beta: a dead server, every request refused -> 0; alpha's c001 and c004: the last one read (c004)
    assert after == {"alpha": 664.07, "beta": 0.0}
    assert mf.maintain_bench_problems(after, before, 0.1) == []
    assert mf.maintain_bench_problems(before, after, 0.1) == [
        "alpha: 461.28 output tok/s after the change, 664.07 before (-30.5 %, tolerance -10 %)",
        "beta: no bench figure after the change",
    ]
    assert mf.maintain_bench_problems({"beta": 0.0}, {"beta": 0.0}, 0.1) == ["beta: every bench request failed"]
    assert mf.maintain_bench_problems({}, before, 0.1) == ["alpha: no bench figure after the change"]
    assert mf.maintain_bench_problems({"alpha": 420.0}, before, 0.1) == []  # -9 %: within
    assert mf.maintain_throughput("/nonexistent") == {}
    # read once more where outside the tolerance: the better reading of each instance counts
    assert mf.maintain_bench_best({"alpha": 35.7, "beta": 0.0}, {"alpha": 401.2, "gamma": 9.0}) == {
        "alpha": 401.2, "beta": 0.0, "gamma": 9.0}  # fmt: skip
    assert mf.maintain_bench_best({"alpha": 420.0}, {"alpha": 12.5}) == {"alpha": 420.0}


def test_an_unreadable_bench_result_names_its_file(tmp_path):
    (tmp_path / "chat" / "c004").mkdir(parents=True)
    (tmp_path / "chat" / "c004" / "result.json").write_text("{not json")
    with pytest.raises(AnsibleFilterError, match="chat/c004/result.json"):
        mf.maintain_throughput(str(tmp_path))


def test_result():
    facts = {
        "host": "rig-1", "batch": 1, "change": "reboot",
        "before": {"boot_id": "a", "driver": "595.45.04"}, "after": {"boot_id": "b", "driver": "595.45.04"},
        "marks": [["drain", 0], ["idle", 1], ["change", 3]], "end": 10,
        "gate": {"chat": {"chat_s": 0.4, "ttft_s": 0.2, "ready_s": 9, "pid": 7}},
        "bench_before": {"chat": 100.0}, "bench_after": {"chat": 98.0}, "failure": None,
    }  # fmt: skip
    ok = mf.maintain_result(facts)
    assert ok["status"] == "maintained" and ok["ok"] and not ok["drained"] and ok["reason"] is None
    assert ok["stage_seconds"] == {"drain": 1.0, "idle": 2.0, "change": 7.0}
    assert ok["gate"] == {"chat": {"chat_s": 0.4, "ttft_s": 0.2, "ready_s": 9}}
    assert ok["bench"] == {"before": {"chat": 100.0}, "after": {"chat": 98.0}}
    failed = mf.maintain_result(dict(facts, failure={"stage": "change", "task": "Reboot", "msg": "timed\n out"}))
    assert failed["status"] == "failed" and failed["drained"] and failed["reason"] == "change: Reboot: timed out"
    kept = mf.maintain_result(dict(facts, drained_before=["rig-1/chat"]))
    assert kept["ok"] and kept["drained"]  # an operator's drain stays
    assert mf.maintain_result(dict(facts, check_mode=True))["status"] == "check"


def test_batches_cut_like_serial():
    hosts = [f"rig-{n}" for n in range(1, 8)]
    assert maintain.batches(hosts, [1]) == [[h] for h in hosts]
    # 50 % of 7 is 3, as in a play's serial (ansible.utils.helpers.pct_to_int)
    assert maintain.batches(hosts, [1, "50%", "100%"]) == [["rig-1"], hosts[1:4], hosts[4:]]
    assert maintain.batches(hosts[:1], [1, "50%"]) == [["rig-1"]]
    assert maintain.batches(hosts, [2, "10%"]) == [hosts[0:2], *[[h] for h in hosts[2:]]]


def ok_event(host, facts=None, task="t", action="set_fact", res=None):
    return {
        "event": "runner_on_ok",
        "event_data": {"host": host, "task": task, "task_action": action, "res": res or {"ansible_facts": facts or {}}},
    }


def result_facts(host, batch, failure=None):
    return mf.maintain_result(
        {"host": host, "batch": batch, "before": {"driver": "595.45.04", "boot_id": "a"},
         "after": {"driver": "595.58.02", "boot_id": "b"}, "marks": [["drain", 0], ["change", 2]], "end": 5,
         "bench_before": {"chat": 10.0}, "bench_after": {"chat": 11.0}, "failure": failure}
    )  # fmt: skip


def test_a_failed_canary_stops_the_job_and_leaves_it_drained():
    job = maintain.Maintenance("m1", "driver", clock=iter(range(0, 10**6, 5)).__next__)
    planned = maintain.batches(["rig-1", "rig-2", "rig-3"], [1, "100%"])
    job.plan(planned)
    lines = job.start_batch(planned[0])
    assert lines == ["canary 1: rig-1"]
    assert job.handle(ok_event("rig-1", {"maintain_plan": {"before": {"driver": "595.45.04"}}})) == [
        "rig-1: planned, driver 595.45.04"
    ]
    assert job.handle(ok_event("rig-1", {"maintain__stage": "change"})) == ["rig-1: change"]
    failure = {"stage": "change", "task": "Maintain | The driver", "msg": "dpkg failed"}
    job.handle(ok_event("rig-1", {"maintain_result": result_facts("rig-1", 1, failure)}))
    job.handle({"event": "runner_on_failed", "event_data": {"host": "rig-1", "task": "Maintain | Verdict", "res": {}}})
    job.finish_batch(2, "failed")
    assert not job.batch_ok(planned[0], 2)
    job.finish()
    report = job.report()
    assert report["exit_code"] == 1 and not report["ok"] and report["canary"] == "rig-1"
    assert {h["host"]: h["status"] for h in report["hosts"]} == {
        "rig-1": "failed", "rig-2": "not_started", "rig-3": "not_started"
    }  # fmt: skip
    first = report["hosts"][0]
    assert first["drained"] is True and first["reason"] == "change: Maintain | The driver: dpkg failed"
    assert report["hosts"][1]["drained"] is None  # never started: the job did not touch it
    assert report["stopped"] == "the canary (rig-1) did not pass: rig-2, rig-3 not started, nothing changed there"
    table = maintain.summary_table(report)
    assert "rig-1 (canary)  1      failed" in table and "595.45.04 -> 595.58.02" in table
    assert "chat 10.0 -> 11.0" in table and "rig-1: change: Maintain | The driver: dpkg failed" in table
    assert "./rigops undrain rig-1" in table and "undrain rig-2" not in table


def test_batches_that_pass_gates_and_a_gateway_that_fails():
    job = maintain.Maintenance("m2", "reboot", clock=iter(range(0, 10**6, 5)).__next__)
    job.plan([["rig-1"], ["rig-2"]])
    job.start_batch(["rig-1"])
    gate = ok_event("rig-1", task="Gate | vllm_endpoint on chat", action="rigops.fleet.vllm_endpoint",
                    res={"kind": "ok", "chat_s": 0.4, "ttft_s": 0.2})  # fmt: skip
    assert job.handle(gate) == ["rig-1: chat gate ok: chat 0.4s ttft 0.2s"]
    job.handle(ok_event("rig-1", {"maintain_result": result_facts("rig-1", 1)}))
    job.finish_batch(0, "successful")
    assert job.batch_ok(["rig-1"], 0)
    job.start_batch(["rig-2"])
    job.handle(ok_event("rig-2", {"maintain_result": result_facts("rig-2", 2)}))
    # the undrain at the gateway failed: the rig is maintained, the job is not ok
    data = {"host": "gw-1", "task": "Rollback | Fail the host", "res": {"msg": "gate failed"}}
    failed = {"event": "runner_on_failed", "event_data": data}
    assert job.handle(failed) == ["gw-1: FAILED Rollback | Fail the host: gate failed"]
    ignored = {
        "event": "runner_on_failed",
        "event_data": {"host": "gw-1", "task": "x", "ignore_errors": True, "res": {}},
    }
    assert job.handle(ignored) == []
    job.finish_batch(2, "failed")
    assert not job.batch_ok(["rig-2"], 2)
    report = job.report()
    assert report["counts"] == {"maintained": 2} and report["exit_code"] == 1
    assert report["other_failures"] == ["gw-1: Rollback | Fail the host: gate failed"]
    assert all(h["rebooted"] and h["drained"] is False for h in report["hosts"])
    assert report["batches"] == [["rig-1"], ["rig-2"]] and report["stopped"] is None
    assert "failed: gw-1: Rollback | Fail the host: gate failed" in maintain.summary_table(report)


def test_arguments():
    args = maintain.parse_args(
        ["--change", "tasks", "--tasks", "t.yml", "-e", '{"a": 1}', "-e", "b=2", "--batches", "1,50%"]
    )
    assert args.batch_spec == [1, "50%"]
    given = maintain.extra_vars(args)
    assert given["a"] == 1 and given["b"] == "2" and given["maintain_change"] == "tasks"
    assert given["maintain_tasks"] == str(Path("t.yml").resolve())
    for bad in (["--batches", "one"], ["--change", "tasks"], ["--tasks", "t.yml"], ["--change", "wipe"]):
        with pytest.raises(SystemExit):
            maintain.parse_args(bad)


def test_the_live_table_names_the_job():
    job = maintain.Maintenance("m3", "none", clock=iter(range(0, 10**6, 5)).__next__)
    job.plan([["rig-1"]])
    out = io.StringIO()
    display = maintain.LiveDisplay(job, out)
    display.show(job.start_batch(["rig-1"]))
    assert out.getvalue().splitlines()[0].startswith("\x1b[2Kmaintenance m3  batch 1")


def test_no_host_is_exit_2(tmp_path, capsys):
    inventory = tmp_path / "inv.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu-rigs": {"hosts": {"rig-1": {}}}}}}))
    assert maintain.run(maintain.parse_args(["-i", str(inventory), "-l", "nope"])) == 2
    assert "no host matches 'gpu-rigs' limited to 'nope'" in capsys.readouterr().err
