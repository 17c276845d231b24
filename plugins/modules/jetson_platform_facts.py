#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: jetson_platform_facts
short_description: Identify a Jetson board, its L4T/JetPack release and its power mode
description:
  - Reads C(/etc/nv_tegra_release) (L4T release, revision, board, date; the JetPack release it belongs to),
    C(/proc/device-tree/model) and C(/proc/device-tree/compatible) (board family, module part number, the key
    of its power-mode table), C(nvpmodel -q) (the power mode in effect), the Python of O(python),
    C(/proc/meminfo) and C(/proc/swaps).
  - Publishes them as the C(jetson_platform) fact. A machine without any of the Jetson files gets
    C(is_jetson=false) and no failure.
  - "The paths are options because a container cannot fake C(/proc/device-tree): the sandbox reads a copy."
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  release_file:
    description: The L4T release file.
    type: path
    default: /etc/nv_tegra_release
  model_file:
    description: The device tree's model (NUL-terminated).
    type: path
    default: /proc/device-tree/model
  compatible_file:
    description: The device tree's compatible strings (NUL-separated).
    type: path
    default: /proc/device-tree/compatible
  nvpmodel_path:
    description:
      - nvpmodel; by default searched in E(PATH), /usr/sbin and /usr/bin. Absent on a machine that is not a
        Jetson.
    type: path
  python:
    description: The interpreter whose version is reported (the base Python of the runtime's venvs).
    type: path
    default: /usr/bin/python3
  swap_file:
    description: A swap file whose size, swap signature and filesystem type are reported (RV(ansible_facts)).
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
  - The parsing is plugins/module_utils/jetson_platform.py, tested on real outputs (tests/fixtures/jetson/).
"""

EXAMPLES = r"""
- name: What this board is
  rigops.fleet.jetson_platform_facts:

- name: The sandbox's copy of the device tree
  rigops.fleet.jetson_platform_facts:
    model_file: /etc/nvidia-sim/proc/device-tree/model
    compatible_file: /etc/nvidia-sim/proc/device-tree/compatible
"""

RETURN = r"""
ansible_facts:
  description: The C(jetson_platform) fact.
  returned: always
  type: complex
  contains:
    jetson_platform:
      description:
        - C(is_jetson), C(release) (L4T C(l4t), C(l4t_release), C(jetpack), C(jetpack_major), C(jetpack_exact),
          C(gcid), C(board), C(date), C(kernel_variant); null without the file), C(board) (C(family), C(key),
          C(label), C(soc), C(sku), C(model)), C(power_mode) (C(name), C(id), C(errors); null without nvpmodel),
          C(python), C(mem_total_mb), C(swaps) (the lines of C(/proc/swaps)), C(swap_file) (C(path), C(bytes)
          (null when absent), C(signature) (a swap signature is in its first page), C(fstype) of its folder).
      type: dict
      returned: always
      sample: {"is_jetson": true, "release": {"l4t": "38.2.0", "l4t_release": "R38.2.0", "jetpack": "7.0",
               "jetpack_major": 7, "jetpack_exact": true, "board": "generic"},
               "board": {"family": "thor", "key": "agx-thor", "label": "Jetson AGX Thor (T5000)",
                         "soc": "tegra264", "sku": "p3834-0008", "model": "NVIDIA Jetson AGX Thor Developer Kit"},
               "power_mode": {"name": "MAXN", "id": 0, "errors": []}, "python": "3.12.3",
               "mem_total_mb": 125772, "swaps": []}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_platform import (
    identify_board,
    parse_device_tree_model,
    parse_nv_tegra_release,
    parse_nvpmodel_query,
    parse_proc_swaps,
    split_compatible,
)


def read(path, binary=False):
    try:
        with open(path, "rb" if binary else "r") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def fstype_of(path):
    """Filesystem type of the mount that holds ``path`` (the longest mount point above it)."""
    best, kind = "", None
    for line in (read("/proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) > 2:
            mount = parts[1].replace("\\040", " ")
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, parts[2]
    return kind


def swap_file_facts(path):
    out = {"path": path, "bytes": None, "signature": False, "fstype": fstype_of(os.path.dirname(path) or "/")}
    try:
        out["bytes"] = os.path.getsize(path)
        page = os.sysconf("SC_PAGE_SIZE")
        with open(path, "rb") as fh:
            fh.seek(page - 10)
            out["signature"] = fh.read(10) in (b"SWAPSPACE2", b"SWAP-SPACE")
    except OSError:
        pass
    return out


def mem_total_mb():
    text = read("/proc/meminfo") or ""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def main():
    module = AnsibleModule(
        argument_spec={
            "release_file": {"type": "path", "default": "/etc/nv_tegra_release"},
            "model_file": {"type": "path", "default": "/proc/device-tree/model"},
            "compatible_file": {"type": "path", "default": "/proc/device-tree/compatible"},
            "nvpmodel_path": {"type": "path"},
            "python": {"type": "path", "default": "/usr/bin/python3"},
            "swap_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    release_text = read(p["release_file"])
    release = parse_nv_tegra_release(release_text) if release_text else None
    model = parse_device_tree_model(read(p["model_file"], binary=True) or b"")
    compatible = split_compatible(read(p["compatible_file"], binary=True) or b"")
    board = identify_board(model, compatible)
    nvpmodel = p["nvpmodel_path"] or module.get_bin_path("nvpmodel", opt_dirs=["/usr/sbin", "/usr/bin"])
    power = None
    if nvpmodel and os.path.exists(nvpmodel):
        rc, out, err = module.run_command([nvpmodel, "-q"], environ_update={"LC_ALL": "C"})
        power = parse_nvpmodel_query(out + "\n" + err)
        power["rc"] = rc
    python = None
    if os.path.exists(p["python"]):
        rc, out, _err = module.run_command([p["python"], "-c", "import platform; print(platform.python_version())"])
        python = out.strip() if rc == 0 else None
    facts = {
        "is_jetson": bool(release or board["family"] in ("thor", "orin", "xavier", "tx2", "nano") or power),
        "release": release,
        "board": board,
        "power_mode": power,
        "python": python,
        "mem_total_mb": mem_total_mb(),
        "swaps": parse_proc_swaps(read("/proc/swaps") or ""),
        "swap_file": swap_file_facts(p["swap_file"]) if p["swap_file"] else None,
        "release_file": p["release_file"],
        "model_file": p["model_file"],
    }
    module.exit_json(changed=False, ansible_facts={"jetson_platform": facts})


if __name__ == "__main__":
    main()
