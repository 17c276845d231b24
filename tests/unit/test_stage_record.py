"""The stage records a job writes on each host (plugins/module_utils/stage_record.py), read back by the
report's filter (plugins/filter/report.py)."""

import datetime
import json
import stat

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils.stage_record import (
    read_records,
    record_text,
    stage_record,
    stage_results,
    write_record,
)
from ansible_run import LOCALHOST, ansible_playbook

WHEN = datetime.datetime(2026, 12, 5, 21, 0, 0, 123456, tzinfo=datetime.UTC)


def test_each_status_holds_what_the_report_reads():
    assert stage_record("driver", "started", now=WHEN) == {
        "stage": "driver", "status": "started", "time": "2026-12-05T21:00:00.123456+00:00",
    }  # fmt: skip
    passed = stage_record("driver", "passed", seconds=20.9, summary={"gpu_count": 8}, now=WHEN)
    assert passed["seconds"] == 20.9 and passed["summary"] == {"gpu_count": 8} and "task" not in passed
    failed = stage_record("services", "failed", task="Gate | vllm_endpoint on chat", now=WHEN)
    assert failed["task"] == "Gate | vllm_endpoint on chat" and "summary" not in failed
    assert stage_record("weights", "passed", now=WHEN)["summary"] == {}
    with pytest.raises(ValueError, match="status must be one of started, passed, failed; got 'done'"):
        stage_record("driver", "done")


def test_the_file_is_what_to_nice_json_wrote_before(tmp_path):
    """Records written by earlier releases (to_nice_json) and by this one read alike: sorted keys, 4 spaces."""
    record = stage_record("topology", "passed", seconds=3.4, summary={"p2p": "ok", "gpu_count": 8}, now=WHEN)
    text = record_text(record)
    assert text.endswith("}\n") and text.index('"seconds"') < text.index('"stage"') < text.index('"status"')
    assert '\n    "summary": {\n        "gpu_count": 8,' in text
    assert json.loads(text) == record


def test_written_atomically_with_its_folder_and_modes(tmp_path):
    path = tmp_path / "stages" / "driver.json"
    write_record(str(path), stage_record("driver", "started", now=WHEN), dry_run=True)
    assert not path.parent.exists()  # check mode: nothing on the host
    write_record(str(path), stage_record("driver", "started", now=WHEN))
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o755 == 0o755
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    write_record(str(path), stage_record("driver", "passed", seconds=1.0, now=WHEN))
    assert json.loads(path.read_text())["status"] == "passed"
    assert sorted(p.name for p in path.parent.iterdir()) == ["driver.json"]  # no temporary file left


def test_the_runs_results_gain_each_stage_that_ends():
    driver = stage_record("driver", "passed", seconds=20.9, now=WHEN)
    results = stage_results({}, driver, check_mode=False)
    assert results == {"driver": {"status": "passed", "check_mode": False, "seconds": 20.9}}
    assert stage_results(results, stage_record("topology", "started", now=WHEN), check_mode=False) == results
    failed = stage_results(results, stage_record("topology", "failed", task="Check | Stop", now=WHEN), True)
    assert failed["topology"] == {"status": "failed", "check_mode": True, "task": "Check | Stop"}
    assert failed["driver"] == results["driver"] and "topology" not in results  # the input is left as it was


def test_the_records_of_the_last_runs_are_read_back(tmp_path):
    write_record(str(tmp_path / "driver.json"), stage_record("driver", "passed", seconds=2.0, now=WHEN))
    (tmp_path / "topology.json").write_text('{"stage": "topo')  # cut short
    records = read_records(str(tmp_path), ["driver", "topology", "runtime"])
    assert list(records) == ["driver"] and records["driver"]["status"] == "passed"
    assert read_records(str(tmp_path / "none"), ["driver"]) == {}


def test_the_module_hands_the_runs_results_on_through_ansible(tmp_path):
    """Through ansible-playbook: the stages start, one passes, the registered answer carries the run's results
    under stage_results (a key named `results` Ansible would rename, with a warning, and the report lose) and the
    records as they were before the start wrote."""
    write_record(str(tmp_path / "driver.json"), stage_record("driver", "passed", seconds=2.0, now=WHEN))
    module = "rigops.fleet.stage_record"
    tasks = [
        {module: {"dir": str(tmp_path), "stages": ["driver", "topology"], "status": "started", "read": ["driver"]},
         "register": "started"},
        {module: {"dir": str(tmp_path), "stage": "driver", "status": "passed", "seconds": 1.5,
                  "stage_results": "{{ {} }}"}, "register": "done"},
        {module: {"dir": str(tmp_path), "stage": "topology", "status": "passed", "seconds": 0.5,
                  "stage_results": "{{ done.stage_results }}"}, "register": "done"},
        {"ansible.builtin.copy": {"content": "{{ {'started': started, 'done': done} | to_json }}",
                                  "dest": str(tmp_path / "out.json"), "mode": "0600"}},
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    # Ansible's own strategy, as a user's run: mitogen's (the suite's fast runs) hands a module's answer on as is
    proc = ansible_playbook(*LOCALHOST, tmp_path / "play.yml", env={"ANSIBLE_STRATEGY": "linear"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "internal 'results' key" not in proc.stdout + proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["started"]["records"]["driver"]["status"] == "passed"  # as the last run left it
    assert out["started"]["stages"] == ["driver", "topology"]
    assert out["done"]["stage_results"] == {
        "driver": {"status": "passed", "check_mode": False, "seconds": 1.5},
        "topology": {"status": "passed", "check_mode": False, "seconds": 0.5},
    }
    assert json.loads((tmp_path / "topology.json").read_text())["status"] == "passed"
