#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: host_files
short_description: Keep a set of files, folders and absences on a host in one task
description:
  - Judges every entry against the host (a file's text, owner, group and mode; a folder's owner, group and
    mode; a path that must be absent) and mends what differs, in the order given, so that a folder comes
    before the files in it. A role's whole set of managed paths is one task, where the file, copy and template
    modules take one task per path.
  - A file is written through a temporary file in its folder, its owner and mode set before the rename; with
    C(validate), the command checks the temporary file first and a failure leaves the old file in place.
  - A path of the wrong kind (a folder where a file should be, or a folder that should be absent) fails the
    task and is left as it is.
  - Render templates on the controller for C(content) (C(lookup('ansible.builtin.template', ...))).
    Secrets do not belong here; the entries are module arguments, shown in verbose output.
  - Logic in plugins/module_utils/host_files.py.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  files:
    description:
      - The entries, each a mapping with C(path) (absolute), C(state) (C(file), the default, C(directory) or
        C(absent)), and for a file or folder C(mode) (an octal string such as C("0644")), C(owner) and
        C(group) (names; C(root) when left out); a file's C(content) (text); a file's C(validate) (a command
        with C(%s), which stands for the new file).
      - Each path at most once.
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would change, changes nothing.
  diff_mode:
    support: full
    details: The text before and after of every file it writes or removes.
"""

EXAMPLES = r"""
- name: Kernel | Module configuration
  rigops.fleet.host_files:
    files:
      - {path: /etc/modprobe.d, state: directory, mode: "0755"}
      - path: /etc/modprobe.d/blacklist-nouveau.conf
        content: "{{ lookup('ansible.builtin.template', 'etc/modprobe.d/blacklist-nouveau.conf.j2') }}"
        mode: "0644"
      - {path: /etc/modprobe.d/nvidia.conf, state: absent}
  register: kernel_files
  notify: rebuild initramfs
"""

RETURN = r"""
changed_paths:
  description: The paths that changed (would change, in check mode), each with what differed.
  returned: always
  type: dict
  sample: {"/etc/modprobe.d/blacklist-nouveau.conf": ["content"], "/etc/modprobe.d/nvidia.conf": ["present"]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.host_files import HostFilesError, converge


def main():
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    try:
        changed, diffs = converge(module.params["files"], check_mode=module.check_mode)
    except (HostFilesError, OSError) as exc:
        module.fail_json(msg=f"host_files: {exc}")
    result = {"changed": bool(changed), "changed_paths": changed}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
