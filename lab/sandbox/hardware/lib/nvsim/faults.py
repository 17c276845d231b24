"""nvidia-sim-fault: inject GPU faults at run time, per GPU, for health checks to find.

``nvidia-sim-fault set GPU KIND [--value N]``, ``clear [GPU [KIND]]``, ``list`` (JSON).
GPU is what ``nvidia-smi -i`` takes: the current index, a bus id in any case and short form
(``00000000:13:00.0``, ``0000:13:00.0``, ``13:00.0``) or the UUID. Kinds (what each shows is in
lab/sandbox/driver_repo/README.md, "Faults"):

* ``xid79``: the GPU falls off the bus: gone from every nvidia-smi output, indices shift;
* ``xid48``: ``--value`` double-bit (DRAM uncorrectable) errors, default 1: ECC counts, then
  row remapping pending (Ampere and later) or a page pending retirement (earlier GPUs);
* ``link_x8``: the PCIe link trained at x8 (max stays the profile's width);
* ``thermal``: HW Slowdown + HW Thermal Slowdown active, temperature ``--value`` C (default 92);
  on a Jetson, tegrastats shows its GPU (and tj) at that temperature;
* ``power_brake``: HW Slowdown + HW Power Brake Slowdown active;
* ``nvlink_down``: NVLink ``--value`` (default 0) of the GPU ``<inactive>`` in ``nvidia-smi nvlink -s``;
* ``nvlink_errors``: ``--value`` (default 1) replay and recovery errors, ten times that in CRC errors,
  on link 0 in ``nvidia-smi nvlink -e`` (a GPU reset, ``clear``, sets the counters back to 0).

State. Active faults live in ``/run/nvidia-sim/faults.json`` (a reboot clears them, like the
rest of /run: a re-seated, re-trained, cooled GPU after a power cycle). The lifetime ECC
figures (aggregate counts, remapped rows, retired pages) live in
``/var/lib/nvidia-sim/ecc-aggregate.json`` and survive reboots, as the InfoROM keeps them.
``clear GPU`` is an operator's GPU reset: the fault goes, volatile ECC counts reset and a
pending remap or retirement takes effect; past kernel lines stay.

Kernel log. ``set`` appends the lines the driver prints (NVRM, ``journalctl -k`` short format)
to ``/var/log/nvidia-sim/kern.log``, when the nvidia module is loaded; nvidia-sim-boot empties
it, as a boot starts a new kernel ring buffer. Message texts are copied from real captures:

* Xid 79 and ``GPU ...: GPU has fallen off the bus.``: kernel logs quoted in
  https://github.com/NVIDIA/NVSentinel/issues/155 and https://github.com/leptonai/gpud/pull/1209
  (``NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus``; the ``pid='<unknown>',
  name=<unknown>`` form of driver 5xx as in the Xid 48 line below), with the ``GPU at PCI:``
  and ``GPU Board Serial Number:`` lines the driver prints before a GPU's first Xid (public
  dmesg captures of driver 5xx);
* Xid 48: https://github.com/NVIDIA/gpu-operator/issues/1146 (``An uncorrectable double bit
  error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7,
  subpartition 1.``);
* Xid 63 (row remapper, after a DBE on Ampere and later): a public runbook of an 8-GPU
  driver 550.90.07 host (``Row Remapper: New row (0x0000000018f31d80) marked for remapping,
  reset gpu to activate.``); NVIDIA's row-remapping guide
  (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/row-remapping.html) for "a GPU reset is
  required" and for page retirement being the scheme before Ampere.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import time
from dataclasses import replace
from typing import Any

from . import kmod, paths
from .profile import Gpu, Profile, ProfileError, load

KINDS = ("xid79", "xid48", "link_x8", "thermal", "power_brake", "nvlink_down", "nvlink_errors")
# kinds that take --value, and its default
VALUE_KINDS = {"xid48": 1, "thermal": 92, "nvlink_down": 0, "nvlink_errors": 1}
# Before Ampere, a DBE retires the page; from Ampere on, the row remapper replaces the row.
PAGE_RETIREMENT_ARCHS = ("kepler", "maxwell", "pascal", "volta", "turing")
USAGE = (
    "usage: nvidia-sim-fault set GPU KIND [--value N]\n"
    "       nvidia-sim-fault clear [GPU [KIND]]\n"
    "       nvidia-sim-fault list\n"
    f"KIND: {', '.join(KINDS)}\n"
    "GPU: an index, a bus id (00000000:13:00.0, 13:00.0) or a UUID, as nvidia-smi -i takes\n"
)


class FaultError(Exception):
    pass


# ---------------------------------------------------------------- state
def _read(rel: str) -> dict[str, Any]:
    try:
        with open(paths.p(rel), encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(rel: str, data: dict[str, Any]) -> None:
    path = paths.p(rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def active() -> dict[str, dict[str, Any]]:
    """bdf -> {kind: {"value": N, ...}} of the faults in effect."""
    return {k: v for k, v in _read(paths.FAULTS).get("gpus", {}).items() if v}


def aggregates() -> dict[str, dict[str, int]]:
    """bdf -> lifetime ECC figures: dbe (aggregate DRAM uncorrectable), rows (remapped), pages (retired)."""
    return {bdf: {"dbe": 0, "rows": 0, "pages": 0, **v} for bdf, v in _read(paths.ECC_AGGREGATE).items()}


def row_remapping(g: Gpu) -> bool:
    return str(g.get("architecture", "")).lower() not in PAGE_RETIREMENT_ARCHS


def has_ecc(g: Gpu) -> bool:
    ecc = g.get("ecc", "N/A")
    return ecc is not None and ecc != "N/A"


def apply(prof: Profile) -> Profile:
    """What NVML enumerates now: GPUs that fell off the bus are gone, the rest renumbered."""
    fallen = {bdf for bdf, kinds in active().items() if "xid79" in kinds}
    if fallen:
        kept = [g for g in prof.gpus if g.bdf not in fallen]
        prof.gpus = [replace(g, index=i) for i, g in enumerate(kept)]
    return prof


# ---------------------------------------------------------------- GPU selection
def _matches(g: Gpu, ident: str) -> bool:
    i = ident.lower()
    return i == g.uuid.lower() or i in (g.bus_id.lower(), g.bdf.lower(), g.bdf[5:].lower())


def resolve(prof: Profile, ident: str) -> Gpu:
    """An index counts among the GPUs nvidia-smi shows now; bus ids and UUIDs also reach a
    GPU that fell off the bus (so that it can be cleared)."""
    shown = apply(load_profile_copy(prof)).gpus
    for g in shown:
        if ident == str(g.index):
            return next(x for x in prof.gpus if x.bdf == g.bdf)
    for g in prof.gpus:
        if _matches(g, ident):
            return g
    listing = ", ".join(f"{g.index}={g.bus_id}" for g in shown) or "none"
    raise FaultError(
        f"no GPU {ident!r}: give an index, a bus id (e.g. 00000000:13:00.0 or 13:00.0) or a UUID "
        f"of a GPU of this machine (nvidia-smi now shows: {listing})"
    )


def load_profile_copy(prof: Profile) -> Profile:
    return Profile(prof.data, prof.source)


# ---------------------------------------------------------------- kernel log
def _pci_tag(g: Gpu) -> str:
    """The Xid's PCI field: domain:bus:device, lower case (PCI:0000:3b:00)."""
    return g.bdf.rsplit(".", 1)[0].lower()


def _addr(g: Gpu, n: int) -> int:
    """A framebuffer address for the n-th DBE of a GPU (stable, so tests can match it)."""
    h = hashlib.sha256(f"{g.bdf}/{n}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFE0


def kernel_lines(g: Gpu, kind: str, value: int, first_xid: bool, count: int) -> list[str]:
    pci = _pci_tag(g)
    xid = f"NVRM: Xid (PCI:{pci}): {{}}, pid='<unknown>', name=<unknown>, {{}}"
    lines = []
    if first_xid:
        lines += [f"NVRM: GPU at PCI:{pci}: {g.uuid}", f"NVRM: GPU Board Serial Number: {g.get('serial', '')}"]
    if kind == "xid79":
        lines.append(xid.format(79, "GPU has fallen off the bus."))
        lines.append(f"NVRM: GPU {g.bdf.lower()}: GPU has fallen off the bus.")
    elif kind == "xid48":
        for i in range(value):
            addr = _addr(g, count + i)
            part, sub = (addr >> 5) % 16, (addr >> 9) % 4
            lines.append(
                xid.format(
                    48,
                    "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
                    f"physAddr 0x{addr:x} partition {part}, subpartition {sub}.",
                )
            )
            if row_remapping(g):
                remap = f"Row Remapper: New row (0x{addr:016x}) marked for remapping, reset gpu to activate."
                lines.append(xid.format(63, remap))
    return lines


def _log(lines: list[str]) -> None:
    if not lines:
        return
    path = paths.p(paths.KERNEL_LOG)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stamp = time.strftime("%b %d %H:%M:%S")
    host = socket.gethostname().split(".")[0]
    with open(path, "a", encoding="utf-8") as fh:
        fh.writelines(f"{stamp} {host} kernel: {line}\n" for line in lines)


def clear_kernel_log() -> None:
    """A boot starts an empty ring buffer."""
    path = paths.p(paths.KERNEL_LOG)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8"):
        pass


# ---------------------------------------------------------------- commands
def set_fault(prof: Profile, ident: str, kind: str, value: int | None) -> str:
    if kind not in KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; one of: {', '.join(KINDS)}")
    if value is not None and kind not in VALUE_KINDS:
        raise FaultError(f"{kind} takes no --value (only {', '.join(VALUE_KINDS)} do)")
    counted = kind in ("xid48", "nvlink_errors")
    if value is not None and value < (1 if counted else 0):
        raise FaultError(f"--value for {kind} must be {'a count of at least 1' if counted else '>= 0'}")
    g = resolve(prof, ident)
    state = _read(paths.FAULTS)
    gpus = state.setdefault("gpus", {})
    mine = gpus.setdefault(g.bdf, {})
    if "xid79" in mine:
        raise FaultError(f"GPU {g.bus_id} has fallen off the bus (xid79); clear it first")
    if kind == "xid48" and not has_ecc(g):
        raise FaultError(f"GPU {g.bus_id} ({g['name']}) has no ECC memory (profile ecc: N/A); xid48 needs ECC")
    v = VALUE_KINDS.get(kind) if value is None else value
    if kind.startswith("nvlink"):
        links = max((prof.nvlinks(g, o) for o in prof.gpus if o.bdf != g.bdf), default=0)
        if not links:
            raise FaultError(f"GPU {g.bus_id} has no NVLink (profile nvlink); {kind} needs one")
        if kind == "nvlink_down" and not 0 <= int(v or 0) < links:
            raise FaultError(f"GPU {g.bus_id} has NVLinks 0 to {links - 1}, not {v}")
    lines: list[str] = []
    count = 0
    if kind == "xid48":
        agg_all = _read(paths.ECC_AGGREGATE)
        agg = {"dbe": 0, "rows": 0, "pages": 0, **agg_all.get(g.bdf, {})}
        count = agg["dbe"]
        agg["dbe"] += int(v or 1)
        agg["rows" if row_remapping(g) else "pages"] += int(v or 1)
        agg_all[g.bdf] = agg
        _write(paths.ECC_AGGREGATE, agg_all)
        prev = mine.get("xid48", {}).get("value", 0)
        mine["xid48"] = {"value": prev + int(v or 1)}
    elif kind == "nvlink_errors":  # counters only grow, until a GPU reset (clear)
        mine[kind] = {"value": mine.get(kind, {}).get("value", 0) + int(v or 1)}
    else:
        mine[kind] = {} if v is None else {"value": v}
    if kind in ("xid79", "xid48") and kmod.is_loaded("nvidia"):
        seen = state.setdefault("xid_reported", [])
        lines = kernel_lines(g, kind, int(v or 1), g.bdf not in seen, count)
        if g.bdf not in seen:
            seen.append(g.bdf)
    _write(paths.FAULTS, state)
    _log(lines)
    return f"nvidia-sim-fault: {kind} set on GPU {g.bus_id}\n"


def clear(prof: Profile, ident: str | None, kind: str | None) -> str:
    if kind is not None and kind not in KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; one of: {', '.join(KINDS)}")
    state = _read(paths.FAULTS)
    gpus = state.setdefault("gpus", {})
    if ident is None:
        gone = sum(len(v) for v in gpus.values())
        state["gpus"] = {}
    else:
        g = resolve(prof, ident)
        mine = gpus.get(g.bdf, {})
        gone = len(mine) if kind is None else int(kind in mine)
        if kind is None:
            gpus.pop(g.bdf, None)
        else:
            mine.pop(kind, None)
    _write(paths.FAULTS, state)
    return f"nvidia-sim-fault: cleared {gone} fault(s)\n"


def listing(prof: Profile) -> str:
    shown = {g.bdf: g.index for g in apply(load_profile_copy(prof)).gpus}
    out = []
    for g in prof.gpus:
        for kind, data in sorted(active().get(g.bdf, {}).items()):
            index = shown.get(g.bdf)
            out.append({"bus_id": g.bus_id, "uuid": g.uuid, "index": index, "kind": kind, "value": data.get("value")})
    return json.dumps(out, indent=2) + "\n"


def main(argv: list[str]) -> int:
    try:
        args = list(argv)
        value: int | None = None
        if "--value" in args or any(a.startswith("--value=") for a in args):
            at = next(i for i, a in enumerate(args) if a == "--value" or a.startswith("--value="))
            raw = args[at].split("=", 1)[1] if "=" in args[at] else (args[at + 1] if at + 1 < len(args) else "")
            del args[at : at + (1 if "=" in args[at] else 2)]
            if not raw.lstrip("-").isdigit():
                raise FaultError(f"--value needs a whole number, not {raw!r}")
            value = int(raw)
        if not args or args[0] in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0 if args else 2
        try:
            prof = load()
        except ProfileError as e:
            sys.stderr.write(f"nvidia-sim-fault: {e}\n")
            return 1
        cmd, rest = args[0], args[1:]
        if cmd == "set" and len(rest) == 2:
            sys.stdout.write(set_fault(prof, rest[0], rest[1], value))
        elif cmd == "clear" and len(rest) <= 2 and value is None:
            sys.stdout.write(clear(prof, rest[0] if rest else None, rest[1] if len(rest) > 1 else None))
        elif cmd == "list" and not rest and value is None:
            sys.stdout.write(listing(prof))
        else:
            raise FaultError(f"bad arguments: {' '.join(argv)}\n{USAGE.rstrip()}")
    except FaultError as e:
        sys.stderr.write(f"nvidia-sim-fault: {e}\n")
        return 2
    return 0
