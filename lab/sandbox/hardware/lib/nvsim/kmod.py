"""Simulated kernel modules: what is installed, what is loaded, what may load.

Installed modules are marker files ``/lib/modules/<release>/.../<name>.ko`` holding
``key=value`` lines (name, version, flavour, license, signer, builddate); the stand-in
DKMS package writes them in its postinst, install-hardware writes the in-tree nouveau
and, on Jetson, the L4T ones. Loaded modules are files under ``/run/nvidia-sim/modules``
(a tmpfs in the container, so a reboot unloads everything).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from dataclasses import dataclass, field

from . import paths
from .profile import Profile

DEPS = {
    "nvidia_uvm": ["nvidia"],
    "nvidia_modeset": ["nvidia"],
    "nvidia_drm": ["nvidia_modeset"],
    "nvidia_peermem": ["nvidia"],
}
SIZES = {
    "nvidia": 14376960,
    "nvidia_uvm": 2076672,
    "nvidia_modeset": 1814528,
    "nvidia_drm": 135168,
    "nvidia_peermem": 16384,
    "nouveau": 3096576,
}
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem")


class ModError(Exception):
    """A modprobe/rmmod failure, with the tool's real message and exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def norm(name: str) -> str:
    return name.replace("-", "_")


# ---------------------------------------------------------------- installed modules
def find_module_file(name: str) -> str | None:
    base = paths.p(paths.module_dir())
    want = norm(name)
    hits = []
    for path in glob.glob(os.path.join(base, "**", "*.ko*"), recursive=True):
        stem = os.path.basename(path).split(".ko")[0]
        if norm(stem) == want:
            hits.append(path)
    if not hits:
        return None
    # like depmod: updates/ (DKMS) wins over the in-tree kernel/ copy
    hits.sort(key=lambda h: (0 if "/updates/" in h else 1, h))
    return hits[0]


def module_info(name: str) -> dict[str, str] | None:
    path = find_module_file(name)
    if not path:
        return None
    info = {"filename": "/" + os.path.relpath(path, paths.root())}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                info[k.strip()] = v.strip()
    info.setdefault("name", norm(name))
    return info


def write_module_file(relpath: str, name: str, **fields: str) -> str:
    """Write one marker .ko (used by install-hardware and by tests)."""
    path = paths.p(os.path.join(paths.module_dir(), relpath, f"{name}.ko"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = "".join(f"{k}={v}\n" for k, v in {"name": norm(name), **fields}.items())
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(body)
    return path


def install_driver_modules(version: str, flavour: str = "open", signer: str = "") -> None:
    """What the stand-in nvidia-dkms postinst does: 'build' the modules for this kernel."""
    lic = "Dual MIT/GPL" if flavour in ("open", "l4t") else "NVIDIA"
    sub = "updates/dkms" if flavour != "l4t" else "updates/opensrc-disp"
    for mod in ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem"):
        write_module_file(
            sub,
            mod,
            version=version,
            flavour=flavour,
            license=lic,
            signer=signer,
            builddate="Mon Jan 12 20:19:47 UTC 2026",
        )


# ---------------------------------------------------------------- modprobe.d config
@dataclass
class ModConfig:
    blacklist: set[str] = field(default_factory=set)
    options: dict[str, str] = field(default_factory=dict)
    install: dict[str, str] = field(default_factory=dict)


def read_config(dirs: tuple[str, ...] | None = None, prefixed: bool = True) -> ModConfig:
    cfg = ModConfig()
    files: dict[str, str] = {}
    for d in reversed(dirs or paths.MODPROBE_D):  # later (= /etc) wins for the same file name
        real = paths.p(d) if prefixed else d
        for f in sorted(glob.glob(os.path.join(real, "*.conf"))):
            files[os.path.basename(f)] = f
    for base in sorted(files):
        with open(files[base], encoding="utf-8", errors="replace") as fh:
            for raw in fh:
                line = raw.split("#", 1)[0].strip()
                parts = line.split()
                if len(parts) < 2:
                    continue
                verb, mod = parts[0], norm(parts[1])
                if verb == "blacklist":
                    cfg.blacklist.add(mod)
                elif verb == "options":
                    cfg.options[mod] = (cfg.options.get(mod, "") + " " + " ".join(parts[2:])).strip()
                elif verb == "install":
                    cfg.install[mod] = " ".join(parts[2:])
    return cfg


def initramfs_config() -> ModConfig:
    snap = paths.p(paths.INITRAMFS_SNAPSHOT)
    return read_config((snap,), prefixed=False)


def snapshot_initramfs() -> None:
    """Copy the modprobe.d configuration into the 'initramfs' (update-initramfs)."""
    snap = paths.p(paths.INITRAMFS_SNAPSHOT)
    tmp = snap + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for d in paths.MODPROBE_D:
        for f in sorted(glob.glob(os.path.join(paths.p(d), "*.conf"))):
            shutil.copy2(f, os.path.join(tmp, os.path.basename(f)))
    shutil.rmtree(snap, ignore_errors=True)
    os.rename(tmp, snap)


# ---------------------------------------------------------------- loaded modules
def loaded() -> dict[str, dict]:
    d = paths.p(paths.MODULES)
    out = {}
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            try:
                with open(os.path.join(d, name), encoding="utf-8") as fh:
                    out[name] = json.load(fh)
            except (OSError, ValueError):
                out[name] = {}
    return out


def is_loaded(name: str) -> bool:
    return os.path.exists(os.path.join(paths.p(paths.MODULES), norm(name)))


def users(name: str, state: dict[str, dict] | None = None) -> list[str]:
    state = loaded() if state is None else state
    return [m for m in state if norm(name) in DEPS.get(m, [])]


def persistenced_pid() -> int | None:
    try:
        with open(paths.p(paths.PERSISTENCED_PID), encoding="utf-8") as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid and pid_alive(pid) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _arch() -> str:
    return os.uname().machine


def _write_loaded(name: str, info: dict[str, str], params: str) -> None:
    d = paths.p(paths.MODULES)
    os.makedirs(d, exist_ok=True)
    rec = {
        "version": info.get("version", ""),
        "flavour": info.get("flavour", ""),
        "params": params,
        "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(os.path.join(d, name), "w", encoding="utf-8") as fh:
        json.dump(rec, fh)
    sysmod = paths.p(os.path.join(paths.RUN_SYSFS_MODULE, name))
    os.makedirs(os.path.join(sysmod, "parameters"), exist_ok=True)
    with open(os.path.join(sysmod, "initstate"), "w", encoding="utf-8") as fh:
        fh.write("live\n")
    for kv in params.split():
        k, _, v = kv.partition("=")
        with open(os.path.join(sysmod, "parameters", k), "w", encoding="utf-8") as fh:
            fh.write(v + "\n")
    if name == "nvidia":
        ver = info.get("version", "")
        with open(os.path.join(sysmod, "version"), "w", encoding="utf-8") as fh:
            fh.write(ver + "\n")
        os.makedirs(paths.p(paths.RUN_PROC_DRIVER), exist_ok=True)
        built = info.get("builddate", "Mon Jan 12 20:19:47 UTC 2026")
        if info.get("flavour") == "proprietary":
            line = f"NVRM version: NVIDIA UNIX {_arch()} Kernel Module  {ver}  {built}"
        else:
            line = (
                f"NVRM version: NVIDIA UNIX Open Kernel Module for {_arch()}  {ver}  Release Build  "
                f"(dvs-builder@U22-I3-AF03-09-1)  {built}"
            )
        with open(os.path.join(paths.p(paths.RUN_PROC_DRIVER), "version"), "w", encoding="utf-8") as fh:
            fh.write(line + "\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n")


def _remove_loaded(name: str) -> None:
    try:
        os.unlink(os.path.join(paths.p(paths.MODULES), name))
    except FileNotFoundError:
        pass
    shutil.rmtree(paths.p(os.path.join(paths.RUN_SYSFS_MODULE, name)), ignore_errors=True)
    if name == "nvidia":
        shutil.rmtree(paths.p(paths.RUN_PROC_DRIVER), ignore_errors=True)
        try:
            os.unlink(paths.p(paths.LEGACY_PM))  # legacy persistence dies with the module
        except FileNotFoundError:
            pass


def insert(name: str, prof: Profile | None, params: str = "") -> None:
    """insmod one module (no dependency handling). Raises ModError like modprobe would."""
    name = norm(name)
    if is_loaded(name):
        return
    info = module_info(name)
    if info is None:
        raise ModError(f"modprobe: FATAL: Module {name} not found in directory {paths.module_dir()}")
    if name == "nvidia":
        if prof is None or not (prof.all_gpus or prof.jetson):
            raise ModError("modprobe: ERROR: could not insert 'nvidia': No such device")
        if is_loaded("nouveau"):
            raise ModError("modprobe: ERROR: could not insert 'nvidia': No such device")
    if name == "nouveau" and prof is not None and is_loaded("nvidia"):
        # nouveau loads but finds the GPUs already bound: harmless, like the real one
        pass
    if (
        prof is not None
        and prof.secure_boot
        and info.get("flavour") in ("open", "proprietary")
        and not (info.get("signer") and prof.system.get("mok_enrolled", False))
    ):
        raise ModError(f"modprobe: ERROR: could not insert '{name}': Key was rejected by service")
    _write_loaded(name, info, params)


def modprobe(name: str, prof: Profile | None, cfg: ModConfig | None = None, extra_params: str = "") -> list[str]:
    """Load a module and its dependencies; return the names inserted."""
    cfg = cfg or read_config()
    name = norm(name)
    if name in cfg.install:
        cmd = cfg.install[name]
        if cmd.strip() in ("/bin/false", "/usr/bin/false", "false"):
            raise ModError(
                "modprobe: ERROR: ../libkmod/libkmod-module.c:1088 command_do() Error running install command "
                f"'{cmd}' for module {name}: retcode 1"
            )
        return []
    done = []
    for dep in DEPS.get(name, []):
        done += modprobe(dep, prof, cfg)
    if not is_loaded(name):
        insert(name, prof, (cfg.options.get(name, "") + " " + extra_params).strip())
        done.append(name)
    return done


def remove(name: str, recursive: bool = False) -> list[str]:
    """rmmod (recursive=False) or modprobe -r (recursive=True)."""
    name = norm(name)
    state = loaded()
    if name not in state:
        if recursive:
            return []
        raise ModError(f"rmmod: ERROR: Module {name} is not currently loaded")
    holders = users(name, state)
    if holders:
        tool = "modprobe: FATAL" if recursive else "rmmod: ERROR"
        raise ModError(f"{tool}: Module {name} is in use by: {' '.join(holders)}")
    if name == "nvidia" and persistenced_pid():
        tool = "modprobe: FATAL" if recursive else "rmmod: ERROR"
        raise ModError(f"{tool}: Module {name} is in use")
    _remove_loaded(name)
    out = [name]
    if recursive:
        for dep in DEPS.get(name, []):
            if dep in loaded() and not users(dep):
                try:
                    out += remove(dep, recursive=True)
                except ModError:
                    pass
    return out


def autoload_nvidia(prof: Profile | None) -> bool:
    """What nvidia-modprobe does for nvidia-smi and the daemon: load 'nvidia' if it can."""
    if is_loaded("nvidia"):
        return True
    if prof is None or is_loaded("nouveau") or module_info("nvidia") is None:
        return False
    try:
        modprobe("nvidia", prof)
    except ModError:
        return False
    return True


def loaded_driver_version() -> str | None:
    rec = loaded().get("nvidia")
    return rec.get("version") if rec else None
