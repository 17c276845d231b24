#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Gather NVIDIA GPU facts from nvidia-smi
description:
  - Reads C(nvidia-smi -q -x) and
    C(nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,compute_cap,persistence_mode,pci.bus_id
    --format=csv,noheader,nounits) and returns the driver and CUDA versions and, per GPU, its index, UUID, name,
    architecture,
    compute capability, total memory, PCI bus id and persistence mode.
  - Publishes them as the C(nvidia_gpu) fact.
  - Fails with a message that tells apart "nvidia-smi is not installed" (driver missing) from "the driver is not
    loaded"
    (nvidia-smi exit code 9 or "couldn't communicate with the NVIDIA driver").
  - Can read captured output instead of running nvidia-smi (O(xml_file), O(query_file)), for support bundles.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  nvidia_smi_path:
    description:
      - Path to the nvidia-smi binary. By default it is searched in E(PATH), /usr/bin, /usr/sbin and /usr/local/bin.
    type: path
  xml_file:
    description:
      - Read captured C(nvidia-smi -q -x) output from this file on the managed host instead of running nvidia-smi.
    type: path
  query_file:
    description:
      - Read captured C(--query-gpu) CSV output (fields in the order listed in the description) from this file instead
        of running nvidia-smi.
      - When only one of O(xml_file) and O(query_file) is given, the other source is skipped (not run).
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
attributes:
  facts:
    support: full
notes:
  - The GPU C(index) is nvidia-smi's enumeration order. C(compute_capability) comes only from C(--query-gpu).
  - Commands run with C(LC_ALL=C).
seealso:
  - module: rigops.fleet.gpu_topology
"""

EXAMPLES = r"""
- name: Gather GPU facts
  rigops.fleet.nvidia_gpu_facts:

- name: Read a support bundle captured on a user's machine
  rigops.fleet.nvidia_gpu_facts:
    xml_file: /tmp/bundle/nvidia-smi-q-x.xml
    query_file: /tmp/bundle/query-gpu.csv

- name: Show the driver and GPU names
  ansible.builtin.debug:
    msg: >-
      {{ ansible_facts.nvidia_gpu.driver_version }}
      {{ ansible_facts.nvidia_gpu.gpus | map(attribute='name') | list }}
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: success
  type: dict
  contains:
    nvidia_gpu:
      description: The NVIDIA GPU facts of the host.
      returned: success
      type: dict
      contains:
        driver_version:
          description: Driver version.
          type: str
          sample: "595.45.04"
        cuda_version:
          description: Highest CUDA version the driver supports (from C(-q -x)); null when not read.
          type: str
          sample: "13.2"
        attached_gpus:
          description: The C(attached_gpus) count printed by C(-q -x); null when not read.
          type: int
          sample: 8
        gpu_count:
          description: Number of GPUs listed.
          type: int
          sample: 8
        gpus:
          description: One entry per GPU, ordered by index.
          type: list
          elements: dict
          sample:
            - index: 0
              uuid: GPU-26a733fc-0175-46d2-eaa7-e8a57ef90515
              name: NVIDIA GeForce RTX 5090
              architecture: Blackwell
              compute_capability: "12.0"
              memory_total_mib: 32607
              pci_bus_id: "0000:01:00.0"
              persistence_mode: Enabled
              persistence_enabled: true
              minor_number: 0
sources:
  description: Where the facts came from (C(command) or the file path) for each source.
  returned: always
  type: dict
  sample: {xml: command, query: command}
"""

# Ansible's module layout puts the documentation first, then the imports.
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import (
    PARSE_ENV,
    QUERY_GPU_ARGS,
    XML_ARGS,
    NvidiaSmiError,
    build_gpu_facts,
    find_nvidia_smi,
    parse_query_gpu_csv,
    parse_smi_xml,
    read_captured,
    run_nvidia_smi,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi_path=dict(type="path"),
            xml_file=dict(type="path"),
            query_file=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    module.run_command_environ_update = PARSE_ENV
    params = module.params
    sources = {}
    xml_text = query_text = None
    try:
        if params["xml_file"] or params["query_file"]:
            if params["xml_file"]:
                xml_text = read_captured(module, params["xml_file"])
                sources["xml"] = params["xml_file"]
            if params["query_file"]:
                query_text = read_captured(module, params["query_file"])
                sources["query"] = params["query_file"]
        else:
            binary = find_nvidia_smi(params["nvidia_smi_path"])
            run = module.run_command
            xml_text = run_nvidia_smi(run, binary, XML_ARGS)
            sources["xml"] = "command"
            query_text = run_nvidia_smi(run, binary, QUERY_GPU_ARGS)
            sources["query"] = "command"
        xml_data = parse_smi_xml(xml_text) if xml_text is not None else None
        csv_rows = parse_query_gpu_csv(query_text) if query_text is not None else None
    except NvidiaSmiError as exc:
        module.fail_json(msg=exc.message, reason=exc.kind, sources=sources)
    facts = build_gpu_facts(xml_data, csv_rows)
    module.exit_json(changed=False, ansible_facts={"nvidia_gpu": facts}, sources=sources)


if __name__ == "__main__":
    main()
