"""The LLM gateway (roles/llm_gateway, roles/llm_clients) on the sandbox rig, in front of its real vLLM instances.

vs-rig is also the gateway (group gateways): its instances bind 127.0.0.1, which only a gateway on the
same host can reach. Names: tiny-a (alpha, 8001), tiny-b (beta, 8002), hosted-1 (the model of a hosted
provider, reached as one is: base URL and key from the inventory); aliases tiny = [tiny-a, tiny-b,
remote:hosted-1] and tiny-far = [tiny-a, remote:hosted-1]. Clients: dev (every name), limited (tiny-a and
tiny). The hosted provider is a stand-in this file runs on the rig (127.0.0.1:9411, plain http): it
checks its own key and records the headers it receives. While it is down (the converge), the gateway
names it unreachable and gates the other names only.

The tests use what users use: the official openai and anthropic clients of the runtime's venv and curl,
over HTTPS with the gateway's certificate checked. The ones that change the host (a stopped vLLM, a
change that fails the gate, a revoked client) run last.
"""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import ROOT, ansible_playbook, start_hosted_standin

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
HOST_VARS = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["vs-rig"]
CLIENT_KEYS = {c["name"]: c["key"] for c in HOST_VARS["llm_gateway_clients"]}
REMOTE = HOST_VARS["llm_gateway_remotes"][0]
REMOTE_KEY = REMOTE["key"]
PYTHON = "/opt/rigops/vllm/current/venv/bin/python"
BASE = "https://127.0.0.1:2461"
CA = "/etc/rigops-llm-gateway/tls/ca.pem"
ETC = "/etc/rigops-llm-gateway"
# every name, and the model that answers it while every upstream runs
SERVED = {"tiny-a": "tiny-a", "tiny-b": "tiny-b", "hosted-1": "hosted-1", "tiny": "tiny-a", "tiny-far": "tiny-a"}
STANDIN_LOG = "/var/log/rigops-remote-standin.jsonl"
CLIENTS_DIR = "/root/.config/rigops-llm/dev"


def put_key(host, name):
    """The client's key in a root-only file on the rig: scripts read it, no command line carries it."""
    path = f"/tmp/gw-key-{name}"
    host.check_output(f"install -m 600 /dev/null {path} && cat > {path} <<'EOF'\n{CLIENT_KEYS[name]}\nEOF")
    return path


def curl(host, path, key_file=None, data=None, extra=""):
    auth = f'-H "Authorization: Bearer $(cat {key_file})"' if key_file else ""
    body = f"-H 'Content-Type: application/json' -d '{json.dumps(data)}'" if data is not None else ""
    fmt = "-o /tmp/gw-body -w '%{http_code}'"
    out = host.check_output(f"curl -s --cacert {CA} {fmt} {auth} {body} {extra} {BASE}{path}")
    return int(out), host.check_output("cat /tmp/gw-body")


def python(host, script, *args):
    host.check_output(f"cat > /tmp/gw_check.py <<'EOF'\n{script}\nEOF")
    run = f"SSL_CERT_FILE={CA} NO_PROXY=127.0.0.1 {PYTHON} /tmp/gw_check.py {' '.join(args)}"
    return json.loads(host.check_output(run))


def access_log(host):
    time.sleep(1.5)  # the log's buffer is flushed every second
    return [json.loads(line) for line in host.check_output("cat /var/log/rigops-llm-gateway/access.log").splitlines()]


def config_id(host, folder="live"):
    return host.check_output(f"cat {ETC}/{folder}/config_id").strip()


@pytest.fixture(scope="module", autouse=True)
def hosted_provider(host):
    """The stand-in provider on the rig, with the key the inventory gives the gateway."""
    start_hosted_standin(host, REMOTE_KEY, STANDIN_LOG)
    yield
    host.run("systemctl stop rigops-remote-standin")


def test_gateway_service_files_and_modes(host):
    svc = host.service("rigops-llm-gateway")
    assert svc.is_running and svc.is_enabled
    assert not host.service("nginx").is_running and not host.service("nginx").is_enabled
    listening = host.check_output("ss -Hltn").splitlines()
    assert any(re.match(r"LISTEN\s+\d+\s+\d+\s+0\.0\.0\.0:2461\s", line) for line in listening)
    modes = {"live": 0o700, "live/nginx.conf": 0o600, "live/gateway.js": 0o600, "health_key": 0o600,
             "tls/key.pem": 0o600, "summary.json": 0o644}  # fmt: skip
    for path, mode in ((f"{ETC}/{name}", mode) for name, mode in modes.items()):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", mode), path
    # what the last run put in service passed its gate, and is the one kept as good
    assert config_id(host) == config_id(host, "last-good") == config_id(host, "staging")
    assert (
        host.run(f"/usr/local/lib/rigops-llm-gateway/rigops-llm-gateway-config same {ETC}/live {ETC}/last-good").rc == 0
    )
    assert json.loads(host.check_output(f"curl -s --cacert {CA} {BASE}/healthz"))["config"] == config_id(host)
    # the workers run unprivileged; the client keys are on the rig only as sha256
    workers = host.check_output("ps -o user= --ppid $(cat /run/rigops-llm-gateway.pid)").split()
    assert workers and set(workers) == {"www-data"}
    conf = host.check_output(f"cat {ETC}/live/nginx.conf {ETC}/live/gateway.js")
    for key in CLIENT_KEYS.values():
        assert key not in conf
    summary = json.loads(host.check_output(f"cat {ETC}/summary.json"))
    assert summary["clients"]["limited"] == ["tiny-a", "tiny"]
    assert set(summary["models"]) == set(SERVED) and summary["url"] == "https://127.0.0.1:2461/v1"
    assert summary["routes"]["tiny"] == ["vs-rig/alpha", "vs-rig/beta", "remote:standin"]
    assert summary["config_id"] == config_id(host)
    assert summary["cert_pem"].strip() == host.file(CA).content_string.strip()
    for key in [*CLIENT_KEYS.values(), REMOTE_KEY]:
        assert key not in json.dumps(summary)
    # the unit checks the set before it starts and before a reload; the config tool is root's
    unit = host.file("/etc/systemd/system/rigops-llm-gateway.service").content_string
    assert f"ExecStart=/usr/sbin/nginx -c {ETC}/live/nginx.conf" in unit
    assert f"ExecReload=/usr/sbin/nginx -t -q -c {ETC}/live/nginx.conf\nExecReload=/bin/kill -s HUP $MAINPID" in unit
    tool = host.file("/usr/local/lib/rigops-llm-gateway/rigops-llm-gateway-config")
    assert (tool.user, tool.group, tool.mode) == ("root", "root", 0o755)
    # a pool's replica sockets (none here) hand on requests with the replica's key: the workers' folder alone,
    # and the unit clears the ones an nginx killed outright left behind
    replicas = host.file("/var/lib/rigops-llm-gateway/replicas")
    assert (replicas.is_directory, replicas.user, replicas.mode) == (True, "www-data", 0o700)
    assert "ExecStartPre=/bin/sh -c 'rm -f /var/lib/rigops-llm-gateway/replicas/*.sock'" in unit
    # every worker may hold its 4096 connections (systemd's default soft limit is 1024 open files)
    worker = host.check_output("pgrep -f 'nginx: worker process' | head -n 1")
    limits = host.check_output(f"grep 'Max open files' /proc/{worker}/limits").split()
    assert limits[3:5] == ["8192", "8192"], limits
    assert "exceed open file resource limit" not in host.check_output("cat /var/log/rigops-llm-gateway/error.log")


OPENAI = """
import json, sys, openai
key = open(sys.argv[1]).read().strip()
c = openai.OpenAI(base_url="https://127.0.0.1:2461/v1", api_key=key)
hi = [{"role": "user", "content": "hi"}]
out = {"models": [m.id for m in c.models.list()], "chat": {}, "stream": {}}
for name in sys.argv[2:]:
    r = c.chat.completions.create(model=name, messages=hi, max_tokens=4)
    out["chat"][name] = [r.model, r.choices[0].finish_reason]
    chunks = [ch for ch in c.chat.completions.create(model=name, messages=hi, max_tokens=4, stream=True)]
    ends = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    out["stream"][name] = [chunks[0].model, sum(1 for ch in chunks if ch.choices), ends]
print(json.dumps(out))
"""


def test_openai_client_chats_and_streams_every_name_through_the_gateway(host):
    out = python(host, OPENAI, put_key(host, "dev"), *SERVED)
    assert set(out["models"]) == set(SERVED)
    for name, served in SERVED.items():
        assert out["chat"][name][0] == served and out["chat"][name][1] in ("length", "stop"), name
        # streamed chunks that end with one finish reason; not their text: the tiny random model's sampled
        # tokens may be byte pieces that vLLM's detokenizer holds back, and so stream no content at all
        assert out["stream"][name][0] == served and out["stream"][name][1] >= 2, (name, out["stream"][name])
        assert len(out["stream"][name][2]) == 1 and out["stream"][name][2][0] in ("length", "stop"), name


ERRORS = """
import json, sys, openai
key = open(sys.argv[1]).read().strip()
hi = [{"role": "user", "content": "hi"}]
out = {}
def code(fn):
    try:
        fn()
        return 200
    except openai.APIStatusError as e:
        return e.status_code
wrong = openai.OpenAI(base_url="https://127.0.0.1:2461/v1", api_key="not-a-client-key-0123456789abcdef01234")
out["wrong_key"] = code(lambda: wrong.models.list())
c = openai.OpenAI(base_url="https://127.0.0.1:2461/v1", api_key=key)
out["models"] = [m.id for m in c.models.list()]
out["not_allowed"] = code(lambda: c.chat.completions.create(model="tiny-b", messages=hi, max_tokens=2))
out["unknown"] = code(lambda: c.chat.completions.create(model="gpt-4o", messages=hi, max_tokens=2))
out["allowed"] = code(lambda: c.chat.completions.create(model="tiny", messages=hi, max_tokens=2))
print(json.dumps(out))
"""


def test_wrong_key_401_model_not_allowed_403_unknown_404(host):
    out = python(host, ERRORS, put_key(host, "limited"))
    assert out == {"wrong_key": 401, "models": ["tiny-a", "tiny"], "not_allowed": 403, "unknown": 404, "allowed": 200}
    status, body = curl(host, "/v1/chat/completions", data={"model": "tiny-a", "messages": []})
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("path", ["/metrics", "/tokenize", "/detokenize", "/health", "/version", "/docs",
                                  "/openapi.json", "/ping", "/load", "/v1/load_lora_adapter"])  # fmt: skip
def test_paths_vllm_leaves_open_are_not_reachable_through_the_gateway(host, path):
    key = put_key(host, "dev")
    assert curl(host, path, key)[0] == 404
    assert curl(host, path, key, data={"model": "tiny-a", "prompt": "hi"})[0] == 404
    if path == "/metrics":
        # vLLM itself answers it without any key: only the gateway keeps it in
        assert host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8001/metrics") == "200"


def test_each_upstream_gets_its_own_key_never_the_clients(host):
    key = put_key(host, "dev")
    # vLLM refuses the client's key: what reached it through the gateway was its own
    direct = (
        "curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $(cat {})\" http://127.0.0.1:{}/v1/models"
    )
    for port in (8001, 8002):
        assert host.check_output(direct.format(key, port)) == "401"
    host.check_output(f": > {STANDIN_LOG}")
    for name in ("tiny-a", "tiny-b", "hosted-1", "tiny-far"):
        request = {"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        status, body = curl(host, "/v1/chat/completions", key, request, extra=f"-H 'X-Api-Key: $(cat {key})'")
        assert status == 200, body
    entries = [e for e in access_log(host) if e["client"] == "dev" and e["path"] == "/v1/chat/completions"]
    targets = {e["model"]: e["target"] for e in entries if e["status"] == 200}
    assert targets["tiny-a"] == "vs-rig/alpha" and targets["tiny-b"] == "vs-rig/beta"
    assert targets["tiny-far"] == "vs-rig/alpha" and targets["hosted-1"] == "remote:standin"
    # the provider saw its own key, never the client's, in no header (X-Api-Key is dropped too)
    seen = [json.loads(line) for line in host.check_output(f"cat {STANDIN_LOG}").splitlines()]
    assert [r["model"] for r in seen] == ["hosted-1"]
    headers = {k.lower(): v for k, v in seen[0]["headers"].items()}
    assert headers["authorization"] == f"Bearer {REMOTE_KEY}" and "x-api-key" not in headers
    assert not any(CLIENT_KEYS["dev"] in v for v in headers.values())
    logs = host.check_output("cat /var/log/rigops-llm-gateway/*.log; journalctl --no-pager -o cat -n 3000")
    for secret in [*CLIENT_KEYS.values(), REMOTE_KEY, host.check_output("cat /etc/vllm/alpha/api_key").strip()]:
        assert secret not in logs


ANTHROPIC = """
import json, sys, anthropic
key = open(sys.argv[1]).read().strip()
hi = [{"role": "user", "content": "hi"}]
out = {}
# api_key: the SDK's default, sent as x-api-key; auth_token: sent as Authorization: Bearer
for how, client in (("api_key", anthropic.Anthropic(base_url="https://127.0.0.1:2461", api_key=key)),
                    ("auth_token", anthropic.Anthropic(base_url="https://127.0.0.1:2461", auth_token=key,
                                                       api_key=None))):
    r = client.messages.create(model="tiny", max_tokens=4, messages=hi)
    out[how] = {"model": r.model, "type": r.type, "blocks": [b.type for b in r.content]}
try:
    anthropic.Anthropic(base_url="https://127.0.0.1:2461", api_key="not-" + key).messages.create(
        model="tiny", max_tokens=4, messages=hi)
except anthropic.AuthenticationError as e:
    out["wrong_key"] = {"status": e.status_code, "body": e.body}
print(json.dumps(out))
"""


def test_claude_code_shape_messages_api_through_the_gateway(host):
    """Claude Code speaks Anthropic's Messages API; the gateway passes /v1/messages on by model to vLLM's. The
    key works in either header Anthropic's SDK sends, and a wrong one is refused in Anthropic's error shape,
    which the SDK raises as its AuthenticationError."""
    out = python(host, ANTHROPIC, put_key(host, "dev"))
    for how in ("api_key", "auth_token"):
        assert out[how]["type"] == "message" and out[how]["model"] == "tiny-a" and out[how]["blocks"], how
    wrong = out["wrong_key"]
    assert wrong["status"] == 401 and wrong["body"]["type"] == "error", wrong
    assert wrong["body"]["error"]["type"] == "authentication_error" and "x-api-key" in wrong["body"]["error"]["message"]


SDK_FROM_ENV = """
import json, os, openai
c = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY only
hi = [{"role": "user", "content": "hi"}]
r = c.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=hi, max_tokens=4)
print(json.dumps({"model": r.model, "finish": r.choices[0].finish_reason}))
"""


def test_client_settings_work_as_written(host):
    folder = host.file(CLIENTS_DIR)
    assert (folder.user, folder.mode) == ("root", 0o700)
    files = ("openai.env", "claude-code/settings.json", "codex/config.toml", "continue.json", "providers.json")
    for name in ("key", *files):
        assert host.file(f"{CLIENTS_DIR}/{name}").mode == 0o600, name
    assert host.check_output(f"cat {CLIENTS_DIR}/key").strip() == CLIENT_KEYS["dev"]
    for name in files:
        assert CLIENT_KEYS["dev"] not in host.check_output(f"cat {CLIENTS_DIR}/{name}"), name
    # the official SDK, configured by nothing but the env file (base URL, key from the key file, CA bundle)
    host.check_output(f"cat > /tmp/gw_env.py <<'EOF'\n{SDK_FROM_ENV}\nEOF")
    run = f"env -i PATH=/usr/bin:/bin bash -c '. {CLIENTS_DIR}/openai.env && {PYTHON} /tmp/gw_env.py'"
    out = json.loads(host.check_output(run))
    registry = json.loads(host.check_output(f"cat {CLIENTS_DIR}/providers.json"))
    assert out["finish"] in ("length", "stop") and out["model"] == SERVED[registry["active"]]
    settings = json.loads(host.check_output(f"cat {CLIENTS_DIR}/claude-code/settings.json"))
    assert settings["env"]["ANTHROPIC_BASE_URL"] == "https://127.0.0.1:2461"
    assert settings["apiKeyHelper"] == f"cat {CLIENTS_DIR}/key"
    read = "import tomllib, json, sys; print(json.dumps(tomllib.load(open(sys.argv[1], 'rb'))))"
    codex = host.check_output(f'{PYTHON} -c "{read}" {CLIENTS_DIR}/codex/config.toml')
    provider = json.loads(codex)["model_providers"]["rigops"]
    assert provider["base_url"] == "https://127.0.0.1:2461/v1" and provider["env_key"] == "RIGOPS_LLM_API_KEY"


# --------------------------------------------------------------------------- changes to the host, last


def chat_model(host, key, name):
    status, body = curl(host, "/v1/chat/completions", key, {"model": name, "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    return status, (json.loads(body).get("model") if status == 200 else json.loads(body)["error"]["type"])


USAGE = """
import json, sys, time, urllib.request, openai
key = open(sys.argv[1]).read().strip()
def vllm():
    text = urllib.request.urlopen("http://127.0.0.1:8001/metrics", timeout=10).read().decode()
    out = {}
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        out[name] = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))
    return out
c = openai.OpenAI(base_url="https://127.0.0.1:2461/v1", api_key=key)
hi = [{"role": "user", "content": "count to three"}]
before = vllm()
r = c.chat.completions.create(model="tiny-a", messages=hi, max_tokens=6)
plain = [r.usage.prompt_tokens, r.usage.completion_tokens]
chunks = list(c.chat.completions.create(model="tiny-a", messages=hi, max_tokens=5, stream=True))
unasked = [ch.usage is not None or not ch.choices for ch in chunks]
chunks = list(c.chat.completions.create(model="tiny-a", messages=hi, max_tokens=4, stream=True,
                                        stream_options={"include_usage": True}))
asked = chunks[-1].usage.completion_tokens if chunks[-1].usage else None
time.sleep(1)
after = vllm()
print(json.dumps({"plain": plain, "unasked": unasked, "asked": asked,
                  "vllm": {k: after[k] - before[k] for k in after}}))
"""


def usage_report(host):
    out = host.check_output("/usr/local/lib/rigops-llm-gateway/rigops-llm-gateway-usage report --json")
    return {(r["client"], r["model"]): r for r in json.loads(out)["rows"]}


def test_usage_per_key_equals_vllms_own_token_counters(host):
    """Usage as vLLM counts it: the prompt and generation tokens of its /metrics, for the same requests
    (a plain answer, a stream whose client did not ask for usage, one that did), equal what the usage service
    counted for the client; the client that did not ask gets no usage chunk."""
    assert host.service("rigops-llm-gateway-usage").is_running
    folder = host.file("/var/lib/rigops-llm-gateway/usage")
    assert (folder.user, folder.group, folder.mode) == ("www-data", "root", 0o770)
    before = usage_report(host)
    out = python(host, USAGE, put_key(host, "limited"))
    assert out["plain"][1] >= 1 and not any(out["unasked"]) and out["asked"] == 4, out
    deadline, after = time.time() + 15, before
    while time.time() < deadline:  # the service sums the day's log every 2 s
        after = usage_report(host)
        if (
            after.get(("limited", "tiny-a"), {}).get("requests", 0)
            >= before.get(("limited", "tiny-a"), {}).get("requests", 0) + 3
        ):
            break
        time.sleep(1)
    old = before.get(("limited", "tiny-a"), {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
    new = after[("limited", "tiny-a")]
    assert new["requests"] - old["requests"] == 3, (old, new)
    assert new["prompt_tokens"] - old["prompt_tokens"] == out["vllm"]["vllm:prompt_tokens_total"], (old, new, out)
    assert new["completion_tokens"] - old["completion_tokens"] == out["vllm"]["vllm:generation_tokens_total"]
    prom = host.check_output("cat /var/lib/prometheus/node-exporter/rigops_llm_gateway_usage.prom")
    assert f'rigops_llm_gateway_prompt_tokens_total{{client="limited",model="tiny-a"}} {new["prompt_tokens"]}' in prom
    # ./rigops usage on the controller: the table of each gateway
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    res = subprocess.run([str(ROOT / "rigops"), "usage", "--since", "1", "-i", str(inventory), "-i",
                          str(ROOT / "inventories" / "sandbox" / "groups.yml")], capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(rf"^limited\s+tiny-a\s+{new['requests']}\s+{new['prompt_tokens']}\s", res.stdout, re.M), res.stdout


def test_a_spent_budget_is_429_and_stays_spent_through_a_reload(host):
    key = put_key(host, "capped")
    statuses = []
    deadline = time.time() + 30
    while time.time() < deadline and 429 not in statuses:
        statuses.append(
            curl(
                host,
                "/v1/chat/completions",
                key,
                {"model": "tiny-a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            )[0]
        )
        time.sleep(1)
    assert statuses[-1] == 429 and set(statuses) == {200, 429}, statuses
    body = json.loads(curl(host, "/v1/chat/completions", key, {"model": "tiny-a", "messages": []})[1])
    assert body["error"]["type"] == "insufficient_quota" and "60 tokens a day, is spent" in body["error"]["message"]
    spent = json.loads(host.check_output("cat /var/lib/rigops-llm-gateway/usage/spent.json"))
    assert spent["spent"]["capped"]["used"] >= 60 and spent["resets_at"] in body["error"]["message"]
    # nginx reloaded, the usage service restarted: the budget is still spent; other keys are not touched
    host.check_output("systemctl reload rigops-llm-gateway && systemctl restart rigops-llm-gateway-usage")
    time.sleep(3)
    assert curl(host, "/v1/chat/completions", key, {"model": "tiny-a", "messages": []})[0] == 429
    assert chat_model(host, put_key(host, "limited"), "tiny-a") == (200, "tiny-a")


@pytest.mark.changes_state
def test_a_stopped_vllm_falls_back_and_comes_back(host):
    key = put_key(host, "dev")
    host.check_output("systemctl stop vllm@alpha")
    try:
        t0 = time.monotonic()
        assert chat_model(host, key, "tiny") == (200, "tiny-b")
        assert time.monotonic() - t0 < 10  # the connect is refused: the fallback answers at once
        assert chat_model(host, key, "tiny") == (200, "tiny-b")
        assert chat_model(host, key, "tiny-far") == (200, "hosted-1")
        assert chat_model(host, key, "tiny-a") == (502, "upstream_unavailable")
        recent = [e for e in access_log(host) if e["model"] in ("tiny", "tiny-far")][-3:]
        assert recent[0]["upstream_status"].startswith("502") and recent[0]["target"] == "vs-rig/beta"
        # alpha is benched: the next request does not even try it
        assert recent[1]["upstream"].split(" : ")[0].startswith("u")
        assert float(recent[0]["request_time"]) < 5
    finally:
        host.check_output("systemctl start vllm@alpha")
    rc, out = ansible_playbook(SCENARIO / "gate.yml")
    assert rc == 0, out[-3000:]
    deadline = time.time() + 60  # llm_gateway_bench_seconds, then alpha is tried again
    while time.time() < deadline and chat_model(host, key, "tiny") != (200, "tiny-a"):
        time.sleep(2)
    assert chat_model(host, key, "tiny") == (200, "tiny-a")
    assert chat_model(host, key, "tiny-a") == (200, "tiny-a")


@pytest.mark.changes_state
def test_a_change_that_fails_the_gate_is_rolled_back(host):
    good = config_id(host)
    remotes = [dict(REMOTE, key="a-wrong-remote-key-0123456789abcdef")]
    rc, out = ansible_playbook(ROOT / "playbooks" / "gateway.yml", "-e", json.dumps({"llm_gateway_remotes": remotes}))
    assert rc != 0
    flat = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", out).split())
    assert "the gateway failed its gate" in flat and "HTTP 401" in flat, out[-3000:]
    assert "The last good config set is back in service" in flat
    assert "a-wrong-remote-key" not in out
    assert config_id(host) == good and config_id(host, "rejected") != good
    assert "a-wrong-remote-key" in host.check_output(f"cat {ETC}/rejected/nginx.conf")
    assert json.loads(host.check_output(f"curl -s --cacert {CA} {BASE}/healthz"))["config"] == good
    # the good set serves on, the remote with its right key
    key = put_key(host, "dev")
    assert chat_model(host, key, "hosted-1") == (200, "hosted-1")
    record = json.loads(host.check_output("cat /var/lib/rigops/stages/gateway.json"))
    assert record["status"] == "failed"


@pytest.mark.changes_state
def test_a_client_removed_from_the_inventory_is_revoked(host):
    key = put_key(host, "limited")
    assert chat_model(host, key, "tiny-a") == (200, "tiny-a")
    clients = [c for c in HOST_VARS["llm_gateway_clients"] if c["name"] != "limited"]
    rc, out = ansible_playbook(ROOT / "playbooks" / "gateway.yml", "-e", json.dumps({"llm_gateway_clients": clients}))
    assert rc == 0, out[-3000:]
    assert chat_model(host, key, "tiny-a") == (401, "authentication_error")
    assert chat_model(host, put_key(host, "dev"), "tiny-a") == (200, "tiny-a")
    # the inventory as it was: the key works again, and the stage is recorded as passed
    rc, out = ansible_playbook(ROOT / "playbooks" / "gateway.yml")
    assert rc == 0, out[-3000:]
    assert chat_model(host, key, "tiny-a") == (200, "tiny-a")
    assert json.loads(host.check_output("cat /var/lib/rigops/stages/gateway.json"))["status"] == "passed"


@pytest.mark.changes_state
def test_a_drained_instance_stays_drained_through_a_rerun_until_undrained(host):
    key = put_key(host, "dev")

    def drain(action, *targets, **more):
        extra = {"llm_gateway_drain_action": action, "llm_gateway_drain_targets": list(targets), **more}
        return ansible_playbook(ROOT / "playbooks" / "drain.yml", "-e", json.dumps(extra))

    rc, out = drain("drain", "vs-rig:alpha")  # ./rigops drain vs-rig:alpha
    assert rc == 0, out[-3000:]
    assert json.loads(host.check_output("cat /etc/rigops-llm-gateway/drains.json")) == {"drained": ["vs-rig/alpha"]}
    assert chat_model(host, key, "tiny") == (200, "tiny-b")
    assert chat_model(host, key, "tiny-a") == (503, "overloaded_error")
    # the gateway stage of the main job, which names no drain, keeps it
    rc, out = ansible_playbook(ROOT / "playbooks" / "gateway.yml")
    assert rc == 0, out[-3000:]
    assert chat_model(host, key, "tiny") == (200, "tiny-b")
    # a target that is not there changes nothing and says what is
    rc, out = drain("drain", "vs-rig:omega")
    assert rc != 0 and "vs-rig has no instance 'omega'; its instances: alpha, beta" in out, out[-3000:]
    # a rig the inventory excludes is a drain the inventory holds: undrain ends the drain by hand, not that one
    rc, out = drain("undrain", "vs-rig", llm_gateway_exclude_hosts=["vs-rig"])
    assert rc == 0, out[-3000:]
    assert json.loads(host.check_output("cat /etc/rigops-llm-gateway/drains.json")) == {"drained": []}
    assert chat_model(host, key, "tiny-a") == (503, "overloaded_error")
    assert chat_model(host, key, "tiny") == (200, "hosted-1")  # the alias on to its hosted fallback
    # the inventory without it: back
    rc, out = ansible_playbook(ROOT / "playbooks" / "gateway.yml")
    assert rc == 0, out[-3000:]
    assert chat_model(host, key, "tiny") == (200, "tiny-a")
