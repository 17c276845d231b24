"""The site rig's gateway as its clients see it, for the tests that change its routing: the hosted provider's
stand-in behind the alias chat-any (a fixture) and one chat through the gateway."""

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import start_hosted_standin

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
HOST_VARS = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["site-rig"]
DEV_KEY = HOST_VARS["llm_gateway_clients"][0]["key"]
SERVED = "qwen3.5-9b"
CA = "/etc/rigops-llm-gateway/tls/ca.pem"
# the client's key in a root-only header file: no command line carries it
AUTH = "/root/drain-auth"


@pytest.fixture(scope="module")
def standin(host):
    start_hosted_standin(host, HOST_VARS["llm_gateway_remotes"][0]["key"], "/var/log/rigops-remote-standin.jsonl")
    header = f"Authorization: Bearer {DEV_KEY}"
    host.check_output(f"install -m 600 /dev/null {AUTH} && cat > {AUTH} <<'EOF'\n{header}\nEOF")
    yield
    host.run("systemctl stop rigops-remote-standin")


def chat(host, model):
    """(status, the model that answered) of one chat through the gateway, as a client sends it."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    out = host.check_output(
        f"curl -sS --cacert {CA} -o /tmp/drain-body -w '%{{http_code}}' -H @{AUTH} "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)} https://127.0.0.1:8443/v1/chat/completions"
    )
    answer = json.loads(host.file("/tmp/drain-body").content_string or "{}")
    return int(out), answer.get("model") or answer.get("error", {}).get("type")
