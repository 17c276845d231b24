"""nvidia-smi stand-in: answers from the hardware profile and the simulated driver.

Layouts follow real captures (tab-separated ``topo -m`` with the ``X`` cell padded as
`` X ``, ``NUMA Affinity`` followed by an empty cell, NIC rows and NIC legend; ``-q -x``
shaped like ``nvsmi_device_v12.dtd``; CSV headers with units). Exit codes are the real
ones: 0 success, 2 invalid argument, 3 not supported, 4 no permission, 6 no such GPU,
9 driver not loaded, 18 driver/library version mismatch.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from . import faults, kmod, persistence
from .profile import P2P_CAPS, Gpu, Profile, ProfileError, load

CUDA_BY_BRANCH = {"570": "12.8", "575": "12.9", "580": "13.0", "590": "13.1", "595": "13.2"}
NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  DR   = Disabled by regkey
  U    = Unknown
"""
HELP = """NVIDIA System Management Interface -- v{ver}

NVSMI provides monitoring information for Tesla and select Quadro devices.
(rigops sandbox stand-in: answers from /etc/nvidia-sim/profile.yaml)

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -x,   --xml-format          Produce XML output.
    -i,   --id=                 Target a specific GPU.
    -f,   --filename=           Log to a specified file, rather than to stdout.
    -l,   --loop=               Probe until Ctrl+C at specified second interval.
    -lms, --loop-ms=            Probe until Ctrl+C at specified millisecond interval.
    --query-gpu=                Information about GPU. Call --help-query-gpu for more info.
    --format=                   Comma separated list of format options: csv, noheader, nounits
    -pm,  --persistence-mode=   Set persistence mode: 0/DISABLED, 1/ENABLED
    topo                        Displays device/system topology. "nvidia-smi topo -h" for more information.
"""


def escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class SmiExit(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------- context
class Ctx:
    def __init__(self, prof: Profile, package: dict[str, Any]):
        self.prof = prof
        self.package = package
        self.driver_version = (
            package.get("driver_version")
            or os.environ.get("NVIDIA_SIM_DRIVER_VERSION")
            or kmod.loaded_driver_version()
            or "595.45.04"
        )
        self.cuda_version = package.get("cuda_version") or CUDA_BY_BRANCH.get(self.driver_version.split(".")[0], "13.2")
        self.usage = _read_usage()
        self.refresh_faults()

    def refresh_faults(self) -> None:
        self.faults = faults.active()
        self.ecc_aggregate = faults.aggregates()

    def fault(self, g: Gpu, kind: str) -> dict[str, Any] | None:
        return self.faults.get(g.bdf, {}).get(kind)

    def used_mib(self, g: Gpu) -> int:
        u = self.usage.get(g.bus_id) or self.usage.get(str(g.index)) or {}
        return int(u.get("memory_used_mib", g.get("memory_idle_mib", 1)))

    def util(self, g: Gpu) -> int:
        u = self.usage.get(g.bus_id) or self.usage.get(str(g.index)) or {}
        return int(u.get("utilization_gpu", 0))


def _read_usage() -> dict[str, Any]:
    from . import paths

    try:
        import yaml

        with open(paths.p(paths.USAGE), encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        return {str(k): v for k, v in data.items()}
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------- argument parsing
class Args:
    def __init__(self) -> None:
        self.mode = "summary"
        self.xml = False
        self.ids: list[str] | None = None
        self.query_gpu: str | None = None
        self.fmt: str | None = None
        self.pm: str | None = None
        self.filename: str | None = None
        self.loop_ms: int | None = None
        self.topo_matrix = False
        self.topo_pci_only = False
        self.p2p: str | None = None
        self.nvlink: str | None = None


def _take(argv: list[str], i: int, opt: str) -> tuple[str, int]:
    if "=" in argv[i] and argv[i].startswith("--"):
        return argv[i].split("=", 1)[1], i + 1
    if argv[i].startswith("-") and "=" in argv[i]:
        return argv[i].split("=", 1)[1], i + 1
    if i + 1 >= len(argv):
        raise SmiExit(2, f'Option "{opt}" is missing its value.')
    return argv[i + 1], i + 2


def parse(argv: list[str]) -> Args:
    a = Args()
    i = 0
    if argv and argv[0] == "topo":
        a.mode = "topo"
        i = 1
        while i < len(argv):
            t = argv[i].split("=", 1)[0]
            if t in ("-m", "--matrix"):
                a.topo_matrix = True
                i += 1
            elif t in ("-mp", "--matrix_pci"):
                a.topo_matrix = a.topo_pci_only = True
                i += 1
            elif t in ("-p2p", "--p2pstatus"):
                a.p2p, i = _take(argv, i, "-p2p")
            elif t in ("-i", "--id"):
                raise SmiExit(2, "The -i command line argument must be used in conjunction with -n or -p.")
            elif t in ("-h", "--help"):
                a.mode = "topo-help"
                i += 1
            else:
                raise SmiExit(2, f"ERROR: Option {argv[i]} is not recognized. Please run 'nvidia-smi topo -h'.")
        if a.mode == "topo" and not a.topo_matrix and a.p2p is None:
            a.mode = "topo-help"
        if a.p2p is not None and a.p2p not in P2P_CAPS:
            raise SmiExit(2, f"Invalid value \"{a.p2p}\" for option -p2p. Please run 'nvidia-smi topo -h'.")
        return a
    if argv and argv[0] == "nvlink":
        return _parse_nvlink(argv[1:], a)
    while i < len(argv):
        tok = argv[i]
        key = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if key in ("-h", "--help"):
            a.mode = "help"
            i += 1
        elif key == "--version":
            a.mode = "version"
            i += 1
        elif key in ("-L", "--list-gpus"):
            a.mode = "list"
            i += 1
        elif key in ("-q", "--query"):
            a.mode = "query"
            i += 1
        elif key in ("-x", "--xml-format"):
            a.xml = True
            i += 1
        elif key in ("-qx", "-xq"):
            a.mode, a.xml = "query", True
            i += 1
        elif key in ("-d", "--display"):
            _, i = _take(argv, i, "-d")
        elif key in ("-i", "--id") or tok.startswith("-i="):
            v, i = _take(argv, i, "-i")
            a.ids = [x.strip() for x in v.split(",") if x.strip()]
        elif key in ("-f", "--filename"):
            a.filename, i = _take(argv, i, "-f")
        elif key in ("-l", "--loop"):
            v, i = _take(argv, i, "-l")
            a.loop_ms = int(float(v) * 1000) if v.replace(".", "", 1).isdigit() else _bad(v, "-l")
        elif key in ("-lms", "--loop-ms"):
            v, i = _take(argv, i, "-lms")
            a.loop_ms = int(v) if v.isdigit() else _bad(v, "-lms")
        elif key == "--query-gpu":
            a.query_gpu, i = _take(argv, i, "--query-gpu")
            a.mode = "query-gpu"
        elif key == "--format":
            a.fmt, i = _take(argv, i, "--format")
        elif key in ("-pm", "--persistence-mode"):
            a.pm, i = _take(argv, i, "-pm")
            a.mode = "pm"
        elif key == "--help-query-gpu":
            a.mode = "help-query-gpu"
            i += 1
        else:
            raise SmiExit(2, f"ERROR: Option {tok} is not recognized. Please run 'nvidia-smi -h'.")
    if a.fmt is not None and a.mode != "query-gpu":
        raise SmiExit(2, INVALID)
    if a.mode == "query-gpu":
        if a.fmt is None:
            raise SmiExit(2, INVALID)
        opts = [o.strip() for o in a.fmt.split(",")]
        if not opts or opts[0] != "csv" or any(o not in ("csv", "noheader", "nounits") for o in opts):
            raise SmiExit(2, INVALID)
    if a.xml and a.mode != "query":
        raise SmiExit(2, INVALID)
    if a.mode == "pm" and (a.pm or "").upper() not in ("0", "1", "ENABLED", "DISABLED"):
        raise SmiExit(2, INVALID)
    return a


def _parse_nvlink(argv: list[str], a: Args) -> Args:
    """``nvidia-smi nvlink -s|-e [-i ID]`` (status, error counters); the other nvlink options are not modelled."""
    a.mode = "nvlink"
    i = 0
    while i < len(argv):
        t = argv[i].split("=", 1)[0]
        if t in ("-s", "--status"):
            a.nvlink = "status"
            i += 1
        elif t in ("-e", "--errorcounters"):
            a.nvlink = "errors"
            i += 1
        elif t in ("-i", "--id"):
            v, i = _take(argv, i, "-i")
            a.ids = [x.strip() for x in v.split(",") if x.strip()]
        else:
            raise SmiExit(2, f"ERROR: Option {argv[i]} is not recognized. Please run 'nvidia-smi nvlink -h'.")
    if a.nvlink is None:
        raise SmiExit(2, "rigops sandbox stand-in: nvidia-smi nvlink models -s and -e only")
    return a


def _bad(v: str, opt: str) -> int:
    raise SmiExit(2, f'Invalid value "{v}" for option {opt}.')


# ---------------------------------------------------------------- driver checks
def _select(ctx: Ctx, ids: list[str] | None) -> list[Gpu]:
    gpus = ctx.prof.gpus
    if ids is None:
        return gpus
    out = []
    for ident in ids:
        hit = None
        for g in gpus:
            if ident == str(g.index) or ident.lower() == g.uuid.lower():
                hit = g
            elif ident.lower() in (g.bus_id.lower(), g.bdf.lower(), g.bdf[5:].lower()):
                hit = g
        if hit is None:
            raise SmiExit(6, "No devices were found")
        out.append(hit)
    return out


def open_driver(package: dict[str, Any]) -> Ctx:
    """NVML init: load the profile, auto-load the module, check versions."""
    try:
        prof = load()
    except ProfileError:
        raise SmiExit(9, NOT_LOADED) from None
    if not kmod.autoload_nvidia(prof):
        raise SmiExit(9, NOT_LOADED)
    faults.apply(prof)  # GPUs that fell off the bus (nvidia-sim-fault xid79) are not enumerated
    ctx = Ctx(prof, package)
    loaded = kmod.loaded_driver_version()
    if package.get("driver_version") and loaded and loaded != package["driver_version"]:
        lib = ".".join(package["driver_version"].split(".")[:2])
        raise SmiExit(18, f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {lib}")
    if not prof.gpus and not prof.jetson:
        raise SmiExit(6, "No devices were found")
    return ctx


# ---------------------------------------------------------------- field values
def _na(v: Any) -> bool:
    return v is None or v == "N/A"


def fan(g: Gpu) -> str:
    return "N/A" if _na(g.get("fan_percent", "N/A")) else f"{g['fan_percent']} %"


def _power(g: Gpu, ctx: Ctx) -> float:
    idle = float(g.get("power_idle_w", 20.0))
    return round(idle + ctx.util(g) * (float(g.get("power_limit_w", 300)) - idle) / 100, 2)


def _pstate(g: Gpu, ctx: Ctx) -> str:
    return "P0" if ctx.util(g) or ctx.used_mib(g) > 100 else g.get("pstate_idle", "P8")


# ---------------------------------------------------------------- health (nvidia-sim-fault)
# clocks event reasons in nvidia-smi -q order: (XML tag suffix, -q label, --query-gpu suffix, NVML bit)
EVENT_REASONS = (
    ("gpu_idle", "Idle", "gpu_idle", 0x1),
    ("applications_clocks_setting", "Applications Clocks Setting", "applications_clocks_setting", 0x2),
    ("sw_power_cap", "SW Power Cap", "sw_power_cap", 0x4),
    ("hw_slowdown", "HW Slowdown", "hw_slowdown", 0x8),
    ("hw_thermal_slowdown", "    HW Thermal Slowdown", "hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", "    HW Power Brake Slowdown", "hw_power_brake_slowdown", 0x80),
    ("sync_boost", "Sync Boost", "sync_boost", 0x10),
    ("sw_thermal_slowdown", "SW Thermal Slowdown", "sw_thermal_slowdown", 0x20),
    ("display_clocks_setting", "Display Clock Setting", "display_clock_setting", 0x100),
)


def event_reasons(g: Gpu, ctx: Ctx) -> dict[str, bool]:
    thermal, brake = ctx.fault(g, "thermal") is not None, ctx.fault(g, "power_brake") is not None
    return {
        "gpu_idle": not ctx.util(g),
        "hw_slowdown": thermal or brake,
        "hw_thermal_slowdown": thermal,
        "hw_power_brake_slowdown": brake,
    }


def _reasons_mask(g: Gpu, ctx: Ctx) -> str:
    on = event_reasons(g, ctx)
    return f"0x{sum(bit for tag, _, _, bit in EVENT_REASONS if on.get(tag)):016x}"


def temperature(g: Gpu, ctx: Ctx) -> int:
    hot = ctx.fault(g, "thermal")
    if hot is not None:
        return int(hot.get("value", 92))
    return int(g.get("temp_idle_c", 32)) + ctx.util(g) // 3


def link_width(g: Gpu, ctx: Ctx) -> int:
    return 8 if ctx.fault(g, "link_x8") is not None else int(g.get("pcie_width", 16))


def link_gen(g: Gpu, ctx: Ctx) -> int:
    """Idle GPUs train the link down to gen 1, as real ones do to save power."""
    return int(g.get("pcie_gen", 5)) if ctx.util(g) else 1


def host_gen(g: Gpu, ctx: Ctx) -> int:
    """The root port's max generation (profile pcie_host_gen; the GPU's max when not given)."""
    return int(g.get("pcie_host_gen", g.get("pcie_gen", 5)))


def ecc(g: Gpu, ctx: Ctx) -> dict[str, Any]:
    """ECC figures: volatile (since the last reset) and aggregate DRAM uncorrectable counts, the
    row remapper (Ampere and later) or page retirement (earlier), N/A without ECC."""
    if not faults.has_ecc(g):
        return {"mode": "N/A", "volatile": "N/A", "aggregate": "N/A", "remap": faults.row_remapping(g), "ecc": False}
    vol = int((ctx.fault(g, "xid48") or {}).get("value", 0))
    agg = ctx.ecc_aggregate.get(g.bdf, {"dbe": 0, "rows": 0, "pages": 0})
    return {
        "mode": "Enabled",
        "volatile": vol,
        "aggregate": agg["dbe"],
        "rows": agg["rows"],
        "pages": agg["pages"],
        "pending": vol > 0,  # remaps/retirements take effect at the next GPU reset or reboot
        "remap": faults.row_remapping(g),
        "ecc": True,
    }


def _yes(b: bool) -> str:
    return "Yes" if b else "No"


def _remap_field(key: str) -> Callable[[Gpu, Ctx], Any]:
    def fn(g: Gpu, c: Ctx) -> Any:
        e = ecc(g, c)
        if not e["remap"]:
            return "N/A"
        return {"correctable": 0, "uncorrectable": e.get("rows", 0), "pending": _yes(e.get("pending", False))}.get(
            key, "No"
        )

    return fn


def _retired_field(key: str) -> Callable[[Gpu, Ctx], Any]:
    def fn(g: Gpu, c: Ctx) -> Any:
        e = ecc(g, c)
        if e["remap"] or not e["ecc"]:
            return "N/A"
        return {"single_bit_ecc.count": 0, "double_bit.count": e["pages"], "pending": _yes(e["pending"])}[key]

    return fn


FIELDS: dict[str, tuple[str, str, Callable[[Gpu, Ctx], Any]]] = {}


def _field(names: tuple[str, ...], header: str, unit: str, fn: Callable[[Gpu, Ctx], Any]) -> None:
    for n in names:
        FIELDS[n] = (header, unit, fn)


_field(("timestamp",), "timestamp", "", lambda g, c: time.strftime("%Y/%m/%d %H:%M:%S.000"))
_field(("driver_version",), "driver_version", "", lambda g, c: c.driver_version)
_field(("count",), "count", "", lambda g, c: len(c.prof.gpus))
_field(("index",), "index", "", lambda g, c: g.index)
_field(("name", "gpu_name"), "name", "", lambda g, c: g["name"])
_field(("serial", "gpu_serial"), "serial", "", lambda g, c: g.get("serial", "N/A"))
_field(("uuid", "gpu_uuid"), "uuid", "", lambda g, c: g.uuid)
_field(("pci.bus_id", "gpu_bus_id"), "pci.bus_id", "", lambda g, c: g.bus_id)
_field(("pci.domain",), "pci.domain", "", lambda g, c: "0x" + g.bus_id[:8][-4:])
_field(("pci.bus",), "pci.bus", "", lambda g, c: "0x" + g.bus_id.split(":")[1])
_field(("pci.device_id",), "pci.device_id", "", lambda g, c: f"0x{g.get('pci_device_id', '2b85').upper()}10DE")
_field(("pci.sub_device_id",), "pci.sub_device_id", "", lambda g, c: g.get("pci_subsystem_id", "N/A"))
_field(("compute_cap",), "compute_cap", "", lambda g, c: g["compute_cap"])
_field(("persistence_mode",), "persistence_mode", "", lambda g, c: persistence.mode(g, c.prof))
_field(("display_mode",), "display_mode", "", lambda g, c: "Disabled")
_field(("display_active",), "display_active", "", lambda g, c: "Disabled")
_field(("compute_mode",), "compute_mode", "", lambda g, c: "Default")
_field(("mig.mode.current",), "mig.mode.current", "", lambda g, c: g.get("mig", "N/A"))
_field(("vbios_version",), "vbios_version", "", lambda g, c: g.get("vbios", "N/A"))
_field(("pstate",), "pstate", "", _pstate)
_field(("memory.total",), "memory.total", "MiB", lambda g, c: g.get("memory_total_mib", "N/A"))
_field(("memory.reserved",), "memory.reserved", "MiB", lambda g, c: g.get("memory_reserved_mib", 0))
_field(("memory.used",), "memory.used", "MiB", lambda g, c: c.used_mib(g))
_field(
    ("memory.free",),
    "memory.free",
    "MiB",
    lambda g, c: (
        "N/A"
        if _na(g.get("memory_total_mib"))
        else g["memory_total_mib"] - g.get("memory_reserved_mib", 0) - c.used_mib(g)
    ),
)
_field(("utilization.gpu",), "utilization.gpu", "%", lambda g, c: c.util(g))
_field(("utilization.memory",), "utilization.memory", "%", lambda g, c: 0)
_field(("temperature.gpu",), "temperature.gpu", "", temperature)
_field(("fan.speed",), "fan.speed", "%", lambda g, c: g.get("fan_percent", "N/A"))
_field(("power.draw",), "power.draw", "W", lambda g, c: f"{_power(g, c):.2f}")
_field(("power.limit",), "power.limit", "W", lambda g, c: f"{float(g.get('power_limit_w', 300)):.2f}")
_field(("clocks.sm", "clocks.current.sm"), "clocks.current.sm", "MHz", lambda g, c: 180 if not c.util(g) else 2400)
_field(("clocks.max.sm", "clocks.max.sm"), "clocks.max.sm", "MHz", lambda g, c: g.get("max_sm_clock_mhz", 3090))
_field(("pcie.link.gen.max",), "pcie.link.gen.max", "", lambda g, c: g.get("pcie_gen", 5))
_field(("pcie.link.width.max",), "pcie.link.width.max", "", lambda g, c: g.get("pcie_width", 16))
_field(("pcie.link.gen.current", "pcie.link.gen.gpucurrent"), "pcie.link.gen.current", "", link_gen)
_field(("pcie.link.gen.gpumax",), "pcie.link.gen.gpumax", "", lambda g, c: g.get("pcie_gen", 5))
_field(("pcie.link.gen.hostmax",), "pcie.link.gen.hostmax", "", host_gen)
_field(("pcie.link.width.current",), "pcie.link.width.current", "", link_width)
_field(
    ("clocks_event_reasons.active", "clocks_throttle_reasons.active"), "clocks_event_reasons.active", "", _reasons_mask
)
for _tag, _label, _q, _bit in EVENT_REASONS:
    _field(
        (f"clocks_event_reasons.{_q}", f"clocks_throttle_reasons.{_q}"),
        f"clocks_event_reasons.{_q}",
        "",
        lambda g, c, t=_tag: "Active" if event_reasons(g, c).get(t) else "Not Active",
    )
_field(("ecc.mode.current",), "ecc.mode.current", "", lambda g, c: ecc(g, c)["mode"])
_field(("ecc.mode.pending",), "ecc.mode.pending", "", lambda g, c: ecc(g, c)["mode"])
for _scope in ("volatile", "aggregate"):
    for _what in ("total", "dram", "device_memory"):
        _field(
            (f"ecc.errors.uncorrected.{_scope}.{_what}",),
            f"ecc.errors.uncorrected.{_scope}.{_what}",
            "",
            lambda g, c, sc=_scope: ecc(g, c)[sc],
        )
        _field(
            (f"ecc.errors.corrected.{_scope}.{_what}",),
            f"ecc.errors.corrected.{_scope}.{_what}",
            "",
            lambda g, c: 0 if ecc(g, c)["ecc"] else "N/A",
        )
for _key in ("correctable", "uncorrectable", "pending", "failure"):
    _field((f"remapped_rows.{_key}",), f"remapped_rows.{_key}", "", _remap_field(_key))
for _key in ("single_bit_ecc.count", "double_bit.count", "pending"):
    _field((f"retired_pages.{_key}",), f"retired_pages.{_key}", "", _retired_field(_key))


def query_gpu(ctx: Ctx, gpus: list[Gpu], spec: str, fmt: str, header: bool = True) -> str:
    names = [f.strip() for f in spec.split(",") if f.strip()]
    for n in names:
        if n not in FIELDS:
            raise SmiExit(2, f'Field "{n}" is not a valid field to query.\n')
    opts = {o.strip() for o in fmt.split(",")}
    units = "nounits" not in opts
    lines = []
    if "noheader" not in opts and header:
        lines.append(", ".join(f"{FIELDS[n][0]} [{FIELDS[n][1]}]" if FIELDS[n][1] else FIELDS[n][0] for n in names))
    for g in gpus:
        cells = []
        for n in names:
            _, unit, fn = FIELDS[n]
            v = fn(g, ctx)
            if _na(v):
                cells.append("[N/A]")
            else:
                cells.append(f"{v} {unit}" if unit and units else str(v))
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- -L, summary
def list_gpus(ctx: Ctx, gpus: list[Gpu]) -> str:
    return "".join(f"GPU {g.index}: {g['name']} (UUID: {g.uuid})\n" for g in gpus)


def summary(ctx: Ctx, gpus: list[Gpu]) -> str:
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out = [
        time.strftime("%a %b %e %H:%M:%S %Y") + "       ",
        "+-----------------------------------------------------------------------------------------+",
        f"| NVIDIA-SMI {ctx.driver_version:<23}Driver Version: {ctx.driver_version:<15}"
        f"CUDA Version: {ctx.cuda_version:<9}|",
        bar,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for g in gpus:
        pm = {"Enabled": "On", "Disabled": "Off"}.get(persistence.mode(g, ctx.prof), "N/A")
        f = g.get("fan_percent", "N/A")
        fan_s = "N/A" if _na(f) else f"{f}%"
        ecc_v = ecc(g, ctx)["volatile"]
        total = g.get("memory_total_mib", "N/A")
        temp = temperature(g, ctx)
        out.append(f"|{g.index:>4}  {g['name'][:29]:<30}{pm:>3}  |   {g.bus_id} Off |{str(ecc_v):>21} |")
        watts, cap = int(_power(g, ctx)), int(g.get("power_limit_w", 300))
        mem = f"{str(ctx.used_mib(g)) + 'MiB':>11} / {str(total) + 'MiB':>9}"
        out.append(
            f"|{fan_s:>4}   {temp:>2}C    {_pstate(g, ctx):<2}{watts:>15}W / {cap:>4}W "
            f"|{mem} |{str(ctx.util(g)) + '%':>8}{'Default':>13} |"
        )
        out.append(f"|{'':41}|{'':24}|{g.get('mig', 'N/A'):>21} |")
        out.append(bar)
    out += [
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
        "|  No running processes found                                                             |",
        "+-----------------------------------------------------------------------------------------+",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- -q
def _q_sections(g: Gpu, ctx: Ctx) -> list[tuple[str, Any]]:
    """(label, value-or-subsections) in nvidia-smi -q order; the XML uses the same data."""
    total = g.get("memory_total_mib", "N/A")
    reserved = g.get("memory_reserved_mib", 0)
    used = ctx.used_mib(g)
    free = "N/A" if _na(total) else f"{total - reserved - used} MiB"
    dom, bus, rest = g.bus_id.split(":")
    dev = rest.split(".")[0]
    fan_v = fan(g)
    return [
        ("Product Name", "product_name", g["name"]),
        ("Product Brand", "product_brand", g.get("brand", "NVIDIA")),
        ("Product Architecture", "product_architecture", g.get("architecture", "N/A")),
        ("Display Mode", "display_mode", "Disabled"),
        ("Display Active", "display_active", "Disabled"),
        ("Persistence Mode", "persistence_mode", persistence.mode(g, ctx.prof)),
        ("Addressing Mode", "addressing_mode", g.get("addressing_mode", "None")),
        (
            "MIG Mode",
            "mig_mode",
            [("Current", "current_mig", g.get("mig", "N/A")), ("Pending", "pending_mig", g.get("mig", "N/A"))],
        ),
        ("Accounting Mode", "accounting_mode", "Disabled"),
        ("Accounting Mode Buffer Size", "accounting_mode_buffer_size", "4000"),
        ("Driver Model", "driver_model", [("Current", "current_dm", "N/A"), ("Pending", "pending_dm", "N/A")]),
        ("Serial Number", "serial", g.get("serial", "N/A")),
        ("GPU UUID", "uuid", g.uuid),
        ("Minor Number", "minor_number", str(g.index)),
        ("VBIOS Version", "vbios_version", g.get("vbios", "N/A")),
        ("MultiGPU Board", "multigpu_board", "No"),
        ("Board ID", "board_id", f"0x{int(bus, 16) << 8:x}"),
        ("GPU Part Number", "gpu_part_number", g.get("part_number", "N/A")),
        ("Module ID", "gpu_module_id", str(g.get("module_id", 1))),
        (
            "PCI",
            "pci",
            [
                ("Bus", "pci_bus", bus),
                ("Device", "pci_device", dev),
                ("Domain", "pci_domain", dom[-4:]),
                ("Device Id", "pci_device_id", f"{g.get('pci_device_id', '2b85').upper()}10DE"),
                ("Bus Id", "pci_bus_id", g.bus_id),
                ("Sub System Id", "pci_sub_system_id", g.get("pci_subsystem_id", "N/A")),
                (
                    "GPU Link Info",
                    "pci_gpu_link_info",
                    [
                        (
                            "PCIe Generation",
                            "pcie_gen",
                            [
                                ("Max", "max_link_gen", str(g.get("pcie_gen", 5))),
                                ("Current", "current_link_gen", str(link_gen(g, ctx))),
                                ("Device Current", "device_current_link_gen", str(link_gen(g, ctx))),
                                ("Device Max", "max_device_link_gen", str(g.get("pcie_gen", 5))),
                                ("Host Max", "max_host_link_gen", str(host_gen(g, ctx))),
                            ],
                        ),
                        (
                            "Link Width",
                            "link_widths",
                            [
                                ("Max", "max_link_width", f"{g.get('pcie_width', 16)}x"),
                                ("Current", "current_link_width", f"{link_width(g, ctx)}x"),
                            ],
                        ),
                    ],
                ),
            ],
        ),
        ("Fan Speed", "fan_speed", fan_v),
        ("Performance State", "performance_state", _pstate(g, ctx)),
        ("Clocks Event Reasons", "clocks_event_reasons", _reason_items(g, ctx)),
        (
            "FB Memory Usage",
            "fb_memory_usage",
            [
                ("Total", "total", "N/A" if _na(total) else f"{total} MiB"),
                ("Reserved", "reserved", f"{reserved} MiB"),
                ("Used", "used", f"{used} MiB"),
                ("Free", "free", free),
            ],
        ),
        ("Compute Mode", "compute_mode", "Default"),
        (
            "Utilization",
            "utilization",
            [("GPU", "gpu_util", f"{ctx.util(g)} %"), ("Memory", "memory_util", "0 %")],
        ),
        *_ecc_items(g, ctx),
        ("Temperature", "temperature", [("GPU Current Temp", "gpu_temp", f"{temperature(g, ctx)} C")]),
        (
            "GPU Power Readings",
            "gpu_power_readings",
            [
                ("Average Power Draw", "average_power_draw", f"{_power(g, ctx):.2f} W"),
                ("Instantaneous Power Draw", "instant_power_draw", f"{_power(g, ctx):.2f} W"),
                ("Current Power Limit", "current_power_limit", f"{float(g.get('power_limit_w', 300)):.2f} W"),
            ],
        ),
        (
            "Max Clocks",
            "max_clocks",
            [("SM", "sm_clock", f"{g.get('max_sm_clock_mhz', 3090)} MHz")],
        ),
        ("Processes", "processes", "None"),
    ]


def _reason_items(g: Gpu, ctx: Ctx) -> list:
    on = event_reasons(g, ctx)
    return [
        (label, f"clocks_event_reason_{tag}", "Active" if on.get(tag) else "Not Active")
        for tag, label, _, _ in EVENT_REASONS
    ]


def _ecc_items(g: Gpu, ctx: Ctx) -> list:
    """ECC Mode, ECC Errors, Retired Pages, Remapped Rows in the layout of driver 550 and later.

    Ampere and later split SRAM uncorrectable into parity and SEC-DED and add the threshold
    flag and the sources; earlier GPUs keep one sram_uncorrectable (real 535 to 580 captures).
    A label of None is XML only, a tag of None is -q text only (the two lay out retired pages
    differently).
    """
    e = ecc(g, ctx)
    na = not e["ecc"]

    def n(v: Any) -> str:
        return "N/A" if na else str(v)

    def counts(scope: str) -> list:
        unc = e[scope]
        items: list = [("SRAM Correctable", "sram_correctable", n(0))]
        if e["remap"]:
            items += [
                ("SRAM Uncorrectable Parity", "sram_uncorrectable_parity", n(0)),
                ("SRAM Uncorrectable SEC-DED", "sram_uncorrectable_secded", n(0)),
            ]
        else:
            items.append(("SRAM Uncorrectable", "sram_uncorrectable", n(0)))
        items += [("DRAM Correctable", "dram_correctable", n(0)), ("DRAM Uncorrectable", "dram_uncorrectable", n(unc))]
        if scope == "aggregate" and e["remap"]:
            items.append(("SRAM Threshold Exceeded", "sram_threshold_exceeded", "N/A" if na else "No"))
        return items

    errors: list = [("Volatile", "volatile", counts("volatile")), ("Aggregate", "aggregate", counts("aggregate"))]
    if e["remap"]:
        errors.append(
            (
                "Aggregate Uncorrectable SRAM Sources",
                "aggregate_uncorrectable_sram_sources",
                [
                    ("SRAM L2", "sram_l2", n(0)),
                    ("SRAM SM", "sram_sm", n(0)),
                    ("SRAM Microcontroller", "sram_microcontroller", n(0)),
                    ("SRAM PCIE", "sram_pcie", n(0)),
                    ("SRAM Other", "sram_other", n(0)),
                ],
            )
        )
    paged = e["ecc"] and not e["remap"]
    pages = str(e["pages"]) if paged else "N/A"
    pend = _yes(e["pending"]) if paged else "N/A"
    retired = [
        (
            None,
            "multiple_single_bit_retirement",
            [(None, "retired_count", "0" if paged else "N/A"), (None, "retired_pagelist", "N/A")],
        ),
        (None, "double_bit_retirement", [(None, "retired_count", pages), (None, "retired_pagelist", "N/A")]),
        (None, "pending_blacklist", pend),
        (None, "pending_retirement", pend),
        ("Single Bit ECC", None, "0" if paged else "N/A"),
        ("Double Bit ECC", None, pages),
        ("Pending Page Blacklist", None, pend),
    ]
    items: list = [
        ("ECC Mode", "ecc_mode", [("Current", "current_ecc", e["mode"]), ("Pending", "pending_ecc", e["mode"])]),
        ("ECC Errors", "ecc_errors", errors),
        ("Retired Pages", "retired_pages", retired),
    ]
    if e["remap"]:
        banks = g.get("row_remapper_banks")
        rows = int(e.get("rows", 0))

        def bank(v: int) -> str:
            return "N/A" if banks is None else f"{v} bank(s)"

        items.append(
            (
                "Remapped Rows",
                "remapped_rows",
                [
                    ("Correctable Error", "remapped_row_corr", "0"),
                    ("Uncorrectable Error", "remapped_row_unc", str(rows)),
                    ("Pending", "remapped_row_pending", _yes(e.get("pending", False))),
                    ("Remapping Failure Occurred", "remapped_row_failure", "No"),
                    (
                        "Bank Remap Availability Histogram",
                        "row_remapper_histogram",
                        [
                            ("Max", "row_remapper_histogram_max", bank(max(int(banks or 0) - rows, 0))),
                            ("High", "row_remapper_histogram_high", bank(min(rows, int(banks or 0)))),
                            ("Partial", "row_remapper_histogram_partial", bank(0)),
                            ("Low", "row_remapper_histogram_low", bank(0)),
                            ("None", "row_remapper_histogram_none", bank(0)),
                        ],
                    ),
                ],
            )
        )
    else:
        items.append(("Remapped Rows", "remapped_rows", "N/A"))
    return items


HEX_IN_TEXT = {"pci_bus", "pci_device", "pci_domain", "pci_device_id"}  # -q shows 0x05, -q -x shows 05


def query_text(ctx: Ctx, gpus: list[Gpu]) -> str:
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp':<42}: {time.strftime('%a %b %e %H:%M:%S %Y')}",
        f"{'Driver Version':<42}: {ctx.driver_version}",
        f"{'CUDA Version':<42}: {ctx.cuda_version}",
        "",
        f"{'Attached GPUs':<42}: {len(ctx.prof.gpus)}",
    ]

    def emit(items: list, depth: int) -> None:
        for label, _tag, value in items:
            if label is None:
                continue
            pad = "    " * depth
            if isinstance(value, list):
                out.append(pad + label)
                emit(value, depth + 1)
            else:
                shown = f"0x{value}" if _tag in HEX_IN_TEXT else value
                out.append(f"{pad}{label:<{42 - len(pad)}}: {shown}")

    for g in gpus:
        out.append(f"GPU {g.bus_id}")
        emit(_q_sections(g, ctx), 1)
        out.append("")
    return "\n".join(out) + "\n"


def query_xml(ctx: Ctx, gpus: list[Gpu]) -> str:
    out = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{time.strftime('%a %b %e %H:%M:%S %Y')}</timestamp>",
        f"\t<driver_version>{ctx.driver_version}</driver_version>",
        f"\t<cuda_version>{ctx.cuda_version}</cuda_version>",
        f"\t<attached_gpus>{len(ctx.prof.gpus)}</attached_gpus>",
    ]

    def emit(items: list, depth: int) -> None:
        for _label, tag, value in items:
            if tag is None:
                continue
            pad = "\t" * depth
            if isinstance(value, list):
                out.append(f"{pad}<{tag}>")
                emit(value, depth + 1)
                out.append(f"{pad}</{tag}>")
            else:
                out.append(f"{pad}<{tag}>{escape(str(value))}</{tag}>")

    for g in gpus:
        out.append(f'\t<gpu id="{g.bus_id}">')
        emit(_q_sections(g, ctx), 2)
        out.append("\t</gpu>")
    out.append("</nvidia_smi_log>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- topo
# Per link, in this order, as pre-Blackwell drivers print them (nvidia-smi nvlink -e on A100 and H100)
NVLINK_COUNTERS = ("Replay Errors", "Recovery Errors", "CRC Errors")


def nvlink_links(ctx: Ctx, g: Gpu) -> int:
    """A GPU's NVLinks: the most it has to any other GPU (an NVSwitch board: all of them to each peer)."""
    return max((ctx.prof.nvlinks(g, o) for o in ctx.prof.gpus if o.bdf != g.bdf), default=0)


def nvlink(ctx: Ctx, gpus: list[Gpu], what: str) -> str:
    """``nvidia-smi nvlink -s`` / ``-e``, laid out as real captures (tab and a space before each link line; a
    blank line after each link's counters). A link of an ``nvlink_down`` fault is ``<inactive>``; an
    ``nvlink_errors`` fault adds its count to link 0's replay and recovery errors and ten times it to CRC.
    A GPU without NVLink prints its header only (not checked against a capture)."""
    speed = str((ctx.prof.data.get("nvlink") or {}).get("speed", "26.562 GB/s"))
    out = []
    for g in gpus:
        out.append(f"GPU {g.index}: {g['name']} (UUID: {g.uuid})")
        down = ctx.fault(g, "nvlink_down")
        errors = int((ctx.fault(g, "nvlink_errors") or {}).get("value", 0))
        for link in range(nvlink_links(ctx, g)):
            if what == "status":
                inactive = down is not None and int(down.get("value", 0)) == link
                out.append(f"\t Link {link}: {'<inactive>' if inactive else speed}")
                continue
            n = errors if link == 0 else 0
            for counter, value in zip(NVLINK_COUNTERS, (n, n, 10 * n), strict=True):
                out.append(f"\t Link {link}: {counter}: {value}")
            out.append("")
    return "\n".join(out) + "\n"


def topo_matrix(ctx: Ctx, pcie_only: bool = False, tty: bool = False) -> str:
    prof = ctx.prof
    gpus = prof.gpus
    nics = prof.nics
    cols = [f"GPU{g.index}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    head = "\t".join([*cols, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = ["\t\x1b[4m" + head + "\x1b[0m" if tty else "\t" + head]

    def cell(code: str) -> str:
        return " X " if code == "X" else code

    nic_bdfs = [n["bdf"] for n in nics]
    for g in gpus:
        row = [f"GPU{g.index}"]
        row += [cell(prof.gpu_link(g, h, pcie_only)) for h in gpus]
        row += [cell(prof.pcie_link(g.bdf, nb)) for nb in nic_bdfs]
        numa = str(g.numa_node) if len(prof.numa) > 1 or g.numa_node >= 0 else "N/A"
        row += [g.cpu_affinity or "N/A", numa, "", g.get("gpu_numa_id", "N/A")]
        lines.append("\t".join(row))
    for i, nb in enumerate(nic_bdfs):
        row = [f"NIC{i}"]
        row += [cell(prof.pcie_link(nb, g.bdf)) for g in gpus]
        row += [cell(prof.pcie_link(nb, ob)) for ob in nic_bdfs]
        row += ["", "", "", ""]
        lines.append("\t".join(row))
    text = "\n".join(lines) + "\n" + TOPO_LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{i}: {n['name']}\n" for i, n in enumerate(nics)) + "\n"
    return text


def topo_p2p(ctx: Ctx, cap: str) -> str:
    gpus = ctx.prof.gpus
    lines = [" \t" + "".join(f"GPU{g.index}\t" for g in gpus)]
    for g in gpus:
        lines.append(f" GPU{g.index}\t" + "".join(ctx.prof.p2p(g, h, cap) + "\t" for h in gpus))
    return "\n".join(lines) + "\n" + P2P_LEGEND


TOPO_HELP = """topo -- Display topological information about the system.

Usage: nvidia-smi topo [options]

Options include:
[-m | --matrix]: Display the GPUDirect communication matrix for the system.
[-mp | --matrix_pci]: Display the GPUDirect communication matrix for the system (PCI Only).
[-p2p | --p2pstatus]: Displays the p2p status between the GPUs of a given p2p capability
                      r - p2p read capabiity
                      w - p2p write capability
                      n - p2p nvlink capability
                      a - p2p atomics capability
                      p - p2p pcie capability
"""


# ---------------------------------------------------------------- -pm
def set_persistence(ctx: Ctx, gpus: list[Gpu], value: str) -> tuple[int, str]:
    on = value.upper() in ("1", "ENABLED")
    if ctx.prof.jetson:
        return 3, "".join(f"Unable to set persistence mode for GPU {g.bus_id}: Not Supported\n" for g in gpus[:1]) + (
            "Terminating early due to previous errors.\n"
        )
    from . import paths

    if paths.euid() != 0:
        g = gpus[0]
        return 4, (
            f"Unable to set persistence mode for GPU {g.bus_id}: Insufficient Permissions\n"
            "Terminating early due to previous errors.\n"
        )
    lines = [persistence.set_mode(g, on) for g in gpus]
    return 0, "\n".join(lines) + "\nAll done.\n"


# ---------------------------------------------------------------- main
def _emit(text: str, filename: str | None) -> None:
    if filename:
        with open(filename, "a", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def run(argv: list[str], package: dict[str, Any]) -> int:
    args = parse(argv)
    if args.mode == "help":
        _emit(HELP.format(ver=package.get("driver_version") or "595.45.04"), None)
        return 0
    if args.mode == "topo-help":
        _emit(TOPO_HELP, None)
        return 0
    if args.mode == "help-query-gpu":
        _emit(
            'List of valid properties to query for the switch "--query-gpu=":\n\n' + "\n".join(sorted(FIELDS)) + "\n",
            None,
        )
        return 0
    ctx = open_driver(package)
    if args.mode == "version":
        branch_lib = ".".join(ctx.driver_version.split(".")[:2])
        _emit(
            f"NVIDIA-SMI version  : {ctx.driver_version}\nNVML version        : {branch_lib}\n"
            f"DRIVER version      : {ctx.driver_version}\nCUDA Version        : {ctx.cuda_version}\n",
            None,
        )
        return 0
    gpus = _select(ctx, args.ids)
    if args.mode == "topo":
        if args.p2p:
            _emit(topo_p2p(ctx, args.p2p), None)
        else:
            _emit(topo_matrix(ctx, args.topo_pci_only, tty=sys.stdout.isatty()), None)
        return 0
    if args.mode == "nvlink":
        _emit(nvlink(ctx, gpus, args.nvlink or "status"), None)
        return 0
    if args.mode == "pm":
        code, text = set_persistence(ctx, gpus, args.pm or "")
        _emit(text, None)
        return code
    if args.mode == "list":
        _emit(list_gpus(ctx, gpus), args.filename)
        return 0
    render: Callable[[bool], str]
    if args.mode == "query-gpu":

        def render(first: bool) -> str:
            return query_gpu(ctx, gpus, args.query_gpu or "", args.fmt or "csv", header=first)

    elif args.mode == "query":

        def render(first: bool) -> str:
            return query_xml(ctx, gpus) if args.xml else query_text(ctx, gpus)

    else:

        def render(first: bool) -> str:
            return summary(ctx, gpus)

    _emit(render(True), args.filename)
    if args.loop_ms:
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        try:
            while not stop:
                time.sleep(args.loop_ms / 1000)
                ctx.usage = _read_usage()
                ctx.refresh_faults()
                _emit(render(False), args.filename)
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str], package: dict[str, Any] | None = None) -> int:
    try:
        return run(argv, package or {})
    except SmiExit as e:
        if e.message:
            sys.stdout.write(e.message.rstrip("\n") + "\n")
        return e.code
    except BrokenPipeError:
        return 0
