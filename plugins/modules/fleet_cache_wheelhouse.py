#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: fleet_cache_wheelhouse
short_description: Fill a fleet cache's wheelhouse from a hash-locked build and lay it out as a PEP 503 index
description:
  - Downloads every wheel of O(lock) (a hash-locked requirements file on the host) from O(index_url) with the
    real pip (C(pip download --no-deps --require-hashes)) into C(<dest>/files), checks every file of the folder
    against the lock's sha256 hashes, and links each as C(<dest>/simple/<project>/<file>), so that a web server's
    directory listing is the index hosts install from (C(pip install --index-url <cache>/simple --require-hashes)).
  - A file the lock does not name is refused and named (the cache never serves what its lock does not pin).
  - A record (C(<dest>/.wheelhouse.json)) of the lock's sha256 and every file's size makes a second run read
    sizes only and change nothing.
  - Logic in plugins/module_utils/fleet_cache_wheelhouse.py.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  lock:
    description: The hash-locked requirements file on the host (every line C(name==version --hash=sha256:...)).
    type: path
    required: true
  index_url:
    description: The index the wheels come from (PEP 503 C(simple/) URL of a mirror or the build's index).
    type: str
    required: true
  dest:
    description: The build's folder in the cache's store (C(files/), C(simple/) and the record go there).
    type: path
    required: true
  python:
    description: Interpreter with pip.
    type: path
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the wheelhouse is complete; downloads and links nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: The cpu build's wheelhouse on the cache
  rigops.fleet.fleet_cache_wheelhouse:
    lock: /srv/rigops/cache/wheels/cpu/requirements.lock
    index_url: https://download.pytorch.org/whl/cpu
    dest: /srv/rigops/cache/wheels/cpu
    python: /opt/rigops/fleet-cache/venv/bin/python
"""

RETURN = r"""
files:
  description: How many wheels the wheelhouse holds.
  returned: success
  type: int
  sample: 142
projects:
  description: How many projects the index lists.
  returned: success
  type: int
  sample: 142
downloaded:
  description: Whether pip was run (something was missing).
  returned: success
  type: bool
  sample: false
"""

# Ansible's module layout puts the documentation first, then the imports.
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.fleet_cache_wheelhouse import (
    PIP_ENVIRONMENT,
    check_files,
    layout,
    lock_hashes,
    pip_download_argv,
    record,
    recorded,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "lock": {"type": "path", "required": True},
            "index_url": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "python": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode and not os.path.exists(p["lock"]):  # a first run in check mode: the lock comes first
        module.exit_json(changed=True, files=0, projects=0, downloaded=False, msg=f"{p['lock']} would be fetched first")
    try:
        with open(p["lock"]) as f:
            text = f.read()
        hashes = lock_hashes(text)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"fleet_cache: lock {p['lock']}: {exc}")
    files_dir = os.path.join(p["dest"], "files")
    if recorded(p["dest"], text):
        module.exit_json(
            changed=False, files=len(os.listdir(files_dir)), projects=len(set(hashes.values())), downloaded=False
        )
    if module.check_mode:
        module.exit_json(changed=True, files=0, projects=len(set(hashes.values())), downloaded=False)
    os.makedirs(files_dir, mode=0o755, exist_ok=True)
    check = check_files(files_dir, hashes)
    downloaded = False
    if check["missing"]:
        argv = pip_download_argv(p["python"], p["lock"], p["index_url"], files_dir)
        rc, out, err = module.run_command(argv, environ_update=dict(PIP_ENVIRONMENT))
        if rc != 0:
            lines = [line for line in (err or out).splitlines() if line.strip()]
            module.fail_json(msg=f"fleet_cache: pip download from {p['index_url']} failed: {' '.join(lines[-3:])}")
        downloaded = True
        check = check_files(files_dir, hashes)
    if check["stray"] or check["missing"]:
        module.fail_json(
            msg=f"fleet_cache: {files_dir} holds files the lock does not pin ({', '.join(check['stray'][:5])}) or "
            f"lacks projects it pins ({', '.join(check['missing'][:5])}); remove the strays and rerun",
            stray=check["stray"],
            missing=check["missing"],
        )
    layout(p["dest"], check["files"])
    record(p["dest"], text, check["files"])
    module.exit_json(
        changed=True, files=len(check["files"]), projects=len({f["project"] for f in check["files"].values()}),
        downloaded=downloaded,
    )  # fmt: skip


if __name__ == "__main__":
    main()
