"""Acceptance of the main job on a sandbox rig (from the runtime stage: molecule.yml): the endpoint as a client
sees it, and the run's report."""

import json
import os
import shlex
from pathlib import Path

import pytest

PORT = 8000
SERVED = "qwen3.5-9b"
BASE = f"http://127.0.0.1:{PORT}/v1"
STAGES = ["driver", "topology", "runtime", "weights", "services", "health", "gpu_health"]


def curl(host, path, key=None, body=None):
    """HTTP status and body of a request made on the rig (the endpoint listens on its loopback only)."""
    cmd = ["curl", "-sS", "--noproxy", "*", "-o", "/tmp/site-body", "-w", "%{http_code}"]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    status = host.check_output(" ".join(shlex.quote(c) for c in [*cmd, BASE + path]))
    return int(status), host.file("/tmp/site-body").content_string


@pytest.fixture(scope="module")
def key(host):
    return host.check_output("cat /etc/vllm/chat/api_key").strip()


@pytest.fixture(scope="module")
def report():
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports" / "latest.json"
    return json.loads(path.read_text())


def test_models_with_the_key_lists_the_served_name(host, key):
    status, body = curl(host, "/models", key)
    assert status == 200, body
    assert [m["id"] for m in json.loads(body)["data"]] == [SERVED]


def test_one_chat_completion(host, key):
    status, body = curl(
        host,
        "/chat/completions",
        key,
        {"model": SERVED, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
    )
    assert status == 200, body
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert answer["usage"]["completion_tokens"] >= 1


def test_no_key_is_401(host):
    status, _ = curl(host, "/models")
    assert status == 401


def test_wrong_model_is_404(host, key):
    status, body = curl(
        host, "/chat/completions", key, {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert status == 404
    assert "gpt-4o" in body


def test_endpoint_listens_on_loopback_only(host):
    sockets = [s for s in host.socket.get_listening_sockets() if s.endswith(f":{PORT}")]
    assert sockets == [f"tcp://127.0.0.1:{PORT}"]


def test_every_stage_left_its_state(host):
    assert host.package("nvidia-open").is_installed or host.package("nvidia-driver-595-open").is_installed
    assert host.file("/opt/rigops/vllm/current").is_symlink
    record = json.loads(host.file("/etc/rigops/models.json").content_string)
    assert record["chat"]["source"] == "modelscope" and len(record["chat"]["commit"]) == 40
    assert host.file(record["chat"]["path"]).is_directory
    assert host.service("vllm@chat").is_running and host.service("vllm@chat").is_enabled


def test_report_says_the_rig_is_done(report):
    (rig,) = report["hosts"]
    assert rig["host"] == "site-rig" and rig["status"] == "ok"
    assert rig["driver"].startswith("595.") and rig["gpus"] == 8 and rig["topology"] == "pass"
    assert rig["runtime_release"] and rig["vllm"] == "0.32.0"
    (inst,) = rig["instances"]
    assert inst["name"] == "chat" and inst["served_name"] == SERVED and inst["url"] == BASE
    assert inst["ttft_s"] is not None and inst["ttft_s"] > 0
    assert set(STAGES) <= set(rig["stage_seconds"])
