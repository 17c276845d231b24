# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the vllm_service role, run on the controller.

- ``rigops_vllm_instances(instances, defaults)``: each instance with the contract's defaults
  and ``vllm_service_instance_defaults`` merged under it (vllm_config.merge_instances);
- ``rigops_vllm_configs(instances, staged, settings)``: one config per instance, what its
  config.toml holds (vllm_config.build_configs);
- ``rigops_vllm_toml(config, header, launcher)``: the whole text of one config.toml, written
  by a TOML library (tomli-w) under the ``ansible_managed`` header and the file's comments;
- ``rigops_vllm_devices(instances, flavour, gpu_facts, extra)``: per instance, the device nodes its
  unit may open (the drop-in devices.conf), minor numbers from the GPU facts
  (vllm_devices.device_plans).

The logic is module_utils/vllm_config.py, the very file the launcher runs with on the host, and
module_utils/vllm_devices.py (controller only).
"""

import importlib.util
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    import tomli_w
except ImportError:  # reported when the filter is used, with the fix
    tomli_w = None


def _load(stem):
    # Imported by path: the project's module_utils folder (ansible.cfg `module_utils`) is only
    # a search path for the modules Ansible ships to hosts; the controller's Python cannot
    # import it as ansible.module_utils.<stem>. The file lies next to roles/ (vllm_config.py is the
    # same file install.yml copies to hosts), whatever ansible.cfg or working directory runs us.
    path = Path(__file__).resolve().parents[3] / "module_utils" / f"{stem}.py"
    name = f"rigops_vllm_service_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


vllm_config = _load("vllm_config")
vllm_devices = _load("vllm_devices")

# TOML comments take no control character but tab (TOML 1.0).
_COMMENT_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _plain(value, where="value"):
    """Ansible's (lazy, tagged) containers and scalars as plain dict, list, str, int, float, bool."""
    if isinstance(value, Mapping):
        return {str(key): _plain(value[key], f"{where}.{key}") for key in value}
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    for kind in (bool, int, float, str):  # bool before int
        if isinstance(value, kind):
            return kind(value)
    if value is None:
        return None
    raise AnsibleFilterError(f"{where}: {value!r} ({type(value).__name__}) is not plain data")


def _no_null(value, where):
    """TOML has no null: name the key rather than let the writer fail without one."""
    if value is None:
        raise AnsibleFilterError(f"{where}: null cannot be written to TOML; give it a value (docs/instances.md)")
    if isinstance(value, dict):
        for key, item in value.items():
            _no_null(item, f"{where} {key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_null(item, f"{where}[{i}]")


def _comment_line(text):
    if _COMMENT_BAD.search(text):
        raise AnsibleFilterError(f"config.toml comment {text!r}: holds a control character; TOML refuses it")
    return f"# {text}" if text else "#"


def render_toml(config, header, launcher):
    """The text of one config.toml: `header` (already commented), our comments, then the sections.

    Sections in vllm_config.SECTIONS order (any other after them, for the launcher to refuse),
    keys sorted, values written by tomli-w: any string (quotes, backslashes, newlines,
    control characters, emoji) reads back exactly with tomllib.
    """
    if tomli_w is None:
        raise AnsibleFilterError(
            "rigops_vllm_toml needs the Python package tomli-w on the controller: pip install -r requirements.txt"
        )
    config = _plain(config, "config")
    if not isinstance(config, dict) or not all(isinstance(config[s], dict) for s in config):
        raise AnsibleFilterError(f"rigops_vllm_toml: {config!r} is not a mapping of sections to tables")
    header_lines = str(header).rstrip("\n").split("\n") if header else []
    for line in header_lines:
        if not line.startswith("#") or _COMMENT_BAD.search(line):
            raise AnsibleFilterError(
                f"rigops_vllm_toml: header line {line!r} is not a TOML comment; pass `ansible_managed | comment`"
            )
    instance = str(config.get("server", {}).get("instance", "?"))
    comments = [
        _comment_line(f"vLLM instance `{instance}`: read by"),
        _comment_line(f"{launcher} (vllm@{instance}.service)."),
        _comment_line(f"Check it with: {launcher} --check <this file>"),
        _comment_line('Every key is documented in the vllm_service role\'s README ("config.toml").'),
    ]
    order = list(vllm_config.SECTIONS) + sorted(s for s in config if s not in vllm_config.SECTIONS)
    body = {s: {k: config[s][k] for k in sorted(config[s])} for s in order if s in config}
    for section, table in body.items():
        _no_null(table, f"config.toml [{section}]")
    return "\n".join(header_lines + comments) + "\n\n" + tomli_w.dumps(body)


def rigops_vllm_instances(instances, defaults=None):
    try:
        return vllm_config.merge_instances(_plain(instances, "vllm_instances"), _plain(defaults or {}, "defaults"))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def rigops_vllm_configs(instances, staged, settings):
    try:
        return vllm_config.build_configs(
            _plain(instances, "vllm_instances"), _plain(staged, "staged"), _plain(settings, "settings")
        )
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def rigops_vllm_toml(config, header, launcher):
    return render_toml(config, header, launcher)


def rigops_vllm_devices(instances, flavour, gpu_facts=None, extra=None):
    try:
        return vllm_devices.device_plans(
            _plain(instances, "instances"),
            str(flavour),
            _plain(gpu_facts or {}, "gpu_facts"),
            _plain(extra or [], "vllm_service_device_allow"),
        )
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """vllm_service: instances, configs, config.toml text, device plans (see the module's docstring)."""

    def filters(self):
        return {
            "rigops_vllm_instances": rigops_vllm_instances,
            "rigops_vllm_configs": rigops_vllm_configs,
            "rigops_vllm_toml": rigops_vllm_toml,
            "rigops_vllm_devices": rigops_vllm_devices,
        }
