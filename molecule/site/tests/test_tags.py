"""Tagged and failing runs of the main job on the converged rig: preflights always run, the
report stays honest, and a run in which every rig fails still ends with the report.

Runs after the acceptance tests (it only reruns the converged job: nothing may change)."""

import json
import os
import re
from itertools import zip_longest
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import ansible_playbook, recap

pytestmark = pytest.mark.changes_state

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
ROLES = ["nvidia_driver", "gpu_topology", "vllm_runtime", "model_weights", "vllm_service"]
STAGES = ["driver", "topology", "runtime", "weights", "services", "health", "gpu_health"]


def part_tags(role):
    """The tags that select part of a role (every tag of its tasks/main.yml but the role's own)."""
    tags = set()
    for task in yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text()):
        tags.update(task.get("tags") or [])
    return sorted(tags - {role, "always"})


def play(*args):
    """The main job again on the converged rig, under mitogen's strategy: what these runs test (tags,
    the report) does not depend on the connection, the converge and idempotence before them ran
    over SSH as a user's run does, and nothing here reboots (each run changes nothing). Over SSH
    these seven runs were nearly all of this scenario's verify."""
    rc, out = ansible_playbook(SCENARIO / "converge.yml", *args, strategy="mitogen_linear")
    return rc, re.sub(r"\x1b\[[0-9;]*m", "", out)


def changed_tasks(out):
    """The TASK lines of what a run changed (what an unexpected change needs to be found)."""
    tasks, current = [], None
    for line in out.splitlines():
        if line.startswith("TASK ["):
            current = line.rstrip(" *")
        elif line.startswith("changed:") and current:
            tasks.append(f"{current}: {line}")
    return tasks


def report_of(hostname):
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports" / "latest.json"
    (rig,) = [h for h in json.loads(path.read_text())["hosts"] if h["host"] == hostname]
    return rig


def test_each_stage_recorded_that_it_passed(host):
    for stage in STAGES:
        record = json.loads(host.file(f"/var/lib/rigops/stages/{stage}.json").content_string)
        assert record["status"] == "passed", (stage, record)
    driver = json.loads(host.file("/var/lib/rigops/stages/driver.json").content_string)
    assert driver["summary"]["version"].startswith("595.")


@pytest.mark.parametrize(
    "selection",
    [list(filter(None, group)) for group in zip_longest(*(part_tags(r) for r in ROLES))],
    ids=lambda sel: ",".join(sel),
)
def test_a_part_of_each_role_runs_alone_with_its_preflight(hostname, selection):
    """`--tags <role>_<part>`: the role's preflight runs too, the part passes, nothing changes."""
    assert selection
    rc, out = play("--tags", ",".join(selection))
    assert rc == 0, out[-4000:]
    counts = recap(out, hostname)
    assert (counts["changed"], counts["unreachable"], counts["failed"]) == (0, 0, 0), changed_tasks(out) or out[-3000:]
    for tag in selection:
        role = next(r for r in ROLES if tag.startswith(r + "_"))
        assert f"[rigops.fleet.{role} : Preflight |" in out, f"--tags {tag} ran no preflight task of {role}"
    assert report_of(hostname)["status"] == "ok"


def test_a_stage_run_alone_reports_the_others_from_the_rig(hostname):
    rc, out = play("--tags", "services")
    assert rc == 0, out[-3000:]
    rig = report_of(hostname)
    assert rig["status"] == "ok" and rig["driver"].startswith("595.")
    assert rig["stages"]["services"]["source"] == "this run"
    assert rig["stages"]["driver"]["source"].startswith("recorded ")
    assert f"{hostname}: ok; driver=595." in out


def test_when_every_rig_fails_the_report_still_runs(host, hostname):
    """A branch change under a serving rig is refused by the driver stage (check mode: nothing is written)."""
    before = host.file("/var/lib/rigops/stages/driver.json").content_string
    rc, out = play("--check", "-e", "nvidia_driver_branch=590")
    assert rc != 0
    rig = report_of(hostname)
    assert rig["status"] == "failed in driver", rig
    assert "serves" in rig["reason"] and "nvidia_driver_allow_branch_change" in rig["reason"]
    assert f"{hostname}: failed in driver;" in out
    assert host.file("/var/lib/rigops/stages/driver.json").content_string == before
    assert host.service("vllm@chat").is_running
