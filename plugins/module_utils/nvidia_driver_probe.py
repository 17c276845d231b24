# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the nvidia_driver role reads from a host before it changes anything, in one call: whether it is a
Jetson, its NVIDIA PCI devices, Secure Boot, the driver packages dpkg has and holds, the kernel's modules and
the loaded nvidia module's version, and the serving units running. Parsers of each command's output, plain
data in and out (tests/unit/test_nvidia_driver_probe.py, on real captures: tests/fixtures/nvidia-driver/real).

Host side: Python 3.8 and the standard library only.
"""

import glob
import os
import re

NVIDIA_VENDOR = "0x10de"
# /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  595.45.04  <date>" or, for the
# open modules, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.45.04  Release Build ..."
PROC_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)")


def is_jetson(tegra_release_exists, device_tree_model):
    """A Jetson: L4T's release file is there, or the device tree names a Jetson."""
    return bool(tegra_release_exists) or "Jetson" in (device_tree_model or "")


def dead_proxies(proxies, connect):
    """The local proxies (``host:port``, a host in brackets for IPv6) that ``connect((host, port))`` cannot reach:
    a proxy variable that points at a dead local proxy breaks apt and every download."""
    dead = []
    for proxy in proxies:
        host, port = proxy.rpartition(":")[::2]
        try:
            connect((host.strip("[]"), int(port)))
        except (OSError, ValueError):
            dead.append(proxy)
    return dead


def parse_lsmod(text):
    """The module names of lsmod's output (its header line left out)."""
    lines = text.splitlines()
    if lines and lines[0].split()[:1] == ["Module"]:
        lines = lines[1:]
    return [line.split()[0] for line in lines if line.strip()]


def parse_proc_version(text):
    """The loaded nvidia module's version from /proc/driver/nvidia/version; "" when none is loaded."""
    match = PROC_VERSION.search(text or "")
    return match.group(1) if match else ""


def parse_sb_state(text):
    """mokutil --sb-state: "enabled", "disabled", or "unknown" (no EFI, no mokutil)."""
    if re.search(r"SecureBoot enabled", text or ""):
        return "enabled"
    if re.search(r"SecureBoot disabled", text or ""):
        return "disabled"
    return "unknown"


def parse_units(text):
    """The unit names of `systemctl list-units --plain --no-legend`."""
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def nvidia_pci_devices(sysfs_root):
    """The PCI addresses under <sysfs_root>/bus/pci/devices whose vendor is NVIDIA's."""
    found = []
    for vendor_file in sorted(glob.glob(os.path.join(sysfs_root, "bus", "pci", "devices", "*", "vendor"))):
        try:
            with open(vendor_file, encoding="ascii") as handle:
                vendor = handle.read().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR:
            found.append(os.path.basename(os.path.dirname(vendor_file)))
    return found


def read_text(path):
    """A small file's text; "" when it cannot be read (absent, no permission)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""
