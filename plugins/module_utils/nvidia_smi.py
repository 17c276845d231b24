# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure helpers around ``nvidia-smi``: find it, run it, classify its failures, and
parse ``-q -x`` XML and ``--query-gpu`` CSV into plain dicts.

Nothing here imports AnsibleModule. Functions that run commands take a ``run``
callable with the signature of ``AnsibleModule.run_command`` (``run(argv) -> (rc,
stdout, stderr)``) so they are unit-testable without a host.
"""

import os
import re
import xml.etree.ElementTree as ET

# The fields we ask --query-gpu for, in this order (see QUERY_GPU_ARGS).
QUERY_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "driver_version",
    "compute_cap",
    "persistence_mode",
    "pci.bus_id",
)
QUERY_GPU_ARGS = [
    "--query-gpu=" + ",".join(QUERY_GPU_FIELDS),
    "--format=csv,noheader,nounits",
]
XML_ARGS = ["-q", "-x"]

# Environment for every nvidia-smi / lspci call whose output we parse.
PARSE_ENV = {"LC_ALL": "C", "LANG": "C"}

MISSING_MSG = (
    "nvidia-smi not found in PATH: the NVIDIA driver is not installed; run the "
    "nvidia_driver role (Blackwell needs the open kernel modules, branch 595) or set "
    "nvidia_smi_path to the binary"
)
NOT_LOADED_MSG = (
    "nvidia-smi is installed but the NVIDIA kernel driver is not loaded (nvidia-smi "
    "could not communicate with the NVIDIA driver): reboot after a driver install or "
    "upgrade, or load it with 'modprobe nvidia'; if that fails, check 'dmesg | grep -i "
    "nvrm' (Secure Boot signing, nouveau still bound, kernel headers mismatch)"
)

_NOT_LOADED_PATTERNS = (
    "couldn't communicate with the nvidia driver",
    "could not communicate with the nvidia driver",
    "nvidia-smi has failed",
    "driver/library version mismatch",
    "no devices were found",
)


def read_captured(module, path):
    """Text of a captured output file (a support bundle); fails the module if unreadable."""
    try:
        with open(path) as handle:
            return handle.read()
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc}")


class NvidiaSmiError(Exception):
    """Raised with ``kind`` in {'missing', 'driver_not_loaded', 'failed', 'parse'}."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message


def find_nvidia_smi(path=None, search_path=None, isfile=os.path.isfile, access=os.access):
    """Return the nvidia-smi binary to use, or raise NvidiaSmiError('missing').

    ``path`` is an explicit binary (option ``nvidia_smi_path``); otherwise every entry
    of ``search_path`` (default ``$PATH`` plus /usr/bin and /usr/sbin) is tried.
    """
    if path:
        if isfile(path) and access(path, os.X_OK):
            return path
        raise NvidiaSmiError("missing", f"{MISSING_MSG} (nvidia_smi_path={path} is not an executable file)")
    dirs = (search_path if search_path is not None else os.environ.get("PATH", "")).split(os.pathsep)
    for extra in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        if extra not in dirs:
            dirs.append(extra)
    for d in dirs:
        if not d:
            continue
        candidate = os.path.join(d, "nvidia-smi")
        if isfile(candidate) and access(candidate, os.X_OK):
            return candidate
    raise NvidiaSmiError("missing", MISSING_MSG)


def classify_failure(rc, stdout, stderr):
    """Turn a failed nvidia-smi run into an NvidiaSmiError with a clear message."""
    text = ("{}\n{}".format(stdout or "", stderr or "")).strip()
    low = text.lower()
    if rc == 9 or any(p in low for p in _NOT_LOADED_PATTERNS):
        return NvidiaSmiError("driver_not_loaded", f"{NOT_LOADED_MSG}. nvidia-smi said (rc={rc}): {text[:400]}")
    return NvidiaSmiError("failed", f"nvidia-smi failed (rc={rc}): {text[:400]}")


def run_nvidia_smi(run, binary, args):
    """Run ``binary args`` through ``run``; return stdout or raise NvidiaSmiError."""
    try:
        rc, out, err = run([binary] + list(args))
    except OSError as exc:  # binary vanished between find and run
        raise NvidiaSmiError("missing", f"{MISSING_MSG} ({exc})") from exc
    if rc != 0:
        raise classify_failure(rc, out, err)
    return out


def _na(value):
    """None for nvidia-smi's 'not available' spellings, else the stripped string."""
    if value is None:
        return None
    value = value.strip()
    if value in ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]"):
        return None
    return value


def parse_mib(value):
    """'32607 MiB' / '32607' / '97887 MiB' -> 32607 (int); GiB converted; else None."""
    value = _na(value)
    if value is None:
        return None
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(MiB|GiB|MB|GB)?\s*$", value)
    if not m:
        return None
    number = float(m.group(1))
    if m.group(2) in ("GiB", "GB"):
        number *= 1024
    return int(round(number))


def normalize_bus_id(value):
    """'00000000:19:00.0' -> '0000:19:00.0' (the sysfs/lspci spelling), lower case."""
    value = _na(value)
    if value is None:
        return None
    m = re.match(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$", value.strip())
    if not m:
        return value.lower()
    domain = (m.group(1) or "0")[-4:].rjust(4, "0")
    return "{}:{}:{}.{}".format(
        domain.lower(), m.group(2).lower().rjust(2, "0"), m.group(3).lower().rjust(2, "0"), m.group(4)
    )


def _text(elem, path):
    if elem is None:
        return None
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    return _na(found.text)


def parse_smi_xml(text):
    """Parse ``nvidia-smi -q -x``.

    Returns ``{driver_version, cuda_version, attached_gpus, gpus: [...]}`` where each GPU
    is ``{index, product_name, product_architecture, persistence_mode, uuid, pci_bus_id,
    memory_total_mib, minor_number}``. ``index`` is the position in the document, which
    is nvidia-smi's own enumeration order (the order ``-q`` prints GPUs in). Missing or
    N/A values are None. Raises NvidiaSmiError('parse') on malformed XML.
    """
    # The DOCTYPE points at a DTD we do not have; ElementTree ignores it.
    try:
        root = ET.fromstring(text.strip().encode("utf-8") if isinstance(text, str) else text)
    except ET.ParseError as exc:
        raise NvidiaSmiError("parse", f"could not parse nvidia-smi -q -x output: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError("parse", f"not an nvidia-smi -q -x document (root element <{root.tag}>)")
    attached = _text(root, "attached_gpus")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        persistence = _text(gpu, "persistence_mode")
        minor = _text(gpu, "minor_number")
        gpus.append(
            {
                "index": index,
                "product_name": _text(gpu, "product_name"),
                "product_architecture": _text(gpu, "product_architecture"),
                "persistence_mode": persistence,
                "uuid": _text(gpu, "uuid"),
                "pci_bus_id": normalize_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id")),
                "memory_total_mib": parse_mib(_text(gpu, "fb_memory_usage/total")),
                "minor_number": int(minor) if minor and minor.isdigit() else None,
            }
        )
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "attached_gpus": int(attached) if attached and attached.isdigit() else None,
        "gpus": gpus,
    }


def parse_query_gpu_csv(text, fields=QUERY_GPU_FIELDS):
    """Parse ``--query-gpu=<fields> --format=csv,noheader[,nounits]`` output.

    Lines that do not have exactly ``len(fields)`` comma-separated values (or whose
    ``index`` is not a number) are skipped, so captured output with surrounding text
    still parses. Units ('MiB') are tolerated. Returns a list of dicts keyed by field
    name with values: index int, memory.total int MiB, others str or None.
    """
    rows = []
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            continue
        row = {}
        for name, value in zip(fields, parts):
            if name == "index":
                if not value.isdigit():
                    row = None
                    break
                row[name] = int(value)
            elif name == "memory.total":
                row[name] = parse_mib(value)
            elif name == "pci.bus_id":
                row[name] = normalize_bus_id(value)
            else:
                row[name] = _na(value)
        if row:
            rows.append(row)
    return rows


def build_gpu_facts(xml_data, csv_rows):
    """Merge parsed XML and CSV into the ``nvidia_gpu`` fact.

    CSV rows are matched to XML GPUs by UUID, then by PCI bus id, then by index. Either
    source may be None/empty; what one lacks the other fills in.
    """
    xml_data = xml_data or {"gpus": []}
    csv_rows = csv_rows or []
    by_uuid = {r.get("uuid"): r for r in csv_rows if r.get("uuid")}
    by_bus = {r.get("pci.bus_id"): r for r in csv_rows if r.get("pci.bus_id")}
    by_index = {r.get("index"): r for r in csv_rows if r.get("index") is not None}
    gpus = []
    used = set()
    sources = xml_data.get("gpus") or []
    for x in sources:
        row = by_uuid.get(x.get("uuid")) or by_bus.get(x.get("pci_bus_id")) or by_index.get(x.get("index")) or {}
        if row:
            used.add(id(row))
        gpus.append(_gpu_entry(x, row))
    for row in csv_rows:
        if id(row) not in used:
            gpus.append(_gpu_entry({}, row))
    gpus.sort(key=lambda g: (g["index"] is None, g["index"]))
    driver = xml_data.get("driver_version")
    if not driver:
        driver = next((r.get("driver_version") for r in csv_rows if r.get("driver_version")), None)
    return {
        "driver_version": driver,
        "cuda_version": xml_data.get("cuda_version"),
        "attached_gpus": xml_data.get("attached_gpus"),
        "gpu_count": len(gpus),
        "gpus": gpus,
    }


def _gpu_entry(x, row):
    index = row.get("index") if row.get("index") is not None else x.get("index")
    persistence = row.get("persistence_mode") or x.get("persistence_mode")
    return {
        "index": index,
        "uuid": row.get("uuid") or x.get("uuid"),
        "name": row.get("name") or x.get("product_name"),
        "architecture": x.get("product_architecture"),
        "compute_capability": row.get("compute_cap"),
        "memory_total_mib": row.get("memory.total")
        if row.get("memory.total") is not None
        else x.get("memory_total_mib"),
        "pci_bus_id": row.get("pci.bus_id") or x.get("pci_bus_id"),
        "persistence_mode": persistence,
        "persistence_enabled": None if persistence is None else persistence.lower() == "enabled",
        "minor_number": x.get("minor_number"),
    }
