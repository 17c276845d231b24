"""The main job's inventory contract, checked without any host.

The preflight and the report plays of site.yml run on the controller only (asserts and
localhost tasks), so running them against the example inventory exercises them for real:
the example must pass, bad instance lists must be refused with a clear message.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "inventories" / "example"


def run(*args, env=None):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", **(env or {}))
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], check=False, cwd=ROOT, capture_output=True, text=True, env=env
    )


def test_example_inventory_graph():
    proc = run("ansible-inventory", "-i", str(EXAMPLE), "--graph")
    assert proc.returncode == 0, proc.stderr
    lines = [ln.strip(" |-") for ln in proc.stdout.splitlines()]
    for name in ["@gpu-rigs:", "@rtx5090:", "@h100:", "@jetson:", "rig-5090-01", "h100-01", "thor-01"]:
        assert name in lines


def test_example_instances_match_the_three_templates():
    proc = run("ansible-inventory", "-i", str(EXAMPLE), "--list")
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    (rig,) = hostvars["rig-5090-01"]["vllm_instances"]
    assert rig["engine"]["tensor_parallel_size"] == 8 and rig["engine"]["gpu_memory_utilization"] == 0.85
    assert rig["model"]["max_model_len"] == 32768 and rig["model"]["dtype"] == "bfloat16"
    h100 = hostvars["h100-01"]["vllm_instances"]
    assert len(h100) == 2 and not set(h100[0]["gpus"]) & set(h100[1]["gpus"])
    thor = hostvars["thor-01"]["vllm_instances"]
    assert len(thor) == 2 and all(i["engine"]["gpu_memory_utilization"] <= 0.4 for i in thor)
    assert 49 in [i["engine"].get("max_num_seqs") for i in thor]


def test_site_syntax_against_the_example():
    proc = run("ansible-playbook", "-i", str(EXAMPLE), "site.yml", "--syntax-check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def preflight(tmp_path):
    def _run(*extra):
        return run(
            "ansible-playbook",
            "-i",
            str(EXAMPLE),
            "playbooks/preflight.yml",
            "playbooks/report.yml",
            "-e",
            f"rigops_report_dir={tmp_path}",
            # the report reads each rig's stage records: here from a folder on this machine
            "-e",
            "ansible_connection=local ansible_become=false",
            "-e",
            f"rigops_stage_record_dir={tmp_path}/stages",
            *extra,
        )

    return _run


def test_preflight_and_report_pass_on_the_example(preflight, tmp_path):
    """No stage ran and none is recorded: the hosts are reported as not done, never as ok; each by its job."""
    proc = preflight()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "latest.json").read_text())
    assert report["jobs"] == ["gpu_rigs", "jetson"] and report["job"] == "gpu_rigs+jetson"
    assert [h["host"] for h in report["hosts"]] == ["rig-5090-01", "h100-01", "thor-01"]
    rigs, (thor,) = report["hosts"][:2], report["hosts"][2:]
    for rig in rigs:
        assert rig["job"] == "gpu_rigs"
        assert rig["status"].startswith("incomplete: driver never run; topology never run"), rig
        assert rig["driver"] is None and rig["stages"]["services"]["status"] == "missing"
    assert thor["job"] == "jetson" and sorted(thor["stages"]) == [
        "gpu_health",
        "health",
        "platform",
        "runtime",
        "services",
        "weights",
    ]
    assert thor["status"].startswith("incomplete: platform never run; runtime never run"), thor
    assert "driver" not in thor and "topology" not in thor
    assert "rig-5090-01: incomplete: driver never run" in proc.stdout
    assert "thor-01: incomplete: platform never run" in proc.stdout
    assert sorted(p.name for p in tmp_path.glob("gpu_rigs+jetson-*.json"))


def test_a_job_records_the_stages_its_tags_select_as_started(tmp_path):
    """A job's preflight records the stages the run's tags select as started, and leaves the others as the last
    run left them; the preflight alone starts none."""
    stages = tmp_path / "stages"
    stages.mkdir()
    for stage in ["platform", "runtime", "weights", "services", "health", "gpu_health"]:
        (stages / f"{stage}.json").write_text(json.dumps({"stage": stage, "status": "passed", "time": "T"}))
    common = ["-i", str(EXAMPLE), "-l", "jetson", "-e", "ansible_connection=local ansible_become=false",
              "-e", f"rigops_stage_record_dir={stages}"]  # fmt: skip
    proc = run("ansible-playbook", *common, "playbooks/preflight.yml", "--tags", "services,health")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {json.loads(p.read_text())["status"] for p in stages.iterdir()} == {"passed"}
    # what playbooks/jetson.yml imports the preflight with
    proc = run("ansible-playbook", *common, "-e", "rigops_preflight_starts_stages=true", "playbooks/preflight.yml",
               "--tags", "services,health", "--skip-tags", "health")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = {p.stem: json.loads(p.read_text())["status"] for p in stages.iterdir()}
    assert status == {"platform": "passed", "runtime": "passed", "weights": "passed", "services": "started",
                      "health": "passed", "gpu_health": "passed"}  # fmt: skip


def test_each_job_reports_its_own_group(tmp_path):
    """-l jetson: the report covers the Jetsons only, with the Jetson job's stages (gpu_rigs.yml skips)."""
    stages = tmp_path / "stages"
    stages.mkdir()
    for stage in ["platform", "runtime", "weights", "services", "health", "gpu_health"]:
        summary = {"board": "Jetson AGX Thor (T5000)", "jetpack": "7.0", "l4t": "R38.2.0", "power_mode": "MAXN"}
        record = {"stage": stage, "status": "passed", "time": "T", "summary": summary if stage == "platform" else {}}
        (stages / f"{stage}.json").write_text(json.dumps(record))
    proc = run(
        "ansible-playbook", "-i", str(EXAMPLE), "playbooks/jetson.yml", "--tags", "never",
        "-e", f"rigops_report_dir={tmp_path}", "-e", "ansible_connection=local ansible_become=false",
        "-e", f"rigops_stage_record_dir={stages}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "latest.json").read_text())
    (thor,) = report["hosts"]
    assert report["job"] == "jetson" and thor["host"] == "thor-01" and thor["status"] == "ok"
    assert (thor["board"], thor["jetpack"], thor["power_mode"]) == ("Jetson AGX Thor (T5000)", "7.0", "MAXN")
    assert "thor-01: ok; board=Jetson AGX Thor (T5000) (L4T R38.2.0, JetPack 7.0) power=MAXN" in proc.stdout


@pytest.mark.parametrize(
    "limit, plays",
    [
        ("gpu-rigs", {"gpu-rigs": 8, "jetson": 0, "report": ["h100-01", "rig-5090-01"]}),
        ("jetson", {"gpu-rigs": 0, "jetson": 7, "report": ["thor-01"]}),
        ("all", {"gpu-rigs": 8, "jetson": 7, "report": ["h100-01", "rig-5090-01", "thor-01"]}),
    ],
)
def test_site_runs_each_job_on_its_group_and_reports_once(limit, plays):
    """site.yml imports both jobs: -l gpu-rigs, -l jetson and no limit each run the right plays, one report."""
    proc = run("ansible-playbook", "-i", str(EXAMPLE), "site.yml", "--list-hosts", "-l", limit)
    assert proc.returncode == 0, proc.stderr
    blocks = proc.stdout.split("  play #")[1:]
    counted = {"gpu-rigs": 0, "jetson": 0}
    reports = []
    for block in blocks:
        head = block.splitlines()[0]
        hosts = [ln.strip() for ln in block.splitlines()[3:] if ln.strip()]
        if "Report |" in head:
            if hosts:
                reports.append(sorted(hosts))
            continue
        for group in counted:
            if f"({group})" in head and hosts:
                counted[group] += 1
    assert counted == {"gpu-rigs": plays["gpu-rigs"], "jetson": plays["jetson"]}
    assert reports == [plays["report"]]


def test_report_takes_stages_from_the_records_on_the_rig(preflight, tmp_path):
    """A run that skipped every stage (only preflight and report) reports what the rig recorded."""
    stages = tmp_path / "stages"
    stages.mkdir()
    for stage in ["driver", "topology", "runtime", "weights", "services", "health", "gpu_health"]:
        summary = {"version": "595.45.04", "source": "ubuntu", "gpu_count": "8"} if stage == "driver" else {}
        record = {"stage": stage, "status": "passed", "time": "2026-11-30T01:00:00+00:00", "summary": summary}
        (stages / f"{stage}.json").write_text(json.dumps(record))
    proc = preflight("-l", "rig-5090-01")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rig,) = json.loads((tmp_path / "latest.json").read_text())["hosts"]
    assert rig["status"] == "ok" and rig["driver"] == "595.45.04"
    assert rig["stages"]["driver"]["source"] == "recorded 2026-11-30T01:00:00+00:00"
    (stages / "runtime.json").write_text(json.dumps({"stage": "runtime", "status": "started", "time": "T"}))
    proc = preflight("-l", "rig-5090-01")
    (rig,) = json.loads((tmp_path / "latest.json").read_text())["hosts"]
    assert rig["status"] == "incomplete: runtime not finished (recorded T)"


@pytest.mark.parametrize(
    "instances, words",
    [
        ('{"name": "a", "port": 8000}', "vllm_instances: '<a mapping>' must be a list of instances"),
        ('[{"name": "a", "port": 8000}, {"name": "a", "port": 8001}]', "vllm_instances[1].name: 'a' is used by 2"),
        ('[{"name": "a", "port": 8000}, {"name": "b", "port": 8000}]', "vllm_instances[1].port: 8000 is claimed by 2"),
        ('[{"port": 8000}]', "vllm_instances[0].name: is missing"),
    ],
)
def test_preflight_refuses_bad_instance_lists(preflight, tmp_path, instances, words):
    proc = preflight("-e", f'{{"vllm_instances": {instances}}}')
    assert proc.returncode != 0
    assert words in proc.stdout, proc.stdout
    assert "docs/instances.md" in proc.stdout
    # every rig refused: the report still runs and says so
    report = json.loads((tmp_path / "latest.json").read_text())
    assert [h["status"] for h in report["hosts"]] == ["failed in preflight"] * 3
