#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: model_weights_plan
short_description: The models a host stages, deduplicated, and which host downloads each fan-out model
description:
  - Reads the vLLM instances of every host of the play (docs/instances.md), validates each instance's model and
    returns this host's models, each once, with the instances that use it.
  - A model with source C(controller) is downloaded from its hub by one cache host (O(cache_host), else the first
    host of the play that needs it; C(role=download) there) and copied from it to the others (C(role=copy)).
  - Runs on the controller's data only; changes nothing.
version_added: "0.1.0"
author: rigops contributors
options:
  host:
    description: This host's inventory name.
    type: str
    required: true
  fleet:
    description: Instances of every host of the play, by inventory name, in play order.
    type: dict
    required: true
  cache_host:
    description: Host that downloads the controller-source models for the fleet; empty for the first that needs one.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Changes nothing in any mode.
"""

EXAMPLES = r"""
- name: Plan the models of this host
  model_weights_plan:
    host: "{{ inventory_hostname }}"
    fleet: "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all
      | map('extract', hostvars, 'vllm_instances'))) }}"
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

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.model_weights import plan  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "fleet": {"type": "dict", "required": True},
            "cache_host": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = plan(p["host"], p["fleet"], p["cache_host"])
    except ValueError as exc:
        module.fail_json(msg=f"{p['host']}: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
