"""The instance schema (plugins/module_utils/vllm_instances.py): mistaken and hostile instance lists.

Each case is a host's vllm_instances (and the context the inventory gives: flavour, expected GPUs,
opt-ins) that must be refused, with the path of the problem and the words of its message. Every
case carries a real-looking key: no message may ever show it. The accepted cases, the example and
sandbox inventories, the key-free views of the instances and the playbook's preflight run on the
controller are checked too.
"""

import copy
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_config
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
KEY = "Vault-K3y-0f-the-chat-1nstance-abcdefghijklmnopq"  # a valid key (44 printable ASCII characters)
OTHER_KEY = "0ther-Vault-K3y-abcdefghijklmnopqrstuvwxyz012345"
BASE = {
    "name": "chat",
    "port": 8000,
    "gpus": [0, 1],
    "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B", "served_name": "qwen3.5-9b"},
    "engine": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.85},
    "security": {"require_key": True, "api_key": KEY},
}
CUDA = {"flavour": "cuda", "expected_gpus": 8}


def inst(**changes):
    """BASE with changes: `model__id="x"` sets model.id; the value DROP removes the key."""
    out = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = out
        for key in parents:
            target = target.setdefault(key, {})
        if value is DROP:
            target.pop(leaf, None)
        else:
            target[leaf] = value
    return out


DROP = object()
SECOND = dict(copy.deepcopy(BASE), name="coder", port=8001, gpus=[2, 3], security={"api_key": OTHER_KEY})


def two(first=None, second=None):
    return [first or copy.deepcopy(BASE), second or copy.deepcopy(SECOND)]


# (id, instances, context, path of the problem, words of its message)
CASES = [
    # typos: unknown keys at every level, with "did you mean"
    ("typo gpu", [inst(gpu=[0], gpus=DROP)], {"flavour": "cpu"}, "vllm_instances[0].gpu", "did you mean gpus?"),
    (
        "typo model.max_len",
        [inst(model__max_len=4096)],
        CUDA,
        "vllm_instances[0].model.max_len",
        "did you mean max_model_len?",
    ),
    (
        "typo security.apikey",
        [inst(security__apikey=KEY)],
        CUDA,
        "vllm_instances[0].security.apikey",
        "did you mean api_key?",
    ),
    (
        "typo engine.tensor_parallel",
        [inst(engine__tensor_parallel=2)],
        CUDA,
        "vllm_instances[0].engine.tensor_parallel",
        "did you mean tensor_parallel_size?",
    ),
    (
        "typo engine.gpu_mem_util",
        [inst(engine__gpu_memory_util=0.5)],
        CUDA,
        "vllm_instances[0].engine.gpu_memory_util",
        "did you mean gpu_memory_utilization?",
    ),
    (
        "a key inside a misspelt extra_args",
        [inst(engine__extra_arg=["--api-key=" + KEY])],
        CUDA,
        "vllm_instances[0].engine.extra_arg",
        "did you mean extra_args?",
    ),
    ("key at the wrong level", [inst(api_key=KEY)], CUDA, "vllm_instances[0].api_key", "is an unknown key"),
    (
        "typo in the site defaults",
        [inst()],
        dict(CUDA, instance_defaults={"engine": {"enforce_eagr": True}}),
        "vllm_service_instance_defaults.engine.enforce_eagr",
        "did you mean enforce_eager?",
    ),
    (
        "name as a site default",
        [inst()],
        dict(CUDA, instance_defaults={"name": "x"}),
        "vllm_service_instance_defaults.name",
        "cannot be a default",
    ),
    # wrong types: bool, int and str strictly
    ("port as a string", [inst(port="8000")], CUDA, "vllm_instances[0].port", "is a quoted string"),
    ("port as a bool", [inst(port=True)], CUDA, "vllm_instances[0].port", "is a boolean"),
    ("port as a float", [inst(port=8000.5)], CUDA, "vllm_instances[0].port", "is not a whole number"),
    ("port null", [inst(port=None)], CUDA, "vllm_instances[0].port", "is null"),
    ("name as a number", [inst(name=5)], CUDA, "vllm_instances[0].name", "is not a string; quote it"),
    ("gpus as a string", [inst(gpus="0,1")], CUDA, "vllm_instances[0].gpus", "is a string; write a YAML list"),
    (
        "tp as a string",
        [inst(engine__tensor_parallel_size="2")],
        CUDA,
        "vllm_instances[0].engine.tensor_parallel_size",
        "is a quoted string",
    ),
    (
        "max_model_len as a string",
        [inst(model__max_model_len="4096")],
        CUDA,
        "vllm_instances[0].model.max_model_len",
        "is a quoted string",
    ),
    (
        "max_model_len as a bool",
        [inst(model__max_model_len=True)],
        CUDA,
        "vllm_instances[0].model.max_model_len",
        "is a boolean",
    ),
    (
        "trust_remote_code as a string",
        [inst(model__trust_remote_code="false")],
        CUDA,
        "vllm_instances[0].model.trust_remote_code",
        "write true or false without quotes",
    ),
    (
        "enforce_eager as a number",
        [inst(engine__enforce_eager=1)],
        CUDA,
        "vllm_instances[0].engine.enforce_eager",
        "is a number; write true or false",
    ),
    (
        "extra_args as a string",
        [inst(engine__extra_args="--seed=1")],
        CUDA,
        "vllm_instances[0].engine.extra_args",
        "is a string; write a YAML list",
    ),
    ("model as a string", [inst(model="Qwen/Qwen3.5-9B")], CUDA, "vllm_instances[0].model", "is not a mapping"),
    ("security as a string", [inst(security=KEY)], CUDA, "vllm_instances[0].security", "is not a mapping"),
    (
        "key as a number",
        [inst(security__api_key=12345678901234567890123456789012345)],
        CUDA,
        "vllm_instances[0].security.api_key",
        "is not a string",
    ),
    ("list is a mapping", {"chat": BASE}, CUDA, "vllm_instances", "must be a list"),
    ("entry is a string", ["chat"], CUDA, "vllm_instances[0]", "is not a mapping"),
    # missing and out of range
    ("no name", [inst(name=DROP)], CUDA, "vllm_instances[0].name", "is missing"),
    ("no model.source", [inst(model__source=DROP)], CUDA, "vllm_instances[0].model.source", "is missing"),
    ("port 80", [inst(port=80)], CUDA, "vllm_instances[0].port", "privileged port"),
    ("port 70000", [inst(port=70000)], CUDA, "vllm_instances[0].port", "is outside 1024-65535"),
    ("port 0", [inst(port=0)], dict(CUDA, allow_privileged_ports=True), "vllm_instances[0].port", "is outside 1-65535"),
    (
        "utilization 1.5",
        [inst(engine__gpu_memory_utilization=1.5)],
        CUDA,
        "vllm_instances[0].engine.gpu_memory_utilization",
        "is above 1",
    ),
    (
        "utilization 0",
        [inst(engine__gpu_memory_utilization=0)],
        CUDA,
        "vllm_instances[0].engine.gpu_memory_utilization",
        "is not above 0",
    ),
    (
        "utilization nan",
        [inst(engine__gpu_memory_utilization=float("nan"))],
        CUDA,
        "vllm_instances[0].engine.gpu_memory_utilization",
        "is not a number",
    ),
    ("max_model_len 0", [inst(model__max_model_len=0)], CUDA, "vllm_instances[0].model.max_model_len", "is below 1"),
    (
        "max_num_seqs negative",
        [inst(engine__max_num_seqs=-1)],
        CUDA,
        "vllm_instances[0].engine.max_num_seqs",
        "is below 1",
    ),
    ("dtype fp8", [inst(model__dtype="fp8")], CUDA, "vllm_instances[0].model.dtype", "is not one of the choices"),
    (
        "source gitlab",
        [inst(model__source="gitlab")],
        CUDA,
        "vllm_instances[0].model.source",
        "is not one of the choices",
    ),
    # clashes across the instances
    (
        "same name twice",
        two(second=dict(SECOND, name="chat")),
        CUDA,
        "vllm_instances[1].name",
        "is used by 2 instances",
    ),
    (
        "same port twice",
        two(second=dict(SECOND, port=8000)),
        CUDA,
        "vllm_instances[1].port",
        "is claimed by 2 instances",
    ),
    (
        "ports 8000 and '8000'",
        two(second=dict(SECOND, port="8000")),
        CUDA,
        "vllm_instances[1].port",
        "is claimed by 2 instances",
    ),
    (
        "two instances fill GPU 0",
        two(second=dict(SECOND, gpus=[0], engine={"gpu_memory_utilization": 0.5})),
        CUDA,
        "vllm_instances[*].engine.gpu_memory_utilization",
        "more than vllm_service_gpu_memory_limit 0.95",
    ),
    # GPUs for the flavour and the rig
    (
        "no GPU on a cuda rig",
        [inst(gpus=[], engine__tensor_parallel_size=1)],
        CUDA,
        "vllm_instances[0].gpus",
        "is empty on a cuda rig",
    ),
    (
        "no GPU on a jetson",
        [inst(gpus=DROP, engine__tensor_parallel_size=1)],
        {"flavour": "jetson"},
        "vllm_instances[0].gpus",
        "is empty on a jetson rig",
    ),
    ("GPU 8 of 8", [inst(gpus=[7, 8])], CUDA, "vllm_instances[0].gpus", "the rig does not have"),
    ("GPU twice", [inst(gpus=[0, 0])], CUDA, "vllm_instances[0].gpus", "has duplicates"),
    ("negative GPU", [inst(gpus=[-1, 0])], CUDA, "vllm_instances[0].gpus", "negative indices"),
    (
        "tp above the GPU group",
        [inst(engine__tensor_parallel_size=4)],
        CUDA,
        "vllm_instances[0].engine.tensor_parallel_size",
        "is larger than the instance's GPU group (2 GPU(s))",
    ),
    # names: charset, length, injections
    ("upper case name", [inst(name="Chat")], CUDA, "vllm_instances[0].name", "holds characters other than"),
    (
        "newline in a name",
        [inst(name="chat\nExecStart=/bin/sh")],
        CUDA,
        "vllm_instances[0].name",
        "holds characters other than",
    ),
    ("../ in a name", [inst(name="../../etc/cron.d/x")], CUDA, "vllm_instances[0].name", "holds characters other"),
    ("shell in a name", [inst(name="a;rm -rf /")], CUDA, "vllm_instances[0].name", "holds characters other than"),
    ("name starts with -", [inst(name="-chat")], CUDA, "vllm_instances[0].name", "starts with -"),
    ("unit specifier in a name", [inst(name="chat%i")], CUDA, "vllm_instances[0].name", "holds characters other"),
    ("250 characters", [inst(name="a" * 250)], CUDA, "vllm_instances[0].name", "more than 26"),
    ("27 characters", [inst(name="a" * 27)], CUDA, "vllm_instances[0].name", "is 27 characters long"),
    # hosts
    ("empty host", [inst(host="")], CUDA, "vllm_instances[0].host", "is empty (vLLM would bind every interface)"),
    ("host name", [inst(host="rig.example.com")], CUDA, "vllm_instances[0].host", "is not a literal IP address"),
    ("shell in a host", [inst(host="127.0.0.1;curl x|sh")], CUDA, "vllm_instances[0].host", "not a literal IP"),
    ("wildcard without opt-in", [inst(host="0.0.0.0")], CUDA, "vllm_instances[0].host", "is not loopback"),
    (
        "remote bind without a key",
        [inst(host="::", security={"require_key": False})],
        dict(CUDA, allow_remote_bind=True),
        "vllm_instances[0].security.require_key",
        "a non-loopback bind needs a key",
    ),
    # keys: checked before any file is written, never shown
    (
        "short key",
        [inst(security__api_key="short-but-secret")],
        CUDA,
        "vllm_instances[0].security.api_key",
        "is shorter than 32 characters",
    ),
    (
        "key with a newline",
        [inst(security__api_key=KEY + "\nX-Injected: 1")],
        CUDA,
        "vllm_instances[0].security.api_key",
        "holds whitespace",
    ),
    (
        "key of spaces",
        [inst(security__api_key=" " * 40)],
        CUDA,
        "vllm_instances[0].security.api_key",
        "holds whitespace",
    ),
    (
        "non-ASCII key",
        [inst(security__api_key="ключ-" + KEY)],
        CUDA,
        "vllm_instances[0].security.api_key",
        "holds non-ASCII characters",
    ),
    (
        "non-Latin-1 key",
        [inst(security__api_key=KEY + "🔑")],
        CUDA,
        "vllm_instances[0].security.api_key",
        "holds non-ASCII characters",
    ),
    (
        "control character key",
        [inst(security__api_key=KEY + "\x07")],
        CUDA,
        "vllm_instances[0].security.api_key",
        "holds control characters",
    ),
    (
        "huge key",
        [inst(security__api_key="k" * 600)],
        CUDA,
        "vllm_instances[0].security.api_key",
        "is longer than 512 characters",
    ),
    # extra_args: what the config owns, in every spelling
    (
        "--api_key= in extra_args",
        [inst(engine__extra_args=["--api_key=" + KEY])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --api-key",
    ),
    (
        "--api-key value in extra_args",
        [inst(engine__extra_args=["--seed=1", "--api-key", KEY])],
        CUDA,
        "vllm_instances[0].engine.extra_args[1]",
        "sets --api-key",
    ),
    (
        "--trust_remote_code",
        [inst(engine__extra_args=["--trust_remote_code"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --trust-remote-code",
    ),
    (
        "--tensor_parallel_size=8",
        [inst(engine__extra_args=["--tensor_parallel_size=8"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --tensor-parallel-size",
    ),
    (
        "-tp 8",
        [inst(engine__extra_args=["-tp", "8"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --tensor-parallel-size",
    ),
    (
        "--gpu_memory_utilization=",
        [inst(engine__extra_args=["--gpu_memory_utilization=0.99"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --gpu-memory-utilization",
    ),
    (
        "--max_model_len",
        [inst(engine__extra_args=["--max_model_len", "999999"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --max-model-len",
    ),
    (
        "--host= in extra_args",
        [inst(engine__extra_args=["--host=0.0.0.0"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --host",
    ),
    (
        "--middleware",
        [inst(engine__extra_args=["--middleware=evil.steal_keys"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "is refused: ASGI middleware is code",
    ),
    (
        "--tool-parser-plugin",
        [inst(engine__extra_args=["--tool_parser_plugin=/tmp/x.py"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "is refused: a plugin file is code",
    ),
    (
        "--config file",
        [inst(engine__extra_args=["--config", "/tmp/flags.yaml"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "would bypass these checks",
    ),
    (
        "dotted --api-key",
        [inst(engine__extra_args=["--api_key.x=" + KEY])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "sets --api-key",
    ),
    (
        "--hf-token",
        [inst(engine__extra_args=["--hf-token=" + OTHER_KEY])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "looks like a secret on a command line",
    ),
    (
        "NUL in an argument",
        [inst(engine__extra_args=["--seed=1\x00"])],
        CUDA,
        "vllm_instances[0].engine.extra_args[0]",
        "holds a NUL character",
    ),
    # model: sources, paths, remote code
    ("hub id without org", [inst(model__id="no-slash")], CUDA, "vllm_instances[0].model.id", "not a hub repository"),
    ("hub model without id", [inst(model__id=DROP)], CUDA, "vllm_instances[0].model.id", "is missing"),
    (
        "controller without hub",
        [inst(model__source="controller")],
        CUDA,
        "vllm_instances[0].model.hub",
        "source controller needs the hub",
    ),
    (
        "hub on a hub model",
        [inst(model__hub="huggingface")],
        CUDA,
        "vllm_instances[0].model.hub",
        "is only for sources controller and fleet_cache",
    ),
    (
        "fleet_cache without hub",
        [inst(model__source="fleet_cache")],
        CUDA,
        "vllm_instances[0].model.hub",
        "source fleet_cache needs the hub",
    ),
    (
        "path on a hub model",
        [inst(model__path="/srv/x")],
        CUDA,
        "vllm_instances[0].model.path",
        "is only for source local",
    ),
    (
        "local without path",
        [inst(model={"source": "local"})],
        CUDA,
        "vllm_instances[0].model.path",
        "a local model needs its directory",
    ),
    (
        "local relative path",
        [inst(model={"source": "local", "path": "models/x"})],
        CUDA,
        "vllm_instances[0].model.path",
        "is not an absolute path",
    ),
    (
        "local path with ..",
        [inst(model={"source": "local", "path": "/srv/models/../../etc"})],
        CUDA,
        "vllm_instances[0].model.path",
        "holds ..",
    ),
    (
        "local model allowed by its declared id",
        [inst(model={"source": "local", "path": "/srv/evil", "id": "Org/Trusted", "trust_remote_code": True})],
        dict(CUDA, remote_code_allowed=["Org/Trusted"]),
        "vllm_instances[0].model.trust_remote_code",
        "a local model is allowed by its path",
    ),
    (
        "hub model with remote code",
        [inst(model__trust_remote_code=True)],
        CUDA,
        "vllm_instances[0].model.trust_remote_code",
        "is not in vllm_service_remote_code_allowed",
    ),
    (
        "served name not allowed",
        [inst()],
        dict(CUDA, allowed_models=["other"]),
        "vllm_instances[0].model.served_name",
        "is not in vllm_service_allowed_models",
    ),
    (
        "NUL in a served name",
        [inst(model__served_name="qwen\x00")],
        CUDA,
        "vllm_instances[0].model.served_name",
        "holds a NUL character",
    ),
    (
        "served name of 300 characters",
        [inst(model__served_name="q" * 300)],
        CUDA,
        "vllm_instances[0].model.served_name",
        "is longer than 256",
    ),
]


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("case", "instances", "context", "path", "words"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_path_and_words_never_the_key(case, instances, context, path, words):
    found = schema.problems(instances, context)
    at_path = [p for p in found if p["path"] == path]
    assert at_path, (case, [p["msg"] for p in found])
    assert any(words in p["msg"] for p in at_path), (case, [p["msg"] for p in at_path])
    for p in found:
        assert set(p) == {"path", "value", "allowed", "example", "msg"}
        assert p["msg"].startswith(p["path"] + ": ")
        assert "; allowed: " in p["msg"] and p["allowed"]
        # no line of a message can pose as another (a newline in a name is shown escaped)
        assert "\n" not in p["msg"] and "\x00" not in p["msg"]
    text = json.dumps(found, ensure_ascii=False)
    for secret in (KEY, OTHER_KEY, "short-but-secret", "ключ", "🔑", "k" * 600):
        assert secret not in text, case
    for p in found:
        if (".security" in p["path"] and not p["path"].endswith("require_key")) or "api_key" in p["path"]:
            assert p["value"] in (None, schema.REDACTED), p


def test_a_key_is_shown_redacted_with_what_is_wrong():
    (problem,) = [p for p in schema.problems([inst(security__api_key="x" * 31)], CUDA) if "api_key" in p["path"]]
    assert problem["value"] == "<redacted>"
    assert problem["msg"].startswith("vllm_instances[0].security.api_key: <redacted> is shorter than 32 characters")
    assert "printable ASCII without spaces, 32-512 characters" in problem["allowed"]


def test_did_you_mean_gives_the_key_and_an_example():
    (problem,) = schema.problems([inst(model__max_len=32768)], CUDA)
    assert problem["msg"] == (
        "vllm_instances[0].model.max_len: 32768 is an unknown key (did you mean max_model_len?); allowed: the keys "
        "of model: source, id, revision, hub, path, served_name, dtype, quantization, max_model_len, "
        "trust_remote_code; e.g. max_model_len: 4096"
    )
    assert problem["example"] == "max_model_len: 4096" and problem["value"] == 32768


ACCEPTED = [
    ("the base instance", [inst()], CUDA),
    ("two instances", two(), CUDA),
    ("26 characters", [inst(name="a" * 26)], CUDA),
    ("port 80 by opt-in", [inst(port=80)], dict(CUDA, allow_privileged_ports=True)),
    ("no GPU on the cpu flavour", [inst(gpus=[], engine__tensor_parallel_size=1)], {"flavour": "cpu"}),
    ("generated key", [inst(security={"require_key": True})], CUDA),
    ("no key, loopback", [inst(security={"require_key": False})], CUDA),
    ("remote bind by opt-in, with a key", [inst(host="0.0.0.0")], dict(CUDA, allow_remote_bind=True)),
    ("IPv6 loopback", [inst(host="::1")], CUDA),
    ("localhost", [inst(host="localhost")], CUDA),
    (
        "flags the config does not own",
        [inst(engine__extra_args=["--seed=1", "--tokenizer=/srv/tok", "--max-num-batched-tokens=8192"])],
        CUDA,
    ),
    (
        "local model allowed by its path",
        [inst(model={"source": "local", "path": "/srv/models/x/", "trust_remote_code": True})],
        dict(CUDA, remote_code_allowed=["/srv/models/x"]),
    ),
    (
        "hub model allowed by its id",
        [inst(model__trust_remote_code=True)],
        dict(CUDA, remote_code_allowed=["Qwen/Qwen3.5-9B"]),
    ),
    ("controller model", [inst(model={"source": "controller", "hub": "huggingface", "id": "Org/M"})], CUDA),
    (
        "site defaults fill the GPUs",
        [inst(gpus=DROP, engine__tensor_parallel_size=1)],
        dict(CUDA, instance_defaults={"gpus": [0]}),
    ),
    ("no instances", [], CUDA),
    ("null instances", None, CUDA),
    (
        "a TOML-breaking served name round-trips",
        [inst(model__served_name='q"] [server]\nport = 1 # \\ 😀 \x1b[31m')],
        CUDA,
    ),
]


@pytest.mark.parametrize(("case", "instances", "context"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted(case, instances, context):
    assert schema.problems(instances, context) == [], case


def test_a_toml_breaking_served_name_round_trips_into_config_toml():
    """Accepted by the schema, it is written by a TOML library and reads back exactly (never breaks the file)."""
    import tomli_w

    served = 'q"] [server]\nport = 1 # \\ 😀 \x1b[31m'
    (cfg,) = vllm_config.build_configs(
        schema.merge([inst(model__served_name=served)]),
        {"chat": {"path": "/srv/m", "commit": "c"}},
        {
            "python": "/opt/venv/bin/python",
            "config_root": "/etc/vllm",
            "cache_root": "/var/cache/vllm",
            "allow_remote_bind": False,
            "allowed_models": [],
            "remote_code_allowed": [],
            "metrics_enabled": True,
        },
    )
    back = tomllib.loads(tomli_w.dumps(cfg))
    assert back == cfg and back["model"]["served_name"] == served and back["server"]["port"] == 8000
    assert vllm_config.validate(back, "x", check_files=False)[1] == []


def test_unknown_context_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown context keys flavor"):
        schema.problems([], {"flavor": "cpu"})


def inventory_hosts(inventory):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(ROOT / "inventories" / inventory), "--list"],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(proc.stdout)["_meta"]["hostvars"]


@pytest.mark.parametrize("inventory", ["example", "sandbox"])
def test_the_shipped_inventories_pass(inventory):
    judged = 0
    for host, hv in inventory_hosts(inventory).items():
        context = {
            "flavour": hv.get("vllm_runtime_flavour"),
            "expected_gpus": hv.get("gpu_topology_expected_gpus"),
            "instance_defaults": hv.get("vllm_service_instance_defaults"),
            "allow_remote_bind": hv.get("vllm_service_allow_remote_bind", False),
        }
        assert schema.problems(hv.get("vllm_instances", []), context) == [], host
        judged += len(hv.get("vllm_instances", []))
    assert judged >= 2


def test_every_schema_key_is_documented_in_docs_instances():
    doc = (ROOT / "docs" / "instances.md").read_text()
    for key, spec in schema.SCHEMA.items():
        assert f"{key}:" in doc, key
        for sub in spec.get("keys", {}):
            assert f"{sub}:" in doc, f"{key}.{sub}"
        assert spec["description"] and (spec["required"] or spec["type"] == "dict" or "default" in spec)
    assert f"at most {schema.NAME_MAX} characters" in doc


def test_defaults_are_the_launchers_and_names_fit_a_systemd_user():
    assert vllm_config.schema is schema  # one schema: vllm_config imports it, never a copy
    assert not hasattr(vllm_config, "merge_instances")  # one merge: the contract's
    assert len(schema.USER_PREFIX + "a" * schema.NAME_MAX) == 31
    cfg = vllm_config.load(Path(__file__).parent / "fixtures" / "vllm_service" / "alpha.config.toml")
    cfg["server"]["instance"] = "a" * 27
    assert any("27 characters long" in p for p in vllm_config.validate(cfg, "x", check_files=False)[1])


def test_public_view_and_model_refs_carry_no_key():
    instances = [inst(), dict(SECOND, secret_token=OTHER_KEY), "junk"]
    public = schema.public(instances)
    assert KEY not in json.dumps(public) and OTHER_KEY not in json.dumps(public)
    assert public[0]["security"] == {"require_key": True} and public[0]["model"] == BASE["model"]
    assert public[2] == "junk" and instances[0]["security"]["api_key"] == KEY  # input untouched
    refs = schema.model_refs(instances)
    assert refs[0] == {"name": "chat", "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B"}}
    assert KEY not in json.dumps(refs) and OTHER_KEY not in json.dumps(refs)
    assert schema.model_sources(instances + [inst(model={"source": "local", "path": "/m"})]) == ["local", "modelscope"]


def test_given_keys_follow_the_merge_and_require_key():
    instances = [inst(), dict(SECOND, security={"require_key": False, "api_key": OTHER_KEY}), inst(name="gen")]
    instances[2]["security"] = {}
    assert schema.given_keys(schema.merge(instances)) == {"chat": KEY}
    site = {"security": {"api_key": OTHER_KEY}}
    assert schema.given_keys(schema.merge([inst(security={})], site)) == {"chat": OTHER_KEY}


def test_merge_order_contract_then_site_then_instance():
    site = {"engine": {"enforce_eager": True, "extra_args": ["--seed=1"]}, "model": {"max_model_len": 1024}}
    one = {"name": "a", "port": 1, "engine": {"extra_args": ["--seed=2"], "max_num_seqs": 8}, "gpus": [3]}
    before = copy.deepcopy((site, one))
    (merged,) = schema.merge([one], site)
    assert merged["engine"]["enforce_eager"] is True  # site over contract
    assert merged["engine"]["extra_args"] == ["--seed=2"]  # lists are replaced, not appended
    assert merged["engine"]["max_num_seqs"] == 8 and merged["engine"]["gpu_memory_utilization"] == 0.9
    assert merged["model"]["max_model_len"] == 1024 and merged["model"]["dtype"] == "auto"
    assert merged["gpus"] == [3] and merged["host"] == "127.0.0.1" and merged["security"]["require_key"] is True
    assert (site, one) == before  # inputs untouched
    merged["engine"]["extra_args"].append("x")
    merged["gpus"].append(4)
    assert one["gpus"] == [3] and schema.defaults()["engine"]["extra_args"] == []  # nothing shared
    assert schema.merge([merged], site) == [merged]  # merging again changes nothing
    assert schema.merge(None) == [] and schema.merge([]) == []


@pytest.mark.parametrize(
    ("instances", "site", "expected"),
    [
        ({"name": "a"}, None, "vllm_instances: '<a mapping>' must be a list of instances"),
        (["a"], None, "vllm_instances[0]: 'a' is not a mapping"),
        ([{"name": "a", "port": 1, "model": None}], None, "vllm_instances[0].model: None is not a mapping"),
        ([], [], "vllm_service_instance_defaults: [] is not a mapping"),
    ],
)
def test_what_cannot_be_merged_is_refused_in_the_contracts_words(instances, site, expected):
    with pytest.raises(ValueError) as info:
        schema.merge(instances, site)
    assert expected in str(info.value) and "vllm_instances refused" in str(info.value)


def test_managed_flag_spellings():
    for token in ("--api-key", "--api_key=x", "--api-key.x", "--API_KEY"):
        assert schema.managed_flag(token) in ("--api-key", None)
    assert schema.managed_flag("--api_key=x") == "--api-key"
    assert schema.managed_flag("-tp8") == "--tensor-parallel-size"
    assert schema.managed_flag("-q=fp8") == "--quantization"
    for token in ("--seed=1", "--tokenizer=/x", "8", "-O3", "--enable-chunked-prefill"):
        assert schema.managed_flag(token) is None, token
    assert set(schema.MANAGED_DESTS) >= {"api_key", "host", "port", "model", "model_tag", "trust_remote_code"}


def test_the_playbook_preflight_refuses_and_never_prints_the_key(tmp_path):
    """playbooks/preflight.yml on the controller (every stage runs it): the refusal lists path, value, allowed
    and an example, at -v too, and the key given in the inventory appears nowhere in the run's output."""
    hostile = [
        inst(model__max_len=4096, security__api_key="ключ-" + KEY),
        dict(SECOND, port="8000", name="chat\nx", engine={"extra_args": ["--api_key=" + OTHER_KEY]}),
    ]
    (tmp_path / "vars.json").write_text(json.dumps({"vllm_instances": hostile}))
    proc = ansible_playbook(
        "-v", "-i", ROOT / "inventories" / "example", "-l", "rig-5090-01", "playbooks/preflight.yml",
        "-e", f"@{tmp_path / 'vars.json'}",
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "rig-5090-01: vllm_instances refused" in out, out[-3000:]
    for words in (
        "vllm_instances[0].model.max_len: 4096 is an unknown key (did you mean max_model_len?)",
        "vllm_instances[0].security.api_key: <redacted> holds non-ASCII characters",
        "vllm_instances[1].port: '8000' is a quoted string",
        "vllm_instances[1].port: 8000 is claimed by 2 instances",
        "vllm_instances[1].engine.extra_args[0]: '--api_key=<redacted>' sets --api-key: a key never goes on a",
    ):
        assert words in out.replace("\n    ", " "), words
    for secret in (KEY, OTHER_KEY, "ключ"):
        assert secret not in out
    assert proc.returncode == 0  # the rescue marks the rig failed; the play goes on for the report


def test_schema_data_is_plain_and_yaml_serialisable():
    yaml.safe_dump(schema.SCHEMA)
    assert all(spec["example"] is not None for spec in schema.SCHEMA.values())
