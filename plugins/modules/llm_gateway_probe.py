#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: llm_gateway_probe
short_description: Which upstreams of the LLM gateway the gateway host reaches
description:
  - For each upstream (a rig instance or a remote provider), one TCP connect from the gateway host to the address and
    port the gateway's config uses, bounded by O(timeout).
  - Read-only; nothing is sent over the connection. The role gates only the names with at least one reachable
    upstream, and names the others in its output.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  targets:
    description: The upstreams, each C(ref) (rig/instance or remote:name) and C(server) (host:port, [v6]:port).
    type: list
    elements: dict
    required: true
  timeout:
    description: Seconds for each connect.
    type: float
    default: 3.0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
"""

EXAMPLES = r"""
- name: Which upstreams answer
  rigops.fleet.llm_gateway_probe:
    targets:
      - {ref: rig-01/chat, server: "10.0.10.11:8000"}
      - {ref: "remote:hosted", server: "api.example.com:443"}
  register: probe
"""

RETURN = r"""
probed:
  description: One entry per target.
  type: list
  elements: dict
  returned: always
  sample: [{ref: rig-01/chat, server: "10.0.10.11:8000", ok: true, error: ""}]
down:
  description: The refs of the targets that did not accept a connection.
  type: list
  elements: str
  returned: always
  sample: [rig-02/chat]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.llm_gateway import probe


def main():
    module = AnsibleModule(
        argument_spec={
            "targets": {"type": "list", "elements": "dict", "required": True},
            "timeout": {"type": "float", "default": 3.0},
        },
        supports_check_mode=True,
    )
    for target in module.params["targets"]:
        if not isinstance(target.get("ref"), str) or not isinstance(target.get("server"), str):
            module.fail_json(msg=f"each target needs ref and server (host:port); got {sorted(target)}")
    results = probe(module.params["targets"], module.params["timeout"])
    module.exit_json(changed=False, probed=results, down=[r["ref"] for r in results if not r["ok"]])


if __name__ == "__main__":
    main()
