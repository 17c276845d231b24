# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The instance contract (plugins/module_utils/vllm_instances.py) as filters, run on the controller.

- ``vllm_instances | rigops.fleet.vllm_instances(site_defaults)``: the host's instances merged by the
  contract (each over vllm_service_instance_defaults over the contract's defaults, deeply, on
  copies): what every other filter of the collection takes. A list that cannot be merged is
  refused with the contract's message;
- ``vllm_instances | rigops.fleet.instance_problems(context)``: every problem of a host's list,
  each a dict ``{path, value, allowed, example, msg}``; context keys: flavour, expected_gpus,
  allow_privileged_ports, allow_remote_bind, instance_defaults, remote_code_allowed,
  allowed_models, gpu_memory_limit (None takes the contract's default). A key's value never
  appears in a problem;
- ``problems | rigops.fleet.instance_refusal(host)``: the refusal text, one line per problem;
- ``instances | rigops.fleet.instances_public``: the instances without ``security.api_key`` (or
  any key that looks secret): what a task may loop over, print or publish;
- ``instances | rigops.fleet.model_refs``: ``[{name, model: {source, id, revision, hub, path,
  trust_remote_code}}]``: what model_weights plans with (never ``security``);
- ``instances | rigops.fleet.model_sources``: the sorted model sources (what vllm_runtime needs to
  know, e.g. ``[modelscope]``);
- ``[vllm_instances, ...] | rigops.fleet.fleet_cache_models(extra)``: the ``{hub, id, revision}`` a
  fleet cache holds for its clients' ``fleet_cache`` models and the extra ones, each once;
- ``merged | rigops.fleet.given_keys``: ``{name: key}`` of the keys the inventory gives, only for
  the task that writes the key files (``no_log: true``).
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain


def instance_problems(instances, context=None):
    try:
        return schema.problems(_plain(instances), _plain(context or {}))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def instance_refusal(problems, host=""):
    return schema.render(_plain(problems), str(host))


def instances_public(instances):
    return schema.public(_plain(instances))


def model_refs(instances):
    return schema.model_refs(_plain(instances))


def model_sources(instances):
    return schema.model_sources(_plain(instances))


def fleet_cache_models(host_lists, extra=None):
    try:
        return schema.fleet_cache_models(_plain(host_lists), _plain(extra or []))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def given_keys(merged):
    return schema.given_keys(_plain(merged))


def vllm_instances(instances, site_defaults=None):
    try:
        return schema.merge(_plain(instances), _plain(site_defaults) if site_defaults is not None else None)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """The instance schema and the key-free views of the instances (see the module's docstring)."""

    def filters(self):
        return {
            "instance_problems": instance_problems,
            "instance_refusal": instance_refusal,
            "instances_public": instances_public,
            "model_refs": model_refs,
            "model_sources": model_sources,
            "given_keys": given_keys,
            "vllm_instances": vllm_instances,
            "fleet_cache_models": fleet_cache_models,
        }
