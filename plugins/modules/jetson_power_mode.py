#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: jetson_power_mode
short_description: Put a Jetson in an nvpmodel power mode, only when it is in another one
description:
  - Queries the mode in effect (C(nvpmodel -q)) and does nothing when it is O(mode).
  - Otherwise runs C(nvpmodel -m <mode>) and answers C(no) to its reboot prompt (nvpmodel asks
    C(DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:) when the mode changes what only a boot applies,
    such as the GPU partitions of Thor's 90W and 70W modes; answering C(YES) reboots the board under
    Ansible's feet).
  - When nvpmodel says the mode needs a reboot and O(reboot_allowed) is false, nothing is changed and the module
    fails with how to allow it. When it is true, the mode is recorded for the next boot in O(status_file)
    (C(pmode:<id>), what nvpmodel itself keeps there) and RV(reboot_required) tells the caller to reboot; the
    mode is then confirmed after the boot by running the module again.
  - A mode applied live is confirmed with C(nvpmodel -q).
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  mode:
    description: The nvpmodel mode id (the role maps a mode's name to its id for the board).
    type: int
    required: true
  name:
    description: The mode's name, for messages.
    type: str
    default: ""
  reboot_allowed:
    description: Record a mode that needs a reboot for the next boot (the caller reboots); false fails instead.
    type: bool
    default: false
  nvpmodel_path:
    description: nvpmodel; by default searched in E(PATH), /usr/sbin and /usr/bin.
    type: path
  status_file:
    description: Where nvpmodel keeps the mode the next boot applies.
    type: path
    default: /var/lib/nvpmodel/status
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Queries only; reports a change when the mode differs (whether it needs a reboot is not known then).
  diff_mode:
    support: none
notes:
  - Real outputs of nvpmodel, and where they come from, are in tests/fixtures/jetson/ (SOURCES.md).
"""

EXAMPLES = r"""
- name: MAXN on a Thor
  rigops.fleet.jetson_power_mode:
    mode: 0

- name: A mode that may need a reboot, allowed
  rigops.fleet.jetson_power_mode:
    mode: 2
    reboot_allowed: true
  register: power

- name: Reboot when nvpmodel asked for it
  ansible.builtin.reboot:
  when: power.reboot_required
"""

RETURN = r"""
before:
  description: The mode in effect before (C(name), C(id)).
  returned: always
  type: dict
  sample: {"name": "MAXN", "id": 0}
after:
  description: The mode in effect now (the one recorded for the next boot when RV(reboot_required)).
  returned: always
  type: dict
  sample: {"name": "120W", "id": 1}
reboot_required:
  description: The mode is recorded for the next boot; it applies only after a reboot.
  returned: always
  type: bool
  sample: false
output:
  description: What C(nvpmodel -m) printed (empty when nothing was run).
  returned: always
  type: str
  sample: "NVPM WARN: Reboot required for changing to this power mode: 2"
"""

import os
import re
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_platform import (
    nvpmodel_errors,
    parse_nvpmodel_query,
    reboot_required,
)

ENV = {"LC_ALL": "C"}


def query(module, nvpmodel):
    rc, out, err = module.run_command([nvpmodel, "-q"], environ_update=ENV)
    mode = parse_nvpmodel_query(out + "\n" + err)
    if rc != 0 or mode["id"] is None:
        module.fail_json(msg="nvpmodel -q failed (rc {}): {}".format(rc, (err or out).strip() or "no output"))
    return {"name": mode["name"], "id": mode["id"]}


def set_mode(nvpmodel, mode):
    """nvpmodel -m MODE, answering "no" to its reboot prompt. Through subprocess, not run_command: nvpmodel
    reads the answer only when it asks, a mode that switches live exits at once, and run_command then fails on
    the write to its closed stdin (EPIPE); communicate() ignores that."""
    proc = subprocess.run(
        [nvpmodel, "-m", str(mode)], input="no\n", capture_output=True, text=True,
        env=dict(os.environ, **ENV), check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def record_for_boot(module, path, mode):
    """pmode:<id> in the status file, the fan mode kept, written through a temporary file and rename(2)."""
    fmode = "quiet"
    try:
        with open(path) as fh:
            m = re.search(r"fmode:(\S+)", fh.read())
            fmode = m.group(1) if m else fmode
    except OSError:
        pass
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, 0o755)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".status.")
    with os.fdopen(fd, "w") as fh:
        fh.write(f"pmode:{mode:04d} fmode:{fmode}\n")
    os.chmod(tmp, 0o644)
    module.atomic_move(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "int", "required": True},
            "name": {"type": "str", "default": ""},
            "reboot_allowed": {"type": "bool", "default": False},
            "nvpmodel_path": {"type": "path"},
            "status_file": {"type": "path", "default": "/var/lib/nvpmodel/status"},
        },
        supports_check_mode=True,
    )
    p = module.params
    nvpmodel = p["nvpmodel_path"] or module.get_bin_path("nvpmodel", required=True, opt_dirs=["/usr/sbin", "/usr/bin"])
    before = query(module, nvpmodel)
    result = {"changed": False, "before": before, "after": before, "reboot_required": False, "output": ""}
    if before["id"] == p["mode"]:
        module.exit_json(**result)
    if module.check_mode:
        result.update(changed=True, after={"name": None, "id": p["mode"]})
        module.exit_json(**result)
    # "no" to the reboot prompt: nvpmodel then changes nothing and says why
    rc, out, err = set_mode(nvpmodel, p["mode"])
    output = (out + "\n" + err).strip()
    result["output"] = output
    needs = reboot_required(output)
    if needs is not None:
        if not p["reboot_allowed"]:
            module.fail_json(
                msg=f"power mode {p['name'] or p['mode']} (nvpmodel id {p['mode']}) needs a reboot to take effect "
                f"(nvpmodel: 'Reboot required for changing to this power mode: {needs}'); nothing was changed. Allow "
                "it with jetson_platform_reboot_allowed: true (the board reboots and its services stop meanwhile), or "
                f"choose a mode that switches live from {before['name']}.",
                **result,
            )
        record_for_boot(module, p["status_file"], p["mode"])
        result.update(changed=True, reboot_required=True, after={"name": None, "id": p["mode"]})
        module.exit_json(**result)
    if rc != 0 or nvpmodel_errors(output):
        module.fail_json(
            msg="nvpmodel -m {} failed (rc {}): {}".format(p["mode"], rc, "; ".join(nvpmodel_errors(output)) or output),
            **result,
        )
    after = query(module, nvpmodel)
    result.update(changed=True, after=after)
    if after["id"] != p["mode"]:
        module.fail_json(
            msg="nvpmodel -m {} returned 0 but the mode in effect is {}".format(p["mode"], after), **result
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
