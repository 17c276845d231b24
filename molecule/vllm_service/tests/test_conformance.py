"""The conformance suite (`./rigops conformance`, commands/conformance.py) on the rig's models, through its
gateway, from a person's machine: this controller.

As a person does it: playbooks/clients.yml writes the dev client's settings here (the gateway's URL
https://127.0.0.1:2461, its CA, the key file); an SSH tunnel carries that port from this machine to the
gateway on the rig, and a second one beta's /metrics (for the case that checks a client leaving mid-stream
frees its slot). Then the suite: every case by a real client (the official OpenAI and Anthropic SDKs, plain
HTTP for the refusals' shapes, Claude Code and Codex installed from commands/clients' lock into the cache).

tiny-b (beta) is served for coding clients: a context long enough for their prompts and vLLM's tool-call
parser. tiny-a (alpha) has neither: its tool choices are reported unsupported, in vLLM's words.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import ROOT, ansible_playbook

testinfra_hosts = ["vs-rig"]
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
HOST_VARS = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["vs-rig"]
GATEWAY_PORT = HOST_VARS["llm_gateway_port"]
METRICS_PORT = 2462  # on this machine: beta's 8002 on the rig
KEY = HOST_VARS["llm_gateway_clients"][0]["key"]


def instance(name):
    (found,) = [i for i in yaml.safe_load(Path(os.environ["MOLECULE_INSTANCE_CONFIG"]).read_text())
                if i["instance"] == name]  # fmt: skip
    return found


def wait_port(port, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def tunnel():
    """This machine's 127.0.0.1:<gateway port> to the gateway on the rig (the URL its clients were given), and
    127.0.0.1:2462 to beta's port (its /metrics, which vLLM serves without a key and the gateway never passes)."""
    inst = instance("vs-rig")
    proc = subprocess.Popen([
        "ssh", "-N", "-o", "ExitOnForwardFailure=yes", "-o", f"UserKnownHostsFile={inst['known_hosts']}",
        "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-i", inst["identity_file"],
        "-p", str(inst["port"]), "-L", f"127.0.0.1:{GATEWAY_PORT}:127.0.0.1:{GATEWAY_PORT}",
        "-L", f"127.0.0.1:{METRICS_PORT}:127.0.0.1:8002", f"root@{inst['address']}",
    ])  # fmt: skip
    try:
        wait_port(GATEWAY_PORT)
        wait_port(METRICS_PORT)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def settings(tunnel, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clients") / "dev"
    extra = {"llm_clients_client": "dev", "llm_clients_dir": str(folder), "llm_clients_active_model": "tiny-b"}
    rc, out = ansible_playbook(ROOT / "playbooks" / "clients.yml", "-e", json.dumps(extra))
    assert rc == 0, out[-3000:]
    return folder


def conformance(settings, tmp_path, *args):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "commands" / "conformance.py"), "--clients", str(settings),
         "--report-dir", str(tmp_path), *args],
        capture_output=True, text=True, check=False, timeout=1200,
    )  # fmt: skip
    (report,) = tmp_path.glob("*/report.json")
    print(proc.stdout)  # the table, with the suite's time per model
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report.read_text())


def test_every_case_passes_on_the_coding_model_through_the_gateway(settings, tmp_path):
    rc, out, report = conformance(
        settings, tmp_path, "--model", "tiny-b", "--metrics", f"tiny-b=http://127.0.0.1:{METRICS_PORT}/metrics"
    )
    results = {r["case"]: r for r in report["results"]}
    failed = {c: r["detail"] for c, r in results.items() if r["status"] == "fail"}
    assert rc == 0 and report["ok"] and not failed, failed or out[-3000:]
    assert len(results) >= 40
    # the CLIs themselves answered, from the settings alone
    for cli in ("claude_code", "codex", "disconnect_frees_slot", "tool_auto", "messages_tool_use", "responses"):
        assert results[cli]["status"] == "pass", results[cli]
    # only what a generative model does not offer is unsupported, in vLLM's own words
    unsupported = {c: r["detail"] for c, r in results.items() if r["status"] == "unsupported"}
    assert set(unsupported) <= {"embeddings"}, unsupported
    assert report["models"]["tiny-b"]["counts"]["not_run"] == 0
    # the key is in no report and no output
    assert KEY not in out and KEY not in json.dumps(report)


def test_a_model_without_a_tool_parser_is_reported_unsupported_in_vllms_words(settings, tmp_path):
    rc, out, report = conformance(settings, tmp_path, "--model", "tiny-a", "--no-cli", "--case", "tool_auto",
                                  "--case", "tool_required", "--case", "chat")  # fmt: skip
    results = {r["case"]: r for r in report["results"]}
    assert rc == 0, out[-3000:]
    assert results["chat"]["status"] == "pass"
    auto, required = results["tool_auto"], results["tool_required"]
    assert auto["status"] == "unsupported" and "--enable-auto-tool-choice" in auto["detail"], auto
    assert required["status"] == "unsupported" and "requires --tool-call-parser" in required["detail"], required
