"""The conformance suite's own logic (commands/conformance.py), without a gateway: the settings read as a
client reads them, how a case ends (pass, fail, unsupported with the engine's words, not run), the table and
the report, the order of a streamed Messages answer, the pinned clients. The cases themselves run against
real vLLM instances through the real gateway in molecule/vllm_service (tests/test_conformance.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import httpx2
import openai
import pytest
from ansible_collections.rigops.fleet.plugins.filter import llm_clients as gw

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("conformance", ROOT / "commands" / "conformance.py")
conformance = importlib.util.module_from_spec(spec)
sys.modules["conformance"] = conformance  # (dataclasses look their module up)
spec.loader.exec_module(conformance)

KEY = "alice-client-key-0123456789abcdef0123456789abcdef"
SUMMARY = {
    "url": "https://gw.example.internal:8443/v1",
    "self_signed": True,
    "clients": {"alice": ["tiny-a", "chat"]},
    "models": ["tiny-a", "chat"],
}
# The event types of a streamed Messages answer as vLLM's /v1/messages sent them through the gateway
# (the demo fleet, qwen3.5-9b, max_tokens 8), and Anthropic's documented order with a ping and two blocks.
VLLM_MESSAGE_EVENTS = (
    "message_start content_block_start content_block_delta content_block_delta content_block_delta "
    "content_block_delta content_block_delta content_block_delta content_block_delta content_block_delta "
    "content_block_stop message_delta message_stop"
)


def folder_for(tmp_path, active="chat"):
    """A client's folder as roles/llm_clients writes it (its own filter renders the files)."""
    folder = tmp_path / "alice"
    (folder / "claude-code").mkdir(parents=True, exist_ok=True)
    (folder / "codex").mkdir(exist_ok=True)
    (folder / "key").write_text(KEY + "\n")
    (folder / "gateway-ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (folder / "ca-bundle.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    files = gw.client_settings(SUMMARY, "alice", {
        "key": "", "inline": False, "key_file": str(folder / "key"), "ca_file": str(folder / "gateway-ca.pem"),
        "bundle_file": str(folder / "ca-bundle.pem"), "active": active, "small": ""})  # fmt: skip
    for name, content in files.items():
        (folder / name).write_text(content)
    return folder


def test_settings_are_read_as_the_clients_read_them(tmp_path):
    s = conformance.Settings.read(folder_for(tmp_path))
    assert s.env["OPENAI_BASE_URL"] == SUMMARY["url"] and s.key == KEY
    assert s.verify == str(tmp_path / "alice" / "ca-bundle.pem")
    assert s.anthropic_key() == KEY  # Claude Code's apiKeyHelper, run
    assert s.claude["env"]["ANTHROPIC_BASE_URL"] == "https://gw.example.internal:8443"
    assert s.codex["model_providers"]["rigops"]["env_key"] == "RIGOPS_LLM_API_KEY"
    assert sorted(s.providers["providers"]) == ["chat", "tiny-a"]


def test_missing_settings_name_the_files_and_the_fix(tmp_path):
    folder = folder_for(tmp_path)
    (folder / "codex" / "config.toml").unlink()
    with pytest.raises(SystemExit, match=r"lacks codex/config.toml: .*playbooks/clients.yml"):
        conformance.Settings.read(folder)


def fake_context(tmp_path):
    return conformance.Context(settings=conformance.Settings.read(folder_for(tmp_path)), openai=None, anthropic=None,
                               http=None, metrics={}, clis={})  # fmt: skip


def api_error(status, message):
    request = httpx2.Request("POST", "https://gw/v1/chat/completions")
    body = {"error": {"message": message, "type": "BadRequestError"}}
    response = httpx2.Response(status, request=request, json=body)
    return openai.APIStatusError(message, response=response, body=body["error"])


AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@pytest.mark.parametrize(
    ("raised", "status", "words"),
    [
        (None, "pass", "fine"),
        (conformance.CaseFailed("usage missing"), "fail", "usage missing"),
        (conformance.NotRun("Codex is not installed"), "not_run", "Codex is not installed"),
        (api_error(500, "engine died"), "fail", "500: engine died"),
        (ValueError(f"bad answer for {KEY}"), "fail", "ValueError: bad answer for <key>"),
    ],
)
def test_how_a_case_ends(tmp_path, monkeypatch, raised, status, words):
    def case(ctx, model):
        if raised:
            raise raised
        return "fine"

    monkeypatch.setitem(conformance.CASES, "probe", ("openai", "openai-sdk", case))
    r = conformance.run_case(fake_context(tmp_path), "chat", "probe")
    assert (r.status, r.detail, r.model, r.api) == (status, words, "chat", "openai")


def test_an_engine_refusal_of_a_feature_is_unsupported_with_its_words(tmp_path, monkeypatch):
    @conformance.unsupported_on(400)
    def feature(ctx, model):
        raise api_error(400, AUTO)

    @conformance.unsupported_on(400)
    def broken(ctx, model):
        raise api_error(502, "bad gateway")

    monkeypatch.setitem(conformance.CASES, "feature", ("openai", "openai-sdk", feature))
    monkeypatch.setitem(conformance.CASES, "broken", ("openai", "openai-sdk", broken))
    ctx = fake_context(tmp_path)
    r = conformance.run_case(ctx, "chat", "feature")
    assert r.status == "unsupported" and r.detail == f"400: {AUTO}"
    assert conformance.run_case(ctx, "chat", "broken").status == "fail"


def test_table_and_report_count_every_status(tmp_path):
    R = conformance.Result
    results = [
        R("chat", "chat", "openai", "openai-sdk", "pass", "ok", 0.5),
        R("chat", "tool_auto", "openai", "openai-sdk", "unsupported", f"400: {AUTO}", 0.1),
        R("tiny-a", "chat", "openai", "openai-sdk", "pass", "ok", 0.4),
        R("tiny-a", "tool_auto", "openai", "openai-sdk", "fail", "no tool call", 0.2),
    ]
    text = conformance.table(results)
    assert text.splitlines()[0].split() == ["case", "chat", "tiny-a"]
    assert text.splitlines()[2].split() == ["tool_auto", "unsupported", "fail"]
    assert f"chat tool_auto: unsupported: 400: {AUTO}" in text and "tiny-a tool_auto: fail: no tool call" in text
    assert "chat: 2 cases, 1 pass, 0 fail, 1 unsupported, 0 not_run; 0.6 s" in text
    data = conformance.report(results, conformance.Settings.read(folder_for(tmp_path)), ["chat", "tiny-a"])
    assert data["ok"] is False and data["models"]["tiny-a"]["counts"]["fail"] == 1
    assert KEY not in json.dumps(data)
    assert conformance.report(results[:2], conformance.Settings.read(folder_for(tmp_path)), ["chat"])["ok"] is True


def test_the_messages_stream_order():
    assert conformance.MESSAGE_EVENTS.match(VLLM_MESSAGE_EVENTS)
    two_blocks = "message_start content_block_start content_block_delta content_block_stop content_block_start " \
                 "content_block_delta content_block_stop message_delta message_stop"  # fmt: skip
    assert conformance.MESSAGE_EVENTS.match(two_blocks)
    for wrong in (
        "content_block_start content_block_delta content_block_stop message_delta message_stop",  # no message_start
        "message_start content_block_start content_block_delta message_delta message_stop",  # a block left open
        "message_start content_block_start content_block_stop message_delta",  # no message_stop
    ):
        assert not conformance.MESSAGE_EVENTS.match(wrong), wrong


def test_every_api_family_and_client_has_cases():
    assert len(conformance.CASES) >= 40
    families = {api for api, _, _ in conformance.CASES.values()}
    clients = {client for _, client, _ in conformance.CASES.values()}
    assert families == {"openai", "responses", "anthropic"}
    assert clients == {"openai-sdk", "anthropic-sdk", "http", "claude", "codex"}


def test_the_clis_are_pinned_exactly_with_integrity():
    folder = ROOT / "commands" / "clients"
    wanted = json.loads((folder / "package.json").read_text())["dependencies"]
    assert all(v[0].isdigit() for v in wanted.values()), wanted  # exact versions, no ranges
    lock = json.loads((folder / "package-lock.json").read_text())["packages"]
    assert lock[""]["dependencies"] == wanted
    for name, version in wanted.items():
        entry = lock[f"node_modules/{name}"]
        assert entry["version"] == version and entry["integrity"].startswith("sha512-")


def test_a_change_is_judged_by_what_it_broke():
    def rep(**statuses):
        results = [{"model": "chat", "case": c, "status": s, "detail": f"{c} {s}"} for c, s in statuses.items()]
        return {"results": results}

    before = rep(chat="pass", tool_auto="pass", embeddings="unsupported", json_schema="fail", logprobs="pass")
    # the tool-call parser dropped: tool_auto from pass to unsupported is what the change broke
    after = rep(chat="pass", tool_auto="unsupported", embeddings="unsupported", json_schema="fail", logprobs="pass",
                new_case="fail")  # fmt: skip
    assert conformance.regressions(before, after) == [
        "chat tool_auto: pass -> unsupported: tool_auto unsupported",
        "chat new_case: not asked -> fail: new_case fail",
    ]
    assert conformance.regressions(before, before) == []


def test_an_instance_reached_directly_reads_its_key_file_and_skips_the_gateways_refusals(tmp_path):
    key_file = tmp_path / "api_key"
    key_file.write_text(KEY + "\n")
    s = conformance.Settings.direct("http://127.0.0.1:8000/", key_file, "tiny")
    assert s.env == {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "OPENAI_API_KEY": KEY}
    assert s.claude["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8000" and s.anthropic_key() == KEY
    assert s.direct_endpoint == "http://127.0.0.1:8000" and list(s.providers["providers"]) == ["tiny"]
    ctx = conformance.Context(settings=s, openai=None, anthropic=None, http=None, metrics={}, clis={})
    for name in conformance.GATEWAY_ONLY:
        assert conformance.run_case(ctx, "tiny", name).status == "not_run"


def test_the_command_refuses_a_half_given_instance(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        conformance.main(["--endpoint", "http://127.0.0.1:8000", "--model", "tiny"])
    assert e.value.code == 2 and "--endpoint takes --key-file and one --model" in capsys.readouterr().err


def test_hosts_name_the_models_their_instances_serve_as_ansible_renders_them():
    """-l: the sandbox inventory's templated instance lists, rendered by Ansible (no connection to any host)."""
    assert conformance.served_by("gpu-rigs", []) == ["qwen3.5-9b", "qwen3.5-9b-instruct"]
    example = [str(ROOT / "inventories" / "example")]
    assert conformance.served_by("h100-01", example) == ["qwen2.5-72b-instruct", "qwen2.5-coder-32b-instruct"]
    with pytest.raises(SystemExit, match="-l no-such-host: no host of the inventory matched"):
        conformance.served_by("no-such-host", [])


def test_an_instance_without_a_served_name_serves_its_own_name(tmp_path):
    """served_name defaults to the instance's name (docs/instances.md), not the model's id; nothing but the
    names comes back (an instance's security.api_key may be in the inventory)."""
    inventory = tmp_path / "hosts.yml"
    instances = [
        {"name": "chat", "port": 8000, "model": {"source": "huggingface", "id": "Org/Model-7B"},
         "security": {"api_key": KEY}},
        {"name": "code", "port": 8001, "model": {"source": "huggingface", "id": "Org/Coder", "served_name": "coder"}},
    ]  # fmt: skip
    inventory.write_text(json.dumps({"all": {"hosts": {"r1": {"vllm_instances": instances}}}}))
    assert conformance.served_by("r1", [str(inventory)]) == ["chat", "coder"]


def test_an_instance_reached_directly_never_installs_the_clis(tmp_path, monkeypatch):
    key_file = tmp_path / "api_key"
    key_file.write_text(KEY + "\n")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):  # (the command sets them for the SDK: undone after)
        monkeypatch.setenv(name, "")
    monkeypatch.setattr(conformance, "install_clis", lambda *a: pytest.fail("the CLIs installed on a host"))
    seen = {}
    monkeypatch.setattr(conformance, "run_suite", lambda ctx, models, cases, progress: seen.update(clis=ctx.clis) or [])
    rc = conformance.main(["--endpoint", "http://127.0.0.1:9", "--key-file", str(key_file), "--model", "tiny",
                           "--report-dir", "none", "--json"])  # fmt: skip
    assert rc == 0 and seen == {"clis": {}}
