# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsers and readers of GPU topology evidence: plain functions, plain data in and out.

No AnsibleModule and no policy here (the policy is module_utils ``gpu_topology``):

* ``parse_topo_matrix``  - ``nvidia-smi topo -m`` as printed or as pasted by people
* ``parse_p2p_matrix``   - ``nvidia-smi topo -p2p r|w|n|a|p``
* ``parse_lspci_vvv``    - ``lspci -vvv``: ACSCtl per device and bridge bus ranges
* ``parse_lspci_tree``   - ``lspci -t[v]``: parent bridge of every device
* ``upstream_bridges``   - bridges above a device (from bus ranges, tree or sysfs)
* ``read_iommu_groups``  - ``<sysfs_root>/kernel/iommu_groups/<n>/devices/<bdf>``
* ``parse_env_file``     - systemd EnvironmentFile / /etc/environment syntax
* ``nccl_level`` / ``link_nccl_level`` - NCCL_P2P_LEVEL values and the level a link needs
* ``normalize_bdf``, ``pair_key``, ``link_rank`` - the keys and the order the check uses

How bridges "above a GPU" are found (documented approach): a PCI bridge routes the
bus numbers ``secondary..subordinate`` of its ``Bus:`` line in ``lspci -vvv``; a
bridge is upstream of a GPU when the GPU's bus lies in that range (same domain).
When ``lspci -vvv`` lacks ``Bus:`` lines, the ``lspci -t`` tree or the sysfs path
``/sys/bus/pci/devices/<bdf>`` (a symlink whose path lists every bridge from the root
port down: ``/sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0``) gives the chain.

Runs on managed hosts: Python 3.8 compatible.
"""

import os
import re

# Best first. NV# (any number of bonded links) ranks best; SOC is the pre-2017 SYS.
LINK_ORDER = ("NV", "PIX", "PSB", "PXB", "PHB", "NODE", "SYS")
LINK_CHOICES = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
P2P_CODES = ("OK", "CNS", "GNS", "TNS", "NS", "DR", "U")
TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[[0-9]{1,2}(?:;[0-9]{1,2})*m")
_PREFIX = re.compile(r"^[\s*#>|]*")
_LINK_CELL = re.compile(r"\s*(X|NV\d{1,2}|NODE|SYS|SOC|PHB|PXB|PIX|PSB)(?=\s|$|X\b|NV\d|NODE|SYS|SOC|PHB|PXB|PIX|PSB)")
_P2P_CELL = re.compile(r"\s*(X|OK|CNS|GNS|TNS|NS|DR|U)(?=\s|$)")
_HEADER_DEV = re.compile(r"(?:GPU|NIC)\d+|\S+")
_AFFINITY_VALUE = re.compile(r"\d[\d,\-]*$")


def pair_key(i, j):
    """'GPU<i>-GPU<j>' with i < j."""
    a, b = sorted((int(i), int(j)))
    return f"GPU{a}-GPU{b}"


def link_rank(code):
    """Rank of a link code: 0 for NV#, 6 for SYS/SOC, 7 for unknown/None."""
    if not code:
        return len(LINK_ORDER)
    code = code.upper()
    if re.match(r"^NV\d*$", code):
        return 0
    if code == "SOC":
        code = "SYS"
    if code in LINK_ORDER:
        return LINK_ORDER.index(code)
    return len(LINK_ORDER)


def _clean_lines(text):
    text = (text or "").replace("\r\n", "\n").replace("\r", "\n")
    text = _ANSI.sub("", text)
    return text.split("\n")


def _strip_prefix(line):
    return _PREFIX.sub("", line)


def _header_at(line):
    """If ``line`` is a matrix header, return the header text from GPU0 on, else None.

    A header has ``GPU0`` followed by ``GPU1``/a NIC/a trailing column; a row has
    ``GPU0`` followed by a cell. Text before GPU0 (a prompt, '*', indentation) is
    ignored, so a header printed on the prompt line still counts.
    """
    m = re.search(r"(?<![A-Za-z0-9_])GPU0(?![0-9])", line)
    if not m:
        return None
    rest = line[m.start() :]
    after = rest[4:].lstrip()
    if re.match(r"^(GPU1(?![0-9])|NIC\d|mlx\d|CPU Affinity)", after):
        return rest
    return None


def _parse_header(rest):
    idx = rest.find("CPU Affinity")
    dev_part = rest if idx < 0 else rest[:idx]
    trail_part = "" if idx < 0 else rest[idx:]
    devices = []
    for tok in dev_part.split():
        devices.extend(_HEADER_DEV.findall(tok) if re.match(r"^(GPU|NIC)\d", tok) else [tok])
    trailing = [c for c in TRAILING_COLUMNS if c in trail_part]
    return devices, trailing


def _blocks(lines):
    """Yield (header_line_index, devices, trailing, rows) for every matrix in the text.

    ``rows`` maps a row label to the rest of the line after the label.
    """
    i = 0
    n = len(lines)
    while i < n:
        rest = _header_at(lines[i])
        if rest is None:
            i += 1
            continue
        devices, trailing = _parse_header(rest)
        rows = {}
        order = []
        j = i + 1
        while j < n:
            body = _strip_prefix(lines[j])
            if not body.strip():
                if rows:
                    break
                j += 1
                continue
            m = re.match(r"^(GPU\d+|NIC\d+|\S+?)(?=\s)", body)
            label = m.group(1) if m else None
            if label is None or label not in devices or label in rows:
                break
            rows[label] = body[m.end() :]
            order.append(label)
            j += 1
        yield i, devices, trailing, rows, order
        i = j if j > i + 1 else i + 1


def _row(devices, cells):
    """{device: cell} for the cells read; a short (damaged) row maps the first devices only."""
    return {devices[k]: cells[k] for k in range(min(len(devices), len(cells)))}


def _read_cells(rest, count, cell_re):
    cells = []
    pos = 0
    while len(cells) < count:
        m = cell_re.match(rest, pos)
        if not m:
            break
        cells.append(m.group(1))
        pos = m.end()
    return cells, rest[pos:]


def _is_topo_block(trailing, rows):
    if trailing:
        return True
    for rest in rows.values():
        cells, _end = _read_cells(rest, 1, _LINK_CELL)
        first = rest.split()[0] if rest.split() else ""
        if cells and cells[0] != "X" or re.match(r"^(NV\d|NODE|SYS|PHB|PXB|PIX)", first):
            return True
    return False


def _is_p2p_block(trailing, rows):
    if trailing:
        return False
    for rest in rows.values():
        toks = rest.split()
        if any(t in P2P_CODES for t in toks):
            return True
    return False


def parse_topo_matrix(text):
    """Parse ``nvidia-smi topo -m``.

    Returns a dict::

        gpu_count: int                  GPUs in the header
        gpus: ['GPU0', ...]
        nics: {count, names, columns}   names resolved through the NIC Legend
        links: {'GPU0-GPU1': 'NV18'|None, ...}  every unordered GPU pair once
        cpu_affinity / numa_affinity / gpu_numa_id: {'GPU0': str|None}
        columns: trailing columns present in the header
        warnings: [str]                 damaged or missing cells, truncation

    ``found`` is False (and everything empty) when no matrix is in the text.
    """
    lines = _clean_lines(text)
    block = None
    for blk in _blocks(lines):
        _title, devices, trailing, rows, _order = blk
        if rows and _is_topo_block(trailing, rows):
            block = blk
            break
    result = {
        "found": False,
        "gpu_count": 0,
        "gpus": [],
        "nics": {"count": 0, "names": [], "columns": []},
        "links": {},
        "cpu_affinity": {},
        "numa_affinity": {},
        "gpu_numa_id": {},
        "columns": [],
        "warnings": [],
    }
    if block is None:
        return result
    header_idx, devices, trailing, rows, _order = block
    warnings = result["warnings"]
    gpus = [d for d in devices if re.match(r"^GPU\d+$", d)]
    others = [d for d in devices if d not in gpus]
    matrix = {}
    for label, rest in rows.items():
        cells, remainder = _read_cells(rest, len(devices), _LINK_CELL)
        if len(cells) < len(devices):
            warnings.append(f"row {label}: read {len(cells)} of {len(devices)} cells (damaged or wrapped line)")
        matrix[label] = _row(devices, cells)
        if label in gpus:
            values = remainder.split()
            for col_i, col in enumerate(trailing):
                value = values[col_i] if col_i < len(values) else None
                if value is not None and value != "N/A" and not re.match(r"^[\d,\-]+$", value):
                    fixed = _AFFINITY_VALUE.search(value)
                    warnings.append(f"row {label}: damaged {col} cell {value!r}")
                    value = fixed.group(0) if fixed else None
                key = {"CPU Affinity": "cpu_affinity", "NUMA Affinity": "numa_affinity", "GPU NUMA ID": "gpu_numa_id"}[
                    col
                ]
                result[key][label] = None if value in (None, "N/A") else value
    for g in gpus:
        for key in ("cpu_affinity", "numa_affinity", "gpu_numa_id"):
            result[key].setdefault(g, None)
        if g not in rows:
            warnings.append(f"row {g} missing (truncated output?)")
    indices = sorted(int(g[3:]) for g in gpus)
    for a_pos, a in enumerate(indices):
        for b in indices[a_pos + 1 :]:
            ga, gb = f"GPU{a}", f"GPU{b}"
            v1 = matrix.get(ga, {}).get(gb)
            v2 = matrix.get(gb, {}).get(ga)
            if v1 and v2 and v1 != v2:
                warnings.append(f"{pair_key(a, b)}: asymmetric cells {v1}/{v2}, using the worse")
                value = v1 if link_rank(v1) >= link_rank(v2) else v2
            else:
                value = v1 or v2
            if value == "SOC":
                value = "SYS"
            if value is None:
                warnings.append(f"{pair_key(a, b)}: link not readable")
            result["links"][pair_key(a, b)] = value
    legend = {}
    for line in lines[header_idx:]:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", _strip_prefix(line))
        if m:
            legend[m.group(1)] = m.group(2)
    result.update(
        {
            "found": True,
            "gpu_count": len(gpus),
            "gpus": [f"GPU{i}" for i in indices],
            "columns": trailing,
            "nics": {"count": len(others), "names": [legend.get(o, o) for o in others], "columns": others},
        }
    )
    return result


def parse_p2p_matrix(text):
    """Parse ``nvidia-smi topo -p2p <mode>``.

    Returns ``{found, gpus, status: {'GPU0-GPU1': 'OK', ...}, warnings}``. The matrix is
    directional; when the two directions of a pair differ, the one that is not OK is
    kept (and a warning says so).
    """
    lines = _clean_lines(text)
    result = {"found": False, "gpus": [], "status": {}, "warnings": []}
    for _title, devices, trailing, rows, _order in _blocks(lines):
        if not rows or not _is_p2p_block(trailing, rows):
            continue
        gpus = [d for d in devices if re.match(r"^GPU\d+$", d)]
        matrix = {}
        for label, rest in rows.items():
            cells, _end = _read_cells(rest, len(devices), _P2P_CELL)
            if len(cells) < len(devices):
                result["warnings"].append(f"row {label}: read {len(cells)} of {len(devices)} cells")
            matrix[label] = _row(devices, cells)
        indices = sorted(int(g[3:]) for g in gpus)
        for a_pos, a in enumerate(indices):
            for b in indices[a_pos + 1 :]:
                v1 = matrix.get(f"GPU{a}", {}).get(f"GPU{b}")
                v2 = matrix.get(f"GPU{b}", {}).get(f"GPU{a}")
                value = v1 or v2
                if v1 and v2 and v1 != v2:
                    value = v1 if v1 != "OK" else v2
                    result["warnings"].append(f"{pair_key(a, b)}: directions differ ({v1}/{v2})")
                result["status"][pair_key(a, b)] = value
        result.update({"found": True, "gpus": [f"GPU{i}" for i in indices]})
        return result
    return result


# --------------------------------------------------------------------------- PCIe


def normalize_bdf(value, domain="0000"):
    """'01:00.0' / '0000:01:00.0' / '00000000:01:00.0' -> '0000:01:00.0'."""
    m = re.match(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", (value or "").strip())
    if not m:
        return None
    dom = (m.group(1) or domain)[-4:].rjust(4, "0").lower()
    return f"{dom}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _acs_flags(line):
    return {name: sign == "+" for name, sign in re.findall(r"([A-Za-z]+)([+-])", line.split(":", 1)[1])}


def acs_redirects(flags):
    """True when ACSCtl redirects peer requests or completions upstream."""
    return bool(flags) and (flags.get("ReqRedir", False) or flags.get("CmpltRedir", False))


def parse_lspci_vvv(text):
    """Parse ``lspci -vvv`` (or a ``grep ACSCtl`` of it).

    Returns ``{devices: {bdf: {description, bridge, secondary, subordinate, acs_ctl,
    acs_redirect, nvidia_gpu}}, orphan_acs: [flags, ...], acs_lines: int,
    access_denied: bool}``. ACSCtl lines that are not inside a device block (grep
    output) go to ``orphan_acs``.
    """
    devices = {}
    orphans = []
    current = None
    acs_lines = 0
    denied = False
    for raw in _clean_lines(text):
        m = re.match(r"^((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(.*)$", raw)
        if m:
            bdf = normalize_bdf(m.group(1))
            desc = m.group(2)
            current = {
                "description": desc,
                "bridge": "PCI bridge" in desc,
                "secondary": None,
                "subordinate": None,
                "acs_ctl": None,
                "acs_redirect": False,
                "nvidia_gpu": bool(
                    re.search(r"(VGA compatible controller|3D controller|Display controller).*NVIDIA", desc)
                ),
            }
            devices[bdf] = current
            continue
        line = raw.strip()
        if "Capabilities: <access denied>" in line:
            denied = True
        bm = re.match(r"^Bus: primary=([0-9a-f]{2}), secondary=([0-9a-f]{2}), subordinate=([0-9a-f]{2})", line)
        if bm and current is not None:
            current["secondary"] = int(bm.group(2), 16)
            current["subordinate"] = int(bm.group(3), 16)
            current["bridge"] = True
            continue
        if line.startswith("ACSCtl:"):
            acs_lines += 1
            flags = _acs_flags(line)
            if current is None:
                orphans.append(flags)
            else:
                current["acs_ctl"] = flags
                current["acs_redirect"] = acs_redirects(flags)
    return {"devices": devices, "orphan_acs": orphans, "acs_lines": acs_lines, "access_denied": denied}


def parse_lspci_tree(text):
    """Parse ``lspci -t`` / ``lspci -tv`` into ``{bdf: parent_bridge_bdf_or_None}``.

    Works by columns: a root ``[dddd:bb]`` or a bridge ``dd.f-[bb(-ss)]`` sets the bus
    of the devices printed at the column of its first child; later lines with a device
    at that column belong to the same bus and parent.
    """
    parents = {}
    col_bus = {}
    col_parent = {}
    domain = "0000"
    token = re.compile(
        r"\[(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2})\]-|([0-9a-fA-F]{2}\.[0-7])(?:-\[([0-9a-fA-F]{2})(?:-[0-9a-fA-F]{2})?\])?"
    )
    for raw in _clean_lines(text):
        pending_bus = None
        pending_parent = None
        for m in token.finditer(raw):
            if m.group(2) is not None:  # root bus marker
                domain = (m.group(1) or domain).lower()
                pending_bus = int(m.group(2), 16)
                pending_parent = None
                continue
            col = m.start()
            if pending_bus is not None:
                col_bus[col] = pending_bus
                col_parent[col] = pending_parent
                pending_bus = None
            if col not in col_bus:
                continue
            bus = col_bus[col]
            bdf = f"{domain}:{bus:02x}:{m.group(3).lower()}"
            parents[bdf] = col_parent[col]
            if m.group(4) is not None:  # a bridge: its first child follows on this line
                pending_bus = int(m.group(4), 16)
                pending_parent = bdf
    return parents


def upstream_bridges(bdf, lspci=None, tree=None, sysfs_root=None, realpath=os.path.realpath):
    """Bridges above ``bdf``, nearest first. Tries bus ranges, then tree, then sysfs."""
    bdf = normalize_bdf(bdf)
    if bdf is None:
        return []
    chain = []
    if lspci and lspci.get("devices"):
        dom, bus = bdf[:4], int(bdf[5:7], 16)
        ranges = [
            (d, info)
            for d, info in lspci["devices"].items()
            if info.get("secondary") is not None and d[:4] == dom and info["secondary"] <= bus <= info["subordinate"]
        ]
        if ranges:
            # narrower range = closer to the device
            ranges.sort(key=lambda item: item[1]["subordinate"] - item[1]["secondary"])
            return [d for d, _range in ranges]
    if tree:
        cur = tree.get(bdf)
        seen = set()
        while cur and cur not in seen:
            seen.add(cur)
            chain.append(cur)
            cur = tree.get(cur)
        if chain:
            return chain
    if sysfs_root:
        link = os.path.join(sysfs_root, "bus", "pci", "devices", bdf)
        if os.path.exists(link):
            parts = realpath(link).split(os.sep)
            found = [normalize_bdf(p) for p in parts if normalize_bdf(p)]
            if found and found[-1] == bdf:
                found = found[:-1]
            return list(reversed(found))
    return chain


def read_iommu_groups(sysfs_root, listdir=os.listdir, isdir=os.path.isdir):
    """``{bdf: group}`` from ``<sysfs_root>/kernel/iommu_groups/<n>/devices/<bdf>``.

    Empty when the directory does not exist (IOMMU off) or cannot be read.
    """
    base = os.path.join(sysfs_root or "/sys", "kernel", "iommu_groups")
    groups = {}
    if not isdir(base):
        return groups
    try:
        names = listdir(base)
    except OSError:
        return groups
    for name in names:
        devdir = os.path.join(base, name, "devices")
        try:
            for dev in listdir(devdir):
                bdf = normalize_bdf(dev)
                if bdf:
                    groups[bdf] = name
        except OSError:
            continue
    return groups


# --------------------------------------------------------------------- environment


def parse_env_file(text):
    """Parse ``/etc/environment`` / systemd ``EnvironmentFile=`` syntax into a dict.

    Handles blank lines, ``#``/``;`` comments, ``export KEY=value``, single and double
    quotes (backslash escapes inside double quotes), trailing `` # comment`` on
    unquoted values and backslash line continuations.
    """
    env = {}
    lines = _clean_lines(text)
    buf = ""
    for raw in lines:
        if raw.endswith("\\") and not raw.strip().startswith(("#", ";")):
            buf += raw[:-1]
            continue
        line = (buf + raw).strip()
        buf = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", line)
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if value[:1] == '"':
            end = 1
            out = []
            while end < len(value) and value[end] != '"':
                if value[end] == "\\" and end + 1 < len(value):
                    end += 1
                out.append(value[end])
                end += 1
            value = "".join(out)
        elif value[:1] == "'":
            end = value.find("'", 1)
            value = value[1:end] if end > 0 else value[1:]
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0].strip()
        env[key] = value
    return env


TRUTHY = ("1", "true", "yes", "on", "y")
_NCCL_LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "SYS": 5}
_LINK_TO_NCCL = {"NV": 1, "PIX": 2, "PSB": 2, "PXB": 3, "PHB": 4, "NODE": 4, "SYS": 5}


def nccl_level(value):
    """NCCL_P2P_LEVEL as an int (LOC=0 ... SYS=5), or None when unset/unknown."""
    if value is None:
        return None
    v = str(value).strip().upper()
    if v.isdigit():
        return int(v)
    return _NCCL_LEVELS.get(v)


def link_nccl_level(code):
    """The NCCL_P2P_LEVEL a ``topo -m`` link needs for NCCL to use P2P on it (NV# -> 1 ... SYS -> 5).

    Unknown or unreadable links count as SYS (5).
    """
    code = (code or "").upper()
    if code.startswith("NV"):
        code = "NV"
    if code == "SOC":
        code = "SYS"
    return _LINK_TO_NCCL.get(code, 5)


def env_truthy(value):
    """True for the values NCCL and systemd read as on: 1, true, yes, on, y (any case)."""
    return str(value if value is not None else "").strip().lower() in TRUTHY
