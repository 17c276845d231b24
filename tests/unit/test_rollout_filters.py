"""The rollout's bookkeeping filters (plugins/filter/rollout.py): versions read from the config.toml
files a host serves, and each host's result (its status decides the run's verdict)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.filter import rollout as rr

ROOT = Path(__file__).resolve().parents[2]


OLD = "/opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0a816e8303e6"
NEW = "/opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-77d2c0ffee42"
TOML = """# Ansible managed
[server]
instance = "chat"
host = "127.0.0.1"
port = 8000
python = "{python}/venv/bin/python"
key_file = "/etc/vllm/chat/api_key"

[model]
served_name = "tiny"
path = "/srv/rigops/models/huggingface/Qwen/Qwen3.5-9B-Instruct/{commit}"
commit = "{commit}"
revision = "v1.0.0"

[security]
require_key = true
"""


def slurped(**files):
    return {
        "results": [{"item": name, "content": base64.b64encode(text.encode()).decode()} for name, text in files.items()]
        + [{"item": "absent", "failed": False, "msg": "file not found"}]
    }


def test_versions_and_configs_from_the_files_a_host_serves():
    files = slurped(chat=TOML.format(python=OLD, commit="a" * 40))
    versions = rr.rollout_versions(files, OLD)
    assert versions["runtime"] == "cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0a816e8303e6"
    chat = versions["instances"]["chat"]
    assert chat["runtime"] == versions["runtime"] and chat["commit"] == "a" * 40 and chat["revision"] == "v1.0.0"
    assert len(chat["config"]) == 12 and "absent" not in versions["instances"]
    (config,) = rr.rollout_configs(files)
    assert config["server"]["port"] == 8000 and config["model"]["served_name"] == "tiny"
    assert config["security"]["require_key"] is True
    newer = rr.rollout_versions(slurped(chat=TOML.format(python=NEW, commit="a" * 40)), NEW)
    assert newer != versions and newer["instances"]["chat"]["config"] != chat["config"]
    assert rr.rollout_versions({"results": []}, None) == {"runtime": None, "instances": {}}


BEFORE = {"runtime": "r-old", "instances": {"chat": {"runtime": "r-old", "commit": "c", "config": "1"}}}
AFTER = {"runtime": "r-new", "instances": {"chat": {"runtime": "r-new", "commit": "c", "config": "2"}}}
FAIL = {"stage": "restart", "task": "Gate | vllm_endpoint on chat", "msg": "failed its gate\n (unit_failed)"}


@pytest.mark.parametrize(
    "facts, status, ok",
    [
        ({"before": BEFORE, "after": BEFORE}, "unchanged", True),
        ({"before": BEFORE, "after": AFTER, "switched": True}, "updated", True),
        (
            {"before": BEFORE, "after": BEFORE, "switched": True, "rolled_back": True, "failure": FAIL},
            "rolled_back",
            False,
        ),
        ({"before": BEFORE, "after": BEFORE, "failure": dict(FAIL, stage="stage")}, "failed", False),
        ({"before": BEFORE, "after": AFTER, "switched": True, "failure": FAIL}, "rollback_failed", False),
        (
            {"before": BEFORE, "switched": True, "failure": FAIL, "rollback_error": "tar: nothing"},
            "rollback_failed",
            False,
        ),
        ({"before": BEFORE, "after": AFTER, "check_mode": True}, "check", True),
    ],
)
def test_result_statuses(facts, status, ok):
    result = rr.rollout_result(dict(facts, host="jet-1", batch=1, marks=[], end=0))
    assert (result["status"], result["ok"], result["canary"]) == (status, ok, True)


def test_result_figures_and_reason():
    marks = [["backup", 100.0], ["stage", 101.5], ["switch", 230.0], ["restart", 230.5], ["rollback", 260.0]]
    result = rr.rollout_result(
        {
            "host": "jet-2", "batch": 2, "before": BEFORE, "after": BEFORE, "switched": True, "rolled_back": True,
            "failure": FAIL, "marks": marks, "end": 300.0,
            "gate": {"chat": {"ready_s": 1, "chat_s": 0.4, "ttft_s": 0.2, "config": "/etc/vllm/chat/config.toml"}},
            "rollback_gate": {"chat": {"ready_s": 40.0, "chat_s": 0.5, "ttft_s": 0.3}, "_tegrastats": {}},
        }
    )  # fmt: skip
    assert result["stage_seconds"] == {"backup": 1.5, "stage": 128.5, "switch": 0.5, "restart": 29.5, "rollback": 40.0}
    assert result["reason"] == "restart: Gate | vllm_endpoint on chat: failed its gate (unit_failed)"
    assert result["gate"] == {"chat": {"ready_s": 1, "chat_s": 0.4, "ttft_s": 0.2}}
    assert list(result["rollback_gate"]) == ["chat"] and not result["canary"] and not result["changed"]
