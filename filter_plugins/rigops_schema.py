# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The instance schema (module_utils/instance_schema.py) as filters, run on the controller.

- ``vllm_instances | rigops_instance_problems(context)``: every problem of a host's list, each a
  dict ``{path, value, allowed, example, msg}``; context keys: flavour, expected_gpus,
  allow_privileged_ports, allow_remote_bind, instance_defaults, remote_code_allowed,
  allowed_models, gpu_memory_limit (None takes the schema's default). A key's value never
  appears in a problem.
- ``problems | rigops_instance_refusal(host)``: the refusal text, one line per problem.
- ``vllm_instances | rigops_instances_public``: the instances without ``security.api_key`` (or
  any key that looks secret): what a task may loop over, print or publish.
- ``vllm_instances | rigops_model_refs``: ``[{name, model: {source, id, revision, hub, path,
  trust_remote_code}}]``: what model_weights plans with (never ``security``).
- ``vllm_instances | rigops_model_sources``: the sorted model sources (what vllm_runtime needs to
  know, e.g. ``[modelscope]``).
- ``[vllm_instances, ...] | rigops_fleet_cache_models(extra)``: the ``{hub, id, revision}`` a fleet
  cache holds for its clients' ``fleet_cache`` models and the extra ones, each once.
- ``vllm_instances | rigops_given_keys(instance_defaults)``: ``{name: key}`` of the keys given in
  the inventory, only for the task that writes the key files (``no_log: true``).

Used by playbooks/preflight.yml (every stage, every tag selection) and the roles. The file is
imported by path: the project's module_utils folder is only a search path for the modules
Ansible ships to hosts; the controller's Python cannot import it as ansible.module_utils.
"""

import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleFilterError

_NAME = "rigops_instance_schema"  # the same module object vllm_config.py loads beside itself


def _load_schema():
    path = Path(__file__).resolve().parents[1] / "module_utils" / "instance_schema.py"
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[_NAME] = module
    return sys.modules[_NAME]


schema = _load_schema()


def _plain(value):
    """Ansible's (lazy, tagged) containers and scalars as plain dict, list, str, int, float, bool, None."""
    if isinstance(value, Mapping):
        return {(str(k) if isinstance(k, str) else k): _plain(value[k]) for k in value}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):  # bool before int
        if isinstance(value, kind):
            return kind(value)
    return value


def rigops_instance_problems(instances, context=None):
    try:
        return schema.problems(_plain(instances), _plain(context or {}))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def rigops_instance_refusal(problems, host=""):
    return schema.render(_plain(problems), str(host))


def rigops_instances_public(instances):
    return schema.public(_plain(instances))


def rigops_model_refs(instances):
    return schema.model_refs(_plain(instances))


def rigops_model_sources(instances):
    return schema.model_sources(_plain(instances))


def rigops_fleet_cache_models(host_lists, extra=None):
    try:
        return schema.fleet_cache_models(_plain(host_lists), _plain(extra or []))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def rigops_given_keys(instances, instance_defaults=None):
    return schema.given_keys(_plain(instances), _plain(instance_defaults or {}))


class FilterModule:
    """The instance schema and the key-free views of the instances (see the module's docstring)."""

    def filters(self):
        return {
            "rigops_instance_problems": rigops_instance_problems,
            "rigops_instance_refusal": rigops_instance_refusal,
            "rigops_instances_public": rigops_instances_public,
            "rigops_model_refs": rigops_model_refs,
            "rigops_model_sources": rigops_model_sources,
            "rigops_given_keys": rigops_given_keys,
            "rigops_fleet_cache_models": rigops_fleet_cache_models,
        }
