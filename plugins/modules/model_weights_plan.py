#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: model_weights_plan
short_description: The models a host stages, deduplicated, and which host downloads each fan-out model
description:
  - Reads the models of the vLLM instances of every host of the play (docs/instances.md), validates each instance's
    model and returns this host's models, each once, with the instances that use it.
  - A model with source C(controller) is downloaded from its hub by one cache host (O(cache_host), else the first
    host of the play that needs it; C(role=download) there) and copied from it to the others (C(role=copy)).
  - Gets only what the plan needs, each instance's name and model fields (the C(rigops.fleet.model_refs) filter), never
    C(security) or any other key. Anything else is refused by the argument spec, before the module logs its
    arguments on the host.
  - Runs on the controller's data only; changes nothing.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  host:
    description: This host's inventory name.
    type: str
    required: true
  fleet:
    description: The model references of every host of the play, in play order.
    type: list
    elements: dict
    required: true
    suboptions:
      host:
        description: The host's inventory name.
        type: str
        required: true
      instances:
        description: The host's instances, reduced to their name and model fields.
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: The instance's name.
            type: raw
          model:
            description: The instance's model fields.
            type: dict
            suboptions:
              source:
                description: modelscope, huggingface, local or controller.
                type: raw
              id:
                description: The hub's repository id.
                type: raw
              revision:
                description: Branch, tag or commit.
                type: raw
              hub:
                description: Source controller only, the hub the cache host downloads from.
                type: raw
              path:
                description: Source local only, the model directory.
                type: raw
              trust_remote_code:
                description: The instance runs the model's own code.
                type: raw
  cache_host:
    description: Host that downloads the controller-source models for the fleet; empty for the first that needs one.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
"""

EXAMPLES = r"""
- name: Plan the models of this host
  rigops.fleet.model_weights_plan:
    host: "{{ inventory_hostname }}"
    # {host: [{name, model}]} of every host, each published with `vllm_instances | rigops.fleet.model_refs`
    fleet: "{{ model_weights__fleet | dict2items(key_name='host', value_name='instances') }}"
"""

RETURN = r"""
models:
  description: This host's models.
  returned: success
  type: list
  sample:
    - key: "modelscope:Qwen/Qwen3.5-9B@master"
      source: modelscope
      hub: modelscope
      id: Qwen/Qwen3.5-9B
      revision: master
      path: ""
      instances: [chat]
      trust_remote_code: false
      cache_host: ""
      role: download
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.model_weights_plan import plan

MODEL_OPTIONS = {key: {"type": "raw"} for key in ("source", "id", "revision", "hub", "path", "trust_remote_code")}


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "fleet": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "host": {"type": "str", "required": True},
                    "instances": {
                        "type": "list",
                        "elements": "dict",
                        "default": [],
                        "options": {"name": {"type": "raw"}, "model": {"type": "dict", "options": MODEL_OPTIONS}},
                    },
                },
            },
            "cache_host": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    fleet = {entry["host"]: entry["instances"] or [] for entry in p["fleet"]}
    try:
        result = plan(p["host"], fleet, p["cache_host"])
    except ValueError as exc:
        module.fail_json(msg=f"{p['host']}: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
