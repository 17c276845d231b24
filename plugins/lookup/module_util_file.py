# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
DOCUMENTATION = r"""
name: module_util_file
author: rigops contributors (@rigops)
short_description: Where one of this collection's module_utils files lies on the controller
description:
  - Returns the path of a module_utils file of rigops.fleet that a host runs outside Ansible, so that a role
    installs it from the collection itself, wherever the collection is (a checkout or an installed artifact).
  - With O(files_in), returns instead each file as an entry of M(rigops.fleet.host_files) in that folder
    (its path there, its text, mode 0644), for a role that installs its files in one task.
  - Only the files hosts run outside Ansible are known, by name; anything else is refused.
options:
  _terms:
    description: Names of module_utils files, without C(.py).
    required: true
    type: list
    elements: str
  files_in:
    description: The folder on the host the files go to; returns M(rigops.fleet.host_files) entries.
    type: str
"""

EXAMPLES = r"""
- name: Install the launcher's logic
  ansible.builtin.copy:
    src: "{{ lookup('rigops.fleet.module_util_file', 'vllm_config') }}"
    dest: /usr/local/lib/rigops-vllm/ansible_collections/rigops/fleet/plugins/module_utils/vllm_config.py
    mode: "0644"

- name: Install the launcher and its logic in one task
  rigops.fleet.host_files:
    files: >-
      {{ query('rigops.fleet.module_util_file', 'vllm_config', 'vllm_instances',
               files_in='/usr/local/lib/rigops-vllm/ansible_collections/rigops/fleet/plugins/module_utils') }}
"""

RETURN = r"""
_raw:
  description: The path of each named file on the controller; with O(files_in), an entry of
    M(rigops.fleet.host_files) for each (path, content, mode).
  type: list
  elements: raw
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.rigops.fleet.plugins.module_utils import (
    board_thermal,
    gpu_health,
    gpu_health_sentinel,
    jetson_platform,
    jetson_tegrastats,
    llm_gateway_health_feed,
    llm_gateway_usage,
    model_weights_peer,
    model_weights_plan,
    nvidia_smi,
    state_file,
    vllm_config,
    vllm_instances,
)

# What a host runs outside Ansible: the vLLM launcher (roles/vllm_service/files/rigops-vllm-launch)
# imports vllm_config, which imports vllm_instances; the GPU health sentinel (roles/gpu_health/files/rigops-gpu-health)
# imports gpu_health_sentinel, which imports gpu_health, nvidia_smi, and for Jetson boards board_thermal,
# jetson_platform and jetson_tegrastats, and state_file; the gateway's health feed
# (roles/llm_gateway/files/rigops-llm-gateway-health) imports llm_gateway_health_feed and state_file, its usage
# service (rigops-llm-gateway-usage) llm_gateway_usage and state_file; the model peer
# (roles/model_weights/files/rigops-model-peer) model_weights_peer, which imports model_weights_plan and vllm_instances.
SHIPPED = {
    m.__name__.rsplit(".", 1)[-1]: m
    for m in (
        vllm_config,
        vllm_instances,
        gpu_health,
        gpu_health_sentinel,
        board_thermal,
        jetson_platform,
        jetson_tegrastats,
        nvidia_smi,
        state_file,
        llm_gateway_health_feed,
        llm_gateway_usage,
        model_weights_peer,
        model_weights_plan,
    )
}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        folder = self.get_option("files_in")
        found = []
        for name in terms:
            if name not in SHIPPED:
                known = ", ".join(sorted(SHIPPED))
                raise AnsibleLookupError(f"module_util_file: {name!r} is not a file hosts run; known: {known}")
            path = SHIPPED[name].__file__
            if folder:
                with open(path, encoding="utf-8") as handle:
                    found.append({"path": f"{folder.rstrip('/')}/{name}.py", "mode": "0644", "content": handle.read()})
            else:
                found.append(path)
        return found
