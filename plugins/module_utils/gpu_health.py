# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The logic of a GPU health sentinel: read NVIDIA Xid events from a kernel log and
the health fields of ``nvidia-smi -q -x``, decide per GPU and per vLLM instance what
is unhealthy, and render the verdict for node exporter's textfile collector.

Plain functions, plain data, stdlib only (host Python 3.8+). Bus ids are normalised
with ``nvidia_smi.normalize_bus_id`` ('0000:3b:00.0').
"""

import re
import xml.etree.ElementTree as ET

from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import (
    NvidiaSmiError,
    _na,
    _text,
    normalize_bus_id,
)

# Meaning and recommended immediate action per Xid, after NVIDIA's Xid catalog
# ("Resolution Bucket (Immediate Action)" column), https://docs.nvidia.com/deploy/xid-errors/
# (analyzing-xid-catalog.html), and for the memory Xids (48, 63, 64, 94, 95) after
# https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/ . Buckets mapped onto our
# actions: RESTART_APP -> restart_app, RESET_GPU -> reset_gpu, RESTART_BM -> reboot,
# CONTACT_SUPPORT -> replace, IGNORE -> none. Xids not listed evaluate as "check".
# The catalog changes with driver branches: re-check these rows against it.
XIDS = {
    8: {"meaning": "GPU stopped processing", "action": "restart_app"},
    13: {"meaning": "Graphics Engine Exception", "action": "restart_app"},
    31: {"meaning": "GPU memory page fault (MMU fault)", "action": "restart_app"},
    43: {"meaning": "GPU stopped processing (reset channel verification error)", "action": "restart_app"},
    45: {"meaning": "Preemptive cleanup, due to previous errors", "action": "none"},
    48: {"meaning": "Double Bit ECC Error (DBE)", "action": "reset_gpu"},
    62: {"meaning": "Internal micro-controller halt", "action": "reset_gpu"},
    63: {"meaning": "ECC page retirement or row remapping recording event", "action": "reset_gpu"},
    64: {"meaning": "ECC page retirement or row remapper recording failure", "action": "reset_gpu"},
    74: {"meaning": "NVLink Error", "action": "reset_gpu"},
    79: {"meaning": "GPU has fallen off the bus", "action": "reboot"},
    92: {"meaning": "High single-bit ECC error rate", "action": "none"},
    94: {"meaning": "Contained ECC error", "action": "restart_app"},
    95: {"meaning": "Uncontained ECC error", "action": "reset_gpu"},
    109: {"meaning": "Context Switch Timeout Error", "action": "restart_app"},
    119: {"meaning": "GSP RPC Timeout", "action": "reset_gpu"},
    120: {"meaning": "GSP Error", "action": "reset_gpu"},
}
WARNING_ACTIONS = ("none", "restart_app")

# 'NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.' after any
# prefix (dmesg '[t]', 'dmesg -T', journal 'Mon dd hh:mm:ss host kernel:', a
# monitor's own text). Old drivers omit 'PCI:'; MIG adds ' GPU-I:05' before ')'.
_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?[^)]*\):\s*(\d+)(?:,\s*(.*))?"
)
# Leading 'pid=<n>|'<unknown>'|..., ' and 'name=<proc>, ' fields of the message.
_PID_NAME_RE = re.compile(r"^(?:pid=(?:'[^']*'|[^,\s]*),\s*)?(?:name=(?:'[^']*'|[^,]*),\s*)?")

SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
CRITICAL_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


def parse_kernel_log(text):
    """Xid events of a kernel log (dmesg, journalctl, syslog), in log order."""
    events = []
    for line in (text or "").splitlines():
        m = _XID_RE.search(line)
        if not m:
            continue
        detail = _PID_NAME_RE.sub("", (m.group(3) or "").strip(), count=1)
        events.append(
            {
                "bus_id": normalize_bus_id(m.group(1) + ".0"),
                "xid": int(m.group(2)),
                "detail": detail,
                "line": line,
            }
        )
    return events


def _int(value):
    """'16x' / '4' / ' 2 ' -> int; N/A or anything else -> None."""
    value = _na(value)
    m = re.match(r"^(\d+)\s*x?$", value) if value else None
    return int(m.group(1)) if m else None


def _yes(value):
    value = _na(value)
    if value is None:
        return None
    return {"yes": True, "no": False, "enabled": True, "disabled": False}.get(value.lower())


def _ecc_dbe_volatile(gpu):
    """Volatile uncorrectable count: '<volatile><double_bit><total>' (old) or the sum
    of '<volatile>' children named '*uncorrectable*' (dram/sram, newer drivers)."""
    total = _int(_text(gpu, "ecc_errors/volatile/double_bit/total"))
    if total is not None:
        return total
    volatile = gpu.find("ecc_errors/volatile")
    counts = [] if volatile is None else [_int(c.text) for c in volatile if "uncorrectable" in c.tag]
    counts = [c for c in counts if c is not None]
    return sum(counts) if counts else None


def _slowdown(gpu):
    for parent, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        reasons = gpu.find(parent)
        if reasons is not None:
            return [r for r in SLOWDOWN_REASONS if (_text(reasons, prefix + r) or "").lower() == "active"]
    return []


def read_smi_xml(text):
    """Health fields of every <gpu> of ``nvidia-smi -q -x``; N/A values are None.

    Raises NvidiaSmiError('parse') when the text is not an nvidia-smi XML document, so
    a broken probe is never read as "no GPUs, all healthy".
    """
    try:
        root = ET.fromstring((text or "").strip().encode("utf-8") if isinstance(text, str) else text)
    except ET.ParseError as exc:
        raise NvidiaSmiError("parse", f"could not parse nvidia-smi -q -x output: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError("parse", f"not an nvidia-smi -q -x document (root <{root.tag}>)")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        pending = [_yes(_text(gpu, "retired_pages/" + t)) for t in ("pending_retirement", "pending_blacklist")]
        link = "pci/pci_gpu_link_info/"
        gpus.append(
            {
                "index": index,
                "bus_id": normalize_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id")),
                "uuid": _text(gpu, "uuid"),
                "name": _text(gpu, "product_name"),
                "persistence": _yes(_text(gpu, "persistence_mode")),
                "ecc_dbe_volatile": _ecc_dbe_volatile(gpu),
                "retired_pending": True if True in pending else (False if False in pending else None),
                "remap_failure": _yes(_text(gpu, "remapped_rows/remapped_row_failure")),
                "remap_pending": _yes(_text(gpu, "remapped_rows/remapped_row_pending")),
                "link_width": {
                    "current": _int(_text(gpu, link + "link_widths/current_link_width")),
                    "max": _int(_text(gpu, link + "link_widths/max_link_width")),
                },
                "link_gen": {
                    "current": _int(_text(gpu, link + "pcie_gen/current_link_gen")),
                    "max": _int(_text(gpu, link + "pcie_gen/max_link_gen")),
                },
                "slowdown": _slowdown(gpu),
                "recovery_action": _text(gpu, "gpu_recovery_action"),
            }
        )
    return gpus


# ---------------------------------------------------------------------------------------------- NVLink
# `nvidia-smi nvlink -s` / `-e` (tests/fixtures/gpu-health/real/n0*.txt): a header per GPU, then per link
# 'Link N: <speed>' or 'Link N: <inactive>' (status) and 'Link N: <Counter>: <value>' (errors); a GPU whose
# links are all down prints 'NVML: Unable to retrieve NVLink information as all links are inActive'.
_NV_GPU_RE = re.compile(r"^GPU (\d+): (.*?) \(UUID: ([^)]*)\)\s*$")
_NV_LINK_RE = re.compile(r"^\s+Link (\d+): (.+?)\s*$")
_NV_COUNTER_RE = re.compile(r"^(.+?): (\S+)$")
# Counters that mean a link had to retrain or replay (DCGM's health watch fails a GPU on any new one:
# NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp MonitorNVLink), and Blackwell's failed recoveries.
NVLINK_CRITICAL = ("replay errors", "recovery errors", "link recovery failed events")
# Counters of data errors that the link corrects (CRC on pre-Blackwell links, Blackwell's packet counters):
# a warning when they grow. FEC corrections, packet and byte counts, BER figures and successful recoveries
# are the link working: never a finding.
NVLINK_WARNING = (
    "crc errors",
    "rx errors",
    "symbol errors",
    "malformed packet errors",
    "buffer overrun errors",
    "local link integrity errors",
    "effective errors",
    "rx remote errors",
    "rx general errors",
)


def parse_nvlink(text):
    """GPUs of ``nvidia-smi nvlink -s`` or ``-e``: {uuid: {"index", "name", "links": {n: {"status"} or
    {counter: int}}, "all_inactive"}}. Lines of no GPU (an elision, a prompt) are skipped."""
    gpus, current = {}, None
    for line in (text or "").splitlines():
        head = _NV_GPU_RE.match(line.strip())
        if head:
            current = gpus.setdefault(
                head.group(3).strip(),
                {"index": int(head.group(1)), "name": head.group(2), "links": {}, "all_inactive": False},
            )
            continue
        if current is None:
            continue
        if "all links are inactive" in line.lower():
            current["all_inactive"] = True
            continue
        link = _NV_LINK_RE.match(line)
        if not link:
            continue
        entry = current["links"].setdefault(int(link.group(1)), {})
        counter = _NV_COUNTER_RE.match(link.group(2))
        if counter and counter.group(2).lstrip("-").isdigit():
            entry[counter.group(1).strip().lower()] = int(counter.group(2))
        elif counter is None:
            entry["status"] = link.group(2)
    return gpus


def nvlink_active(links):
    """How many links of a GPU's `-s` entry are up (a speed, not <inactive>)."""
    return sum(1 for v in links.values() if v.get("status") and "inactive" not in v["status"].lower())


def nvlink_findings(status, counters, before, expected):
    """Findings of one GPU's NVLinks: ``status`` its ``-s`` entry, ``counters`` its ``-e`` links now, ``before``
    the same last round ({} the first time: nothing grew yet), ``expected`` the links it should have up (the
    most seen up, or the site's figure). Counters are cumulative: what grew since the last round is a finding."""
    found = []
    links = status.get("links", {})
    inactive = sorted(n for n, v in links.items() if "inactive" in v.get("status", "").lower())
    up = nvlink_active(links)
    if status.get("all_inactive") or (expected and up < expected):
        which = "all" if status.get("all_inactive") or not up else ", ".join(str(n) for n in inactive) or "?"
        detail = f"NVLink down: {up} of {expected or len(links)} link(s) up (inactive: {which})"
        found.append(_finding("nvlink", "critical", detail, "reset_gpu"))
    grown = {}
    prior = {str(k): v for k, v in (before or {}).items()}  # a state file's keys are strings
    for link, values in counters.items():
        for name, value in values.items():
            delta = value - prior.get(str(link), {}).get(name, value)
            if delta > 0:
                grown.setdefault(name, []).append((link, delta))
    for name, hits in sorted(grown.items()):
        severity = "critical" if name in NVLINK_CRITICAL else ("warning" if name in NVLINK_WARNING else None)
        if severity is None:
            continue
        where = ", ".join(f"link {link} +{delta}" for link, delta in sorted(hits))
        found.append(_finding("nvlink", severity, f"NVLink {name} grew since the last round: {where}", "check"))
    return found


# ------------------------------------------------------------------------------------------------ DCGM
# `dcgmi health -c` and `dcgmi discovery -l` (tests/fixtures/gpu-health/real/d0*.txt): the tool's tables.
# The text, not `-j`: no public capture of `-j` with an incident was found, and the table is what the
# captures show. DCGM watches memory and NVLink over time (rates, thresholds): where it answered for a GPU,
# its verdict on those replaces nvidia-smi's snapshot findings (DCGM_COVERS); its other systems (power,
# thermal, PCIe replays, InfoROM, driver) are added beside what nvidia-smi finds.
DCGM_COVERS = ("ecc", "retired_pages", "row_remap", "nvlink")
DCGM_RESULTS = {"healthy": None, "warning": "warning", "failure": "critical"}
_DCGM_ROW_RE = re.compile(r"^\|\s*(.*?)\s*\|\s*(.*?)\s*\|\s*$")


def parse_dcgmi_health(text):
    """``dcgmi health -c``: {"watches": False} when no watch is set, else {"watches": True, "overall": word,
    "gpus": {id: {"health": word, "systems": {name: {"health": word, "message": text}}}}}."""
    text = text or ""
    if "health watches not enabled" in text.lower():
        return {"watches": False, "overall": None, "gpus": {}}
    out = {"watches": True, "overall": None, "gpus": {}}
    gpu = system = None
    for line in text.splitlines():
        row = _DCGM_ROW_RE.match(line.strip())
        if not row:
            continue
        key, value = row.group(1), row.group(2)
        if key == "Overall Health":
            out["overall"] = value
        elif re.match(r"^-> \d+$", key):
            gpu = out["gpus"].setdefault(int(key[3:]), {"health": value, "systems": {}})
            system = None
        elif key.startswith("-> ") and gpu is not None and key != "-> Errors":
            system = gpu["systems"].setdefault(key[3:], {"health": value, "message": ""})
        elif key == "" and value and system is not None:
            system["message"] = (system["message"] + " " + value).strip()
        elif key and not key.startswith("->"):  # an entity group (GPU, NvSwitch...): its rows follow
            gpu = system = None
    return out


def parse_dcgmi_discovery(text):
    """``dcgmi discovery -l``: {DCGM GPU id: bus id}."""
    ids, current = {}, None
    for line in (text or "").splitlines():
        row = _DCGM_ROW_RE.match(line.strip())
        if not row:
            continue
        if row.group(1).isdigit():
            current = int(row.group(1))
        bus = re.match(r"^PCI Bus ID:\s*(\S+)", row.group(2))
        if bus and current is not None:
            ids[current] = normalize_bus_id(bus.group(1))
    return ids


def dcgm_findings(entry):
    """Findings of one GPU's `dcgmi health -c` entry: a Failure critical, a Warning a warning."""
    found = []
    for name, system in sorted(entry.get("systems", {}).items()):
        severity = DCGM_RESULTS.get(system["health"].lower(), "critical")
        if severity:
            detail = f"DCGM {name}: {system['health']}" + (f": {system['message']}" if system["message"] else "")
            found.append(_finding("dcgm", severity, detail, "check", system=name))
    return found


def _finding(check, severity, detail, action, **extra):
    finding = {"check": check, "severity": severity, "detail": detail, "action": action}
    finding.update(extra)
    return finding


def _recovery_action(value):
    low = value.lower()
    return "reboot" if "reboot" in low else ("reset_gpu" if "reset" in low or "drain" in low else "check")


def _gpu_findings(gpu):
    found = []
    dbe = gpu.get("ecc_dbe_volatile")
    if dbe:
        found.append(_finding("ecc", "critical", f"{dbe} volatile uncorrectable ECC error(s)", "reset_gpu"))
    if gpu.get("retired_pending") is True:
        found.append(_finding("retired_pages", "critical", "page retirement pending", "reset_gpu"))
    if gpu.get("remap_failure") is True:
        found.append(_finding("row_remap", "critical", "row remapping failure", "replace"))
    if gpu.get("remap_pending") is True:
        found.append(_finding("row_remap", "warning", "row remapping pending (activates on GPU reset)", "reset_gpu"))
    width = gpu.get("link_width") or {}
    if width.get("current") is not None and width.get("max") is not None and width["current"] < width["max"]:
        detail = "PCIe link x{} of x{} (down-trained: reseat the card or riser)".format(width["current"], width["max"])
        found.append(_finding("pcie_link", "critical", detail, "check"))
    # The link generation drops at idle by design (power saving): never a finding.
    for reason in gpu.get("slowdown") or []:
        severity = "critical" if reason in CRITICAL_SLOWDOWN else "warning"
        found.append(_finding("slowdown", severity, f"clocks slowed: {reason} active", "check"))
    if gpu.get("persistence") is False:
        found.append(_finding("persistence", "warning", "persistence mode disabled", "check"))
    action = gpu.get("recovery_action")
    if action not in (None, "None"):
        detail = f"driver asks for recovery action: {action}"
        found.append(_finding("recovery_action", "critical", detail, _recovery_action(action)))
    return found


def _xid_findings(events):
    """One finding per distinct Xid, ordered by each Xid's last event (the last
    finding is the most recent Xid)."""
    by_xid = {}
    for position, event in enumerate(events):
        entry = by_xid.setdefault(event["xid"], {"count": 0})
        entry.update(count=entry["count"] + 1, last=position, detail=event.get("detail") or "")
    found = []
    for xid, entry in sorted(by_xid.items(), key=lambda item: item[1]["last"]):
        known = XIDS.get(xid)
        action = known["action"] if known else "check"
        meaning = known["meaning"] if known else "not in the Xid catalog table"
        severity = "warning" if action in WARNING_ACTIONS else "critical"
        detail = "Xid {} ({}), {} event(s); last: {}".format(xid, meaning, entry["count"], entry["detail"])
        found.append(_finding("xid", severity, detail.rstrip(": "), action, xid=xid))
    return found


def _entry(index, bus_id, uuid, findings):
    healthy = not any(f["severity"] == "critical" for f in findings)
    return {"index": index, "bus_id": bus_id, "uuid": uuid, "healthy": healthy, "findings": findings}


def evaluate(gpus, xids, expected_bus_ids=None, extra=None, dcgm=None):
    """Verdict per GPU and for the host. Xid events on a bus id nvidia-smi does not
    list (a GPU that fell off the bus) get an entry of their own (index None). ``extra``:
    more findings per bus id (NVLink's). ``dcgm``: DCGM's findings per bus id, for the GPUs
    it answered for: they replace the findings of the checks in DCGM_COVERS."""
    extra = {normalize_bus_id(b): f for b, f in (extra or {}).items()}
    dcgm = {normalize_bus_id(b): f for b, f in (dcgm or {}).items()}
    events = {}
    for event in xids or []:
        events.setdefault(normalize_bus_id(event.get("bus_id")), []).append(event)
    entries, seen = [], set()
    for gpu in sorted(gpus or [], key=lambda g: (g.get("index") is None, g.get("index"))):
        bus_id = normalize_bus_id(gpu.get("bus_id"))
        seen.add(bus_id)
        findings = _gpu_findings(gpu) + extra.get(bus_id, [])
        if bus_id in dcgm:
            findings = dcgm[bus_id] + [f for f in findings if f["check"] not in DCGM_COVERS]
        findings += _xid_findings(events.get(bus_id, []))
        entries.append(_entry(gpu.get("index"), bus_id, gpu.get("uuid"), findings))
    absent = {normalize_bus_id(b) for b in expected_bus_ids or []} - seen
    for bus_id in sorted(absent | (set(events) - seen - {None})):
        findings = []
        if bus_id in absent:
            findings.append(_finding("missing", "critical", "expected GPU not listed by nvidia-smi", "reboot"))
        entries.append(_entry(None, bus_id, None, findings + _xid_findings(events.get(bus_id, []))))
    return {"healthy": all(e["healthy"] for e in entries), "gpus": entries}


def _match(gpu, ref):
    if isinstance(ref, int) and not isinstance(ref, bool):
        return gpu["index"] == ref
    ref = str(ref).strip()
    if ref.isdigit():
        return gpu["index"] == int(ref)
    return gpu["bus_id"] == normalize_bus_id(ref) or (gpu["uuid"] or "").lower() == ref.lower()


def instance_verdicts(result, instances):
    """Per vLLM instance: unhealthy when any of its GPUs is (or cannot be found)."""
    verdicts = {}
    for instance in instances or []:
        unhealthy, findings = [], []
        for ref in instance.get("gpus") or []:
            gpu = next((g for g in result.get("gpus", []) if _match(g, ref)), None)
            if gpu is None:
                unhealthy.append(ref)
                findings.append(_finding("missing", "critical", f"GPU {ref} not found", "check", bus_id=None))
                continue
            if not gpu["healthy"]:
                unhealthy.append(gpu["bus_id"])
            findings.extend(dict(f, bus_id=gpu["bus_id"]) for f in gpu["findings"])
        verdicts[instance.get("name")] = {"healthy": not unhealthy, "unhealthy_gpus": unhealthy, "findings": findings}
    return verdicts


def _labels(pairs):
    escaped = (
        '{}="{}"'.format(k, str("" if v is None else v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
        for k, v in sorted(pairs)
    )
    return "{" + ",".join(escaped) + "}"


def prometheus(result, verdicts):
    """Text exposition format (node exporter textfile collector), deterministic."""
    gpus = sorted(result.get("gpus", []), key=lambda g: (g["bus_id"] or "", str(g["index"])))
    out = []

    def family(name, help_text, samples):
        out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} gauge"])
        out.extend(f"{name}{labels} {value}" for labels, value in samples)

    family(
        "rigops_gpu_healthy",
        "1 when the GPU has no critical health finding.",
        [
            (_labels([("bus_id", g["bus_id"]), ("uuid", g["uuid"]), ("index", g["index"])]), int(g["healthy"]))
            for g in gpus
        ],
    )
    counts = {}
    for g in gpus:
        for f in g["findings"]:
            key = (g["bus_id"] or "", f["check"], f["severity"])
            counts[key] = counts.get(key, 0) + 1
    family(
        "rigops_gpu_health_findings",
        "Health findings per GPU, check and severity.",
        [(_labels([("bus_id", b), ("check", c), ("severity", s)]), n) for (b, c, s), n in sorted(counts.items())],
    )
    last = [(g["bus_id"], [f["xid"] for f in g["findings"] if f["check"] == "xid"]) for g in gpus]
    family(
        "rigops_gpu_xid_last",
        "Most recent NVIDIA Xid seen in the kernel log for the GPU.",
        [(_labels([("bus_id", b)]), x[-1]) for b, x in last if x],
    )
    family(
        "rigops_vllm_instance_gpu_healthy",
        "1 when every GPU of the vLLM instance is healthy.",
        [
            (_labels([("vllm_instance", name)]), int(v["healthy"]))
            for name, v in sorted((verdicts or {}).items(), key=lambda i: str(i[0]))
        ],
    )
    return "\n".join(out) + "\n"
