# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The instance contract: `vllm_instances` (docs/instances.md), its schema, its one merge and its judge.

The one owner of what an instance is. Every consumer (the main job's preflight, the services
role and its launcher, the gateway's routing table, the Jetson memory budget, model staging)
takes instances merged and judged here and never merges or judges them itself:

- `SCHEMA`: every key of an instance at every level, with its type, default, range or
  choices, an example and a description;
- `merge(instances, site_defaults)`: each instance over vllm_service_instance_defaults over the
  contract's defaults, deeply, on copies (nothing is shared with the inventory);
- `problems(instances, context)`: every mistake of a host's list, each as a plain dict
  `{path, value, allowed, example, msg}` (`value` is `"<redacted>"` for anything that may be a
  secret: a key's value never reaches a message);
- the single rules (`name_problem`, `port_problem`, `host_problem`, `key_problem`,
  `managed_flag`, `tp_problem`, `memory_overcommit`, ...) that `vllm_config.py` (the launcher's
  config.toml rules on the host) imports rather than keeping a second copy.

Used by plugins/filter/vllm_instances.py (playbooks/preflight.yml and the vllm_service role's
preflight) and by plugins/module_utils/vllm_config.py. Standard library only, Python 3.8+: the file is
installed beside the launcher on the hosts, and modules get it through AnsiballZ
(`from ansible_collections.rigops.fleet.plugins.module_utils.vllm_instances import ...`).

Choices made here (docs/instances.md says the same):

- a port given as a string ("8000") is refused with the fix, never normalised: every role
  reads the inventory itself, and a value that one reader converts and another does not is how
  two instances end up on "different" ports 8000 and "8000";
- an instance name is at most NAME_MAX (26) characters: each instance runs under its own
  system user `vllm-<name>`, and user names longer than 31 characters are refused
  (utmp, systemd); the unit `vllm@<name>.service` (255) and the folder `/etc/vllm/<name>` (255) fit
  easily within that.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re

NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9-]*\Z")
# user names are at most 31 characters; each instance runs as its own user `vllm-<name>`.
USER_PREFIX = "vllm-"
NAME_MAX = 31 - len(USER_PREFIX)
PORT_MIN, PORT_MAX, PORT_UNPRIVILEGED = 1, 65535, 1024
KEY_MIN, KEY_MAX = 32, 512
SERVED_NAME_MAX = 256
SOURCES = ("modelscope", "huggingface", "local", "controller", "fleet_cache")
HUBS = ("modelscope", "huggingface")
# sources whose model names its hub in model.hub (the fan-out host or the fleet cache downloads from it)
HUB_SOURCES = ("controller", "fleet_cache")
DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
# Flavours (vllm_runtime_flavour) whose instances run on GPUs: they must name them.
GPU_FLAVOURS = ("cuda", "jetson")
HUB_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
REDACTED = "<redacted>"
# Key names whose values are never shown, wherever they appear (a typo of api_key included).
SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential")

# vLLM options the config owns (or that would bypass its checks), by long name: refused in
# engine.extra_args in every spelling (--a-b, --a_b, --a-b=v, --a-b.x=v). The value says who owns it.
MANAGED_OPTIONS = {
    "--model": "model.path (the staged weights)",
    "--served-model-name": "model.served_name",
    "--host": "host",
    "--port": "port",
    "--uds": "host and port (a socket instead of the port)",
    "--api-key": "the instance's key file (a key never goes on a command line)",
    "--dtype": "model.dtype",
    "--quantization": "model.quantization",
    "--max-model-len": "model.max_model_len",
    "--trust-remote-code": "model.trust_remote_code and vllm_service_remote_code_allowed",
    "--no-trust-remote-code": "model.trust_remote_code",
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "--gpu-memory-utilization": "engine.gpu_memory_utilization",
    "--max-num-seqs": "engine.max_num_seqs",
    "--enable-prefix-caching": "engine.enable_prefix_caching",
    "--no-enable-prefix-caching": "engine.enable_prefix_caching",
    "--enforce-eager": "engine.enforce_eager",
    "--no-enforce-eager": "engine.enforce_eager",
    "--swap-space": "engine.swap_space",
    "--kv-cache-memory-bytes": "engine.kv_cache_memory_bytes",
    "--disable-log-stats": "vllm_service_metrics_enabled",
    "--enable-log-stats": "vllm_service_metrics_enabled",
    "--middleware": "nothing: ASGI middleware is code the config does not review",
    "--tool-parser-plugin": "nothing: a plugin file is code the config does not review",
    "--reasoning-parser-plugin": "nothing: a plugin file is code the config does not review",
    "--logits-processors": "nothing: logits processors are code the config does not review",
    "--worker-cls": "nothing: a worker class is code the config does not review",
    "--worker-extension-cls": "nothing: a worker extension is code the config does not review",
    "--allowed-local-media-path": "nothing: it lets requests read files of the host",
    "--config": "nothing: a YAML file of flags would bypass these checks",
    "--headless": "nothing: the instance must serve its HTTP API (the gate needs it)",
    "--grpc": "nothing: the instance must serve its HTTP API (the gate needs it)",
    "--help": "nothing: it prints the help and exits",
    "--version": "nothing: it prints the version and exits",
}
# Short spellings vLLM's parser knows for managed options.
MANAGED_SHORT = {"-tp": "--tensor-parallel-size", "-q": "--quantization", "-h": "--help"}
# The same options as argparse destinations (what vLLM's own parser sets), for the host's check.
MANAGED_DESTS = {"model_tag": "model.path (a positional argument is the model)"}
for _option, _owner in MANAGED_OPTIONS.items():
    MANAGED_DESTS.setdefault(_option[len("--no-") if _option.startswith("--no-") else 2 :].replace("-", "_"), _owner)
del _option, _owner
# Words that make the last word of a vLLM option name a secret (--api-key, --hf-token).
SECRET_OPTION_WORDS = ("key", "token", "secret", "password", "passwd")


def _spec(kind, description, default=None, required=False, example=None, **rule):
    out = {"type": kind, "description": description, "default": default, "required": required, "example": example}
    out.update(rule)
    return out


# Every key of an instance. type: str, int, number (int or float), bool, list[int], list[str], dict.
# Rules: min/max (numbers), exclusive_min, choices, and `allowed` (what the messages say is allowed).
SCHEMA = {
    "name": _spec(
        "str",
        "instance name: unit vllm@<name>.service, user vllm-<name>, folder /etc/vllm/<name>; unique on the host",
        required=True,
        example="chat",
        allowed=f"[a-z0-9][a-z0-9-]*, at most {NAME_MAX} characters",
    ),
    "port": _spec(
        "int",
        "TCP port of the OpenAI-compatible API; unique on the host",
        required=True,
        example=8000,
        min=PORT_UNPRIVILEGED,
        max=PORT_MAX,
        rule="port_problem",
        allowed=f"an unquoted integer {PORT_UNPRIVILEGED}-{PORT_MAX} "
        "(1-1023 with vllm_service_allow_privileged_ports: true)",
    ),
    "host": _spec(
        "str",
        "bind address: a literal IP address or localhost; anything but loopback needs "
        "vllm_service_allow_remote_bind: true and a key",
        default="127.0.0.1",
        example="127.0.0.1",
        allowed="a literal IP address (127.0.0.1, ::1, 0.0.0.0 ...) or localhost",
    ),
    "gpus": _spec(
        "list[int]",
        "GPU indices the instance owns (CUDA_VISIBLE_DEVICES); required on the cuda and jetson flavours",
        default=[],
        example=[0, 1],
        allowed="a list of distinct GPU indices >= 0 (below gpu_topology_expected_gpus when set)",
    ),
    "model": _spec(
        "dict",
        "the model and how it is served",
        required=True,
        example={"source": "modelscope", "id": "Qwen/Qwen3.5-9B"},
        keys={
            "source": _spec(
                "str",
                "where the weights come from",
                required=True,
                example="modelscope",
                choices=SOURCES,
            ),
            "id": _spec(
                "str",
                "the hub's repository id (sources modelscope, huggingface, controller, fleet_cache); a label for local",
                default="",
                example="Qwen/Qwen3.5-9B",
                allowed="Org/Name",
            ),
            "revision": _spec(
                "str",
                "branch, tag or commit; a branch or tag is resolved to its commit on the host",
                default="",
                example="master",
                allowed="a quoted string",
            ),
            "hub": _spec(
                "str",
                "sources controller and fleet_cache only: the hub the model is downloaded from",
                default="",
                example="modelscope",
                choices=("",) + HUBS,
            ),
            "path": _spec(
                "str",
                "source local only: the model directory on the host",
                default="",
                example="/srv/models/tiny",
                allowed="an absolute directory without .. (source local only)",
            ),
            "served_name": _spec(
                "str",
                "the name clients ask for (default: the instance name)",
                default="",
                example="qwen3.5-9b",
                allowed=f"up to {SERVED_NAME_MAX} characters, no NUL",
            ),
            "dtype": _spec("str", "vLLM's --dtype", default="auto", example="bfloat16", choices=DTYPES),
            "quantization": _spec(
                "str", "vLLM's --quantization; empty for none", default="", example="fp8", allowed="a string"
            ),
            "max_model_len": _spec(
                "int",
                "context length in tokens (--max-model-len); at most what the staged model's config.json allows",
                default=4096,
                example=4096,
                min=1,
                allowed="an integer >= 1",
            ),
            "trust_remote_code": _spec(
                "bool",
                "run the model's own code; only for ids (or, for local models, paths) in "
                "vllm_service_remote_code_allowed",
                default=False,
                example=False,
            ),
        },
    ),
    "engine": _spec(
        "dict",
        "vLLM engine settings",
        default={},
        example={"tensor_parallel_size": 1},
        keys={
            "tensor_parallel_size": _spec(
                "int",
                "--tensor-parallel-size; at most len(gpus)",
                default=1,
                example=1,
                min=1,
                allowed="an integer >= 1, at most the number of the instance's GPUs",
            ),
            "gpu_memory_utilization": _spec(
                "number",
                "--gpu-memory-utilization; the instances on a GPU sum to at most vllm_service_gpu_memory_limit",
                default=0.9,
                example=0.85,
                exclusive_min=0,
                max=1,
                allowed="a fraction in (0, 1]",
            ),
            "max_num_seqs": _spec("int", "--max-num-seqs", default=256, example=64, min=1, allowed="an integer >= 1"),
            "enable_prefix_caching": _spec(
                "bool", "--enable-prefix-caching / --no-enable-prefix-caching", default=True, example=True
            ),
            "enforce_eager": _spec("bool", "--enforce-eager", default=False, example=False),
            "swap_space": _spec(
                "number",
                "--swap-space in GiB when > 0 (vLLM's V1 engine has no such flag: keep 0 there)",
                default=0,
                example=0,
                min=0,
                allowed="a number of GiB >= 0",
            ),
            "kv_cache_memory_bytes": _spec(
                "int",
                "--kv-cache-memory-bytes when > 0 (0: derived from gpu_memory_utilization)",
                default=0,
                example=0,
                min=0,
                allowed="an integer >= 0",
            ),
            "extra_args": _spec(
                "list[str]",
                "further vLLM arguments, checked by vLLM's own parser on the host; never what the config owns",
                default=[],
                example=["--seed=1"],
                allowed="a list of strings, none of them setting what the config owns",
            ),
        },
    ),
    "security": _spec(
        "dict",
        "the instance's API key",
        default={},
        example={"require_key": True},
        keys={
            "require_key": _spec("bool", "clients must send the instance's key", default=True, example=True),
            "api_key": _spec(
                "str",
                "the key, from a vault; empty: generated on the host at first deploy",
                default="",
                example="{{ vault_chat_key }}",
                allowed=f"printable ASCII without spaces, {KEY_MIN}-{KEY_MAX} characters (or empty)",
            ),
        },
    ),
}

# What the checks take from the role's and the inventory's variables (None: the default here).
CONTEXT_DEFAULTS = {
    "flavour": "cuda",  # vllm_runtime_flavour
    "expected_gpus": None,  # gpu_topology_expected_gpus
    "allow_privileged_ports": False,  # vllm_service_allow_privileged_ports
    "allow_remote_bind": False,  # vllm_service_allow_remote_bind
    "instance_defaults": {},  # vllm_service_instance_defaults
    "remote_code_allowed": [],  # vllm_service_remote_code_allowed
    "allowed_models": [],  # vllm_service_allowed_models
    "gpu_memory_limit": 0.95,  # vllm_service_gpu_memory_limit
}


def _fill_allowed(keys):
    for spec in keys.values():
        if "choices" in spec and "allowed" not in spec:
            spec["allowed"] = "one of " + ", ".join(repr(c) if c == "" else c for c in spec["choices"])
        if spec["type"] == "dict":
            _fill_allowed(spec["keys"])


_fill_allowed(SCHEMA)
# Example value of every key (top level and sections), for "did you mean" messages.
EXAMPLES = {}
for _key, _spec_ in SCHEMA.items():
    EXAMPLES[_key] = _spec_["example"]
    for _sub, _sub_spec in _spec_.get("keys", {}).items():
        EXAMPLES.setdefault(_sub, _sub_spec["example"])
del _key, _spec_, _sub, _sub_spec


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _merge(base, over):
    """`over` merged into a copy of `base`: mappings recursively, anything else replaced."""
    out = {k: _copy(v) for k, v in base.items()}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = _copy(value)
    return out


def merge(instances, site_defaults=None):
    """Each instance of a host's list over `site_defaults` (vllm_service_instance_defaults) over `defaults()`.

    Deeply (mappings key by key; lists and scalars replaced) and on copies: the result shares nothing
    with the inventory. ValueError, with the refusal problems() gives, when the list cannot be merged
    (not a list, an entry or a section that is not a mapping); a list that merges may still have
    problems(): judge it before use.
    """
    shape = _shape_problems(instances, site_defaults)
    if shape:
        raise ValueError(render(shape))
    base = _merge(defaults(), site_defaults or {})
    return [_merge(base, inst) for inst in instances or []]


def _shape_problems(instances, site_defaults):
    """The problems that make a list impossible to merge, in problems()' words."""
    report = _Report()
    if site_defaults is not None and not isinstance(site_defaults, dict):
        _site_defaults(report, site_defaults)
    if instances is not None and not isinstance(instances, list):
        _not_a_list(report, instances, "vllm_instances")
        return report.items
    for index, inst in enumerate(instances or []):
        path = f"vllm_instances[{index}]"
        if not isinstance(inst, dict):
            _not_a_mapping(report, path, inst)
            continue
        for section in ("model", "engine", "security"):
            if section in inst and not isinstance(inst[section], dict):
                spec = SCHEMA[section]
                report.add(f"{path}.{section}", inst[section], _type_fix("dict", inst[section]), _TYPE_WORDS["dict"],
                           spec["example"], secret=_is_secret(section, "an instance", inst[section]))  # fmt: skip
    return report.items


def _not_a_list(report, instances, name):
    report.add(
        name,
        "<a mapping>" if isinstance(instances, dict) else instances,
        "must be a list of instances",
        "a YAML list, one entry per instance (docs/instances.md)",
        [{"name": "chat", "port": 8000, "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B"}}],
    )


def _not_a_mapping(report, path, inst):
    report.add(
        path,
        inst,
        "is not a mapping",
        "a mapping with name, port and model",
        {"name": "chat", "port": 8000, "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B"}},
    )


def defaults():
    """The contract's defaults of an instance (every key that is not required), from SCHEMA."""
    out = {}
    for key, spec in SCHEMA.items():
        if spec["type"] == "dict":
            out[key] = {k: _copy(s["default"]) for k, s in spec["keys"].items() if not s["required"]}
        elif not spec["required"]:
            out[key] = _copy(spec["default"])
    return out


# --------------------------------------------------------------------------------------
# The single rules. Each returns what is wrong (a phrase) or None; no rule ever quotes a key.


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return (is_int(value) or isinstance(value, float)) and not (isinstance(value, float) and not math.isfinite(value))


def name_problem(name):
    if not isinstance(name, str):
        return "is not a string"
    if not NAME_RE.match(name):
        return "holds characters other than a-z, 0-9 and - (or starts with -)"
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long, more than {NAME_MAX} (systemd user name vllm-<name>: 31 at most)"
    return None


def port_problem(port, allow_privileged=False):
    if isinstance(port, str) and port.strip().isdigit():
        return "is a quoted string"
    if not is_int(port):
        return "is not an integer"
    low = PORT_MIN if allow_privileged else PORT_UNPRIVILEGED
    if not low <= port <= PORT_MAX:
        if 1 <= port < PORT_UNPRIVILEGED:
            return "is a privileged port (below 1024) and vllm_service_allow_privileged_ports is not true"
        return f"is outside {low}-{PORT_MAX}"
    return None


def port_number(port):
    """The port as an int for clash detection ("8000" and 8000 are the same port), else None."""
    if is_int(port):
        return port
    if isinstance(port, str) and port.strip().isdigit():
        return int(port.strip())
    return None


def is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_problem(host):
    if not isinstance(host, str):
        return "is not a string"
    if host == "":
        return "is empty (vLLM would bind every interface)"
    if host == "localhost":
        return None
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "is not a literal IP address (host names resolve to addresses nobody reviewed)"
    return None


def key_problem(key):
    """What is wrong with an API key, never quoting it."""
    if not isinstance(key, str):
        return "is not a string"
    if any(ord(c) > 126 for c in key):
        return "holds non-ASCII characters (an HTTP header cannot carry them)"
    if any(c.isspace() for c in key):
        return "holds whitespace (spaces, tabs or newlines)"
    if any(ord(c) < 33 or ord(c) == 127 for c in key):
        return "holds control characters"
    if len(key) < KEY_MIN:
        return f"is shorter than {KEY_MIN} characters"
    if len(key) > KEY_MAX:
        return f"is longer than {KEY_MAX} characters"
    return None


def served_name_problem(name):
    if not isinstance(name, str):
        return "is not a string"
    if "\x00" in name:
        return "holds a NUL character (no command line can carry it)"
    if len(name) > SERVED_NAME_MAX:
        return f"is longer than {SERVED_NAME_MAX} characters"
    return None


def managed_flag(token):
    """The managed option a token of extra_args sets, in any spelling vLLM's parser accepts, or None.

    `--api_key=x`, `--api-key x`, `--trust_remote_code`, `--tensor_parallel_size=8`, `-tp 8`,
    `--kv-transfer-config.x=1` (dotted JSON args) are all recognised. The host's check with vLLM's
    own parser (vllm_config.parse_extra_args) also catches abbreviations and positionals.
    """
    if not isinstance(token, str) or not token.startswith("-"):
        return None
    if token.startswith("--"):
        name = token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        option = "--" + name
        return option if option in MANAGED_OPTIONS else None
    for short, option in MANAGED_SHORT.items():
        if token == short or token.startswith(short + "=") or (token.startswith(short) and short != "-h"):
            return option
    return None


def tp_problem(tp, gpus):
    if is_int(tp) and isinstance(gpus, list) and tp > max(1, len(gpus)):
        return f"is larger than the instance's GPU group ({len(gpus)} GPU(s))"
    return None


def memory_overcommit(claims, limit):
    """[(gpu, total, [(name, fraction), ...])] for every GPU promised more than `limit`.

    claims: [(instance name, gpus, gpu_memory_utilization)]; malformed entries are skipped.
    """
    per_gpu = {}
    for name, gpus, util in claims:
        if not is_number(util) or not isinstance(gpus, list):
            continue
        for gpu in gpus:
            if is_int(gpu):
                per_gpu.setdefault(gpu, []).append((name, util))
    out = []
    for gpu in sorted(per_gpu):
        total = round(sum(u for _name, u in per_gpu[gpu]), 4)
        if total > limit:
            out.append((gpu, total, per_gpu[gpu]))
    return out


def remote_code_allowed(model, allowed):
    """Is trust_remote_code allowed for this model? Hub models by id; local models by path, never by id."""
    allowed = allowed or []
    if model.get("source") == "local":
        path = _norm_path(model.get("path"))
        return bool(path) and path in {_norm_path(a) for a in allowed if isinstance(a, str) and a.startswith("/")}
    return bool(model.get("id")) and model.get("id") in allowed


def _norm_path(path):
    if not isinstance(path, str) or not path.startswith("/"):
        return ""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


def path_problem(path):
    if not isinstance(path, str):
        return "is not a string"
    if not path.startswith("/"):
        return "is not an absolute path"
    if "\x00" in path or any(ord(c) < 32 for c in path):
        return "holds control characters"
    if ".." in path.split("/"):
        return "holds .. (name the directory itself)"
    return None


def is_secret_name(name):
    return isinstance(name, str) and any(word in name.lower() for word in SECRET_WORDS)


def show(value, secret=False):
    """A value as a message shows it: repr (control characters escaped), cut short; secrets never."""
    if secret:
        return REDACTED
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------------------
# Judging a host's list.

_MISSING = object()

_TYPE_WORDS = {
    "str": "a string",
    "bool": "true or false (unquoted)",
    "int": "an integer (unquoted)",
    "number": "a number (unquoted)",
    "dict": "a mapping",
    "list[int]": "a list of integers",
    "list[str]": "a list of strings",
}


def _yaml(value):
    """A value as one would write it in the inventory (for the examples of the messages)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value and re.fullmatch(r"[A-Za-z0-9_./{}|= -]+", value) else repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return str(value)


def _leaf(path):
    """The key a path ends with, or None for a list item or the list itself."""
    if "." not in path:
        return None
    leaf = path.rsplit(".", 1)[-1]
    return None if leaf.endswith("]") else leaf


class _Report:
    def __init__(self):
        self.items = []

    def add(self, path, value, what, allowed, example=None, secret=False, hint="", example_key=None):
        """One problem. `example` is a value; it is shown as `<key>: <value>` (the path's key by default)."""
        secret = secret or _holds_secret_flag(value)
        key = example_key or _leaf(path)
        example_text = None if example is None else (f"{key}: {_yaml(example)}" if key else _yaml(example))
        if value is _MISSING:
            msg, shown = f"{path}: {what}", None
        else:
            msg = f"{path}: {show(value, secret)} {what}"
            shown = REDACTED if secret else (value if isinstance(value, (str, int, float, bool)) else show(value))
        if hint:
            msg += f" ({hint})"
        msg += f"; allowed: {allowed}"
        if example_text is not None:
            msg += f"; e.g. {example_text}"
        self.items.append({"path": path, "value": shown, "allowed": allowed, "example": example_text, "msg": msg})


def _type_ok(kind, value):
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return is_int(value)
    if kind == "number":
        return is_number(value)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list[int]":
        return isinstance(value, list) and all(is_int(x) for x in value)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(x, str) for x in value)
    raise ValueError(kind)


def _type_fix(kind, value):
    """Why a value has the wrong type, with the fix."""
    if kind in ("int", "number") and isinstance(value, str):
        try:
            float(value)
            return "is a quoted string; write the number without quotes"
        except ValueError:
            return f"is a string; write {_TYPE_WORDS[kind]}"
    if kind in ("int", "number") and isinstance(value, bool):
        return f"is a boolean; write {_TYPE_WORDS[kind]}"
    if kind == "int" and isinstance(value, float):
        return "is not a whole number; write an integer"
    if kind == "bool" and isinstance(value, str):
        return "is a string; write true or false without quotes"
    if kind == "bool" and is_number(value):
        return "is a number; write true or false"
    if kind == "str" and not isinstance(value, (dict, list)):
        return "is not a string; quote it"
    if kind.startswith("list") and isinstance(value, str):
        return "is a string; write a YAML list"
    if kind.startswith("list") and isinstance(value, list):
        return f"holds an item that is not {'an integer' if kind == 'list[int]' else 'a string'}"
    return f"is not {_TYPE_WORDS[kind]}"


def _holds_secret_flag(value, depth=0):
    """A value that carries a key on a would-be command line (--api-key=..., --hf-token ...), anywhere inside."""
    if depth > 8:
        return False
    if isinstance(value, str):
        return REDACTED not in value and (managed_flag(value) == "--api-key" or _secret_token(value))
    if isinstance(value, dict):
        return any(_holds_secret_flag(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_secret_flag(v, depth + 1) for v in value)
    return False


def _args_hold_key(value):
    return isinstance(value, list) and any(managed_flag(t) == "--api-key" or _secret_token(t) for t in value)


def _secret_token(token):
    """A flag whose name ends in a secret word (--hf-token, --api-key); --tokenizer or --max-num-batched-tokens
    are not."""
    if not isinstance(token, str) or not token.startswith("-"):
        return False
    name = token.lstrip("-").split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    return name.rsplit("-", 1)[-1].lower() in SECRET_OPTION_WORDS


def _is_secret(key, where, value=None):
    """Is the value at this key possibly a secret (never shown)?"""
    if where == "security":
        return key != "require_key"
    if key == "extra_args":
        return _args_hold_key(value)
    return key == "security" or (is_secret_name(key) and key != "require_key")


def _range_problem(spec, value):
    if spec.get("rule"):
        return None  # judged by its own rule (e.g. ports, with the privileged opt-in)
    if "choices" in spec and value not in spec["choices"]:
        guess = difflib.get_close_matches(str(value), [c for c in spec["choices"] if c], n=1, cutoff=0.5)
        return "is not one of the choices" + (f" (did you mean {guess[0]}?)" if guess else "")
    if "min" in spec and value < spec["min"]:
        return f"is below {spec['min']}"
    if "exclusive_min" in spec and value <= spec["exclusive_min"]:
        return f"is not above {spec['exclusive_min']}"
    if "max" in spec and value > spec["max"]:
        return f"is above {spec['max']}"
    return None


def _unknown(report, path, key, value, known, where):
    guess = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    if not guess and isinstance(key, str) and len(key) >= 3:
        guess = [k for k in known if k.startswith(key) or key.startswith(k)][:1]
    report.add(
        f"{path}.{key}",
        value,
        "is an unknown key",
        f"the keys of {where}: {', '.join(known)}",
        EXAMPLES.get(guess[0]) if guess else None,
        secret=_is_secret(str(key), where) or where == "security" or is_secret_name(str(key)),
        hint=f"did you mean {guess[0]}?" if guess else "",
        example_key=guess[0] if guess else None,
    )


def _walk(report, path, given, keys, where, bad):
    """Unknown keys, types and ranges of one mapping; paths with a bad value go to `bad`."""
    for key in given:
        if key not in keys:
            _unknown(report, path, key, given[key], list(keys), where)
            bad.add(f"{path}.{key}")
    for key, spec in keys.items():
        if key not in given:
            continue
        value, here = given[key], f"{path}.{key}"
        secret = _is_secret(key, where, value)
        allowed = spec.get("allowed") or _TYPE_WORDS[spec["type"]]
        if value is None or not _type_ok(spec["type"], value):
            what = "is null" if value is None else _type_fix(spec["type"], value)
            report.add(here, value, what, allowed, spec["example"], secret=secret)
            bad.add(here)
        elif spec["type"] == "dict":
            _walk(report, here, value, spec["keys"], key, bad)
        else:
            what = _range_problem(spec, value)
            if what:
                report.add(here, value, what, allowed, spec["example"], secret=secret)
                bad.add(here)


def _clean(given, keys, path, bad):
    """The known, well-typed part of a mapping (what the rules across keys may rely on)."""
    out = {}
    for key, value in given.items():
        here = f"{path}.{key}"
        if key not in keys or here in bad:
            continue
        out[key] = _clean(value, keys[key]["keys"], here, bad) if keys[key]["type"] == "dict" else value
    return out


def _context(context):
    context = dict(context or {})
    unknown = sorted(set(context) - set(CONTEXT_DEFAULTS))
    if unknown:
        raise ValueError(f"instance_schema.problems: unknown context keys {', '.join(unknown)}")
    out = dict(CONTEXT_DEFAULTS)
    out.update({k: v for k, v in context.items() if v is not None})
    expected = out["expected_gpus"]
    if isinstance(expected, str) and expected.strip().isdigit():
        out["expected_gpus"] = int(expected)
    return out


def problems(instances, context=None, name="vllm_instances"):
    """Every problem of one host's instance list, as {path, value, allowed, example, msg} dicts.

    instances: the list as the inventory gives it (vllm_instances); context: see CONTEXT_DEFAULTS
    (None values take the default). Checks unknown keys (with "did you mean"), types (bool, int and
    str strictly), ranges, names, ports, hosts, keys, GPUs against the flavour and the expected GPU
    count, tensor parallel size, extra_args, remote code, and across the instances: names, ports and
    the per-GPU memory sum. A value under a secret-looking key is shown as "<redacted>".
    """
    ctx = _context(context)
    report = _Report()
    site = _site_defaults(report, ctx["instance_defaults"])
    if instances is None:
        instances = []
    if not isinstance(instances, list):
        _not_a_list(report, instances, name)
        return report.items
    base = _merge(defaults(), site)
    judged = []
    for index, inst in enumerate(instances):
        path = f"{name}[{index}]"
        if not isinstance(inst, dict):
            _not_a_mapping(report, path, inst)
            continue
        bad = set()
        for key, spec in SCHEMA.items():
            if spec["required"] and key not in inst:
                allowed = spec.get("allowed") or _TYPE_WORDS[spec["type"]]
                report.add(f"{path}.{key}", _MISSING, "is missing", allowed, spec["example"])
                bad.add(f"{path}.{key}")
        _walk(report, path, inst, SCHEMA, "an instance", bad)
        if isinstance(inst.get("model"), dict) and "source" not in inst["model"]:
            spec = SCHEMA["model"]["keys"]["source"]
            report.add(f"{path}.model.source", _MISSING, "is missing", spec["allowed"], spec["example"])
            bad.add(f"{path}.model.source")
        merged = _merge(base, _clean(inst, SCHEMA, path, bad))
        for section in ("model", "engine", "security"):
            merged[section] = merged[section] if isinstance(merged.get(section), dict) else {}
        _rules(report, path, inst, merged, bad, ctx)
        judged.append((path, inst, merged, bad))
    _across(report, judged, ctx, name)
    return report.items


def _site_defaults(report, given):
    """Check vllm_service_instance_defaults like an instance (less name and port); its usable part."""
    where = "vllm_service_instance_defaults"
    if not isinstance(given, dict):
        report.add(
            where,
            given,
            "is not a mapping",
            "a mapping shaped like an instance (model:, engine:, security:, host:, gpus:)",
            {"engine": {"enforce_eager": True}},
        )
        return {}
    bad = set()
    for key in ("name", "port"):
        if key in given:
            report.add(f"{where}.{key}", given[key], "cannot be a default", "set it on each instance")
            bad.add(f"{where}.{key}")
    _walk(report, where, {k: v for k, v in given.items() if k not in ("name", "port")}, SCHEMA, "an instance", bad)
    return _clean({k: v for k, v in given.items() if k not in ("name", "port")}, SCHEMA, where, bad)


def _ok(bad, *paths):
    return not any(p in bad for p in paths)


def _rules(report, path, inst, merged, bad, ctx):
    """Rules on one instance (types already judged): name, port, host, model, GPUs, engine, key."""
    if "name" in inst and _ok(bad, f"{path}.name"):
        what = name_problem(inst["name"])
        if what:
            report.add(f"{path}.name", inst["name"], what, SCHEMA["name"]["allowed"], "chat")
            bad.add(f"{path}.name")
    if "port" in inst and _ok(bad, f"{path}.port"):
        what = port_problem(inst["port"], ctx["allow_privileged_ports"] is True)
        if what:
            report.add(f"{path}.port", inst["port"], what, SCHEMA["port"]["allowed"], 8000)
            bad.add(f"{path}.port")
    host = merged.get("host")
    if _ok(bad, f"{path}.host"):
        what = host_problem(host)
        if what:
            report.add(f"{path}.host", host, what, SCHEMA["host"]["allowed"], "127.0.0.1")
            bad.add(f"{path}.host")
    _model_rules(report, path, merged["model"], bad, ctx)
    gpus = merged.get("gpus", [])
    if _ok(bad, f"{path}.gpus"):
        _gpu_rules(report, path, gpus, bad, ctx)
    engine = merged["engine"]
    tp = engine.get("tensor_parallel_size")
    if _ok(bad, f"{path}.engine.tensor_parallel_size", f"{path}.gpus"):
        what = tp_problem(tp, gpus)
        if what:
            report.add(
                f"{path}.engine.tensor_parallel_size",
                tp,
                what,
                SCHEMA["engine"]["keys"]["tensor_parallel_size"]["allowed"],
                max(1, len(gpus)),
            )
    if _ok(bad, f"{path}.engine.extra_args"):
        _extra_args_rules(report, path, engine.get("extra_args", []))
    _security_rules(report, path, merged, bad, ctx)


def _gpu_rules(report, path, gpus, bad, ctx):
    allowed = SCHEMA["gpus"]["allowed"]
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        report.add(f"{path}.gpus", gpus, "has duplicates or negative indices", allowed, [0, 1])
        bad.add(f"{path}.gpus")
        return
    if not gpus and ctx["flavour"] in GPU_FLAVOURS:
        report.add(
            f"{path}.gpus",
            gpus,
            f"is empty on a {ctx['flavour']} rig (the instance would see every GPU, outside the per-GPU memory check)",
            "a non-empty list of the GPU indices the instance owns",
            [0],
        )
        bad.add(f"{path}.gpus")
        return
    expected = ctx["expected_gpus"]
    if is_int(expected) and expected > 0:
        outside = [g for g in gpus if g >= expected]
        if outside:
            report.add(
                f"{path}.gpus",
                gpus,
                f"names GPU(s) {outside} the rig does not have (gpu_topology_expected_gpus: {expected})",
                f"indices 0-{expected - 1}",
                list(range(min(expected, 2))),
            )
            bad.add(f"{path}.gpus")


def _extra_args_rules(report, path, args):
    for i, arg in enumerate(args):
        here = f"{path}.engine.extra_args[{i}]"
        option = managed_flag(arg)
        if option:
            owner = MANAGED_OPTIONS[option]
            secret = option == "--api-key" or _secret_token(arg)
            shown = arg.split("=", 1)[0] + ("=" + REDACTED if "=" in arg else "") if secret else arg
            if option == "--api-key":
                what = (
                    "sets --api-key: a key never goes on a command line (ps, the journal); the instance's key comes "
                    "from its key file (security.api_key, or generated on the host)"
                )
            elif owner.startswith("nothing: "):
                what = f"sets {option}, which is refused: {owner[len('nothing: ') :]}"
            else:
                what = f"sets {option}, which the config owns ({owner}); use that key instead"
            report.add(here, shown, what, "vLLM flags the config does not own", "--seed=1")
        elif "\x00" in arg:
            report.add(here, arg, "holds a NUL character", "a string without NUL", "--seed=1")
        elif _secret_token(arg):
            report.add(
                here,
                arg.split("=", 1)[0] + ("=" + REDACTED if "=" in arg else ""),
                "looks like a secret on a command line (visible in ps and the journal)",
                "vLLM flags without secrets (the key comes from the instance's key file)",
                "--seed=1",
            )


def _model_rules(report, path, model, bad, ctx):
    here = f"{path}.model"
    source = model.get("source")
    if source is None or not _ok(bad, f"{here}.source"):
        return
    model_id = model.get("id", "")
    if source in ("modelscope", "huggingface") + HUB_SOURCES and _ok(bad, f"{here}.id"):
        if not HUB_ID_RE.match(model_id):
            what = "is not a hub repository id" if model_id else "is missing (a hub model needs its id)"
            report.add(f"{here}.id", model_id if model_id else _MISSING, what, "Org/Name", "Qwen/Qwen3.5-9B")
            bad.add(f"{here}.id")
    hub = model.get("hub", "")
    if source in HUB_SOURCES and _ok(bad, f"{here}.hub") and hub not in HUBS:
        report.add(
            f"{here}.hub",
            hub if hub else _MISSING,
            f"{'is not a hub' if hub else 'is missing'}: source {source} needs the hub the model is downloaded from",
            "one of " + ", ".join(HUBS),
            "modelscope",
        )
    elif source not in HUB_SOURCES and hub and _ok(bad, f"{here}.hub"):
        report.add(f"{here}.hub", hub, f"is only for sources controller and fleet_cache (source is {source})", "''", "")
    path_value = model.get("path", "")
    if source == "local" and _ok(bad, f"{here}.path"):
        what = path_problem(path_value) if path_value else "is missing (a local model needs its directory)"
        if what:
            shown = path_value if path_value else _MISSING
            report.add(f"{here}.path", shown, what, SCHEMA["model"]["keys"]["path"]["allowed"], "/srv/models/tiny")
            bad.add(f"{here}.path")
    elif source != "local" and path_value and _ok(bad, f"{here}.path"):
        report.add(
            f"{here}.path",
            path_value,
            f"is only for source local (source is {source}; model_weights stages it and says where)",
            "''",
            "",
        )
    served = model.get("served_name", "")
    if served and _ok(bad, f"{here}.served_name"):
        what = served_name_problem(served)
        if what:
            allowed = SCHEMA["model"]["keys"]["served_name"]["allowed"]
            report.add(f"{here}.served_name", served, what, allowed, "qwen3.5-9b")
            bad.add(f"{here}.served_name")
    allowed_names = ctx["allowed_models"]
    if allowed_names and isinstance(allowed_names, list) and _ok(bad, f"{here}.served_name", f"{path}.name"):
        effective = served or None
        if effective is not None and effective not in allowed_names:
            report.add(
                f"{here}.served_name",
                effective,
                "is not in vllm_service_allowed_models",
                "one of " + ", ".join(str(a) for a in allowed_names),
                allowed_names[0],
            )
    if model.get("trust_remote_code") is True and _ok(bad, f"{here}.trust_remote_code", f"{here}.path", f"{here}.id"):
        if not remote_code_allowed(model, ctx["remote_code_allowed"]):
            local = source == "local"
            what = (
                f"is set for the local model {model.get('path')!r}, whose path is not in "
                "vllm_service_remote_code_allowed (a local model is allowed by its path; its id is only a label)"
                if local
                else f"is set for {model_id!r}, which is not in vllm_service_remote_code_allowed"
            )
            report.add(
                f"{here}.trust_remote_code",
                True,
                what,
                "false, or true for a reviewed model listed in vllm_service_remote_code_allowed "
                + ("by its path" if local else "by its id"),
                False,
            )


def _security_rules(report, path, merged, bad, ctx):
    security, host = merged["security"], merged.get("host")
    here = f"{path}.security"
    require = security.get("require_key", True)
    if _ok(bad, f"{path}.host") and not is_loopback(host):
        if ctx["allow_remote_bind"] is not True:
            report.add(
                f"{path}.host",
                host,
                "is not loopback and vllm_service_allow_remote_bind is not true",
                "127.0.0.1 behind a gateway, or vllm_service_allow_remote_bind: true and a key",
                "127.0.0.1",
            )
        if require is False:
            report.add(f"{here}.require_key", False, f"with host {host}: a non-loopback bind needs a key", "true", True)
    key = security.get("api_key", "")
    if key and _ok(bad, f"{here}.api_key"):
        what = key_problem(key)
        if what:
            report.add(
                f"{here}.api_key",
                key,
                what,
                SCHEMA["security"]["keys"]["api_key"]["allowed"],
                "{{ vault_chat_key }}",
                secret=True,
                hint="secrets.token_urlsafe(32) makes a good one",
            )


def _across(report, judged, ctx, name):
    """Rules across the instances of the host: names, ports (after normalisation), memory per GPU."""
    by_name, by_port, claims = {}, {}, []
    for path, inst, merged, bad in judged:
        inst_name = inst.get("name")
        if isinstance(inst_name, str) and _ok(bad, f"{path}.name"):
            by_name.setdefault(inst_name, []).append(path)
        port = port_number(inst.get("port"))
        if port is not None:
            by_port.setdefault(port, []).append(path)
        util = merged["engine"].get("gpu_memory_utilization")
        if _ok(bad, f"{path}.gpus", f"{path}.engine.gpu_memory_utilization"):
            claims.append((inst_name if isinstance(inst_name, str) else path, merged.get("gpus", []), util))
    for inst_name, paths in by_name.items():
        for p in paths[1:]:
            what = f"is used by {len(paths)} instances ({', '.join(paths)})"
            report.add(f"{p}.name", inst_name, what, "a name unique on the host", f"{inst_name}-2")
    for port, paths in sorted(by_port.items()):
        for p in paths[1:]:
            what = f"is claimed by {len(paths)} instances ({', '.join(paths)})"
            report.add(f"{p}.port", port, what, "a port unique on the host", port + 1)
    limit = ctx["gpu_memory_limit"]
    for gpu, total, holders in memory_overcommit(claims, limit):
        detail = ", ".join(f"{n} {u}" for n, u in holders)
        report.add(
            f"{name}[*].engine.gpu_memory_utilization",
            total,
            f"is the share of GPU {gpu} promised ({detail}), more than vllm_service_gpu_memory_limit {limit}",
            f"a sum per GPU of at most {limit}",
            round(limit / max(1, len(holders)), 2),
        )


def render(items, host=""):
    """The refusal text: a head line, then one line per problem."""
    head = f"{host}: " if host else ""
    lines = [f"{head}vllm_instances refused ({len(items)} problem(s); the schema: docs/instances.md):"]
    lines += [f"  - {item['msg']}" for item in items]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Views of the instances without their keys (for facts, loops and modules).


def public(instances):
    """The instances without security.api_key (anything a task prints, loops over or publishes)."""
    if not isinstance(instances, list):
        return instances
    out = []
    for inst in instances:
        if isinstance(inst, dict):
            inst = {k: v for k, v in inst.items() if not is_secret_name(k)}
            if isinstance(inst.get("security"), dict):
                inst["security"] = {k: v for k, v in inst["security"].items() if k == "require_key"}
            elif "security" in inst:
                inst["security"] = REDACTED
        out.append(inst)
    return out


MODEL_FIELDS = ("source", "id", "revision", "hub", "path", "trust_remote_code")


def model_refs(instances):
    """[{name, model: {source, id, revision, hub, path, trust_remote_code}}]: what model_weights plans with."""
    if not isinstance(instances, list):
        return instances
    out = []
    for inst in instances:
        if not isinstance(inst, dict):
            out.append(inst)
            continue
        ref = {k: inst[k] for k in ("name",) if k in inst}
        model = inst.get("model")
        if isinstance(model, dict):
            ref["model"] = {k: model[k] for k in MODEL_FIELDS if k in model}
        elif "model" in inst:
            ref["model"] = model if not isinstance(model, (list, tuple)) else REDACTED
        out.append(ref)
    return out


def model_sources(instances):
    """The sorted model sources (and, for controller models, their hubs) of a host's instances."""
    found = set()
    for inst in instances if isinstance(instances, list) else []:
        model = inst.get("model") if isinstance(inst, dict) else None
        if isinstance(model, dict) and isinstance(model.get("source"), str):
            found.add(model["source"])
    return sorted(found)


def fleet_cache_models(host_lists, extra=None):
    """The models a fleet cache holds: {hub, id, revision} of every `fleet_cache` instance model of
    its clients (host_lists: one vllm_instances list per client host) and of `extra`, each once, sorted.
    A missing revision is the hub's default branch. ValueError names an extra entry that is not a model."""
    default_revision = {"modelscope": "master", "huggingface": "main"}

    def ref(model):
        return (model["hub"], str(model.get("id", "")), str(model.get("revision") or default_revision[model["hub"]]))

    found = set()
    for instances in host_lists if isinstance(host_lists, list) else []:
        for inst in instances if isinstance(instances, list) else []:
            model = inst.get("model") if isinstance(inst, dict) else None
            if isinstance(model, dict) and model.get("source") == "fleet_cache" and model.get("hub") in HUBS:
                found.add(ref(model))
    for i, model in enumerate(extra or []):
        if not isinstance(model, dict) or model.get("hub") not in HUBS or not HUB_ID_RE.match(str(model.get("id", ""))):
            hubs = " or ".join(HUBS)
            raise ValueError(
                f"fleet_cache_extra_models[{i}] must be {{hub: {hubs}, id: Org/Name, revision}}, got {model!r}"
            )
        found.add(ref(model))
    return [{"hub": h, "id": i, "revision": r} for h, i, r in sorted(found)]


def given_keys(merged):
    """{name: key} of the merged instances that require a key and give one.

    Only for the task that writes the key files, under no_log.
    """
    out = {}
    for inst in merged if isinstance(merged, list) else []:
        if not isinstance(inst, dict) or not isinstance(inst.get("name"), str):
            continue
        security = inst.get("security") if isinstance(inst.get("security"), dict) else {}
        key = security.get("api_key")
        if security.get("require_key", True) is not False and isinstance(key, str) and key:
            out[inst["name"]] = key
    return out
