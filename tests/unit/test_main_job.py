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
    """No stage ran and none is recorded: the rigs are reported as not done, never as ok."""
    proc = preflight()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "latest.json").read_text())
    assert [h["host"] for h in report["hosts"]] == ["rig-5090-01", "h100-01"]
    for rig in report["hosts"]:
        assert rig["status"].startswith("incomplete: driver never run; topology never run"), rig
        assert rig["driver"] is None and rig["stages"]["services"]["status"] == "missing"
    assert "rig-5090-01: incomplete: driver never run" in proc.stdout


def test_report_takes_stages_from_the_records_on_the_rig(preflight, tmp_path):
    """A run that skipped every stage (only preflight and report) reports what the rig recorded."""
    stages = tmp_path / "stages"
    stages.mkdir()
    for stage in ["driver", "topology", "runtime", "weights", "services", "health"]:
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
    assert [h["status"] for h in report["hosts"]] == ["failed in preflight", "failed in preflight"]
