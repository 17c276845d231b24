"""config.toml of a vLLM instance (module_utils/vllm_config.py): schema, policy, placement, argv and env,
and the configs the role builds from the instances (merge_instances, build_configs).

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
from ansible.module_utils import vllm_config
from ansible.module_utils.vllm_config import (
    INSTANCE_DEFAULTS,
    build_argv,
    build_configs,
    build_env,
    check_model_dir,
    command,
    dry_run,
    load,
    merge_instances,
    normalize,
    placement,
    validate,
)

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
    assert env["VLLM_CACHE_ROOT"] == "/var/cache/vllm/alpha"
    assert env["VLLM_RPC_BASE_PATH"] == "/run/vllm-alpha"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert "VLLM_API_KEY" not in env  # only the launcher's key counts, never one inherited


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
        ("engine", {"extra_args": ["--port", "9"]}, "[engine] extra_args: --port is set from the file's own keys"),
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
    assert "shorter than 16" in vllm_config.check_key(cfg["server"], cfg["security"])[0]
    (tmp_path / "api_key").write_text("A" * 43 + "\n")
    assert vllm_config.check_key(cfg["server"], cfg["security"]) == []
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api_key").write_text("B" * 43)
    assert vllm_config.read_key(cfg["server"], str(creds)) == "B" * 43


def test_launcher_cli_preflight_and_check(raw, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "module_utils")}
    clash = [raw, with_(raw, "server", instance="beta")]
    (tmp_path / "all.json").write_text(json.dumps(clash))
    proc = subprocess.run(
        [sys.executable, str(LAUNCHER), "--preflight", str(tmp_path / "all.json")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 1 and "port 8001 is claimed by alpha, beta" in proc.stderr
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


def sandbox_settings(**over):
    """The role's variables as vars/main.yml hands them over, with the sandbox's instance defaults."""
    sandbox = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/all/vllm_service.yml").read_text())
    settings = {
        "instance_defaults": sandbox["vllm_service_instance_defaults"],
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


def test_build_configs_gives_what_the_role_rendered_on_the_sandbox_rig():
    alpha, beta = build_configs(MOLECULE_INSTANCES, STAGED, sandbox_settings())
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
        {"name": "vault", "port": 9001, "model": {"id": "org/m"}, "security": {"api_key": "s3cret-from-the-vault"}},
    ]
    loc, vault = build_configs(instances, {"vault": {"path": "/srv/m", "commit": "c0ffee"}}, sandbox_settings())
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
    (cfg,) = build_configs(
        [{"name": "a", "port": 1, "model": {"source": "huggingface", "id": "o/m"}}], {}, sandbox_settings()
    )
    assert cfg["model"]["path"] == "" and cfg["model"]["commit"] == ""
    assert any("[model] path: '' is not absolute; stage the weights first" in p for p in problems(cfg))


def test_role_variables_reach_every_config():
    settings = sandbox_settings(
        allow_remote_bind=True, allowed_models=["tiny-a"], remote_code_allowed=["org/ok"], metrics_enabled=False
    )
    for cfg in build_configs(MOLECULE_INSTANCES, STAGED, settings):
        assert cfg["server"]["allow_remote_bind"] is True
        assert cfg["security"]["allowed_models"] == ["tiny-a"]
        assert cfg["security"]["remote_code_allowed"] == ["org/ok"]
        assert cfg["metrics"]["enabled"] is False
    assert "--disable-log-stats" in build_argv(normalize(cfg)[0])
    # each config has its own lists: changing one changes no other, nor the settings
    cfg["security"]["allowed_models"].append("x")
    assert settings["allowed_models"] == ["tiny-a"]


def test_merge_order_contract_then_site_then_instance():
    defaults = {"engine": {"enforce_eager": True, "extra_args": ["--seed=1"]}, "model": {"max_model_len": 1024}}
    inst = {"name": "a", "port": 1, "engine": {"extra_args": ["--seed=2"], "max_num_seqs": 8}, "gpus": [3]}
    before = copy.deepcopy((defaults, inst))
    (merged,) = merge_instances([inst], defaults)
    assert merged["engine"]["enforce_eager"] is True  # site over contract
    assert merged["engine"]["extra_args"] == ["--seed=2"]  # lists are replaced, not appended
    assert merged["engine"]["max_num_seqs"] == 8 and merged["engine"]["gpu_memory_utilization"] == 0.9
    assert merged["model"]["max_model_len"] == 1024 and merged["model"]["dtype"] == "auto"
    assert merged["gpus"] == [3] and merged["host"] == "127.0.0.1" and merged["security"]["require_key"] is True
    assert (defaults, inst) == before  # inputs untouched
    merged["engine"]["extra_args"].append("x")
    assert INSTANCE_DEFAULTS["engine"]["extra_args"] == []  # nor the contract's defaults
    assert merge_instances([merged], defaults) == [merged]  # merging again changes nothing


@pytest.mark.parametrize(
    ("instances", "staged", "over", "expected"),
    [
        ({"name": "a"}, {}, {}, "vllm_instances: {'name': 'a'} is not a list"),
        (["a"], {}, {}, "vllm_instances[0]: 'a' is not a mapping"),
        ([{"name": "a", "port": 1, "model": None}], {}, {}, "vllm_instances[0] (a): model: None is not a mapping"),
        ([{"port": 1}], {}, {}, "an instance has no name"),
        ([{"name": "a", "port": 1}], {"a": "x"}, {}, "model_weights_staged: a: 'x' is not a record"),
        ([], [], {}, "model_weights_staged: [] is not a mapping"),
        ([], {}, {"allow_remote_bind": "false"}, "allow_remote_bind: 'false' is not a bool"),
        ([], {}, {"instance_defaults": []}, "vllm_service_instance_defaults: [] is not a mapping"),
    ],
)
def test_build_configs_refuses_malformed_input(instances, staged, over, expected):
    with pytest.raises(ValueError) as info:
        build_configs(instances, staged, sandbox_settings(**over))
    assert expected in str(info.value)


def test_build_configs_names_missing_settings():
    settings = sandbox_settings()
    del settings["python"], settings["cache_root"]
    with pytest.raises(ValueError, match="settings lack python, cache_root"):
        build_configs([], {}, settings)


def test_missing_port_is_left_for_the_launcher_to_name():
    (cfg,) = build_configs([{"name": "a", "model": {"source": "local", "path": "/m"}}], {}, sandbox_settings())
    assert "port" not in cfg["server"]
    assert any("[server] port: missing; it is required" in p for p in problems(cfg))
