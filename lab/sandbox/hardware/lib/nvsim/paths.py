"""Every path the simulation reads or writes, relative to NVIDIA_SIM_ROOT.

``NVIDIA_SIM_ROOT`` (default ``/``) prefixes every path, so the tools and
``install-hardware`` can run against a scratch directory in unit tests without
touching the host. Nothing else in nvsim builds an absolute path by hand.
"""

from __future__ import annotations

import os

# Hardware description copied in by the sandbox fleet (lab/sandbox/profiles/<name>.yaml).
PROFILE = "/etc/nvidia-sim/profile.yaml"
# Static simulated kernel views, written by install-hardware.
SIM_ETC = "/etc/nvidia-sim"
SYSFS = "/etc/nvidia-sim/sys"  # bus/pci/devices, kernel/iommu_groups, module -> /run/...
PROCFS = "/etc/nvidia-sim/proc"  # device-tree/model (Jetson), driver -> /run/...
# Runtime state: /run is a tmpfs, so a container restart (= reboot) clears it.
RUN = "/run/nvidia-sim"
MODULES = "/run/nvidia-sim/modules"  # one file per loaded module
RUN_SYSFS_MODULE = "/run/nvidia-sim/sys/module"  # <name>/version, <name>/initstate
RUN_PROC_DRIVER = "/run/nvidia-sim/proc/driver/nvidia"  # version (as /proc/driver/nvidia/version)
LEGACY_PM = "/run/nvidia-sim/persistence-legacy.json"  # `nvidia-smi -pm 1` without the daemon
DAEMON_STATE = "/run/nvidia-sim/persistenced.json"  # what the running daemon holds
USAGE = "/run/nvidia-sim/usage.yaml"  # optional per-GPU memory.used / utilization.gpu
JETSON_CLOCKS = "/run/nvidia-sim/jetson_clocks.json"
# nvpmodel: the mode set since boot (a reboot clears it and the status file applies again)
NVPMODEL_ACTIVE = "/run/nvidia-sim/nvpmodel-active"
BOOT_LOG = "/run/nvidia-sim/boot.log"
FAULTS = "/run/nvidia-sim/faults.json"  # faults in effect (nvidia-sim-fault); a reboot clears them
# The real daemon's PID file and directory.
PERSISTENCED_DIR = "/run/nvidia-persistenced"
PERSISTENCED_PID = "/run/nvidia-persistenced/nvidia-persistenced.pid"
# Persistent (survives reboot) simulated state.
VAR_LIB = "/var/lib/nvidia-sim"
INITRAMFS_SNAPSHOT = "/var/lib/nvidia-sim/initramfs/modprobe.d"  # blacklist seen by early boot
INITRAMFS_LOG = "/var/log/nvidia-sim/initramfs.log"
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"
ECC_AGGREGATE = "/var/lib/nvidia-sim/ecc-aggregate.json"  # lifetime ECC counts, remapped rows (InfoROM)
# The kernel's Xid lines (NVRM), in `journalctl -k` short format; nvidia-sim-boot empties it.
KERNEL_LOG = "/var/log/nvidia-sim/kern.log"
# Real configuration the tools honour.
MODPROBE_D = ("/etc/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d", "/run/modprobe.d")
MODULES_LOAD_D = ("/etc/modules-load.d", "/usr/lib/modules-load.d", "/run/modules-load.d")
MODULES_FILE = "/etc/modules"


def root() -> str:
    return os.environ.get("NVIDIA_SIM_ROOT") or "/"


def p(path: str) -> str:
    """Map an absolute path of the simulated machine to where it lives here."""
    return os.path.join(root(), path.lstrip("/"))


def kernel_release() -> str:
    return os.environ.get("NVIDIA_SIM_KERNEL_RELEASE") or os.uname().release


def module_dir() -> str:
    return f"/lib/modules/{kernel_release()}"


def euid() -> int:
    """Effective uid; NVIDIA_SIM_FAKE_EUID lets unit tests play a normal user."""
    fake = os.environ.get("NVIDIA_SIM_FAKE_EUID")
    return int(fake) if fake not in (None, "") else os.geteuid()


def profile_path() -> str:
    return os.environ.get("NVIDIA_SIM_PROFILE") or p(PROFILE)
