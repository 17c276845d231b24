"""install-hardware: lay down what the machine's hardware and base OS provide.

Idempotent: a second run with the same profile changes nothing and says so. Writes,
under NVIDIA_SIM_ROOT (default /):

* ``/etc/nvidia-sim/sys``: simulated sysfs (``bus/pci/devices/<bdf>/{vendor,device,
  class,numa_node,local_cpulist,iommu_group}``, ``kernel/iommu_groups/<n>/devices/<bdf>``,
  ``module`` -> ``/run/nvidia-sim/sys/module``; on Jetson ``class/thermal``: the profile's
  thermal zones, trip points and cooling devices);
* ``/etc/nvidia-sim/proc``: ``device-tree/model`` on Jetson (NUL-terminated, as the real
  one), ``driver/nvidia`` -> ``/run/nvidia-sim/proc/driver/nvidia``;
* the profile's ``files`` (``/etc/nv_tegra_release``, lines in ``/etc/environment``, ...);
* stand-in commands as symlinks at the real paths (diverted with dpkg-divert, so a
  later ``apt install kmod pciutils`` cannot replace them);
* the in-tree nouveau module, and on Jetson the L4T driver modules and (per profile)
  its ``nvidia-smi``;
* ``nvidia-sim-boot.service``, enabled, then runs the boot-time module loading once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from . import commands, kmod, paths
from .profile import ProfileError, load

TOOLS = {
    "lspci": "/usr/bin/lspci",
    "modprobe": "/usr/sbin/modprobe",
    "lsmod": "/usr/sbin/lsmod",
    "rmmod": "/usr/sbin/rmmod",
    "modinfo": "/usr/sbin/modinfo",
    "update-initramfs": "/usr/sbin/update-initramfs",
    "mokutil": "/usr/bin/mokutil",
    "nvidia-sim-boot": "/usr/sbin/nvidia-sim-boot",
    "nvidia-sim-fault": "/usr/sbin/nvidia-sim-fault",
}
JETSON_TOOLS = {
    "nvpmodel": "/usr/sbin/nvpmodel",
    "jetson_clocks": "/usr/bin/jetson_clocks",
    "tegrastats": "/usr/bin/tegrastats",
}
UNIT = "nvidia-sim-boot.service"

SMI_WRAPPER = """#!/usr/bin/python3
# nvidia-smi as shipped inside L4T on this simulated Jetson (written by install-hardware).
import sys

PACKAGE = {package!r}
sys.path.insert(0, PACKAGE["lib"])
from nvsim import smi  # noqa: E402

sys.exit(smi.main(sys.argv[1:], PACKAGE))
"""


class Changes:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, what: str) -> None:
        self.items.append(what)


def _write(rel: str, content: str | bytes, ch: Changes, mode: int = 0o644) -> None:
    path = paths.p(rel)
    data = content.encode() if isinstance(content, str) else content
    try:
        with open(path, "rb") as fh:
            same = fh.read() == data
    except OSError:
        same = False
    if not same:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".nvsim-tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
        ch.add(rel)
    if (os.stat(path).st_mode & 0o7777) != mode:
        os.chmod(path, mode)
        ch.add(rel + " (mode)")


def _symlink(rel: str, target: str, ch: Changes) -> None:
    path = paths.p(rel)
    if os.path.islink(path) and os.readlink(path) == target:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.symlink(target, path)
    ch.add(rel)


def _rel_link(from_rel: str, to_rel: str) -> str:
    return os.path.relpath("/" + to_rel.lstrip("/"), os.path.dirname("/" + from_rel.lstrip("/")))


def sync_tree(base_rel: str, manifest: dict[str, tuple[str, str | bytes]], ch: Changes) -> None:
    """Make base_rel hold exactly the manifest (relpath -> ("file", data) | ("link", target))."""
    base = paths.p(base_rel)
    for rel, (kind, value) in sorted(manifest.items()):
        full_rel = os.path.join(base_rel, rel)
        if kind == "file":
            _write(full_rel, value, ch)
        else:
            _symlink(full_rel, str(value), ch)
    wanted = set(manifest)
    parents = {os.path.dirname(r) for r in wanted}
    while parents:
        wanted |= parents
        parents = {os.path.dirname(r) for r in parents if r} - wanted
    for dirpath, dirnames, filenames in os.walk(base, topdown=False):
        for name in filenames + dirnames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base)
            if rel not in wanted:
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)
                ch.add(os.path.join(base_rel, rel) + " (removed)")


def sysfs_manifest(prof) -> dict[str, tuple[str, str | bytes]]:
    m: dict[str, tuple[str, str | bytes]] = {}
    groups = prof.iommu_groups()
    for bdf, d in prof.pci.items():
        dev = f"bus/pci/devices/{bdf}"
        numa = prof.numa_of(bdf) if len(prof.numa) > 1 else -1
        m[f"{dev}/vendor"] = ("file", f"0x{d.vendor}\n")
        m[f"{dev}/device"] = ("file", f"0x{d.device}\n")
        m[f"{dev}/class"] = ("file", f"0x{d.class_code}00\n")
        m[f"{dev}/numa_node"] = ("file", f"{numa}\n")
        cpus = str(prof.numa.get(prof.numa_of(bdf), {}).get("cpus", "")) or "0"
        m[f"{dev}/local_cpulist"] = ("file", cpus + "\n")
        if d.kind in ("root_port", "switch_downstream") and d.acs_ctl:
            # not a real sysfs file: the ACS control word lspci -vvv would print
            m[f"{dev}/nvidia_sim_acs_ctl"] = ("file", d.acs_ctl + "\n")
        if bdf in groups:
            g = groups[bdf]
            m[f"{dev}/iommu_group"] = ("link", f"../../../../kernel/iommu_groups/{g}")
            m[f"kernel/iommu_groups/{g}/devices/{bdf}"] = ("link", f"../../../../bus/pci/devices/{bdf}")
    m["module"] = ("link", _rel_link(paths.SYSFS + "/module", paths.RUN_SYSFS_MODULE))
    m.update(thermal_manifest(prof))
    return m


def thermal_manifest(prof) -> dict[str, tuple[str, str | bytes]]:
    """A Jetson's thermal zones and cooling devices (profile ``jetson.thermal``) as the thermal framework
    lays them out under class/thermal: ``thermal_zoneN/{type,trip_point_K_temp,trip_point_K_type}`` and,
    per binding, ``cdevJ`` (a link to the cooling device) with ``cdevJ_trip_point``. The temperatures are
    tegrastats' (nvidia-sim-fault thermal raises them there), not these files'."""
    thermal = (prof.jetson or {}).get("thermal") or {}
    devices = list(thermal.get("cooling_devices") or [])
    m: dict[str, tuple[str, str | bytes]] = {}
    for i, device in enumerate(devices):
        base = f"class/thermal/cooling_device{i}"
        m[f"{base}/type"] = ("file", device + "\n")
        m[f"{base}/cur_state"] = ("file", "0\n")
        m[f"{base}/max_state"] = ("file", "1\n")
    for z, zone in enumerate(thermal.get("zones") or []):
        base = f"class/thermal/thermal_zone{z}"
        m[f"{base}/type"] = ("file", zone["type"] + "\n")
        binding = 0
        for k, (millis, kind, bound) in enumerate(zone.get("trips") or []):
            m[f"{base}/trip_point_{k}_temp"] = ("file", f"{int(millis)}\n")
            m[f"{base}/trip_point_{k}_type"] = ("file", f"{kind}\n")
            for device in bound:
                m[f"{base}/cdev{binding}"] = ("link", f"../cooling_device{devices.index(device)}")
                m[f"{base}/cdev{binding}_trip_point"] = ("file", f"{k}\n")
                binding += 1
    return m


def procfs_manifest(prof) -> dict[str, tuple[str, str | bytes]]:
    m: dict[str, tuple[str, str | bytes]] = {
        "driver/nvidia": ("link", _rel_link(paths.PROCFS + "/driver/nvidia", paths.RUN_PROC_DRIVER)),
    }
    if prof.jetson:
        m["device-tree/model"] = ("file", prof.jetson["model"].encode() + b"\0")
        # NUL-separated strings, most specific first, each NUL-terminated (like the real file)
        compat = prof.jetson.get("compatible", ["nvidia,p3971-0000+p3834-0008", "nvidia,tegra264"])
        compat = compat if isinstance(compat, list) else [compat]
        m["device-tree/compatible"] = ("file", b"".join(c.encode() + b"\0" for c in compat))
    return m


def _profile_files(prof, ch: Changes) -> None:
    for f in prof.data.get("files") or []:
        rel = f["path"]
        if "content" in f:
            _write(rel, f["content"], ch, int(str(f.get("mode", "0644")), 8))
        elif "line" in f:
            path = paths.p(rel)
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            except FileNotFoundError:
                text = ""
            if f["line"] not in text.splitlines():
                if text and not text.endswith("\n"):
                    text += "\n"
                _write(rel, text + f["line"] + "\n", ch, int(str(f.get("mode", "0644")), 8))


def _divert(target: str) -> None:
    """Keep a later package's real binary from replacing our stand-in."""
    if paths.root() != "/" or not shutil.which("dpkg-divert"):
        return
    listed = subprocess.run(["dpkg-divert", "--listpackage", target], capture_output=True, text=True, check=False)
    if listed.stdout.strip() == "LOCAL":
        return
    subprocess.run(
        ["dpkg-divert", "--local", "--no-rename", "--divert", target + ".distrib", "--add", target],
        capture_output=True,
        check=False,
    )


def _tools(prof, hw_dir: str, ch: Changes) -> None:
    wanted = dict(TOOLS)
    if prof.jetson:
        wanted.update(JETSON_TOOLS)
    if prof.data.get("dcgm"):  # NVIDIA's DCGM installed (datacenter-gpu-manager-4): its client, dcgmi
        wanted["dcgmi"] = "/usr/bin/dcgmi"
    for name, target in wanted.items():
        _divert(target)
        _symlink(target, os.path.join(hw_dir, "bin", name), ch)


def _modules(prof, hw_dir: str, ch: Changes) -> None:
    nouveau = os.path.join(paths.module_dir(), "kernel/drivers/gpu/drm/nouveau/nouveau.ko")
    body = (
        f"name=nouveau\nversion={paths.kernel_release()}\nflavour=in-tree\nlicense=GPL and additional rights\n"
        "signer=Debian Secure Boot CA\n"
    )
    _write(nouveau, body, ch)
    j = prof.jetson
    if not j:
        return
    ver = j.get("driver_version", "580.00")
    before = kmod.module_info("nvidia")
    if not before or before.get("version") != ver:
        kmod.install_driver_modules(ver, flavour="l4t", signer="NVIDIA L4T")
        ch.add("L4T kernel modules")
    # modules of the board's own driver stack (Orin's nvgpu) beside the OpenRM set
    for name in j.get("boot_modules") or []:
        if kmod.module_info(name) is None:
            kmod.write_module_file(
                "updates/opensrc-disp", name, version=ver, flavour="l4t", license="GPL", signer="NVIDIA L4T"
            )
            ch.add(f"L4T kernel module {name}")
    if j.get("nvidia_smi"):
        package = {
            "driver_version": ver,
            "cuda_version": j.get("cuda_version", "13.0"),
            "lib": os.path.join(hw_dir, "lib"),
            "flavour": "l4t",
        }
        _write("/usr/bin/nvidia-smi", SMI_WRAPPER.format(package=package), ch, 0o755)


def _unit(hw_dir: str, ch: Changes) -> None:
    with open(os.path.join(hw_dir, "systemd", UNIT), encoding="utf-8") as fh:
        _write(f"/etc/systemd/system/{UNIT}", fh.read(), ch)
    _symlink(f"/etc/systemd/system/sysinit.target.wants/{UNIT}", f"/etc/systemd/system/{UNIT}", ch)


def install(hw_dir: str, run_boot: bool = True) -> Changes:
    prof = load()
    ch = Changes()
    for d in (paths.RUN, paths.VAR_LIB, os.path.dirname(paths.INITRAMFS_LOG)):
        os.makedirs(paths.p(d), exist_ok=True)
    sync_tree(paths.SYSFS, sysfs_manifest(prof), ch)
    sync_tree(paths.PROCFS, procfs_manifest(prof), ch)
    _profile_files(prof, ch)
    _tools(prof, hw_dir, ch)
    _modules(prof, hw_dir, ch)
    _unit(hw_dir, ch)
    if not os.path.isdir(paths.p(paths.INITRAMFS_SNAPSHOT)):
        kmod.snapshot_initramfs()  # the initramfs the OS image shipped with (not a logged run)
        ch.add("initramfs snapshot")
    if paths.root() == "/" and os.path.isdir("/run/systemd/system") and shutil.which("systemctl"):
        if any(c.startswith("/etc/systemd/system/") for c in ch.items):
            subprocess.run(["systemctl", "daemon-reload"], check=False)
    booted = paths.p(os.path.join(paths.RUN, "booted"))
    if run_boot and not os.path.exists(booted):
        commands.boot_main([])
        ch.add("boot-time module loading")
    return ch


def main(argv: list[str], hw_dir: str) -> int:
    quiet = "-q" in argv
    try:
        ch = install(hw_dir, run_boot="--no-boot" not in argv)
    except ProfileError as e:
        sys.stderr.write(f"install-hardware: {e}\n")
        return 1
    if not quiet:
        state = "changed" if ch.items else "unchanged"
        shown = ch.items if "-v" in argv else ch.items[:12]
        more = f"  ... and {len(ch.items) - len(shown)} more (-v lists all)\n" if len(shown) < len(ch.items) else ""
        sys.stdout.write(f"install-hardware: {state}\n" + "".join(f"  {c}\n" for c in shown) + more)
    return 0
