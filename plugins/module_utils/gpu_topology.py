# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The topology check: policy over what ``nvidia_topology`` parsed. Plain data in and out.

``evaluate_check`` is a short driver: it prepares the evidence once (``_evidence``), then
runs one small function per check, host-wide (``check_topology_readable``,
``check_gpu_count``) and per GPU group (``GROUP_CHECKS``: GPUs present, links, NUMA, P2P
status, ACS, IOMMU, NCCL environment), and collects their findings into one verdict per
group. ``format_problems`` renders the findings as one line per instance and kind.

A finding is a dict::

    instance     the GPU group (vLLM instance) it concerns; None for the host as a whole
    kind         what was found, one of PROBLEM_KINDS
    pair         'GPU<i>-GPU<j>' (i < j) for a pair, 'GPU<i>' for one GPU, 'GPU0,GPU1,...'
                 for the whole group, None for the host
    cause        what was seen, for this pair (or GPU, group, host)
    summary      what was seen, worded for every pair of the instance that has it
                 (format_problems groups on it)
    fix          what to do
    cause_class  why it happens, one of CAUSE_CLASSES
    severity     'error' when kind is in fail_on (never for cause_class 'informational'),
                 else 'warning'; the check passes when no finding is an error

Runs on managed hosts: Python 3.8 compatible.
"""

from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
    acs_redirects,
    env_truthy,
    link_nccl_level,
    link_rank,
    nccl_level,
    normalize_bdf,
    pair_key,
    upstream_bridges,
)

PROBLEM_KINDS = (
    "gpu_missing",
    "link_worse_than_allowed",
    "p2p_not_supported",
    "p2p_unsupported_by_product",
    "acs_redirect",
    "iommu_split",
    "nccl_p2p_disabled",
    "cross_numa",
    "topology_unreadable",
)
DEFAULT_FAIL_ON = (
    "gpu_missing",
    "link_worse_than_allowed",
    "p2p_not_supported",
    "acs_redirect",
    "nccl_p2p_disabled",
    "topology_unreadable",
)
CAUSE_CLASSES = {
    "product": (
        "the GPU model, its driver or the platform offers no P2P on the pair (GNS; CNS/TNS across the CPU "
        "socket interconnect); no BIOS, boot or environment setting changes it; NCCL goes through host memory"
    ),
    "fixable": (
        "a setting blocks P2P the product offers: ACS redirect, IOMMU grouping, NCCL_P2P_DISABLE/NCCL_P2P_LEVEL, "
        "a driver registry key, or a P2P status that points at one (CNS/NS/DR/U inside one socket)"
    ),
    "informational": (
        "a setting that would block PCIe P2P (ACS redirect, split IOMMU group) on pairs where it cannot matter: the "
        "product offers no P2P there anyway, or the pair talks over NVLink; never an error"
    ),
    "layout": "the GPUs chosen for the instance, or the slots they sit in: links, NUMA nodes, TNS inside a socket",
    "inventory": "the host does not show the GPUs the inventory expects",
    "evidence": "what the check needs could not be read: no topo -m matrix, an unreadable link, no P2P status",
}
P2P_MEANINGS = {
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}
P2P_FIXES = {
    "CNS": (
        "the chipset/BIOS blocks P2P: disable ACS (and IOMMU or set iommu=pt) in the BIOS, "
        "or place the GPUs behind one PCIe switch"
    ),
    "TNS": "the slot topology does not allow P2P: move the cards into slots under one CPU root complex or PCIe switch",
    "NS": "P2P not supported on this path: check ACS (BIOS: ACS off), IOMMU (iommu=pt) and the driver branch",
    "DR": (
        "P2P disabled by a driver registry key: remove the NVreg_* P2P override from /etc/modprobe.d "
        "and rebuild the initramfs"
    ),
    "U": "P2P status unknown: the GPU may be in an error state; check 'nvidia-smi -q' and 'dmesg | grep -i xid'",
}
# What NCCL does when the product offers no P2P, and what it costs (docs: field notes, "Topology").
NO_P2P_COST = (
    "NCCL turns P2P off for these pairs and moves tensor-parallel traffic through host memory (SHM): "
    "it works, at roughly half the tensor-parallel throughput"
)
CROSS_SOCKET_COST = (
    "NCCL moves the traffic of these pairs through host memory (SHM): it works, and every tensor-parallel "
    "step that spans both sockets waits for it"
)
ACS_FIX = "BIOS: disable ACS (PCIe Access Control Services), or clear it at boot ({})"
IOMMU_FIX = (
    "boot with iommu=pt (intel_iommu=on iommu=pt / amd_iommu=pt) or disable the IOMMU, and "
    "disable ACS in the BIOS so peer traffic is not forced through the root complex"
)
MOOT_PRODUCT = (
    " (informational: this product offers no P2P on these pairs, see p2p_unsupported_by_product; "
    "it matters only with a P2P-capable driver or GPU)"
)
MOOT_NVLINK = " (informational: these pairs talk over NVLink, which neither ACS nor the IOMMU touches)"

# ------------------------------------------------------------------ helpers


def _finding(ev, grp, kind, pair, cause, fix, cause_class, summary=None):
    return {
        "instance": grp["name"] if grp else None,
        "kind": kind,
        "pair": pair,
        "cause": cause,
        "summary": summary or cause,
        "fix": fix,
        "cause_class": cause_class,
        "severity": "error" if kind in ev["fail_on"] and cause_class != "informational" else "warning",
    }


def _numa_of(topo, gpu):
    return (topo.get("numa_affinity") or {}).get(gpu)


def _by_numa(ev, gpus):
    """{numa node: [gpu index, ...]} for the GPUs whose NUMA node is known."""
    by_node = {}
    for g in gpus:
        node = _numa_of(ev["topo"], f"GPU{g}")
        if node is not None:
            by_node.setdefault(node, []).append(g)
    return by_node


def _numa_split_hint(ev, gpus):
    by_node = _by_numa(ev, gpus)
    if not by_node:
        return ""
    parts = ["{} (NUMA {})".format(",".join(f"GPU{g}" for g in v), k) for k, v in sorted(by_node.items())]
    return " e.g. " + " or ".join(parts)


def _layout_hint(ev, grp):
    """The layout that keeps tensor-parallel traffic off the socket interconnect, for this group."""
    by_node = _by_numa(ev, grp["present"])
    where = ", ".join(f"{gpu_set(v)} on NUMA {k}" for k, v in sorted(by_node.items()))
    if len(by_node) > 1:
        sizes = set(len(v) for v in by_node.values())
        if len(sizes) == 1:
            tp, pp = sizes.pop(), len(by_node)
            how = f"engine.tensor_parallel_size {tp} with '--pipeline-parallel-size={pp}' in engine.extra_args"
            return f"keep tensor parallel inside one NUMA node and pipeline parallel across nodes ({how}; {where})"
        return f"keep tensor parallel inside one NUMA node and pipeline parallel across nodes ({where})"
    if by_node:
        return (
            f"tensor parallel already stays inside one NUMA node ({where}); a smaller tensor_parallel_size "
            "with pipeline parallelism moves less through host memory"
        )
    return "keep tensor parallel inside one NUMA node and pipeline parallel across nodes"


def _group_label(gpus):
    return ",".join(f"GPU{g}" for g in gpus)


def _normalize_groups(groups, gpu_count):
    out = []
    for pos, grp in enumerate(groups or []):
        if isinstance(grp, dict):
            name = grp.get("name") or f"group{pos}"
            gpus = grp.get("gpus") or []
        else:
            name = f"group{pos}"
            gpus = grp
        out.append({"name": str(name), "gpus": sorted(set(int(g) for g in gpus))})
    if not out and gpu_count:
        out.append({"name": "all", "gpus": list(range(gpu_count))})
    return out


def _evidence(
    topo,
    p2p_by_mode,
    expected_gpus,
    require_p2p,
    worst_link_allowed,
    fail_on,
    lspci,
    tree,
    gpu_bus_ids,
    iommu_groups,
    env_by_file,
    sysfs_root,
):
    """Everything the checks read, prepared once: a plain dict."""
    topo_found = bool(topo) and bool(topo.get("found"))
    gpu_count = topo.get("gpu_count", 0) if topo else 0
    topo = topo or {"links": {}, "gpu_count": 0}
    bus_ids = {idx: normalize_bdf(bus) for idx, bus in enumerate(gpu_bus_ids or []) if bus}
    devices = (lspci or {}).get("devices") or {}
    redirecting = sorted(d for d, info in devices.items() if info.get("acs_redirect"))
    gpu_redirect = {}
    for idx, bdf in bus_ids.items():
        hits = [b for b in upstream_bridges(bdf, lspci=lspci, tree=tree, sysfs_root=sysfs_root) if b in redirecting]
        if hits:
            gpu_redirect[idx] = hits
    nccl_disable, nccl_level_set = [], []
    for path, env in sorted((env_by_file or {}).items()):
        if env_truthy(env.get("NCCL_P2P_DISABLE")):
            nccl_disable.append((path, env["NCCL_P2P_DISABLE"]))
        lvl = nccl_level(env.get("NCCL_P2P_LEVEL"))
        if lvl is not None:
            nccl_level_set.append((path, env["NCCL_P2P_LEVEL"], lvl))
    return {
        "topo": topo,
        "topo_found": topo_found,
        "gpu_count": gpu_count,
        "p2p_by_mode": p2p_by_mode or {},
        "expected_gpus": expected_gpus,
        "require_p2p": require_p2p,
        "worst_link_allowed": worst_link_allowed or "SYS",
        "allowed_rank": link_rank(worst_link_allowed or "SYS"),
        "fail_on": tuple(fail_on or ()),
        "bus_ids": bus_ids,
        "redirecting": redirecting,
        "orphan_redirects": [f for f in ((lspci or {}).get("orphan_acs") or []) if acs_redirects(f)],
        "gpu_redirect": gpu_redirect,
        "iommu_groups": iommu_groups or {},
        "nccl_disable": nccl_disable,
        "nccl_level_set": nccl_level_set,
    }


def _group_view(ev, grp):
    """One GPU group as the checks see it: its GPUs, those present, their pairs."""
    present = [g for g in grp["gpus"] if g < ev["gpu_count"]]
    return {
        "name": grp["name"],
        "gpus": grp["gpus"],
        "present": present,
        "label": _group_label(grp["gpus"]),
        "pairs": [(a, b) for pos, a in enumerate(present) for b in present[pos + 1 :]],
    }


def _link(ev, a, b):
    return ev["topo"].get("links", {}).get(pair_key(a, b))


def pair_p2p(ev, a, b):
    """Why P2P is missing between GPU a and GPU b: ``(mode, code, cause_class)`` for the first
    mode (in sorted order) that is not OK, or None when every mode read says OK or none was read.

    GNS is the product (GeForce on NVIDIA's stock driver); CNS/TNS on a pair that crosses the
    CPU socket interconnect (SYS) is the platform, which no setting changes: both 'product'.
    TNS inside a socket is the slot layout; a missing status is 'evidence'; the rest
    (CNS/NS/DR/U inside a socket) points at a setting: 'fixable'.
    """
    for mode, status in sorted(ev["p2p_by_mode"].items()):
        code = (status or {}).get(pair_key(a, b))
        if code == "OK":
            continue
        if code is None:
            return mode, None, "evidence"
        if code == "GNS" or (code in ("CNS", "TNS") and link_rank(_link(ev, a, b)) == link_rank("SYS")):
            return mode, code, "product"
        return mode, code, "layout" if code == "TNS" else "fixable"
    return None


def _product_limited(ev, a, b):
    found = pair_p2p(ev, a, b)
    return bool(found) and found[2] == "product"


def _moot(ev, a, b):
    """Why an ACS redirect or an IOMMU split cannot matter for P2P between GPU a and GPU b (a note
    for the finding), or '' when it can: the product offers no P2P there, or they talk over NVLink."""
    if _product_limited(ev, a, b):
        return MOOT_PRODUCT
    if (_link(ev, a, b) or "").startswith("NV"):
        return MOOT_NVLINK
    return ""


# ------------------------------------------------------------------ host-wide checks


def check_topology_readable(ev):
    """topology_unreadable when no ``topo -m`` matrix was read."""
    if ev["topo_found"]:
        return []
    return [
        _finding(
            ev,
            None,
            "topology_unreadable",
            None,
            "no 'nvidia-smi topo -m' matrix could be read",
            "check that nvidia-smi works on the host, or pass the full 'nvidia-smi topo -m' output as topo_file",
            "evidence",
        )
    ]


def check_gpu_count(ev):
    """gpu_missing when the host shows another number of GPUs than expected."""
    expected = ev["expected_gpus"]
    if expected is None or ev["gpu_count"] == int(expected):
        return []
    return [
        _finding(
            ev,
            None,
            "gpu_missing",
            None,
            "expected {} GPUs, nvidia-smi shows {}".format(int(expected), ev["gpu_count"]),
            "check that every card is seated and powered ('lspci | grep -i nvidia', "
            "'dmesg | grep -i -e nvrm -e xid'); if the inventory is wrong, fix the expected GPU count",
            "inventory",
        )
    ]


# ------------------------------------------------------------------ per-group checks


def check_gpus_present(ev, grp):
    """gpu_missing for each GPU of the group the host does not show."""
    count = ev["gpu_count"]
    shows = f"the host shows {count} GPU(s) (GPU0..GPU{max(count - 1, 0)})"
    return [
        _finding(
            ev,
            grp,
            "gpu_missing",
            f"GPU{g}",
            "instance {} uses GPU{} but {}".format(grp["name"], g, shows),
            "check that the card is seated and powered ('lspci | grep -i nvidia', 'dmesg | grep -i nvrm'), "
            "or change the instance's gpus to existing indices",
            "inventory",
            "the instance uses GPUs the host does not show: " + shows,
        )
        for g in grp["gpus"]
        if g >= count
    ]


def check_links(ev, grp):
    """link_worse_than_allowed for each pair whose ``topo -m`` link ranks worse than allowed."""
    out = []
    allowed = ev["worst_link_allowed"]
    for a, b in grp["pairs"]:
        code = _link(ev, a, b)
        if link_rank(code) <= ev["allowed_rank"]:
            continue
        if code is None:
            cause = f"the link between GPU{a} and GPU{b} could not be read from 'nvidia-smi topo -m'"
            summary = "links could not be read from 'nvidia-smi topo -m'"
            fix, cause_class = "capture the full, untruncated 'nvidia-smi topo -m' output", "evidence"
        elif code in ("SYS", "SOC"):
            cause = f"GPU{a} and GPU{b} talk across the CPU socket interconnect ({code}), worse than allowed {allowed}"
            summary = f"GPUs talk across the CPU socket interconnect ({code}), worse than allowed {allowed}"
            fix = "pin the instance to GPUs on one NUMA node{}, or move the cards into slots of one CPU".format(
                _numa_split_hint(ev, grp["present"])
            )
            cause_class = "layout"
        else:
            cause = f"GPU{a}-GPU{b} link is {code}, worse than allowed {allowed}"
            summary = f"links are {code}, worse than allowed {allowed}"
            fix = (
                "slot placement: put the cards under one PCIe switch or root port (PIX/PXB), "
                f"or raise worst_link_allowed if {code} is acceptable"
            )
            cause_class = "layout"
        out.append(_finding(ev, grp, "link_worse_than_allowed", pair_key(a, b), cause, fix, cause_class, summary))
    return out


def check_numa(ev, grp):
    """cross_numa for each pair whose GPUs sit on different NUMA nodes."""
    out = []
    nodes = sorted(_by_numa(ev, grp["present"]))
    summary = "the instance's GPUs sit on NUMA nodes {}: traffic between them crosses the CPU socket interconnect"
    for a, b in grp["pairs"]:
        na, nb = _numa_of(ev["topo"], f"GPU{a}"), _numa_of(ev["topo"], f"GPU{b}")
        if na is not None and nb is not None and na != nb:
            out.append(
                _finding(
                    ev,
                    grp,
                    "cross_numa",
                    pair_key(a, b),
                    f"GPU{a} is on NUMA node {na} and GPU{b} on NUMA node {nb}",
                    "pin the instance to GPUs on one NUMA node{}, or {}".format(
                        _numa_split_hint(ev, grp["present"]), _layout_hint(ev, grp)
                    ),
                    "layout",
                    summary.format(", ".join(nodes)),
                )
            )
    return out


def _p2p_finding(ev, grp, a, b, mode, code, cause_class):
    key = pair_key(a, b)
    seen = "'nvidia-smi topo -p2p {}' reports {}".format(mode, code or "nothing")
    cause = f"{seen} for GPU{a}-GPU{b}"
    if cause_class == "evidence":
        fix = f"capture 'nvidia-smi topo -p2p {mode}' for these GPUs"
        return _finding(ev, grp, "p2p_not_supported", key, cause, fix, cause_class, seen)
    seen = "{} ({})".format(seen, P2P_MEANINGS.get(code, "an unknown code"))
    if cause_class != "product":
        fix = P2P_FIXES.get(code, P2P_FIXES["U"])
        return _finding(ev, grp, "p2p_not_supported", key, cause, fix, cause_class, seen)
    if code == "GNS":
        why = (
            "this GPU model offers no PCIe P2P on this driver (GeForce cards on NVIDIA's stock driver); " + NO_P2P_COST
        )
    else:
        why = "the platform does not carry PCIe P2P across the CPU socket interconnect (SYS); " + CROSS_SOCKET_COST
    fix = (
        f"nothing to set on this host; to limit the cost, {_layout_hint(ev, grp)}. Full P2P needs NVLink or "
        "datacenter GPUs (or a P2P-enabled open driver build, not supported by NVIDIA)"
    )
    return _finding(ev, grp, "p2p_unsupported_by_product", key, cause, fix, "product", f"{seen}: {why}")


def check_p2p_status(ev, grp):
    """When P2P is required: for each pair not OK in some mode, p2p_unsupported_by_product (a warning
    unless in fail_on) when the product or platform cannot do P2P there, else p2p_not_supported; and
    p2p_not_supported for the group when no ``topo -p2p`` status was read at all."""
    if not ev["require_p2p"]:
        return []
    out = []
    for a, b in grp["pairs"]:
        found = pair_p2p(ev, a, b)
        if found:
            out.append(_p2p_finding(ev, grp, a, b, *found))
    if len(grp["present"]) > 1 and not ev["p2p_by_mode"]:
        out.append(
            _finding(
                ev,
                grp,
                "p2p_not_supported",
                grp["label"],
                "P2P is required but no 'nvidia-smi topo -p2p' status was read for these GPUs",
                "run 'nvidia-smi topo -p2p r' on the host, or pass its captured output as p2p_file",
                "evidence",
            )
        )
    return out


def check_acs(ev, grp):
    """acs_redirect for each pair with a redirecting bridge above one of its GPUs, or for the group
    when redirecting bridges were seen but could not be mapped to GPUs. Informational on pairs where
    it cannot matter (``_moot``: no P2P from the product anyway, or NVLink)."""
    out = []
    redirect = ev["gpu_redirect"]
    bridges = sorted(set(b for g in grp["present"] for b in redirect.get(g, [])))
    above = [g for g in grp["present"] if g in redirect]
    summary = f"ACS redirects peer traffic (ReqRedir+/CmpltRedir+) on {len(bridges)} bridge(s) above {gpu_set(above)}"
    fix = ACS_FIX.format("setpci on the bridge ACS control register / pci=disable_acs_redir=" + ";".join(bridges))
    for a, b in grp["pairs"]:
        g = a if a in redirect else b if b in redirect else None
        if g is None:
            continue
        cause = "ACS redirects peer traffic on bridge(s) {} above GPU{} (ReqRedir+/CmpltRedir+)".format(
            ", ".join(redirect[g]), g
        )
        note = _moot(ev, a, b)
        cause_class = "informational" if note else "fixable"
        out.append(_finding(ev, grp, "acs_redirect", pair_key(a, b), cause + note, fix, cause_class, summary + note))
    unmapped = (ev["redirecting"] or ev["orphan_redirects"]) and not redirect
    if len(grp["present"]) > 1 and unmapped and (not ev["bus_ids"] or ev["orphan_redirects"]):
        where = (
            ", ".join(ev["redirecting"])
            if ev["redirecting"]
            else "{} bridge(s) (unmapped grep output)".format(len(ev["orphan_redirects"]))
        )
        cause = f"ACS redirect (ReqRedir+/CmpltRedir+) is on for {where}; the bridges could not be mapped to GPUs"
        fix = (
            "BIOS: disable ACS (PCIe Access Control Services); then "
            "'sudo lspci -vvv | grep ACSCtl' must show ReqRedir- CmpltRedir- on every bridge"
        )
        notes = set(_moot(ev, a, b) for a, b in grp["pairs"])
        note = notes.pop() if len(notes) == 1 else ""
        cause_class = "informational" if note else "fixable"
        out.append(_finding(ev, grp, "acs_redirect", grp["label"], cause + note, fix, cause_class))
    return out


def check_iommu(ev, grp):
    """iommu_split for each pair whose GPUs sit in different IOMMU groups; informational on pairs
    where it cannot matter (``_moot``)."""
    out = []
    bus_ids, groups = ev["bus_ids"], ev["iommu_groups"]
    if not groups:
        return out
    member = {}
    for g in grp["present"]:
        if g in bus_ids and groups.get(bus_ids[g]) is not None:
            member.setdefault(groups[bus_ids[g]], []).append(g)
    summary = "the GPUs sit in {} IOMMU groups ({})".format(
        len(member), ", ".join(f"{gpu_set(v)}: {k}" for k, v in sorted(member.items(), key=lambda kv: kv[1]))
    )
    for a, b in grp["pairs"]:
        if a not in bus_ids or b not in bus_ids:
            continue
        ga, gb = groups.get(bus_ids[a]), groups.get(bus_ids[b])
        if ga is None or gb is None or ga == gb:
            continue
        cause = f"GPU{a} ({bus_ids[a]}) is in IOMMU group {ga} and GPU{b} ({bus_ids[b]}) in group {gb}"
        note = _moot(ev, a, b)
        cause_class = "informational" if note else "fixable"
        out.append(
            _finding(ev, grp, "iommu_split", pair_key(a, b), cause + note, IOMMU_FIX, cause_class, summary + note)
        )
    return out


def check_nccl_env(ev, grp):
    """nccl_p2p_disabled for NCCL_P2P_DISABLE set, or NCCL_P2P_LEVEL stricter than the group's
    worst link. Fixable whatever the product: the setting is ours to remove, and it would silently
    turn P2P off again under a P2P-capable driver."""
    if len(grp["present"]) < 2:
        return []
    out = []
    for path, value in ev["nccl_disable"]:
        out.append(
            _finding(
                ev,
                grp,
                "nccl_p2p_disabled",
                grp["label"],
                f"NCCL_P2P_DISABLE={value} in {path} turns P2P off for every GPU pair",
                f"remove NCCL_P2P_DISABLE from {path} and restart the service",
                "fixable",
            )
        )
    if ev["nccl_level_set"]:
        need = max([link_nccl_level(_link(ev, a, b)) for a, b in grp["pairs"]] or [0])
        worst, _unused = _worst_pair(ev, grp["pairs"])
        for path, value, lvl in ev["nccl_level_set"]:
            if lvl < need:
                out.append(
                    _finding(
                        ev,
                        grp,
                        "nccl_p2p_disabled",
                        grp["label"],
                        f"NCCL_P2P_LEVEL={value} in {path} is stricter than the worst link {worst} "
                        "in this group, so NCCL will not use P2P there",
                        f"remove NCCL_P2P_LEVEL from {path} (NCCL picks the level from the topology)",
                        "fixable",
                    )
                )
    return out


GROUP_CHECKS = (
    check_gpus_present,
    check_links,
    check_numa,
    check_p2p_status,
    check_acs,
    check_iommu,
    check_nccl_env,
)


# ------------------------------------------------------------------ driver


def _worst_pair(ev, pairs):
    """(worst link code, its pair key) over ``pairs``, an unreadable link (None) counting as the
    worst; the first pair wins a tie. (None, None) when there is no pair."""
    worst, worst_pair = None, None
    for a, b in pairs:
        code = _link(ev, a, b)
        if worst_pair is None or link_rank(code) > link_rank(worst):
            worst, worst_pair = code, pair_key(a, b)
    return worst, worst_pair


def _verdict(ev, grp, problems):
    pairs = grp["pairs"]
    worst, worst_pair = _worst_pair(ev, pairs)
    p2p_ok_by_mode = {}
    for mode, status in sorted(ev["p2p_by_mode"].items()):
        vals = [(status or {}).get(pair_key(a, b)) for a, b in pairs]
        p2p_ok_by_mode[mode] = all(v == "OK" for v in vals) if pairs else True
    return {
        "name": grp["name"],
        "gpus": grp["gpus"],
        "worst_link": worst,
        "worst_pair": worst_pair,
        "p2p_ok": (all(p2p_ok_by_mode.values()) if p2p_ok_by_mode else None),
        "p2p_by_mode": p2p_ok_by_mode,
        "p2p_product_pairs": [pair_key(a, b) for a, b in pairs if _product_limited(ev, a, b)],
        "numa_nodes": sorted(set(_by_numa(ev, grp["present"]))),
        "problems": problems,
        "passed": not any(p["severity"] == "error" for p in problems),
    }


def _unique(problems):
    seen = set()
    out = []
    for p in problems:
        k = (p["instance"], p["kind"], p["pair"], p["cause"])
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def evaluate_check(
    topo,
    p2p_by_mode=None,
    groups=None,
    expected_gpus=None,
    require_p2p=False,
    worst_link_allowed="SYS",
    fail_on=DEFAULT_FAIL_ON,
    lspci=None,
    tree=None,
    gpu_bus_ids=None,
    iommu_groups=None,
    env_by_file=None,
    sysfs_root=None,
):
    """Apply the topology policy.

    ``groups`` is a list of GPU index lists or of ``{name, gpus}`` dicts (the GPUs one
    vLLM instance uses); with none, all GPUs form one group. Returns ``{verdicts,
    problems, passed}``: one verdict per group ``{name, gpus, worst_link, worst_pair,
    p2p_ok, p2p_by_mode, p2p_product_pairs, numa_nodes, problems, passed}`` and the
    de-duplicated list of all findings (see the module docstring for their keys).
    ``passed`` is False when any finding is an error.
    """
    ev = _evidence(
        topo,
        p2p_by_mode,
        expected_gpus,
        require_p2p,
        worst_link_allowed,
        fail_on,
        lspci,
        tree,
        gpu_bus_ids,
        iommu_groups,
        env_by_file,
        sysfs_root,
    )
    problems = check_topology_readable(ev) + check_gpu_count(ev)
    verdicts = []
    for group in _normalize_groups(groups, ev["gpu_count"]):
        grp = _group_view(ev, group)
        found = [p for check in GROUP_CHECKS for p in check(ev, grp)]
        verdicts.append(_verdict(ev, grp, found))
        problems.extend(found)
    unique = _unique(problems)
    return {
        "verdicts": verdicts,
        "problems": unique,
        "passed": not any(p["severity"] == "error" for p in unique),
    }


# ------------------------------------------------------------------ rendering


def gpu_set(gpus):
    """'GPU5' for one GPU, else 'GPU[0-3,6]' (ranges of consecutive indices), '' for none."""
    gpus = sorted(set(int(g) for g in gpus))
    if len(gpus) == 1:
        return f"GPU{gpus[0]}"
    runs = []
    for g in gpus:
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return "GPU[{}]".format(",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)) if gpus else ""


def _components(pairs):
    """Connected components of the pair graph, each a sorted list of its pairs; by lowest GPU."""
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    comps = {}
    for a, b in pairs:
        comps.setdefault(find(a), []).append((a, b))
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def _component_text(pairs):
    """One connected set of pairs: a pair, every pair of a GPU set, a full A x B, or blocks."""
    if len(pairs) == 1:
        return pair_key(*pairs[0])
    gpus = sorted(set(g for p in pairs for g in p))
    if len(pairs) == len(gpus) * (len(gpus) - 1) // 2:
        return f"all pairs of {gpu_set(gpus)}"
    side_b = sorted(set(b if a == gpus[0] else a for a, b in pairs if gpus[0] in (a, b)))
    side_a = [g for g in gpus if g not in side_b]
    if len(pairs) == len(side_a) * len(side_b) and all((a in side_a) != (b in side_a) for a, b in pairs):
        return f"{gpu_set(side_a)} x {gpu_set(side_b)}"
    partners = {}
    for a, b in pairs:
        partners.setdefault(a, []).append(b)
    blocks = {}
    for a in sorted(partners):
        blocks.setdefault(tuple(partners[a]), []).append(a)
    parts = sorted(((firsts, list(seconds)) for seconds, firsts in blocks.items()), key=lambda fs: fs[0][0])
    return ", ".join(
        pair_key(f[0], s[0]) if len(f) == len(s) == 1 else f"{gpu_set(f)} x {gpu_set(s)}" for f, s in parts
    )


def pairs_text(keys):
    """Compress pair keys ('GPU0-GPU4', ...) into a short, deterministic text.

    One pair stays 'GPU0-GPU4'; every pair of a set is 'all pairs of GPU[0-7]'; a full
    bipartite set is 'GPU[0-3] x GPU[4-7]'; anything else is blocks 'GPU[0-1] x GPU[2-7], ...';
    separate groups of pairs are joined by '; '. More than one pair adds '(N pairs)'.
    """
    pairs = sorted(set(tuple(int(x[3:]) for x in k.split("-")) for k in keys))
    text = "; ".join(_component_text(c) for c in _components(pairs))
    return text if len(pairs) == 1 else f"{text} ({len(pairs)} pairs)"


def _where(items):
    """The GPUs a line of findings concerns: pairs compressed, single GPUs and groups as a GPU set."""
    items = [i for i in items if i]
    pairs = [i for i in items if "-" in i and "," not in i]
    gpus = sorted(set(int(g[3:]) for i in items if i not in pairs for g in i.split(",")))
    return " ".join(t for t in (gpu_set(gpus), pairs_text(pairs) if pairs else "") if t)


def format_problems(problems):
    """The findings as readable lines: one per instance, kind and summary, the GPUs compressed.

    ``[<instance>] <GPUs or pairs> <kind> [<severity>, <cause_class>]: <summary>. Fix: <fix>``;
    host-wide findings read ``[host] <kind> ...``. Order: host first, then instances as they
    come; errors before warnings; kinds in PROBLEM_KINDS order. Per-pair detail stays in the
    findings themselves (``cause``).
    """
    instances, lines = [], {}
    for p in problems:
        inst = p.get("instance")
        if inst not in instances:
            instances.append(inst)
        key = (inst, p["severity"], p["kind"], p.get("cause_class"), p.get("summary") or p["cause"], p["fix"])
        lines.setdefault(key, []).append(p.get("pair"))

    def order(key):
        inst, severity, kind = key[:3]
        rank = PROBLEM_KINDS.index(kind) if kind in PROBLEM_KINDS else len(PROBLEM_KINDS)
        return (inst is not None, instances.index(inst), severity != "error", rank, key[4])

    out = []
    for key in sorted(lines, key=order):
        inst, severity, kind, cause_class, summary, fix = key
        where = _where(lines[key])
        head = "[{}] {}".format("host" if inst is None else inst, where + " " if where else "")
        tag = severity if not cause_class else f"{severity}, {cause_class}"
        out.append(f"{head}{kind} [{tag}]: {summary}. Fix: {fix}")
    return out
