"""commands/fleet_plan.py: the fleet planner's pure functions, its inputs file and its command line.

The batches are checked against Ansible's own splitting of ``serial`` (PlaybookExecutor) and
against how commands/rollout.py passes --batches to the playbook; the estimates use fixed figures
(``M``) so that a new measurement in docs/measurements.yml does not move them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.executor.playbook_executor import PlaybookExecutor

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "docs" / "measurements.yml"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fp = _load(ROOT / "commands" / "fleet_plan.py", "rigops_fleet_plan")
rollout = _load(ROOT / "commands" / "rollout.py", "rigops_rollout_for_fleet_plan")

# the figures of docs/measurements.yml on 2026-11-30, fixed here
M = fp.Measured(task_s=0.394, board_s=57.42, outside_s=10.5, host_gbps=None)
DEFAULT = (1, "10%", "50%", "100%")


def wall(m=M, **plan) -> float:
    return fp.estimate(fp.Plan(**plan), m)["wall_s"]


def ansible_batches(devices: int, serial: list) -> list[int]:
    """How Ansible itself splits ``devices`` hosts under ``serial`` (its PlaybookExecutor, on a stub inventory)."""
    hosts = [f"h{i}" for i in range(devices)]
    executor = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda pattern, order=None: list(hosts)))
    play = SimpleNamespace(hosts="all", order="inventory", serial=list(serial))
    return [len(batch) for batch in PlaybookExecutor._get_serialized_batches(executor, play)]


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize("serial", [[1, "10%", "50%", "100%"], [1, "100%"], [1, "10%"], [1, 5, "30%"], [1, "33%"]])
@pytest.mark.parametrize("devices", [1, 2, 3, 4, 10, 11, 99, 100, 101, 999, 1000, 1234])
def test_batches_split_as_ansible_splits_serial(devices, serial):
    assert fp.split_batches(devices, serial) == ansible_batches(devices, serial)


def test_batches_of_the_default_rollout():
    assert fp.split_batches(10, DEFAULT) == [1, 1, 5, 3]
    assert fp.split_batches(100, DEFAULT) == [1, 10, 50, 39]
    assert fp.split_batches(1000, DEFAULT) == [1, 100, 500, 399]


@pytest.mark.parametrize("text", ["1,10%,50%,100%", "1, 10% ,100%", "1,5,100%", "1"])
def test_batches_read_as_tools_rollout_passes_them_to_the_playbook(text):
    passed = rollout.extra_vars(rollout.parse_args(["--batches", text]), "id")["rollout_batches"]
    assert fp.parse_batches(text) == passed


@pytest.mark.parametrize("text", ["0", "1,0", "1,0%", "1,101%", "1,x", "2,100%", "10%,100%", "1,,100%"])
def test_batches_the_playbook_would_refuse_are_refused(text):
    with pytest.raises(ValueError):
        fp.parse_batches(text)


# --------------------------------------------------------------------------- the estimate


def test_wall_time_grows_with_the_number_of_batches():
    for devices in (10, 100, 1000):
        walls = [
            wall(devices=devices, forks=devices, serial=serial, controller_memory_gb=1e6)
            for serial in ((1, "100%"), (1, "50%", "100%"), DEFAULT, (1, "10%"))
        ]
        assert walls == sorted(walls) and len(set(walls)) == len(walls), (devices, walls)


def test_more_forks_lower_the_wall_time_until_another_limit_binds():
    plan = fp.Plan(devices=1000, caches_per_site=100, controller_memory_gb=1e6)
    forks = [5, 10, 20, 50, 100, 200, 400, 1000]
    rows = fp.plan_rows([replace(plan, forks=f) for f in forks], M)
    walls = [r["wall_s"] for r in rows]
    assert walls == sorted(walls, reverse=True), walls
    assert walls[0] > 3 * walls[2]  # 5 -> 20 forks: a quarter of the waves
    assert rows[0]["binds"] == "forks"
    # then the controller's CPU: 1000 forks are hardly better than 200
    assert rows[-1]["binds"] == "controller CPU"
    assert walls[-1] > 0.9 * walls[-3]
    # and without that limit, the forks would have kept paying
    unlimited = [fp.estimate(replace(plan, forks=f, controller_cores=math.inf), M)["wall_s"] for f in (200, 1000)]
    assert unlimited[1] < 0.8 * unlimited[0]


def test_cache_bandwidth_binds_when_the_caches_are_few():
    few, many = fp.plan_rows([fp.Plan(devices=1000, forks=100, caches_per_site=n) for n in (1, 50)], M)
    assert few["binds"] == "cache bandwidth"
    assert many["binds"] != "cache bandwidth"
    # one cache of 10 Gbit/s sends 1000 x 18 GB: 14,400 s of pulling, whatever the forks
    assert few["pull_s"] == pytest.approx(1000 * 18 * 8 / 10, rel=0.01)
    assert few["wall_s"] > 2 * many["wall_s"]
    assert few["hosts_per_cache"] == 1000 and many["hosts_per_cache"] == 20


def test_a_measured_board_download_caps_each_pull():
    slow = replace(M, host_gbps=1.0)
    one = fp.Plan(devices=1, model_gb=18, cache_gbps=10)
    assert fp.estimate(one, M)["pull_s"] == pytest.approx(14.4)
    assert fp.estimate(one, slow)["pull_s"] == pytest.approx(144.0)
    assert fp.plan_rows([fp.Plan(devices=1000, forks=100, caches_per_site=100)], slow)[0]["binds"] == "board download"


def test_a_board_link_caps_each_pull_like_a_measured_download():
    one = fp.Plan(devices=1, model_gb=18, cache_gbps=10)
    assert fp.estimate(replace(one, device_gbps=1.0), M)["pull_s"] == pytest.approx(144.0)
    # the lower of the link and the measured pull
    assert fp.estimate(replace(one, device_gbps=1.0), replace(M, host_gbps=0.5))["pull_s"] == pytest.approx(288.0)
    row = fp.plan_rows([fp.Plan(devices=1000, forks=100, caches_per_site=100, device_gbps=1.0)], M)[0]
    assert row["binds"] == "board download" and row["peer_share"] is None


def test_peers_serve_later_batches_and_take_the_load_off_the_cache():
    """The canary and batch 2 pull from the cache alone (no peer yet, then one); from batch 3 on, the boards that
    finished serve their site's later batches: the cache stops binding, the boards' links do."""
    plan = fp.Plan(devices=1000, forks=100, device_gbps=1.0, connection="mitogen")
    alone = fp.estimate(plan, M)
    assisted = fp.estimate(replace(plan, peers=True), M)
    # the canary: 144 s at its link; batch 2: 100 boards share 10 + 1 Gbit/s; batches 3 and 4: 5 and 4 waves of
    # 100 boards at their own links
    assert assisted["pull_s"] == pytest.approx(144 + 100 * 144 / 11 + 9 * 144, rel=0.01)
    assert assisted["pull_s"] < 0.25 * alone["pull_s"]
    # the peers sent most of the bytes: batches 3 and 4 mostly from the 101 and 601 boards before them
    assert 0.8 < assisted["peer_share"] < 0.95 and alone["peer_share"] is None
    # a slower peer than its link serves less
    slower = fp.estimate(replace(plan, peers=True, peer_gbps=0.1), M)
    assert slower["pull_s"] > assisted["pull_s"] and slower["peer_share"] < assisted["peer_share"]
    # peers of one site do not serve another: 10 sites, each of them a tenth of the boards and of the peers
    sites = fp.estimate(replace(plan, peers=True, sites=10, caches_per_site=1), M)
    assert sites["pull_s"] < assisted["pull_s"]


def test_the_plan_for_1000_boards_distributes_the_model_within_the_hour():
    """1,000 boards, an 18 GB model, 1 Gbit/s per board, one 10 Gbit/s cache (docs/fleet-scale.md): with peers and
    100 forks under mitogen, the model is everywhere within 60 minutes and the boards' links bind."""
    plan = fp.Plan(devices=1000, forks=100, device_gbps=1.0, connection="mitogen", peers=True)
    (row,) = fp.plan_rows([plan], M)
    assert row["pull_s"] <= 3600 and row["binds"] == "board download", row
    (cache_only,) = fp.plan_rows([replace(plan, peers=False)], M)
    assert cache_only["pull_s"] > 4 * 3600 and cache_only["binds"] == "cache bandwidth"
    assert "--peers" in cache_only["then"]


def test_controller_memory_binds_before_anything_else():
    row = fp.plan_rows([fp.Plan(devices=1000, forks=200, mem_per_fork_mb=100, controller_memory_gb=16)], M)[0]
    assert row["memory_gb"] == pytest.approx(19.53, abs=0.01)
    assert row["binds"] == "controller memory"
    assert "one controller per site" in row["then"]


def test_mitogen_lowers_wall_time_cpu_and_advice_follows():
    ssh = replace(M, task_s=0.394)
    mito = replace(M, task_s=0.095)
    plan = fp.Plan(devices=1000, forks=100, caches_per_site=100)
    a, b = fp.plan_rows([plan], ssh)[0], fp.plan_rows([replace(plan, connection="mitogen")], mito)[0]
    assert b["wall_s"] < a["wall_s"] and b["cpu_s"] < a["cpu_s"]
    assert a["binds"] == "controller CPU" and "mitogen" in a["then"]
    # mitogen holds one connection per board for the whole run
    assert b["peak_ssh"] == 1000
    # boards that do little themselves: the per-task cost binds, and the advice knows mitogen is on
    quick = fp.Plan(devices=10, tasks_per_host=250, model_gb=0)
    over_ssh = fp.plan_rows([quick], replace(ssh, board_s=1.0))[0]
    over_mitogen = fp.plan_rows([replace(quick, connection="mitogen")], replace(mito, board_s=1.0))[0]
    assert over_ssh["binds"] == over_mitogen["binds"] == "per-task cost"
    assert "--connection mitogen" in over_ssh["then"]
    assert "mitogen is on already" in over_mitogen["then"]


def test_ssh_control_masters_outlive_a_batch():
    # ControlPersist keeps the previous batch's masters while the next batch opens its own
    plan = fp.Plan(devices=1000, forks=1, control_persist_s=1.0, serial=(1, "10%", "50%", "100%"))
    assert fp.estimate(plan, M)["peak_ssh"] == 500 + 399
    assert fp.estimate(replace(plan, control_persist_s=0.0), M)["peak_ssh"] == 500
    # 120 s: the plan play goes round the whole fleet within it, every board's master stays open
    assert fp.estimate(replace(plan, control_persist_s=120.0, forks=20), M)["peak_ssh"] == 1000


def test_controller_figures_scale_with_the_plan():
    row = fp.estimate(fp.Plan(devices=100, forks=20, tasks_per_host=100, cpu_per_task=0.1), M)
    assert row["cpu_s"] == pytest.approx(100 * 100 * 0.1)
    assert row["memory_gb"] == pytest.approx(20 * 100 / 1024, abs=0.01)
    # by default the CPU per task is 0.25 CPU per busy fork over the connection's seconds per task
    assert fp.cpu_per_task(fp.Plan(devices=1), M) == pytest.approx(0.25 * 0.394)


def test_one_board_gives_back_the_measured_canary():
    # the measured rollout less its batch 2: the plan play, then the canary alone (no model to pull)
    m = fp.measured(fp.load_inputs(INPUTS), "ssh", 120)
    row = fp.estimate(fp.Plan(devices=1, serial=(1, "100%"), model_gb=0), m)
    assert row["wall_s"] == pytest.approx(401.7 - 286.5)


# --------------------------------------------------------------------------- inputs


def write_inputs(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(INPUTS.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = {**data[key], **value}
    path = tmp_path / "inputs.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_measured_figure_names_the_command_that_measured_it():
    inputs = fp.load_inputs(INPUTS)
    assert set(fp.REQUIRED) <= set(inputs)
    for key in [*fp.REQUIRED, fp.CACHE_PULL]:
        entry = inputs[key]
        command = entry["command"].split()
        assert command[:3] == ["./rigops", "measure", command[2]], key
        assert (ROOT / "lab" / "measure" / f"{command[2]}.py").is_file(), key
        assert entry["unit"], key
        if entry["value"] is not None:
            assert re.fullmatch(r"20\d\d-\d\d-\d\d", str(entry["date"])), key
    for key in fp.REQUIRED:
        assert inputs[key]["value"] is not None, key
    assert inputs["cache_pull"]["command"].startswith("./rigops measure model_weights --hosts 1,2,4,8 ")


def test_figures_read_from_the_inputs_file():
    m = fp.measured(fp.load_inputs(INPUTS), "mitogen", 120)
    assert m.task_s == 0.095
    assert m.board_s == pytest.approx(104.7 - 120 * 0.394)
    assert m.outside_s == pytest.approx(401.7 - 104.7 - 286.5)


def test_the_controllers_cpu_per_task_is_the_most_the_main_job_measured(tmp_path, capsys):
    figures = {
        "main_job_host_tasks_per_rig": 100,
        "main_job_noop_rerun_cpu_controller_1_rigs": 15.0,  # 0.15 per task: the play's start-up on one rig
        "main_job_noop_rerun_cpu_controller_4_rigs": 48.0,  # 0.12
        "main_job_noop_rerun_mitogen_cpu_controller_4_rigs": 44.0,  # 0.11
    }
    data = {
        k: {"value": v, "unit": "x", "command": "./rigops measure main_job", "date": "2026-12-06"}
        for k, v in figures.items()
    }
    data.update({k: v for k, v in yaml.safe_load(INPUTS.read_text()).items() if k in fp.REQUIRED})
    (tmp_path / "in.yml").write_text(yaml.safe_dump(data))
    inputs = fp.load_inputs(tmp_path / "in.yml")
    assert fp.measured(inputs, "ssh", 120).cpu_task == 0.15
    assert fp.measured(inputs, "mitogen", 120).cpu_task == 0.11
    plan = fp.Plan(devices=10)
    assert fp.cpu_per_task(plan, fp.measured(inputs, "ssh", 120)) == 0.15
    assert fp.cpu_per_task(replace(plan, cpu_per_task=0.5), fp.measured(inputs, "ssh", 120)) == 0.5
    assert fp.main(["--inputs", str(tmp_path / "in.yml"), "--devices", "10"]) == 0
    out = capsys.readouterr().out
    assert "controller CPU: 0.15 CPU-s per task per host over ssh" in out
    assert "main_job_noop_rerun_cpu_controller_{1,4}_rigs over N rigs x main_job_host_tasks_per_rig" in out
    assert "CPU-s per task per host" not in out.split("assumed (options, not measured):")[1]
    # not measured (no task count, or no run over that connection): 0.25 CPU per busy fork x the task cost
    del data["main_job_noop_rerun_mitogen_cpu_controller_4_rigs"]
    (tmp_path / "in.yml").write_text(yaml.safe_dump(data))
    m = fp.measured(fp.load_inputs(tmp_path / "in.yml"), "mitogen", 120)
    assert m.cpu_task is None and fp.cpu_per_task(plan, m) == pytest.approx(0.25 * 0.095)
    assert fp.main(["--inputs", str(tmp_path / "in.yml"), "--devices", "10", "--connection", "mitogen"]) == 0
    assumed = capsys.readouterr().out.split("assumed (options, not measured):")[1]
    assert "0.024 CPU-s per task per host (--cpu-per-task; 0.25 CPU per busy fork" in assumed


def test_a_figure_not_measured_yet_names_its_command(tmp_path):
    inputs = fp.load_inputs(write_inputs(tmp_path, rollout_canary_board={"value": None}))
    with pytest.raises(fp.InputError, match=r"rollout_canary_board: not measured yet \(run ./rigops measure rollout"):
        fp.measured(inputs, "ssh", 120)


def test_a_missing_figure_is_named(tmp_path):
    inputs = fp.load_inputs(write_inputs(tmp_path, task_cost_mitogen_1_host=None))
    fp.measured(inputs, "ssh", 120)  # not needed over SSH
    with pytest.raises(fp.InputError, match="task_cost_mitogen_1_host: missing .*connection_cost"):
        fp.measured(inputs, "mitogen", 120)


def test_a_figure_without_its_command_is_refused(tmp_path):
    data = yaml.safe_load(INPUTS.read_text())
    del data["rollout_wall"]["command"]
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(data))
    with pytest.raises(fp.InputError, match="rollout_wall: needs value, unit, command and date"):
        fp.load_inputs(tmp_path / "bad.yml")


def test_main_stops_with_the_message_when_a_figure_is_missing(tmp_path, capsys):
    path = write_inputs(tmp_path, task_cost_ssh_1_host={"value": None})
    assert fp.main(["--inputs", str(path)]) == 2
    assert "task_cost_ssh_1_host: not measured yet (run ./rigops measure connection_cost" in capsys.readouterr().err


def test_an_unmeasured_cache_pull_is_said_not_invented(tmp_path, capsys):
    path = write_inputs(tmp_path, cache_pull={"value": None, "date": None})
    assert fp.measured(fp.load_inputs(path), "ssh", 120).host_gbps is None
    assert fp.main(["--inputs", str(path), "--cache-gbps", "25"]) == 0
    out = capsys.readouterr().out
    assert "cache pull: not measured yet (run ./rigops measure model_weights --hosts 1,2,4,8" in out
    assert "--cache-gbps 25 Gbit/s per cache (assumed)" in out


def test_a_measured_cache_pull_is_used(tmp_path, capsys):
    path = write_inputs(tmp_path, cache_pull={"value": 2.5, "date": "2026-12-01"})
    assert fp.measured(fp.load_inputs(path), "ssh", 120).host_gbps == 2.5
    assert fp.main(["--inputs", str(path), "--devices", "1"]) == 0
    assert "cache pull: 2.5 Gbit/s per host" in capsys.readouterr().out
    bad = write_inputs(tmp_path, cache_pull={"value": 300, "unit": "MB/s"})
    with pytest.raises(fp.InputError, match="cache_pull: a value > 0 in Gbit/s"):
        fp.measured(fp.load_inputs(bad), "ssh", 120)


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    "option, value",
    [
        ("--forks", "0"),
        ("--batches", "0"),
        ("--batches", "2,100%"),
        ("--devices", "0"),
        ("--devices", "10,x"),
        ("--cache-gbps", "0"),
        ("--model-gb", "-1"),
        ("--caches-per-site", "0"),
        ("--device-gbps", "0"),
        ("--peer-gbps", "-1"),
        ("--connection", "podman"),
    ],
)
def test_bad_options_are_refused_naming_the_option(option, value, capsys):
    with pytest.raises(SystemExit) as exc:
        fp.parse_args([option, value])
    assert exc.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_too_many_tasks_for_the_measured_canary_names_the_option(capsys):
    assert fp.main(["--tasks-per-host", "400"]) == 2
    assert "--tasks-per-host 400" in capsys.readouterr().err


def test_the_outputs_carry_every_row_and_label_the_assumptions(capsys):
    assert fp.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["devices"] for r in report["rows"]] == [10, 100, 1000]
    assert {"wall_s", "pull_s", "cpu_s", "peak_ssh", "memory_gb", "binds", "then"} <= set(report["rows"][0])
    assert report["measured"]["task_cost_ssh_1_host"]["command"].startswith("./rigops measure connection_cost")

    assert fp.main(["--markdown", "--devices", "10,1000"]) == 0
    md = capsys.readouterr().out
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 4 and table[0].startswith("| devices |")
    assert all(line.count("|") == len(fp.HEADERS) + 1 for line in table)

    assert fp.main([]) == 0
    text = capsys.readouterr().out
    for label in ("--tasks-per-host", "--mem-per-fork", "--model-gb", "--controller-cores"):
        assert label in text.split("assumed (options, not measured):")[1], label
    assert "--cpu-per-task sets another" in text.split("assumed (options, not measured):")[0]


def test_the_tables_in_the_doc_are_the_tools_output(capsys):
    doc = (ROOT / "docs" / "fleet-scale.md").read_text()
    commands = re.findall(r"```sh\n\./rigops python commands/fleet_plan\.py (.*)\n```\n\n", doc)
    assert len(commands) == 3
    for command in commands:
        assert fp.main(shlex.split(command)) == 0
        output = capsys.readouterr().out
        assert output in doc, f"docs/fleet-scale.md is stale: paste the output of commands/fleet_plan.py {command}"
