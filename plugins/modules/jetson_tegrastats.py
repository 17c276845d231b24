#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: jetson_tegrastats
short_description: One tegrastats sample of a Jetson as facts (RAM, swap, CPU, GPU load, temperatures, power)
description:
  - Starts C(tegrastats --interval <ms>), reads its first line, stops it (tegrastats prints until it is stopped)
    and parses the line.
  - Publishes the C(jetson_health) fact; read-only.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  tegrastats_path:
    description: tegrastats; by default searched in E(PATH), /usr/bin and /usr/sbin.
    type: path
  interval:
    description: Milliseconds between tegrastats' samples (the first one comes after about this long).
    type: int
    default: 1000
  timeout:
    description: Seconds to wait for the first line.
    type: int
    default: 15
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
attributes:
  facts:
    support: full
notes:
  - Layouts differ between boards and JetPack releases (AGX Orin prints SWAP, EMC and GR3D loads; Thor on JetPack
    7.0 prints no SWAP and GPU clocks without a load); a field a board does not print is null. The parser is
    plugins/module_utils/jetson_platform.py, tested on real lines (tests/fixtures/jetson/tegrastats/).
"""

EXAMPLES = r"""
- name: One health sample
  rigops.fleet.jetson_tegrastats:
  register: health
"""

RETURN = r"""
line:
  description: The line tegrastats printed.
  returned: always
  type: str
  sample: "08-07-2026 17:50:34 RAM 42435/125772MB (lfb 5x4MB) CPU [7%@972] cpu@52.906C tj@56.906C gpu@56.5C ..."
ansible_facts:
  description: The C(jetson_health) fact.
  returned: always
  type: complex
  contains:
    jetson_health:
      description:
        - C(sample) (every parsed field, plugins/module_utils/jetson_platform.py parse_tegrastats) and C(summary)
          (C(ram_used_mb), C(ram_total_mb), C(swap_used_mb), C(swap_total_mb), C(cpu_load_percent),
          C(gpu_load_percent), C(gpu_temp_c), C(max_temp_c), C(input_power_mw)).
      type: dict
      returned: always
      sample: {"summary": {"ram_used_mb": 42435, "ram_total_mb": 125772, "swap_used_mb": null,
                           "swap_total_mb": null, "cpu_load_percent": 7.0, "gpu_load_percent": null,
                           "gpu_temp_c": 56.5, "max_temp_c": 56.906, "input_power_mw": 68862}}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_platform import health_summary, parse_tegrastats
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_tegrastats import first_line


def main():
    module = AnsibleModule(
        argument_spec={
            "tegrastats_path": {"type": "path"},
            "interval": {"type": "int", "default": 1000},
            "timeout": {"type": "int", "default": 15},
        },
        supports_check_mode=True,
    )
    p = module.params
    binary = p["tegrastats_path"] or module.get_bin_path(
        "tegrastats", required=True, opt_dirs=["/usr/bin", "/usr/sbin"]
    )
    line, error = first_line([binary, "--interval", str(p["interval"])], p["timeout"])
    if line is None:
        module.fail_json(msg=f"tegrastats printed nothing: {error}")
    sample = parse_tegrastats(line)
    if sample is None:
        module.fail_json(msg=f"tegrastats printed a line without a RAM field: {line[:300]!r}", line=line)
    module.exit_json(
        changed=False, line=line, ansible_facts={"jetson_health": {"sample": sample, "summary": health_summary(sample)}}
    )


if __name__ == "__main__":
    main()
