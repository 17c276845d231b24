#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: nvidia_driver_probe
short_description: Read what a host's NVIDIA driver stands on, in one call, changing nothing
description:
  - Reads whether the host is a Jetson (L4T's release file, or a Jetson device-tree model), its NVIDIA PCI
    devices (vendor 0x10de in sysfs), the Secure Boot state (C(mokutil --sb-state)), the driver packages dpkg
    has installed and every package it holds (C(dpkg-query)), the kernel's loaded modules (C(lsmod)), the loaded
    nvidia module's version (C(/proc/driver/nvidia/version)), and the serving units that run now
    (C(systemctl list-units)).
  - What the nvidia_driver role needs before it changes anything, read once; each of its tasks then reads the
    result instead of probing again.
  - A command that is missing (no mokutil, no systemd) or a file that is absent reads as empty, never as a
    failure.
  - Logic in plugins/module_utils/nvidia_driver_probe.py.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  package_regex:
    description: The names of the packages that are "the driver" of some branch (a Python regular expression).
    type: str
    required: true
  serving_units_pattern:
    description: The units that serve from the GPUs (a C(systemctl list-units) pattern).
    type: str
    default: vllm@*.service
  sysfs_root:
    description: Where sysfs is mounted.
    type: path
    default: /sys
  proc_version_file:
    description: The loaded nvidia module's version file.
    type: path
    default: /proc/driver/nvidia/version
  tegra_release_file:
    description: L4T's release file, present on a Jetson.
    type: path
    default: /etc/nv_tegra_release
  device_tree_model_file:
    description: The device tree's model, which names a Jetson board.
    type: path
    default: /proc/device-tree/model
  other_packages:
    description: Packages besides the driver whose installed versions to report (build prerequisites, a pin).
    type: list
    elements: str
    default: []
  proxies:
    description:
      - Local proxies (C(host:port)) the host's environment names; each one nothing listens on is returned and
        warned about (apt, pip and hub downloads through it fail). A warning, not a failure, it may be wanted.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reads only; the same in check mode.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Preflight | What the host is and has
  rigops.fleet.nvidia_driver_probe:
    package_regex: '^(nvidia-driver-[0-9]+(-open|-server|-server-open)?|nvidia-open|cuda-drivers)$'
  register: nvidia_driver__probe
"""

RETURN = r"""
jetson:
  description: Whether the host is a Jetson.
  returned: always
  type: bool
  sample: false
pci_devices:
  description: The PCI addresses of the NVIDIA devices.
  returned: always
  type: list
  elements: str
  sample: ["0000:01:00.0", "0000:41:00.0"]
secure_boot:
  description: C(enabled), C(disabled), or C(unknown) (no EFI variables, no mokutil).
  returned: always
  type: str
  sample: disabled
packages:
  description: The installed driver packages (those C(package_regex) matches) and their versions.
  returned: always
  type: dict
  sample: {"nvidia-driver-595-open": "595.45.04-0ubuntu1"}
other_packages:
  description: Of O(other_packages), those installed and their versions.
  returned: always
  type: dict
  sample: {"dkms": "3.0.10-8+deb12u1"}
dead_proxies:
  description: Of O(proxies), those nothing listens on (each is warned about).
  returned: always
  type: list
  elements: str
  sample: ["127.0.0.1:7890"]
holds:
  description: Every package dpkg holds.
  returned: always
  type: list
  elements: str
  sample: ["nvidia-driver-595-open"]
loaded_modules:
  description: The kernel's loaded modules.
  returned: always
  type: list
  elements: str
  sample: ["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia"]
loaded_version:
  description: The loaded nvidia module's version, "" when none is loaded.
  returned: always
  type: str
  sample: 595.45.04
serving_units:
  description: The serving units (C(serving_units_pattern)) active now.
  returned: always
  type: list
  elements: str
  sample: ["vllm@chat.service"]
"""

import os
import socket

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.dpkg import DPKG_FORMAT, names_regex, parse_dpkg
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_driver_probe import (
    dead_proxies,
    is_jetson,
    nvidia_pci_devices,
    parse_lsmod,
    parse_proc_version,
    parse_sb_state,
    parse_units,
    read_text,
)


def output(module, name, *args):
    """A command's standard output (LC_ALL=C); "" when the command is missing."""
    path = module.get_bin_path(name)
    if not path:
        return ""
    _rc, out, err = module.run_command([path, *args], environ_update={"LC_ALL": "C"})
    # mokutil writes "EFI variables are not supported on this system" to stderr
    return out + err if name == "mokutil" else out


def main():
    module = AnsibleModule(
        argument_spec={
            "package_regex": {"type": "str", "required": True},
            "serving_units_pattern": {"type": "str", "default": "vllm@*.service"},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "proc_version_file": {"type": "path", "default": "/proc/driver/nvidia/version"},
            "tegra_release_file": {"type": "path", "default": "/etc/nv_tegra_release"},
            "device_tree_model_file": {"type": "path", "default": "/proc/device-tree/model"},
            "other_packages": {"type": "list", "elements": "str", "default": []},
            "proxies": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    dpkg = output(module, "dpkg-query", "--show", "--showformat", DPKG_FORMAT)
    packages, holds = parse_dpkg(dpkg, p["package_regex"])
    units = output(
        module, "systemctl", "list-units", "--state=active", "--plain", "--no-legend", p["serving_units_pattern"]
    )
    others = parse_dpkg(dpkg, names_regex(p["other_packages"]))[0]
    jetson = is_jetson(os.path.exists(p["tegra_release_file"]), read_text(p["device_tree_model_file"]))
    if jetson:
        module.warn("a Jetson: its GPU driver comes with L4T/JetPack, so nvidia_driver changes nothing here")
    dead = dead_proxies(p["proxies"], lambda address: socket.create_connection(address, timeout=2).close())
    for proxy in dead:
        module.warn(
            f"a proxy is set at {proxy} but nothing listens there; apt, pip and hub downloads will fail with "
            '"proxy failed". Start the proxy or remove the variable.'
        )
    module.exit_json(
        changed=False,
        jetson=jetson,
        pci_devices=nvidia_pci_devices(p["sysfs_root"]),
        secure_boot=parse_sb_state(output(module, "mokutil", "--sb-state")),
        packages=packages,
        other_packages=others,
        holds=holds,
        loaded_modules=parse_lsmod(output(module, "lsmod")),
        loaded_version=parse_proc_version(read_text(p["proc_version_file"])),
        serving_units=parse_units(units),
        dead_proxies=dead,
    )


if __name__ == "__main__":
    main()
