#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: vllm_service_probe
short_description: What the vllm_service preflight checks on the host before anything changes
description:
  - For each instance's config (what its config.toml will hold), the checks that need the host, read-only
    (plugins/module_utils/vllm_config.py).
  - C(max_model_len) against the staged model's C(config.json) (C(max_position_embeddings) and the like, stretched
    by rope scaling), unless O(allow_long_max_model_len).
  - The code a C(local) model ships (C(auto_map) in C(config.json) or C(tokenizer_config.json), C(*.py) files)
    with C(trust_remote_code) and a path outside the allow list it is refused; otherwise noted.
  - C(extra_args) parsed by vLLM's own argument parser, from the runtime the config names (both spellings,
    C(=) forms, abbreviations, positionals). What the config owns, or what would bypass its checks, is refused,
    and so is whatever the parser refuses (unknown flags, bad values). Only instances with C(extra_args) start the
    runtime's python, and only when O(cache_dir) holds no clean verdict for the same request (loading vLLM takes
    seconds of CPU on every run, while the verdict depends only on the runtime's installed packages, the
    instances' command lines and the C(VLLM_*) environment, all in the verdict's name).
  - Instances on the host that left the inventory (orphans), found from folders C(<config_root>/<name>/config.toml)
    and units C(vllm@<name>.service) (loaded, enabled, or with a drop-in), with the port each config holds.
  - The key is never read.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  configs:
    description: The instances' configs (vllm_config.build_configs; no secret in them).
    type: list
    elements: dict
    required: true
  config_root:
    description: Folder of the per-instance folders.
    type: path
    default: /etc/vllm
  systemd_root:
    description: Folder of the local unit files (drop-ins C(vllm@<name>.service.d), C(*.wants) links).
    type: path
    default: /etc/systemd/system
  keep_orphans:
    description:
      - The orphans are kept running (vllm_service_keep_orphans); a port one of them holds (its config.toml) that an
        instance of O(configs) claims is then a problem (that instance would fail with "address in use").
    type: bool
    default: false
  allow_long_max_model_len:
    description: Skip the context limit check (vLLM's C(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1) is in the units' environment).
    type: bool
    default: false
  timeout:
    description: Seconds the runtime's python may take to import vLLM and parse the arguments.
    type: int
    default: 600
  cache_dir:
    description:
      - Folder (root only) of the clean verdicts of vLLM's parser, one empty-finding answer per file named by the
        sha256 of what it judged; a verdict with a finding is never kept (the next run judges it again). Empty
        string to judge every time. The newest 64 are kept.
    type: str
    default: /var/cache/rigops/vllm-args
  masked_files:
    description: Files the instances see as C(/dev/null); those present on the host are returned (RV(masked_present)).
    type: list
    elements: path
    default: []
  host_name:
    description: The host's name in the inventory, for the refusal's message.
    type: str
    default: ""
  keep_verdicts:
    description:
      - Write a clean verdict to O(cache_dir) (one kept is read either way). Never in check mode; the role's task
        runs even in check mode (it only reads), so it passes C(not ansible_check_mode) here.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.accounts
  - rigops.fleet.attributes.read_only
"""

EXAMPLES = r"""
- name: Probe the host for the instances' configs
  rigops.fleet.vllm_service_probe:
    configs: "{{ vllm_service__configs }}"
    config_root: /etc/vllm
  register: probe
"""

RETURN = r"""
problems:
  description:
    - What the host refuses, one message per problem (file, key, fix); empty when all is well. The module fails
      when there is one, its message the host's refusal.
  type: list
  elements: str
  returned: always
  sample: ["/etc/vllm/chat/config.toml: [model] max_model_len: 65536 is more than the model allows (32768 tokens)"]
notes:
  description: What is worth knowing but refuses nothing (code a model ships and does not run, ...); each is warned.
  type: list
  elements: str
  returned: always
  sample: []
orphans:
  description: Instances present on the host that are not in O(configs), by name.
  type: list
  elements: str
  returned: always
  sample: [old-chat]
orphan_folders:
  description: The orphans that have a folder under O(config_root).
  type: list
  elements: str
  returned: always
  sample: [old-chat]
orphan_ports:
  description: The port each orphan's config.toml holds (when readable).
  type: dict
  returned: always
  sample: {old-chat: 8000}
accounts_to_fix:
  description: Of O(accounts), the groups missing and the users missing or differing (primary group, shell, home).
  returned: always
  type: dict
  sample: {"users": ["vllm-chat"], "groups": ["vllm-chat"]}
active:
  description: The instances of O(configs) whose unit is active now.
  type: list
  elements: str
  returned: always
  sample: [chat]
masked_present:
  description: Of O(masked_files), those present on the host.
  type: list
  elements: str
  returned: always
  sample: [/etc/gai.conf]
extra_args_checked:
  description: Instances whose extra_args vLLM's parser judged (now, or in a kept verdict).
  type: list
  elements: str
  returned: always
  sample: [chat]
extra_args_cached:
  description: The instances of RV(extra_args_checked) whose verdict came from O(cache_dir).
  type: list
  elements: str
  returned: always
  sample: [chat]
"""

import json
import os
import shutil
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.accounts import accounts_to_fix
from ansible_collections.rigops.fleet.plugins.module_utils.state_file import write_atomic
from ansible_collections.rigops.fleet.plugins.module_utils.systemd_units import active_units
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_config import (
    PARSE_EXTRA_ARGS_SOURCE,
    build_argv,
    context_problems,
    extra_args_problems,
    extra_args_verdict_key,
    load,
    normalize,
    orphan_port_clashes,
    orphans,
    remote_code_findings,
    unit_instances,
)
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_instances import MANAGED_DESTS

# Run with the runtime's python: builds the API server's own parser and judges each instance's
# extra_args with parse_extra_args (PARSE_EXTRA_ARGS_SOURCE, put before this). vLLM's logging goes to
# stderr; the answer is the one JSON document on the saved stdout.
DRIVER = r"""
import json, os, sys
_answer = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def _first(*names):
    import importlib

    for module, attr in names:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            continue
    raise ImportError("none of " + ", ".join(m + "." + a for m, a in names))


def _vllm_parser():
    # where vLLM keeps them moves between releases; the API server's own pair
    flexible = _first(("vllm.utils.argparse_utils", "FlexibleArgumentParser"), ("vllm.utils", "FlexibleArgumentParser"))
    make = _first(
        ("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
        ("vllm.entrypoints.openai.cli_args", "make_arg_parser"),
    )
    return make(flexible(prog="vllm.entrypoints.openai.api_server"))


_request = json.loads(sys.stdin.read())
_out = {}
for _item in _request["instances"]:
    _out[_item["name"]] = parse_extra_args(_vllm_parser(), _item["extra_args"], _request["managed"], _item["argv"])
_answer.write(json.dumps(_out))
_answer.flush()
"""


KEEP_VERDICTS = 64


def _kept(cache_dir, key):
    """Whether cache_dir holds the clean verdict named key."""
    return bool(cache_dir and key) and os.path.isfile(os.path.join(cache_dir, key + ".json"))


def _keep(cache_dir, key, python, names):
    """Keep a clean verdict (root only), and only the newest KEEP_VERDICTS. A cache: a failure to write it is
    no failure of the probe."""
    try:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
        os.chmod(cache_dir, 0o700)
        write_atomic(
            os.path.join(cache_dir, key + ".json"),
            json.dumps({"python": python, "instances": names, "findings": [], "judged": int(time.time())}) + "\n",
            mode=0o600,
        )
        kept = sorted(
            (os.path.join(cache_dir, n) for n in os.listdir(cache_dir) if n.endswith(".json")),
            key=os.path.getmtime,
            reverse=True,
        )
        for old in kept[KEEP_VERDICTS:]:
            os.unlink(old)
    except OSError:
        pass


def _judge_extra_args(module, cfgs, config_root):
    """{instance: findings} from vLLM's parser, one runtime python per distinct python; a clean verdict kept in
    cache_dir stands in for the parser's while nothing it judged has changed (extra_args_verdict_key)."""
    cache_dir = module.params["cache_dir"]
    by_python = {}
    for cfg in cfgs:
        if cfg["engine"]["extra_args"]:
            by_python.setdefault(cfg["server"]["python"], []).append(cfg)
    problems, checked, cached = [], [], []
    for python, group in sorted(by_python.items()):
        names = ", ".join(c["server"]["instance"] for c in group)
        if not os.access(python, os.X_OK):
            problems.append(
                f"{names}: [engine] extra_args cannot be checked: {python} is not an executable; install the runtime "
                "(vllm_runtime role) first"
            )
            continue
        request = {
            "managed": MANAGED_DESTS,
            "instances": [
                {
                    "name": c["server"]["instance"],
                    "extra_args": c["engine"]["extra_args"],
                    "argv": build_argv(c)[: -len(c["engine"]["extra_args"])],
                }
                for c in group
            ],
        }
        script = PARSE_EXTRA_ARGS_SOURCE + DRIVER
        key = extra_args_verdict_key(python, script, request, os.environ)
        group_names = [c["server"]["instance"] for c in group]
        if _kept(cache_dir, key):
            checked += group_names
            cached += group_names
            continue
        home = tempfile.mkdtemp(prefix="rigops-vllm-args-")
        env = dict(
            os.environ,
            HOME=home,
            XDG_CACHE_HOME=home,
            XDG_CONFIG_HOME=home,
            VLLM_CONFIG_ROOT=home,
            VLLM_CACHE_ROOT=home,
            HF_HOME=home,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            VLLM_LOGGING_LEVEL="ERROR",
            LC_ALL="C",
        )
        env.pop("VLLM_API_KEY", None)
        try:
            proc = subprocess.run(
                [python, "-c", script],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                env=env,
                cwd=home,
                timeout=module.params["timeout"],
                check=False,
            )
        except subprocess.TimeoutExpired:
            limit = module.params["timeout"]
            problems.append(f"{names}: [engine] extra_args: {python} did not answer within {limit} s")
            continue
        finally:
            shutil.rmtree(home, ignore_errors=True)
        try:
            answer = json.loads(proc.stdout)
        except ValueError:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            problems.append(
                f"{names}: [engine] extra_args: vLLM's parser could not be loaded from {python} (rc {proc.returncode}: "
                f"{tail or 'no output'}); check the runtime (vllm_runtime role)"
            )
            continue
        found = []
        for name in group_names:
            checked.append(name)
            found += extra_args_problems(answer.get(name, []), f"{config_root}/{name}/config.toml")
        problems += found
        keep = module.params["keep_verdicts"] and not module.check_mode
        if not found and proc.returncode == 0 and cache_dir and key and keep:
            _keep(cache_dir, key, python, group_names)
    return problems, checked, cached


def _systemctl_units(module):
    """Instance names of the vllm@ units systemd knows (loaded or in unit files); [] when it cannot be asked."""
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return []
    names = []
    for args in (
        ["list-units", "--all", "--plain", "--no-legend", "--no-pager", "vllm@*.service"],
        ["list-unit-files", "--plain", "--no-legend", "--no-pager", "vllm@*.service"],
    ):
        rc, out, _err = module.run_command([systemctl] + args, environ_update={"LC_ALL": "C"})
        if rc == 0:
            names += [line.split()[0] for line in out.splitlines() if line.split()]
    return names


def _local_units(root):
    """vllm@<name>.service names enabled (*.wants links) or with a drop-in folder under root."""
    names = []
    try:
        entries = os.listdir(root)
    except OSError:
        return names
    for entry in entries:
        if entry.startswith("vllm@") and entry.endswith(".service.d"):
            names.append(entry[: -len(".d")])
        elif entry.endswith(".wants") and os.path.isdir(os.path.join(root, entry)):
            try:
                names += [n for n in os.listdir(os.path.join(root, entry)) if n.startswith("vllm@")]
            except OSError:
                continue
    return names


def main():
    module = AnsibleModule(
        argument_spec={
            "configs": {"type": "list", "elements": "dict", "required": True},
            "config_root": {"type": "path", "default": "/etc/vllm"},
            "systemd_root": {"type": "path", "default": "/etc/systemd/system"},
            "keep_orphans": {"type": "bool", "default": False},
            "allow_long_max_model_len": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 600},
            "cache_dir": {"type": "str", "default": "/var/cache/rigops/vllm-args"},
            "keep_verdicts": {"type": "bool", "default": True},
            "masked_files": {"type": "list", "elements": "path", "default": []},
            "host_name": {"type": "str", "default": ""},
            "accounts": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems, notes, cfgs = [], [], []
    for raw in p["configs"]:
        name = str((raw.get("server") or {}).get("instance", "?"))
        where = f"{p['config_root']}/{name}/config.toml"
        cfg, probs = normalize(raw, where)
        if probs:  # the controller's preflight already refused these; nothing to judge here
            problems += probs
            continue
        cfgs.append(cfg)
        problems += context_problems(cfg, where, allow_long=p["allow_long_max_model_len"])
        refused, noted = remote_code_findings(cfg, where)
        problems += refused
        notes += noted
    arg_problems, checked, cached = _judge_extra_args(module, cfgs, p["config_root"])
    problems += arg_problems

    wanted = [c["server"]["instance"] for c in cfgs] + [
        str((r.get("server") or {}).get("instance", "")) for r in p["configs"]
    ]
    try:
        folders = [
            n for n in os.listdir(p["config_root"]) if os.path.isfile(os.path.join(p["config_root"], n, "config.toml"))
        ]
    except OSError:
        folders = []
    units = unit_instances(_systemctl_units(module) + _local_units(p["systemd_root"]))
    found = orphans(wanted, folders, units)
    ports = {}
    for name in found:
        try:
            ports[name] = load(os.path.join(p["config_root"], name, "config.toml"))["server"]["port"]
        except Exception:  # noqa: BLE001 - an unreadable old config has no port to report
            continue
    if p["keep_orphans"]:
        claimed = {c["server"]["instance"]: c["server"]["port"] for c in cfgs}
        for port, orphan, name in orphan_port_clashes(ports, claimed):
            problems.append(
                f"{p['config_root']}/{name}/config.toml: [server] port: {port} is held by {orphan}, which left "
                "vllm_instances and is kept (vllm_service_keep_orphans: true): the instance would fail with 'address "
                "in use'; give it another port, or let the role remove the old instance (vllm_service_keep_orphans: "
                "false)"
            )
    units = [f"vllm@{c['server']['instance']}.service" for c in cfgs]
    systemctl = module.get_bin_path("systemctl")
    is_active = module.run_command([systemctl, "is-active", *units])[1] if systemctl and units else ""
    result = {
        "changed": False,
        "problems": problems,
        "notes": notes,
        "orphans": found,
        "orphan_folders": [n for n in found if n in folders],
        "orphan_ports": ports,
        "extra_args_checked": checked,
        "extra_args_cached": cached,
        "active": [u[len("vllm@") : -len(".service")] for u in active_units(units, is_active)],
        "masked_present": [path for path in p["masked_files"] if os.path.exists(path)],
        "accounts_to_fix": accounts_to_fix(p["accounts"].get("users"), p["accounts"].get("groups")),
    }
    for note in notes:
        module.warn(note)
    if problems:
        module.fail_json(msg=f"{p['host_name']}: vllm_service preflight refused:\n" + "\n".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
