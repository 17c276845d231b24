"""Client settings for the LLM gateway: roles/llm_clients and the filter rigops.fleet.clients_settings.

- The files from plain data: the key only where asked for (inline), the active model everywhere,
  Codex's TOML and the JSON files read back, Claude Code pointed at the gateway's Messages API.
- The env file sourced by a shell sets exactly what an OpenAI SDK reads, and a client configured
  by nothing else completes a chat with an HTTPS stand-in gateway whose self-signed certificate
  it trusts through the bundle the role writes.
- The role run by ansible-playbook on this machine (connection local): folder 0700, files 0600,
  the key in the key file only, a rerun and check mode change nothing, switching the active model
  is one variable.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.filter import llm_clients as gw
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]

KEY = "alice-client-key-0123456789abcdef0123456789abcdef"
SUMMARY = {
    "url": "https://gw.example.internal:8443/v1",
    "self_signed": True,
    "clients": {"alice": ["tiny-a", "chat", "big-r"], "ci": ["chat"]},
    "models": ["tiny-a", "big-r", "chat"],
}
OPTIONS = {"key": "", "inline": False, "key_file": "/home/a/.config/rigops-llm/alice/key",
           "ca_file": "/home/a/.config/rigops-llm/alice/gateway-ca.pem",
           "bundle_file": "/home/a/.config/rigops-llm/alice/ca-bundle.pem", "active": "chat", "small": ""}  # fmt: skip


def settings(**over):
    return gw.client_settings(SUMMARY, "alice", {**OPTIONS, **over})


def test_files_point_at_the_gateway_and_the_active_model():
    files = settings()
    assert sorted(files) == ["claude-code/settings.json", "codex/config.toml", "continue.json", "openai.env",
                             "providers.json"]  # fmt: skip
    env = files["openai.env"]
    assert "export OPENAI_BASE_URL=https://gw.example.internal:8443/v1" in env
    assert 'export OPENAI_API_KEY="$(cat /home/a/.config/rigops-llm/alice/key)"' in env
    assert (
        "export OPENAI_MODEL=chat" in env
        and "export SSL_CERT_FILE=/home/a/.config/rigops-llm/alice/ca-bundle.pem" in env
    )
    codex = tomllib.loads(files["codex/config.toml"])
    assert codex["model"] == "chat" and codex["model_provider"] == "rigops"
    assert codex["model_providers"]["rigops"] == {
        "name": "rigops gateway (alice)", "base_url": "https://gw.example.internal:8443/v1", "wire_api": "responses",
        "env_key": gw.KEY_ENV,
    }  # fmt: skip
    claude = json.loads(files["claude-code/settings.json"])
    assert claude["env"]["ANTHROPIC_BASE_URL"] == "https://gw.example.internal:8443"
    assert claude["env"]["ANTHROPIC_DEFAULT_SONNET_MODEL"] == "chat" == claude["env"]["ANTHROPIC_MODEL"]
    assert claude["env"]["NODE_EXTRA_CA_CERTS"].endswith("/gateway-ca.pem")
    assert claude["apiKeyHelper"] == "cat /home/a/.config/rigops-llm/alice/key"
    assert "ANTHROPIC_AUTH_TOKEN" not in claude["env"]
    cont = json.loads(files["continue.json"])
    assert [m["model"] for m in cont["models"]] == ["chat", "tiny-a", "big-r"]
    assert all(m["provider"] == "openai" and "apiKey" not in m for m in cont["models"])
    registry = json.loads(files["providers.json"])
    assert registry["active"] == "chat" and list(registry["providers"]) == ["chat", "tiny-a", "big-r"]
    assert registry["providers"]["big-r"]["api_key_env"] == gw.KEY_ENV
    assert all(KEY not in text for text in files.values())


def test_switching_the_active_model_is_one_value():
    before, after = settings(active="chat"), settings(active="big-r")
    assert json.loads(after["providers.json"])["active"] == "big-r"
    assert tomllib.loads(after["codex/config.toml"])["model"] == "big-r"
    assert json.loads(after["claude-code/settings.json"])["env"]["ANTHROPIC_MODEL"] == "big-r"
    assert "export OPENAI_MODEL=big-r" in after["openai.env"]
    assert json.loads(after["continue.json"])["models"][0]["model"] == "big-r"
    assert all(before[name] != after[name] for name in before)
    assert json.loads(settings(active="")["providers.json"])["active"] == "tiny-a"


def test_inline_key_goes_into_every_file_and_nowhere_else_otherwise():
    files = settings(inline=True, key=KEY)
    assert all(KEY in text for text in files.values()), [n for n, t in files.items() if KEY not in t]
    assert tomllib.loads(files["codex/config.toml"])["model_providers"]["rigops"]["experimental_bearer_token"] == KEY
    assert json.loads(files["claude-code/settings.json"])["env"]["ANTHROPIC_AUTH_TOKEN"] == KEY
    assert "apiKeyHelper" not in json.loads(files["claude-code/settings.json"])
    # a key is never written when not asked for, even when given
    assert all(KEY not in text for text in settings(inline=False, key=KEY).values())


@pytest.mark.parametrize(
    ("client", "over", "words"),
    [
        ("bob", {}, "the gateway has no client 'bob'; its clients: alice, ci"),
        ("ci", {"active": "tiny-a"}, "'tiny-a' is not one of ci's models: chat"),
        ("alice", {"small": "huge"}, "llm_clients_small_model 'huge'"),
        ("alice", {"inline": True, "key": ""}, "no key for client 'alice'"),
    ],
)
def test_refusals(client, over, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        gw.client_settings(SUMMARY, client, {**OPTIONS, **over})


def test_odd_model_names_survive_toml_json_and_the_shell(tmp_path):
    odd = 'tiny "quoted" $(touch pwned) 😀 back\\slash'
    summary = {**SUMMARY, "clients": {"alice": [odd]}}
    files = gw.client_settings(summary, "alice", {**OPTIONS, "active": odd})
    assert tomllib.loads(files["codex/config.toml"])["model"] == odd
    assert json.loads(files["providers.json"])["active"] == odd
    (tmp_path / "openai.env").write_text(files["openai.env"])
    out = subprocess.run(["bash", "-c", '. ./openai.env 2>/dev/null; printf %s "$OPENAI_MODEL"'], cwd=tmp_path,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout == odd and not (tmp_path / "pwned").exists()


# --------------------------------------------------------------------------- an HTTPS stand-in gateway


class Gateway:
    def __init__(self, tmp):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-keyout", str(tmp / "gw-key.pem"), "-out", str(tmp / "gw.pem")],
            check=True, capture_output=True,
        )  # fmt: skip
        self.seen = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append((self.path, self.headers.get("Authorization"), body.get("model")))
                ok = self.headers.get("Authorization") == f"Bearer {KEY}"
                data = json.dumps({"model": body.get("model"), "choices": [{"message": {"content": "hi"}}]} if ok
                                  else {"error": {"message": "bad key"}}).encode()  # fmt: skip
                self.send_response(200 if ok else 401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tmp / "gw.pem"), str(tmp / "gw-key.pem"))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/v1"
        self.cert = (tmp / "gw.pem").read_text()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in(tmp_path):
    g = Gateway(tmp_path)
    yield g
    g.close()


# What an OpenAI SDK does with its environment, with the standard library only: the base URL and
# the key from OPENAI_BASE_URL and OPENAI_API_KEY, TLS verified against the default CAs (which
# honour SSL_CERT_FILE), one chat completion.
SDK_LIKE = """
import json, os, ssl, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
    data=json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": "hi"}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, context=ssl.create_default_context()))["choices"][0]["message"]["content"])
"""


def test_a_client_configured_only_by_the_env_file_completes_a_chat(stand_in, tmp_path):
    folder = tmp_path / "alice"
    folder.mkdir()
    (folder / "key").write_text(KEY + "\n")
    (folder / "gateway-ca.pem").write_text(stand_in.cert)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    (folder / "ca-bundle.pem").write_text((system.read_text() + "\n" if system.exists() else "") + stand_in.cert)
    files = gw.client_settings({**SUMMARY, "url": stand_in.url}, "alice", {
        **OPTIONS, "key_file": str(folder / "key"), "ca_file": str(folder / "gateway-ca.pem"),
        "bundle_file": str(folder / "ca-bundle.pem")})  # fmt: skip
    (folder / "openai.env").write_text(files["openai.env"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SSL_CERT", "REQUESTS_CA"))}
    run = subprocess.run(["bash", "-c", f". {folder}/openai.env && exec {sys.executable} -c '{SDK_LIKE}'"],
                         capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "hi"
    assert stand_in.seen == [("/v1/chat/completions", f"Bearer {KEY}", "chat")]
    # without the bundle the self-signed gateway is refused: the setting is what made it work
    (folder / "openai.env").write_text(files["openai.env"].replace("export SSL_CERT_FILE", "# "))
    run = subprocess.run(["bash", "-c", f". {folder}/openai.env && exec {sys.executable} -c '{SDK_LIKE}'"],
                         capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert run.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in run.stderr


# --------------------------------------------------------------------------- the role, through ansible-playbook


def run_role(tmp, extra_vars, *args):
    gateway_root = tmp / "gateway"
    inventory = {
        "all": {
            "children": {
                "gateways": {"hosts": {"gw": {
                    "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "llm_gateway_config_root": str(gateway_root),
                    "llm_gateway_clients": [{"name": "alice", "key": KEY, "models": "*"},
                                            {"name": "ci", "key": "ci-" + KEY, "models": ["chat"]}],
                }}},
                "workstations": {"hosts": {"ws": {"ansible_connection": "local",
                                                  "ansible_python_interpreter": sys.executable}}},
            }
        }
    }  # fmt: skip
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "name": "llm_clients",
            "hosts": "workstations",
            "gather_facts": False,
            "roles": [{"role": "rigops.fleet.llm_clients"}],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    proc = ansible_playbook("-i", tmp / "inventory.yml", tmp / "play.yml", "-e", json.dumps(extra_vars), *args)
    out = proc.stdout + proc.stderr
    m = re.search(r"^ws\s*:\s*ok=\d+\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", out, re.M)
    return proc.returncode, out, (int(m.group(1)), int(m.group(2))) if m else None


def test_the_role_writes_the_files_private_idempotent_and_switchable(tmp_path):
    cert = "-----BEGIN CERTIFICATE-----\nMIIBstand-in\n-----END CERTIFICATE-----\n"
    (tmp_path / "gateway").mkdir()
    (tmp_path / "gateway" / "summary.json").write_text(json.dumps({**SUMMARY, "cert_pem": cert}))
    out_dir = tmp_path / "out"
    vars_ = {"llm_clients_dir": str(out_dir), "llm_clients_active_model": "chat"}
    rc, out, counts = run_role(tmp_path, vars_)
    assert rc == 0, out[-3000:]
    assert out_dir.stat().st_mode & 0o777 == 0o700
    for name in ("key", "openai.env", "claude-code/settings.json", "codex/config.toml", "continue.json",
                 "providers.json"):  # fmt: skip
        assert (out_dir / name).stat().st_mode & 0o777 == 0o600, name
    assert (out_dir / "key").read_text().strip() == KEY
    assert (out_dir / "gateway-ca.pem").read_text() == cert
    # the system's CAs, then the certificate on a line of its own (OpenSSL skips a block it cannot read)
    system = Path("/etc/ssl/certs/ca-certificates.crt")
    expected = (system.read_text().strip() + "\n" if system.exists() else "") + cert
    assert (out_dir / "ca-bundle.pem").read_text() == expected
    for path in out_dir.rglob("*"):
        if path.is_file() and path.name != "key":
            assert KEY not in path.read_text(), path
    assert KEY not in out
    assert json.loads((out_dir / "providers.json").read_text())["active"] == "chat"
    assert f"cat {out_dir}/key" == json.loads((out_dir / "claude-code/settings.json").read_text())["apiKeyHelper"]
    # a rerun and check mode change nothing
    assert run_role(tmp_path, vars_)[2] == (0, 0)
    assert run_role(tmp_path, {**vars_, "llm_clients_active_model": "big-r"}, "--check")[2][1] == 0
    assert json.loads((out_dir / "providers.json").read_text())["active"] == "chat"
    # switching the model is one variable
    rc, out, counts = run_role(tmp_path, {**vars_, "llm_clients_active_model": "big-r"})
    # the one task that writes the settings files changed (every file names the model)
    assert rc == 0 and counts[0] == 1
    assert tomllib.loads((out_dir / "codex/config.toml").read_text())["model"] == "big-r"
    # a model the client may not use is refused before anything is written
    rc, out, _ = run_role(tmp_path, {**vars_, "llm_clients_client": "ci", "llm_clients_active_model": "big-r"})
    assert rc != 0 and "ci may use chat (asked: active big-r" in " ".join(out.split())
    assert tomllib.loads((out_dir / "codex/config.toml").read_text())["model"] == "big-r"


def test_the_role_refuses_without_a_deployed_gateway(tmp_path):
    rc, out, _ = run_role(tmp_path, {"llm_clients_dir": str(tmp_path / "out")})
    assert rc != 0
    assert "deploy the gateway first (site.yml --tags gateway)" in " ".join(out.split())
    assert not (tmp_path / "out").exists()


def test_argument_specs_mirror_the_defaults():
    for role in ("llm_gateway", "llm_clients"):
        defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
        options = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"][
            "main"
        ]["options"]
        assert sorted(defaults) == sorted(options), role
        for name, opt in options.items():
            assert opt.get("description"), name
            if isinstance(defaults[name], str) and "{{" in defaults[name] or name == "llm_clients_dir":
                continue
            assert opt.get("default") == defaults[name], name
