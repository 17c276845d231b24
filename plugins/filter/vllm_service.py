# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the vllm_service role, run on the controller.

- ``merged | rigops.fleet.vllm_configs(staged, settings)``: one config per instance (merged by
  rigops.fleet.vllm_instances), what its config.toml holds (vllm_config.build_configs);
- ``configs | rigops.fleet.vllm_preflight(limit)``: what the launcher refuses in one host's configs
  (each file's policy, then their placement: ports, names, memory per GPU), before any is written;
- ``rigops.fleet.vllm_toml(config, header, launcher)``: the whole text of one config.toml, written
  by a TOML library (tomli-w) under the ``ansible_managed`` header and the file's comments;
- ``configs | rigops.fleet.vllm_config_files(header, launcher, root, group)``: each config.toml as an entry of
  rigops.fleet.host_files (its text, owner, mode, and the launcher's --check as its validation);
- ``changed_paths | rigops.fleet.vllm_changed_instances(names, root, unit_dir)``: the instances whose folder
  (config, key) or drop-ins a host_files task changed;
- ``rigops.fleet.vllm_devices(instances, flavour, gpu_facts, extra)``: per instance, the device nodes its
  unit may open (the drop-in devices.conf), minor numbers from the GPU facts
  (vllm_devices.device_plans);
- ``old_text | rigops.fleet.vllm_config_changes(new_text)``: what a new config.toml changed against the
  one that served, as ``section.key: old -> new`` (the message of a failed restart).

The logic is plugins/module_utils/vllm_config.py, the very file the launcher runs with on the host, and
plugins/module_utils/vllm_devices.py (controller only).
"""

import re
import tomllib

from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_config, vllm_devices
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain

try:
    import tomli_w
except ImportError:  # reported when the filter is used, with the fix
    tomli_w = None

# TOML comments take no control character but tab (TOML 1.0).
_COMMENT_BAD = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _no_null(value, where):
    """TOML has no null (nor any type but these): name the key rather than let the writer fail without one."""
    if value is None:
        raise AnsibleFilterError(f"{where}: null cannot be written to TOML; give it a value (docs/instances.md)")
    if not isinstance(value, (str, int, float, bool, dict, list)):
        raise AnsibleFilterError(f"{where}: {value!r} ({type(value).__name__}) is not plain data")
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
            "rigops.fleet.vllm_toml needs the Python package tomli-w on the controller: pip install -r requirements.txt"
        )
    config = _plain(config)
    if not isinstance(config, dict) or not all(isinstance(config[s], dict) for s in config):
        raise AnsibleFilterError(f"rigops.fleet.vllm_toml: {config!r} is not a mapping of sections to tables")
    header_lines = str(header).rstrip("\n").split("\n") if header else []
    for line in header_lines:
        if not line.startswith("#") or _COMMENT_BAD.search(line):
            raise AnsibleFilterError(
                f"rigops.fleet.vllm_toml: header line {line!r} is not a TOML comment; pass `ansible_managed | comment`"
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


def vllm_configs(instances, staged, settings):
    try:
        return vllm_config.build_configs(_plain(instances), _plain(staged), _plain(settings))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_preflight(configs, limit=0.95):
    """The launcher's rules over one host's configs, on the controller: [problem, ...]."""
    return vllm_config.preflight(_plain(configs), float(limit))


def vllm_toml(config, header, launcher):
    return render_toml(config, header, launcher)


def vllm_config_files(configs, header, launcher, root, group):
    """Each config.toml (``root``/<instance>/config.toml, root:``group`` 0640) as a rigops.fleet.host_files entry,
    checked by the launcher (``launcher`` --check) before it replaces the old one."""
    return [
        {
            "path": f"{root}/{config['server']['instance']}/config.toml",
            "content": render_toml(config, header, launcher),
            "group": str(group),
            "mode": "0640",
            "validate": f"{launcher} --check %s",
        }
        for config in _plain(configs)
    ]


def vllm_changed_instances(changed_paths, names, root, unit_dir):
    """The instances (of ``names``) with a changed path (a rigops.fleet.host_files result's changed_paths) in their
    folder (``root``/<name>/: config, key) or their drop-in folder (``unit_dir``/vllm@<name>.service.d/)."""
    changed = list(_plain(changed_paths or {}))
    return [
        name
        for name in _plain(names)
        if any(p.startswith((f"{root}/{name}/", f"{unit_dir}/vllm@{name}.service.d/")) for p in changed)
    ]


def vllm_devices_filter(instances, flavour, gpu_facts=None, extra=None):
    try:
        return vllm_devices.device_plans(
            _plain(instances),
            str(flavour),
            _plain(gpu_facts or {}),
            _plain(extra or []),
        )
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _flat(table, prefix=""):
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def vllm_config_changes(old_text, new_text):
    """``section.key: old -> new`` for every value a new config.toml changed (added or removed: ``-``).
    A config.toml holds no key (the key file does): values are shown."""
    try:
        old, new = _flat(tomllib.loads(str(old_text))), _flat(tomllib.loads(str(new_text)))
    except tomllib.TOMLDecodeError as exc:
        return [f"(a config.toml is not TOML: {exc})"]
    return [
        f"{key}: {old.get(key, '-')!r} -> {new.get(key, '-')!r}".replace("'-'", "-")
        for key in sorted(set(old) | set(new))
        if old.get(key, "-") != new.get(key, "-")
    ] or ["nothing (the same config.toml)"]


class FilterModule:
    """vllm_service: instances, configs, config.toml text, device plans (see the module's docstring)."""

    def filters(self):
        return {
            "vllm_configs": vllm_configs,
            "vllm_preflight": vllm_preflight,
            "vllm_toml": vllm_toml,
            "vllm_config_files": vllm_config_files,
            "vllm_changed_instances": vllm_changed_instances,
            "vllm_devices": vllm_devices_filter,
            "vllm_config_changes": vllm_config_changes,
        }
