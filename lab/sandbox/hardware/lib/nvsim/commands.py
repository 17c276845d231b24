"""Stand-ins for the kernel-facing commands a container cannot run for real.

Each ``*_main(argv) -> int`` is one command: lspci, modprobe, lsmod, rmmod, modinfo,
update-initramfs, mokutil, nvpmodel, jetson_clocks, tegrastats, the boot-time module loading
of ``nvidia-sim-boot``, and the sandbox's fault injection ``nvidia-sim-fault`` (nvsim.faults).
``lab/sandbox/hardware/bin/<command>`` dispatches here.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time

from . import faults, kmod, paths
from .profile import CLASS_NAMES, PciDev, Profile, load_or_none


def _out(text: str) -> None:
    sys.stdout.write(text)


def _err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


# ---------------------------------------------------------------- lspci
LSPCI_CONTROL = (
    "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR- FastB2B- DisINTx+"
)
LSPCI_STATUS = "\tStatus: Cap+ 66MHz- UDF- FastB2B- ParErr- DEVSEL=fast >TAbort- <TAbort- <MAbort- >SERR- <PERR- INTx-"
_REV = re.compile(r"^(.*?)(?: \((rev [0-9a-f]+)\))?$")


def _lspci_driver(prof: Profile, d: PciDev) -> tuple[str | None, str | None]:
    if d.vendor == "10de" and d.class_code.startswith("03"):
        mods = "nvidiafb, nouveau, nvidia_drm, nvidia" if kmod.module_info("nvidia") else "nvidiafb, nouveau"
        if kmod.is_loaded("nvidia"):
            return "nvidia", mods
        if kmod.is_loaded("nouveau"):
            return "nouveau", mods
        return None, mods
    if d.kind in ("root_port", "switch_upstream", "switch_downstream"):
        return "pcieport", None
    if d.kind == "nic":
        return "mlx5_core", "mlx5_core"
    if d.kind == "audio":
        return "snd_hda_intel", "snd_hda_intel"
    return None, None


def _express_type(d: PciDev) -> str:
    return {
        "root_port": "Root Port (Slot+)",
        "switch_upstream": "Upstream Port",
        "switch_downstream": "Downstream Port (Slot+)",
    }.get(d.kind, "Endpoint")


def lspci_main(argv: list[str]) -> int:
    verbose = 0
    numeric = 0
    domains = False
    kernel = False
    vendor_filter: str | None = None
    slot_filter: str | None = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if re.fullmatch(r"-v+", a):
            verbose = max(verbose, len(a) - 1)
        elif a == "-nn":
            numeric = 2
        elif a == "-n":
            numeric = max(numeric, 1)
        elif a == "-D":
            domains = True
        elif a == "-k":
            kernel = True
        elif a in ("-d", "-s"):
            if i + 1 >= len(argv):
                _err(f"lspci: option requires an argument -- '{a[1]}'")
                return 2
            if a == "-d":
                vendor_filter = argv[i + 1]
            else:
                slot_filter = argv[i + 1]
            i += 1
        elif a.startswith("-d") and len(a) > 2:
            vendor_filter = a[2:]
        elif a.startswith("-s") and len(a) > 2:
            slot_filter = a[2:]
        elif a in ("-q", "-qq", "-mm", "-m", "-t", "-tv", "-P", "-PP"):
            if a.startswith("-t"):
                _err("lspci (rigops sandbox stand-in): -t is not modelled; use -vvv")
                return 1
        elif re.fullmatch(r"-[vnDk]+", a):
            for ch in a[1:]:
                if ch == "v":
                    verbose += 1
                elif ch == "n":
                    numeric += 1
                elif ch == "D":
                    domains = True
                elif ch == "k":
                    kernel = True
        else:
            _err(f"lspci: invalid option -- '{a.lstrip('-')[:1]}'")
            return 2
        i += 1
    prof = load_or_none()
    if prof is None:
        return 0
    groups = prof.iommu_groups()
    is_root = paths.euid() == 0
    domains = domains or any(not b.startswith("0000:") for b in prof.pci)  # lspci shows domains then
    out = []
    for bdf in sorted(prof.pci):
        d = prof.pci[bdf]
        if vendor_filter:
            parts = vendor_filter.split(":")
            if parts[0] and parts[0].lower() != d.vendor:
                continue
            if len(parts) > 1 and parts[1] and parts[1].lower() != d.device:
                continue
            if len(parts) > 2 and parts[2] and not d.class_code.startswith(parts[2].lower()):
                continue
        if slot_filter and not (bdf == slot_filter or d.short == slot_filter or bdf.endswith(slot_filter)):
            continue
        name = d.bdf if domains else d.short
        label, rev = _REV.match(d.label).groups()
        cls = CLASS_NAMES.get(d.class_code, "Non-VGA unclassified device")
        rev_s = f" ({rev})" if rev else ""
        if numeric == 1:
            line = f"{name} {d.class_code}: {d.vendor}:{d.device}{rev_s}"
        elif numeric >= 2:
            line = f"{name} {cls} [{d.class_code}]: {label} [{d.vendor}:{d.device}]{rev_s}"
        else:
            line = f"{name} {cls}: {label}{rev_s}"
        if d.class_code == "0300" and verbose:
            line += " (prog-if 00 [VGA controller])"
        elif d.class_code == "0604" and verbose:
            line += " (prog-if 00 [Normal decode])"
        out.append(line)
        drv, mods = _lspci_driver(prof, d)
        if verbose:
            sub = d.extra.get("subsystem", f"{label.split(' [')[0]} Device 0000")
            out.append(f"\tSubsystem: {sub}")
            if verbose >= 2:
                out.append(LSPCI_CONTROL)
                out.append(LSPCI_STATUS)
            out.append("\tLatency: 0")
            numa = prof.numa_of(bdf)
            if numa >= 0 and len(prof.numa) > 1:
                out.append(f"\tNUMA node: {numa}")
            if bdf in groups:
                out.append(f"\tIOMMU group: {groups[bdf]}")
            if d.kind in ("root_port", "switch_upstream", "switch_downstream"):
                kids = [c for c in prof.pci.values() if c.parent == bdf]
                buses = sorted({int(c.bdf.split(":")[1], 16) for c in kids}) or [0]
                # a bridge forwards its whole subtree: subordinate is the highest bus below it
                below, todo = set(buses), [c.bdf for c in kids]
                while todo:
                    parent = todo.pop()
                    for c in prof.pci.values():
                        if c.parent == parent:
                            below.add(int(c.bdf.split(":")[1], 16))
                            todo.append(c.bdf)
                sub_max = max(below)
                prim = bdf.split(":")[1]
                out.append(f"\tBus: primary={prim}, secondary={buses[0]:02x}, subordinate={sub_max:02x}, sec-latency=0")
            if d.kind != "host_bridge":
                if not is_root:
                    out.append("\tCapabilities: <access denied>")
                else:
                    speed, _, width = (d.link or "32GT/s x16").partition(" ")
                    width_now = width
                    if d.extra.get("gpu") and "link_x8" in faults.active().get(d.bdf, {}):
                        width_now = "x8 (downgraded)"
                    out.append(f"\tCapabilities: [68] Express (v2) {_express_type(d)}, MSI 00")
                    if verbose >= 2:
                        out.append(
                            f"\t\tLnkCap:\tPort #0, Speed {speed}, Width {width}, ASPM L1, Exit Latency L1 unlimited"
                        )
                        out.append(f"\t\tLnkSta:\tSpeed {speed}, Width {width_now}")
                    if d.acs_ctl is not None:
                        out.append("\tCapabilities: [2a0 v1] Access Control Services")
                        if verbose >= 2:
                            out.append(f"\t\tACSCap:\t{d.acs_cap}")
                            out.append(f"\t\tACSCtl:\t{d.acs_ctl}")
        if verbose or kernel:
            if drv:
                out.append(f"\tKernel driver in use: {drv}")
            if mods:
                out.append(f"\tKernel modules: {mods}")
        if verbose:
            out.append("")
    _out("\n".join(out) + ("\n" if out and not verbose else ""))
    return 0


# ---------------------------------------------------------------- modprobe & co
def modprobe_main(argv: list[str]) -> int:
    remove = quiet = verbose = dry = all_names = use_blacklist = False
    names: list[str] = []
    for a in argv:
        if a in ("-r", "--remove"):
            remove = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a in ("-v", "--verbose"):
            verbose = True
        elif a in ("-n", "--dry-run", "--show"):
            dry = True
        elif a in ("-a", "--all"):
            all_names = True
        elif a in ("-b", "--use-blacklist"):
            use_blacklist = True
        elif a in ("-c", "--showconfig"):
            cfg = kmod.read_config()
            lines = [f"blacklist {m}" for m in sorted(cfg.blacklist)]
            lines += [f"options {m} {o}" for m, o in sorted(cfg.options.items())]
            _out("\n".join(lines) + "\n")
            return 0
        elif a.startswith("-"):
            _err(f"modprobe: ERROR: unrecognized option '{a}'")
            return 1
        else:
            names.append(a)
    if not names:
        _err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    if not (remove or all_names):
        names, params = names[:1], " ".join(names[1:])
    else:
        params = ""
    prof = load_or_none()
    cfg = kmod.read_config()
    rc = 0
    for n in names:
        try:
            if remove:
                if dry:
                    continue
                for m in kmod.remove(n, recursive=True):
                    if verbose:
                        _out(f"rmmod {m}\n")
            else:
                if use_blacklist and kmod.norm(n) in cfg.blacklist:
                    continue
                if dry:
                    if kmod.module_info(n) is None:
                        raise kmod.ModError(f"modprobe: FATAL: Module {n} not found in directory {paths.module_dir()}")
                    continue
                for m in kmod.modprobe(n, prof, cfg, params):
                    if verbose:
                        info = kmod.module_info(m) or {}
                        _out(f"insmod {info.get('filename', m)} {cfg.options.get(m, '')}".rstrip() + "\n")
        except kmod.ModError as e:
            if not quiet or "not found" not in str(e):
                _err(str(e))
            rc = e.code
    return rc


def lsmod_main(argv: list[str]) -> int:
    state = kmod.loaded()
    lines = ["Module                  Size  Used by"]
    for name in reversed(list(state)):
        holders = kmod.users(name, state)
        count = len(holders) + (1 if name == "nvidia" and kmod.persistenced_pid() else 0)
        lines.append(
            f"{name:<19} {kmod.SIZES.get(name, 65536):>8}  {count}" + (f" {','.join(holders)}" if holders else "")
        )
    _out("\n".join(lines) + "\n")
    return 0


def rmmod_main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        _err("rmmod: ERROR: missing module name.")
        return 1
    rc = 0
    for n in names:
        try:
            kmod.remove(n)
        except kmod.ModError as e:
            _err(str(e))
            rc = 1
    return rc


def modinfo_main(argv: list[str]) -> int:
    field = None
    names = []
    i = 0
    while i < len(argv):
        if argv[i] in ("-F", "--field"):
            field = argv[i + 1] if i + 1 < len(argv) else None
            i += 2
            continue
        if argv[i].startswith("--field="):
            field = argv[i].split("=", 1)[1]
        elif not argv[i].startswith("-"):
            names.append(argv[i])
        i += 1
    rc = 0
    for n in names:
        info = kmod.module_info(n)
        if info is None:
            _err(f"modinfo: ERROR: Module {n} not found.")
            rc = 1
            continue
        if field:
            if info.get(field):
                _out(info[field] + "\n")
            continue
        for k in ("filename", "version", "license", "description", "author", "srcversion", "name", "signer"):
            if info.get(k):
                _out(f"{k + ':':<16}{info[k]}\n")
    return rc


# ---------------------------------------------------------------- update-initramfs
def update_initramfs_main(argv: list[str]) -> int:
    if not argv or not any(a in ("-u", "-c", "-d") for a in argv):
        _err("Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]")
        return 2
    kver = paths.kernel_release()
    if "-k" in argv:
        k = argv[argv.index("-k") + 1] if argv.index("-k") + 1 < len(argv) else kver
        kver = kver if k == "all" else k
    kmod.snapshot_initramfs()
    log = paths.p(paths.INITRAMFS_LOG)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
            parent = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        parent = "?"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"{stamp}\tupdate-initramfs {' '.join(argv)}\tparent={parent[:200]}\n")
    if "-d" not in argv:
        _out(f"update-initramfs: Generating /boot/initrd.img-{kver}\n")
    else:
        _out(f"update-initramfs: Deleting /boot/initrd.img-{kver}\n")
    return 0


# ---------------------------------------------------------------- mokutil
def mokutil_main(argv: list[str]) -> int:
    prof = load_or_none()
    system = prof.system if prof else {}
    if not system.get("efi", True):
        _err("EFI variables are not supported on this system")
        return 1
    if "--sb-state" in argv:
        _out("SecureBoot enabled\n" if system.get("secure_boot") else "SecureBoot disabled\n")
        return 0
    if "--list-enrolled" in argv:
        if system.get("mok_enrolled"):
            _out("[key 1]\nSHA1 Fingerprint: 5a:1d:...\n        Subject: CN=rigops sandbox DKMS module signing key\n")
        else:
            _out("MokListRT is empty\n")
        return 0
    _err("mokutil (rigops sandbox stand-in): only --sb-state and --list-enrolled are modelled")
    return 1


# ---------------------------------------------------------------- Jetson
def _jetson(prof: Profile | None) -> dict:
    if prof is None or not prof.jetson:
        _err("This is not a Jetson platform")
        raise SystemExit(1)
    return prof.jetson


def _nvp_modes(j: dict) -> dict[int, dict]:
    return {int(m["id"]): m for m in j.get("nvpmodel", {}).get("modes", [])}


def _nvp_status(j: dict) -> int:
    """The mode of the status file (what the next boot applies), else the profile's default."""
    try:
        with open(paths.p(paths.NVPMODEL_STATUS), encoding="utf-8") as fh:
            m = re.search(r"pmode:(\d+)", fh.read())
            if m:
                return int(m.group(1))
    except OSError:
        pass
    return int(j.get("nvpmodel", {}).get("default", 0))


def _nvp_current(j: dict) -> int:
    """The mode in effect: set since boot (/run), else what boot applied from the status file."""
    try:
        with open(paths.p(paths.NVPMODEL_ACTIVE), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return _nvp_status(j)


def _nvp_write(j: dict, mode: int, live: bool) -> None:
    """Record ``mode`` for the next boot; ``live``: it is in effect now too (else the current one stays)."""
    active = paths.p(paths.NVPMODEL_ACTIVE)
    if not live and not os.path.exists(active):
        os.makedirs(os.path.dirname(active), exist_ok=True)
        with open(active, "w", encoding="utf-8") as fh:
            fh.write(f"{_nvp_current(j)}\n")
    status = paths.p(paths.NVPMODEL_STATUS)
    os.makedirs(os.path.dirname(status), exist_ok=True)
    fmode = "quiet"
    try:
        with open(status, encoding="utf-8") as fh:
            m = re.search(r"fmode:(\S+)", fh.read())
            fmode = m.group(1) if m else fmode
    except OSError:
        pass
    with open(status, "w", encoding="utf-8") as fh:
        fh.write(f"pmode:{mode:04d} fmode:{fmode}\n")
    if live:
        os.makedirs(os.path.dirname(active), exist_ok=True)
        with open(active, "w", encoding="utf-8") as fh:
            fh.write(f"{mode}\n")


def nvpmodel_main(argv: list[str]) -> int:
    """nvpmodel as L4T ships it: -q, -p, -m <id> (with its reboot prompt).

    A change between modes whose GPU power-gating masks differ (profile: ``pg_mask``) only
    takes effect at boot: nvpmodel asks ``DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:``
    on stdin. ``YES``/``yes`` records the mode and reboots; anything else (or no input) is
    refused with ``bad input!`` and changes nothing (real outputs: tests/fixtures/jetson/).
    """
    try:
        j = _jetson(load_or_none())
    except SystemExit as e:
        return int(e.code or 1)
    modes = _nvp_modes(j)
    names = {i: m["name"] for i, m in modes.items()}
    if "-m" in argv:
        idx = argv.index("-m")
        val = argv[idx + 1] if idx + 1 < len(argv) else ""
        if paths.euid() != 0:
            _err("NVPM ERROR: failed to write to /var/lib/nvpmodel/status: Permission denied")
            return 1
        if not val.isdigit() or int(val) not in modes:
            _err(f"NVPM ERROR: Invalid power mode id: {val}")
            return 1
        want, cur = int(val), _nvp_current(j)
        if modes[want].get("pg_mask") != modes.get(cur, {}).get("pg_mask"):
            _out(f"NVPM WARN: Reboot required for changing to this power mode: {want}\n")
            _out("NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:\n")
            sys.stdout.flush()
            answer = sys.stdin.readline().strip() if not sys.stdin.closed else ""
            if answer not in ("YES", "yes"):
                _err("NVPM ERROR: bad input!")
                _err("NVPM ERROR: optMask is 1, no request for power mode")
                return 1
            _nvp_write(j, want, live=False)
            _out("NVPM WARN: rebooting\n")
            sys.stdout.flush()
            if paths.root() == "/" and os.path.isdir("/run/systemd/system"):
                subprocess.run(["systemctl", "reboot"], check=False)
            return 0
        _nvp_write(j, want, live=True)
        return 0
    if "-p" in argv:
        for i, name in sorted(names.items()):
            _out(f"NVPM VERB: POWER_MODEL: ID={i} NAME={name}\n")
        return 0
    if "-q" in argv:
        cur = _nvp_current(j)
        _out(f"NV Power Mode: {names.get(cur, 'UNKNOWN')}\n{cur}\n")
        if paths.euid() != 0:
            # as a normal user some sysfs files cannot be read (jetbot issue 49): the mode, then errors
            _err("NVPM ERROR: Error opening /sys/kernel/nvpmodel_emc_cap/emc_iso_cap: 13")
            _err("NVPM ERROR: failed to read PARAM EMC: ARG MAX_FREQ: PATH /sys/kernel/nvpmodel_emc_cap/emc_iso_cap")
        return 0
    _err("Usage: nvpmodel [-m <mode id>] [-q] [-p --verbose]")
    return 1


def jetson_clocks_main(argv: list[str]) -> int:
    prof = load_or_none()
    try:
        j = _jetson(prof)
    except SystemExit as e:
        return int(e.code or 1)
    state_path = paths.p(paths.JETSON_CLOCKS)
    try:
        with open(state_path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {"locked": False}
    clocks = j.get("clocks", {})
    if paths.euid() != 0:
        _err("Error: Run this script($0) as a root user")
        return 1

    def save(st: dict) -> None:
        os.makedirs(os.path.dirname(state_path), exist_ok=True)
        with open(state_path, "w", encoding="utf-8") as fh:
            json.dump(st, fh)

    def conf_path(i: int) -> str:
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
        return os.path.join(os.environ.get("HOME", "/root"), "l4t_dfs.conf")

    if "--show" in argv:
        modes = {int(m["id"]): m["name"] for m in j.get("nvpmodel", {}).get("modes", [])}
        cpus = int(clocks.get("cpus", 14))
        cmax, cmin = int(clocks.get("cpu_max_khz", 2601000)), int(clocks.get("cpu_min_khz", 972000))
        cur = cmax if state.get("locked") else cmin
        lo = cmax if state.get("locked") else cmin
        lines = [
            f"SOC family:{j.get('soc', 'tegra264')}  Machine:{j.get('model', 'NVIDIA Jetson')}",
            f"Online CPUs: 0-{cpus - 1}, Offline CPUs:",
        ]
        for c in range(cpus):
            lines.append(
                f"cpu{c}:  Governor=schedutil MinFreq={lo} MaxFreq={cmax} CurrentFreq={cur} IdleStates: WFI=1 cc7=1"
            )
        gmax, gmin = int(clocks.get("gpu_max_hz", 1575000000)), int(clocks.get("gpu_min_hz", 306000000))
        g = gmax if state.get("locked") else gmin
        lines.append(f"GPU MinFreq={gmax if state.get('locked') else gmin} MaxFreq={gmax} CurrentFreq={g}")
        emc = int(clocks.get("emc_max_hz", 4266000000))
        lines.append(
            f"EMC MinFreq=665600000 MaxFreq={emc} CurrentFreq={emc} FreqOverride={int(bool(state.get('locked')))}"
        )
        lines.append(f"NV Power Mode: {modes.get(_nvp_current(j), 'UNKNOWN')}")
        _out("\n".join(lines) + "\n")
        return 0
    if "--store" in argv:
        path = conf_path(argv.index("--store"))
        with open(path if os.path.isabs(path) else path, "w", encoding="utf-8") as fh:
            json.dump({"locked": bool(state.get("locked"))}, fh)
        return 0
    if "--restore" in argv:
        path = conf_path(argv.index("--restore"))
        try:
            with open(path, encoding="utf-8") as fh:
                saved = json.load(fh)
        except (OSError, ValueError):
            _err(f"Error: {path} file not found!")
            return 1
        save({"locked": bool(saved.get("locked"))})
        return 0
    if any(a not in ("--fan",) for a in argv):
        _err("Usage: jetson_clocks [--show] [--store [file]] [--restore [file]] [--fan]")
        return 1
    save({"locked": True})
    return 0


def _meminfo_used_mb() -> tuple[int | None, int | None, int | None]:
    """Used RAM, swap total and swap used (MiB) of the machine this runs on (/proc is real)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            info = {ln.split(":")[0]: int(ln.split()[1]) for ln in fh if ln.split()[1:2] and ln.split()[1].isdigit()}
    except OSError:
        return None, None, None
    used = (info.get("MemTotal", 0) - info.get("MemAvailable", 0)) // 1024
    swap_total = info.get("SwapTotal", 0) // 1024
    return used, swap_total, swap_total - info.get("SwapFree", 0) // 1024


def _fault_temp_c() -> float | None:
    """The temperature ``nvidia-sim-fault set 0 thermal --value C`` gave the board's GPU, if any."""
    hot = [float(k["thermal"].get("value", 92)) for k in faults.active().values() if "thermal" in k]
    return max(hot) if hot else None


def tegrastats_line(j: dict, when: float | None = None, hot_c: float | None = None) -> str:
    """One line in the board's format (profile ``jetson.tegrastats.style``: orin or thor).

    The layout follows real lines (tests/fixtures/jetson/tegrastats/): AGX Orin prints SWAP
    (JetPack's zram), EMC and GR3D with the load, sensors that are off as -256C and rails in
    mW; Thor (JetPack 7.0) prints no SWAP, GR3D_FREQ as clocks only, lowercase sensors and the
    VDD_GPU/VIN rails. RAM used is this machine's (so a loading model shows), capped at the
    board's RAM; temperatures and power are the profile's idle figures, but for ``hot_c`` (a
    thermal fault): the GPU at that temperature, and tj (the hottest point) with it.
    """
    ts = j.get("tegrastats") or {}
    total = int(ts.get("ram_total_mb", 62801))
    used, swap_total, swap_used = _meminfo_used_mb()
    used = min(total, used if used is not None else int(ts.get("ram_idle_mb", 4321)))
    clocks = j.get("clocks", {})
    cpus = int(clocks.get("cpus", 12))
    locked = False
    try:
        with open(paths.p(paths.JETSON_CLOCKS), encoding="utf-8") as fh:
            locked = bool(json.load(fh).get("locked"))
    except (OSError, ValueError):
        pass
    freq = int(clocks.get("cpu_max_khz" if locked else "cpu_min_khz", 729600)) // 1000
    stamp = time.strftime("%m-%d-%Y %H:%M:%S", time.localtime(when))
    cores = ",".join(f"0%@{freq}" for _ in range(cpus))
    gpu_c = float(ts.get("gpu_temp_c", 41.5)) if hot_c is None else hot_c
    if ts.get("style") == "thor":
        cpu_c = float(ts.get("gpu_temp_c", 41.5)) + 2
        return (
            f"{stamp} RAM {used}/{total}MB (lfb 5x4MB) CPU [{cores}] GR3D_FREQ @[314,314,314] "
            f"cpu@{cpu_c:.3f}C tj@{max(cpu_c, gpu_c) + 2:.3f}C gpu@{gpu_c:.2f}C "
            f"VDD_GPU {int(ts.get('gpu_mw', 2376))}mW/{int(ts.get('gpu_mw', 2376))}mW "
            f"VDD_CPU_SOC_MSS 3924mW/3835mW VIN_SYS_5V0 5064mW/5055mW "
            f"VIN {int(ts.get('input_mw', 15004))}mW/{int(ts.get('input_mw', 15004))}mW"
        )
    swap = f"SWAP {swap_used or 0}/{swap_total or int(total // 2)}MB (cached 0MB) "
    return (
        f"{stamp} RAM {used}/{total}MB (lfb 1759x4MB) {swap}CPU [{cores}] EMC_FREQ 0%@2133 "
        f"GR3D_FREQ 0%@[0,0] VIC_FREQ 729 APE 174 CV0@-256C CPU@44.562C Tboard@32C SOC2@40.093C "
        f"Tdiode@33C SOC0@41.093C CV1@-256C GPU@{gpu_c:.3f}C tj@{max(44.343, gpu_c):.3f}C SOC1@41.25C CV2@-256C "
        f"VDD_GPU_SOC {int(ts.get('gpu_mw', 2340))}mW/{int(ts.get('gpu_mw', 2340))}mW VDD_CPU_CV 390mW/390mW "
        f"VIN_SYS_5V0 {int(ts.get('input_mw', 4025))}mW/{int(ts.get('input_mw', 4025))}mW NC 0mW/0mW "
        "VDDQ_VDD2_1V8AO 301mW/301mW NC 0mW/0mW"
    )


def tegrastats_main(argv: list[str]) -> int:
    """tegrastats: one line every --interval milliseconds (default 1000) until stopped (SIGTERM,
    SIGINT), to stdout or --logfile; --start/--stop (the background logger) are not modelled."""
    try:
        j = _jetson(load_or_none())
    except SystemExit as e:
        return int(e.code or 1)
    interval, logfile = 1000, None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--interval" and i + 1 < len(argv) and argv[i + 1].isdigit():
            interval = int(argv[i + 1])
            i += 1
        elif a == "--logfile" and i + 1 < len(argv):
            logfile = argv[i + 1]
            i += 1
        elif a in ("--start", "--stop"):
            _err(f"tegrastats (rigops sandbox stand-in): {a} is not modelled; run it in front and stop it")
            return 1
        elif a not in ("--verbose", "--readall"):
            _err(f"Usage: tegrastats [-option]\nInvalid option: {a}")
            return 1
        i += 1
    import signal  # noqa: PLC0415 (only this command needs it)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    out = open(logfile, "a", encoding="utf-8") if logfile else sys.stdout  # noqa: SIM115
    try:
        while True:
            out.write(tegrastats_line(j, hot_c=_fault_temp_c()) + "\n")
            out.flush()
            time.sleep(interval / 1000.0)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    finally:
        if logfile:
            out.close()


# ---------------------------------------------------------------- boot
def _boot_log(msg: str) -> None:
    path = paths.p(paths.BOOT_LOG)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {msg}\n")


def _try_load(name: str, prof: Profile, cfg: kmod.ModConfig, why: str) -> None:
    try:
        done = kmod.modprobe(name, prof, cfg)
        _boot_log(f"{why}: loaded {' '.join(done) or name + ' (already loaded)'}")
    except kmod.ModError as e:
        _boot_log(f"{why}: {e}")


def modules_load_entries() -> list[str]:
    names: list[str] = []
    files: dict[str, str] = {}
    for d in reversed(paths.MODULES_LOAD_D):
        for f in sorted(glob.glob(os.path.join(paths.p(d), "*.conf"))):
            files[os.path.basename(f)] = f
    sources = [files[k] for k in sorted(files)]
    if os.path.exists(paths.p(paths.MODULES_FILE)):
        sources.append(paths.p(paths.MODULES_FILE))
    for f in sources:
        if not os.path.isfile(f):  # dangling symlink (Debian's modules.conf -> /etc/modules)
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.split("#", 1)[0].split(";", 1)[0].strip()
                if line:
                    names.append(line.split()[0])
    return names


def boot(start_services: bool = True) -> int:
    """What a boot does to modules: initramfs, udev coldplug, systemd-modules-load."""
    prof = load_or_none()
    os.makedirs(paths.p(paths.MODULES), exist_ok=True)
    if prof is None:
        _boot_log("no hardware profile; nothing to do")
        return 0
    early = kmod.initramfs_config()
    root_cfg = kmod.read_config()
    gpus_on_pci = prof.has_nvidia_gpu_on_pci
    # 1. initramfs: nouveau is in the initramfs; only a blacklist baked into it stops it
    if gpus_on_pci and prof.nouveau_capable and "nouveau" not in early.blacklist and "nouveau" not in early.install:
        _try_load("nouveau", prof, early, "initramfs")
    # 2. udev coldplug: modalias matches for the GPUs, honouring the root fs blacklist
    if gpus_on_pci:
        if prof.nouveau_capable and "nouveau" not in root_cfg.blacklist and "nouveau" not in root_cfg.install:
            _try_load("nouveau", prof, root_cfg, "udev")
        if kmod.module_info("nvidia") and "nvidia" not in root_cfg.blacklist:
            _try_load("nvidia", prof, root_cfg, "udev")
    for name in (prof.jetson or {}).get("boot_modules", []):
        _try_load(name, prof, root_cfg, "l4t")
    if prof.jetson:
        # nvpmodel.service: the mode recorded in /var/lib/nvpmodel/status takes effect at boot
        active = paths.p(paths.NVPMODEL_ACTIVE)
        os.makedirs(os.path.dirname(active), exist_ok=True)
        with open(active, "w", encoding="utf-8") as fh:
            fh.write(f"{_nvp_status(prof.jetson)}\n")
        _boot_log(f"nvpmodel: power mode {_nvp_status(prof.jetson)}")
    # 3. systemd-modules-load.service: explicit loads, blacklist does not apply
    for name in modules_load_entries():
        _try_load(name, prof, root_cfg, "modules-load.d")
    # 4. udev rules that pull in a service when the nvidia device appears
    if start_services and kmod.is_loaded("nvidia") and _udev_wants_persistenced():
        _boot_log("udev: a rule starts nvidia-persistenced.service")
        if paths.root() == "/" and os.path.isdir("/run/systemd/system"):
            subprocess.run(["systemctl", "--no-block", "start", "nvidia-persistenced.service"], check=False)
    return 0


def _udev_wants_persistenced() -> bool:
    for d in ("/etc/udev/rules.d", "/usr/lib/udev/rules.d", "/lib/udev/rules.d"):
        for f in glob.glob(os.path.join(paths.p(d), "*.rules")):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
                # Ubuntu's 71-nvidia.rules: RUN+="/bin/systemctl start --no-block nvidia-persistenced.service"
                if re.search(r'ACTION=="add".*(systemctl start[^"]*|SYSTEMD_WANTS\}?\+?=")nvidia-persistenced', text):
                    return True
    return False


def boot_main(argv: list[str]) -> int:
    faults.clear_kernel_log()  # a new boot, a new kernel ring buffer
    rc = boot(start_services="--no-services" not in argv)
    with open(paths.p(os.path.join(paths.RUN, "booted")), "w", encoding="utf-8") as fh:
        fh.write(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))
    return rc


COMMANDS = {
    "lspci": lspci_main,
    "modprobe": modprobe_main,
    "lsmod": lsmod_main,
    "rmmod": rmmod_main,
    "modinfo": modinfo_main,
    "update-initramfs": update_initramfs_main,
    "mokutil": mokutil_main,
    "nvpmodel": nvpmodel_main,
    "jetson_clocks": jetson_clocks_main,
    "tegrastats": tegrastats_main,
    "nvidia-sim-boot": boot_main,
    "nvidia-sim-fault": faults.main,
}


def dispatch(prog: str, argv: list[str]) -> int:
    name = os.path.basename(prog)
    if name not in COMMANDS:
        _err(f"nvsim: unknown command {name}")
        return 127
    return COMMANDS[name](argv)
