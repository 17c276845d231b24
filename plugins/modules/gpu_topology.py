#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: gpu_topology
short_description: Check GPU topology, P2P, ACS, IOMMU and NCCL settings
description:
  - Reads C(nvidia-smi topo -m) and C(nvidia-smi topo -p2p <mode>) for each mode in O(p2p_modes), and where available
    the ACS control bits of the PCIe bridges above the GPUs (C(lspci -vvv) C(ACSCtl)), the IOMMU groups
    (C(<sysfs_root>/kernel/iommu_groups)) and C(NCCL_P2P_DISABLE) / C(NCCL_P2P_LEVEL) in the environment files the
    service will see.
  - Judges each requested GPU group (the GPUs one vLLM instance will use) and returns a verdict per group and a list
    of findings, each naming the GPU pair, the cause, the fix, a severity and a cause class.
  - "Cause classes: C(product) (the GPU model, its driver or the platform offers no P2P on the pair: C(GNS), as on
    GeForce cards with NVIDIA's stock driver, or C(CNS)/C(TNS) across the CPU socket interconnect; nothing on the
    host changes it, NCCL moves the traffic through host memory at roughly half the tensor-parallel throughput),
    C(fixable) (a setting blocks P2P the product offers: ACS redirect, IOMMU grouping, C(NCCL_P2P_DISABLE) /
    C(NCCL_P2P_LEVEL), a driver registry key), C(informational) (an ACS redirect or a split IOMMU group on pairs
    where it cannot matter: the product offers no P2P there anyway, or the pair talks over NVLink), C(layout)
    (links, NUMA nodes or slots of the GPUs chosen), C(inventory) (GPUs the host does not show) and C(evidence)
    (topology or P2P status not readable)."
  - Fails only for findings whose kind is in O(fail_on) and whose cause class is not C(informational); the others are
    returned and reported as warnings, one line per instance and kind with the GPU pairs compressed.
  - Can validate captured output (O(topo_file), O(p2p_file), O(lspci_file)) instead of running commands, for a
    support bundle.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  expected_gpus:
    description: Number of GPUs the host must show. A different count is a C(gpu_missing) problem.
    type: int
  groups:
    description:
      - GPU groups to judge. Each item is a list of GPU indices, or a dict with C(name) and C(gpus) (list of indices).
      - With no groups, all GPUs form one group named C(all).
    type: list
    elements: raw
    default: []
  require_p2p:
    description:
      - Every pair in a group should report C(OK) in every mode of O(p2p_modes).
      - A pair that does not is C(p2p_unsupported_by_product) when the product or platform cannot do P2P there
        (C(GNS); C(CNS)/C(TNS) on a C(SYS) pair), a warning unless that kind is in O(fail_on); otherwise
        C(p2p_not_supported) with the fix (C(CNS), C(NS), C(DR), C(U) or C(TNS) inside a socket, or no status read).
    type: bool
    default: false
  worst_link_allowed:
    description:
      - Worst C(topo -m) link allowed between two GPUs of a group. Ranking, best first, is C(NV) (any C(NV#)), C(PIX),
        C(PXB), C(PHB), C(NODE), C(SYS). Worse links are C(link_worse_than_allowed).
    type: str
    default: SYS
    choices: [NV, PIX, PXB, PHB, NODE, SYS]
  fail_on:
    description:
      - Finding kinds that fail the task; other kinds only warn. Findings of cause class C(informational) never fail.
      - C(p2p_unsupported_by_product) is not in the default; add it to refuse rigs whose GPUs cannot do P2P at all.
    type: list
    elements: str
    default: [gpu_missing, link_worse_than_allowed, p2p_not_supported, acs_redirect, nccl_p2p_disabled,
      topology_unreadable]
    choices: [gpu_missing, link_worse_than_allowed, p2p_not_supported, p2p_unsupported_by_product, acs_redirect,
              iommu_split, nccl_p2p_disabled, cross_numa, topology_unreadable]
  topo_file:
    description: Read captured C(nvidia-smi topo -m) output from this file instead of running it. Pasted text is fine.
    type: path
  p2p_file:
    description:
      - Read captured C(nvidia-smi topo -p2p) output from this file instead of running it; it counts as the first
        mode of O(p2p_modes). Without it, and with O(topo_file) set, no P2P data is read.
    type: path
  p2p_modes:
    description: C(topo -p2p) modes to run (C(r) read, C(w) write, C(n) nvlink, C(a) atomics, C(p) prop).
    type: list
    elements: str
    default: [r, w]
    choices: [r, w, n, a, p]
  lspci_file:
    description:
      - Read captured C(lspci -vvv) (or C(lspci -vvv | grep ACSCtl)) output instead of running C(lspci -vvv).
      - Without it, C(lspci -vvv) runs when lspci is installed (ACS bits need root; unprivileged runs see C(<access
        denied>)).
    type: path
  lspci_tree_file:
    description: Captured C(lspci -tv) output, used to find the bridges above each GPU when O(lspci_file) has no
      C(Bus:) lines.
    type: path
  gpu_bus_ids:
    description:
      - PCI bus ids of GPU0, GPU1, ... (as C(nvidia-smi) prints them). Needed to map ACS bridges and IOMMU groups to
        GPUs when reading captured files; otherwise read with C(nvidia-smi --query-gpu=index,pci.bus_id).
    type: list
    elements: str
  sysfs_root:
    description: Root of sysfs, for C(kernel/iommu_groups) and C(bus/pci/devices). Point it elsewhere to test or to
      read a bundle.
    type: path
    default: /sys
  env_files:
    description:
      - Environment files the service will see (/etc/environment syntax or systemd C(EnvironmentFile=)), checked for
        C(NCCL_P2P_DISABLE) and C(NCCL_P2P_LEVEL). Missing files are skipped.
    type: list
    elements: path
    default: [/etc/environment]
  nvidia_smi_path:
    description: Path to nvidia-smi; searched in E(PATH) by default.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
notes:
  - Bridges above a GPU are found from the C(Bus:) ranges in C(lspci -vvv), else from the C(lspci -tv) tree, else
    from the sysfs device path under O(sysfs_root).
  - The parsers live in the module_utils C(nvidia_topology), the policy in C(gpu_topology).
  - Commands run with C(LC_ALL=C).
seealso:
  - module: rigops.fleet.nvidia_gpu_facts
"""

EXAMPLES = r"""
- name: Check the GPUs each vLLM instance will use
  rigops.fleet.gpu_topology:
    expected_gpus: 8
    groups:
      - name: big
        gpus: [0, 1, 2, 3]
      - name: small
        gpus: [4, 5]
    require_p2p: true
    worst_link_allowed: NODE

- name: Validate a support bundle from a user's machine (no host access needed)
  rigops.fleet.gpu_topology:
    topo_file: /tmp/bundle/topo-m.txt
    p2p_file: /tmp/bundle/topo-p2p-r.txt
    groups: [[0, 1, 2, 3, 4, 5, 6, 7]]
    require_p2p: true
  delegate_to: localhost

- name: Only warn about cross-NUMA and IOMMU grouping
  rigops.fleet.gpu_topology:
    fail_on: [gpu_missing, p2p_not_supported, acs_redirect, nccl_p2p_disabled]
    env_files: [/etc/environment, /etc/rigops/vllm-main.env]

- name: Refuse rigs whose GPUs cannot do P2P at all (GeForce on the stock driver)
  rigops.fleet.gpu_topology:
    require_p2p: true
    fail_on: [gpu_missing, link_worse_than_allowed, p2p_not_supported, p2p_unsupported_by_product, acs_redirect,
              nccl_p2p_disabled, topology_unreadable]
"""

RETURN = r"""
gpus:
  description: Number of GPUs in the C(topo -m) matrix.
  returned: always
  type: int
  sample: 8
nics:
  description: NICs in the matrix, names resolved through the NIC Legend.
  returned: always
  type: dict
  sample: {count: 2, names: [mlx5_0, mlx5_1]}
links:
  description: Every unordered GPU pair once, keyed C(GPU<i>-GPU<j>) with i < j, value the code as printed (null if
    unreadable).
  returned: always
  type: dict
  sample: {GPU0-GPU1: NV18, GPU0-GPU2: NV18}
numa_affinity:
  description: Per C(GPU<i>) the C(NUMA Affinity) as printed; null for N/A or a missing column.
  returned: always
  type: dict
  sample: {GPU0: "0", GPU1: "1"}
cpu_affinity:
  description: Per C(GPU<i>) the C(CPU Affinity) as printed; null for N/A or a missing column.
  returned: always
  type: dict
  sample: {GPU0: "0-55,112-167"}
gpu_numa_id:
  description: Per C(GPU<i>) the C(GPU NUMA ID) as printed; null for N/A or a missing column (older drivers).
  returned: always
  type: dict
  sample: {GPU0: null}
p2p:
  description: Per pair the status of the first mode in O(p2p_modes) (the read mode by default). Codes OK, CNS, GNS,
    TNS, NS, DR, U.
  returned: always
  type: dict
  sample: {GPU0-GPU1: OK}
p2p_by_mode:
  description: Per mode, per pair the status code.
  returned: always
  type: dict
  sample: {r: {GPU0-GPU1: OK}, w: {GPU0-GPU1: OK}}
worst_link:
  description: Worst link over all judged groups (groups of two or more GPUs); null when no pair was judged.
  returned: always
  type: str
  sample: NODE
p2p_ok:
  description: True when every pair of every judged group reports OK in every mode read; null when no P2P status was
    read.
  returned: always
  type: bool
  sample: true
verdicts:
  description: One verdict per group.
  returned: always
  type: list
  elements: dict
  sample:
    - name: big
      gpus: [0, 1, 2, 3]
      worst_link: NODE
      worst_pair: GPU0-GPU2
      p2p_ok: true
      p2p_by_mode: {r: true, w: true}
      p2p_product_pairs: []
      numa_nodes: ["0"]
      problems: []
      passed: true
  contains:
    name:
      description: The group's name (the vLLM instance's name).
      type: str
    gpus:
      description: The group's GPU indices, sorted.
      type: list
      elements: int
    worst_link:
      description: Worst C(topo -m) link between two GPUs of the group; null if a link is unreadable or no pair.
      type: str
    worst_pair:
      description: The pair with the worst link (the first unreadable one, if any); null for a group of one GPU.
      type: str
    p2p_ok:
      description: Every pair reports C(OK) in every mode read; null when no P2P status was read.
      type: bool
    p2p_by_mode:
      description: Per mode, whether every pair reports C(OK).
      type: dict
    p2p_product_pairs:
      description: Pairs of the group on which the product or platform offers no P2P (cause class C(product)).
      type: list
      elements: str
    numa_nodes:
      description: NUMA nodes of the group's GPUs, as C(topo -m) prints them.
      type: list
      elements: str
    problems:
      description: The group's findings (same keys as RV(problems)).
      type: list
      elements: dict
    passed:
      description: False when a finding of the group is an error.
      type: bool
problems:
  description:
    - Every finding, one per GPU pair (or per GPU, group, or host), de-duplicated per instance.
    - C(cause) is worded for the pair, C(summary) for every pair of the instance with the same finding
      (C(problem_lines) groups on it).
  returned: always
  type: list
  elements: dict
  contains:
    instance:
      description: Name of the GPU group (vLLM instance); null for host-wide findings.
      type: str
    kind:
      description: What was found; one of the O(fail_on) choices.
      type: str
    pair:
      description: C(GPU<i>-GPU<j>) (i < j), C(GPU<i>), C(GPU0,GPU1,...) for the group, or null for the host.
      type: str
    cause:
      description: What was seen, for this pair.
      type: str
    summary:
      description: What was seen, for every pair of the instance with this finding.
      type: str
    fix:
      description: What to do.
      type: str
    cause_class:
      description: Why, one of C(product), C(fixable), C(informational), C(layout), C(inventory), C(evidence).
      type: str
    severity:
      description: C(error) when the kind is in O(fail_on) and the class is not C(informational), else C(warning).
      type: str
  sample:
    - instance: main
      kind: p2p_unsupported_by_product
      pair: GPU0-GPU1
      cause: "'nvidia-smi topo -p2p r' reports GNS for GPU0-GPU1"
      summary: "'nvidia-smi topo -p2p r' reports GNS (GPU not supported): this GPU model offers no PCIe P2P on this
        driver (GeForce cards on NVIDIA's stock driver); NCCL turns P2P off for these pairs and moves
        tensor-parallel traffic through host memory (SHM): it works, at roughly half the tensor-parallel throughput"
      fix: "nothing to set on this host; to limit the cost, keep tensor parallel inside one NUMA node and pipeline
        parallel across nodes (...)"
      cause_class: product
      severity: warning
passed:
  description: False when any finding has severity C(error).
  returned: always
  type: bool
  sample: true
acs:
  description: What was learnt about ACS; C(checked) is false when no ACSCtl line could be read.
  returned: always
  type: dict
  sample: {checked: true, redirecting_bridges: ["0000:00:01.1"], access_denied: false}
iommu_groups:
  description: IOMMU group per GPU (C(GPU<i>)), empty when the IOMMU is off or bus ids are unknown.
  returned: always
  type: dict
  sample: {GPU0: "12", GPU1: "13"}
nccl_env:
  description: NCCL_P2P_DISABLE / NCCL_P2P_LEVEL found per environment file.
  returned: always
  type: dict
  sample: {/etc/environment: {NCCL_P2P_DISABLE: "1"}}
problem_lines:
  description:
    - The findings as readable lines, one per instance, kind and summary, with the GPU pairs compressed
      (C(GPU0-GPU4), C(all pairs of GPU[0-7]), C(GPU[0-3] x GPU[4-7]), blocks such as C(GPU[0-1] x GPU[2-7]))
      and their count.
    - "Form: C([<instance>] <GPUs or pairs> <kind> [<severity>, <cause_class>]: <summary>. Fix: <fix>);
      host-wide findings start with C([host]). Errors come before warnings."
  returned: always
  type: list
  elements: str
  sample: ["[main] GPU[0-3] x GPU[4-7] (16 pairs) cross_numa [warning, layout]: the instance's GPUs sit on NUMA nodes
    0, 1: traffic between them crosses the CPU socket interconnect. Fix: pin the instance to GPUs on one NUMA node
    (...)"]
parse_warnings:
  description: Cells the parser could not read (damaged, truncated or wrapped output).
  returned: always
  type: list
  elements: str
  sample: ["row GPU5 missing (truncated output?)"]
"""

# Ansible's module layout puts the documentation first, then the imports.
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.gpu_topology import (
    DEFAULT_FAIL_ON,
    PROBLEM_KINDS,
    evaluate_check,
    format_problems,
)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import (
    PARSE_ENV,
    NvidiaSmiError,
    find_nvidia_smi,
    parse_query_gpu_csv,
    read_captured,
    run_nvidia_smi,
)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
    LINK_CHOICES,
    link_rank,
    normalize_bdf,
    parse_env_file,
    parse_lspci_tree,
    parse_lspci_vvv,
    parse_p2p_matrix,
    parse_topo_matrix,
    read_iommu_groups,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            expected_gpus=dict(type="int"),
            groups=dict(type="list", elements="raw", default=[]),
            require_p2p=dict(type="bool", default=False),
            worst_link_allowed=dict(type="str", default="SYS", choices=list(LINK_CHOICES)),
            fail_on=dict(type="list", elements="str", default=list(DEFAULT_FAIL_ON), choices=list(PROBLEM_KINDS)),
            topo_file=dict(type="path"),
            p2p_file=dict(type="path"),
            p2p_modes=dict(type="list", elements="str", default=["r", "w"], choices=["r", "w", "n", "a", "p"]),
            lspci_file=dict(type="path"),
            lspci_tree_file=dict(type="path"),
            gpu_bus_ids=dict(type="list", elements="str"),
            sysfs_root=dict(type="path", default="/sys"),
            env_files=dict(type="list", elements="path", default=["/etc/environment"]),
            nvidia_smi_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    module.run_command_environ_update = PARSE_ENV
    p = module.params
    run = module.run_command

    for grp in p["groups"]:
        gpus = grp.get("gpus") if isinstance(grp, dict) else grp
        if not isinstance(gpus, list) or not all(str(g).isdigit() for g in gpus):
            module.fail_json(
                msg=f"each item of groups must be a list of GPU indices or a dict with name and gpus; got {grp!r}"
            )

    binary = None
    bus_ids = p["gpu_bus_ids"]
    try:
        if p["topo_file"]:
            topo_text = read_captured(module, p["topo_file"])
        else:
            binary = find_nvidia_smi(p["nvidia_smi_path"])
            topo_text = run_nvidia_smi(run, binary, ["topo", "-m"])
        p2p_by_mode = {}
        if p["p2p_file"]:
            p2p_by_mode[p["p2p_modes"][0]] = parse_p2p_matrix(read_captured(module, p["p2p_file"]))
        elif binary:
            for mode in p["p2p_modes"]:
                p2p_by_mode[mode] = parse_p2p_matrix(run_nvidia_smi(run, binary, ["topo", "-p2p", mode]))
        if bus_ids is None and binary:
            rows = parse_query_gpu_csv(
                run_nvidia_smi(run, binary, ["--query-gpu=index,pci.bus_id", "--format=csv,noheader"]),
                fields=("index", "pci.bus_id"),
            )
            bus_ids = [r["pci.bus_id"] for r in sorted(rows, key=lambda r: r["index"])]
    except NvidiaSmiError as exc:
        module.fail_json(msg=exc.message, reason=exc.kind)

    topo = parse_topo_matrix(topo_text)
    warnings = list(topo["warnings"])
    for mode, parsed in p2p_by_mode.items():
        warnings.extend(f"p2p {mode}: {w}" for w in parsed["warnings"])
        if not parsed["found"]:
            warnings.append(f"no 'topo -p2p {mode}' matrix found in the output")

    lspci = None
    if p["lspci_file"]:
        lspci = parse_lspci_vvv(read_captured(module, p["lspci_file"]))
    else:
        lspci_bin = module.get_bin_path("lspci")
        if lspci_bin:
            rc, out, err = module.run_command([lspci_bin, "-vvv"])
            if rc == 0:
                lspci = parse_lspci_vvv(out)
            else:
                warnings.append(f"lspci -vvv failed (rc={rc}): {err.strip()[:200]}")
    tree = parse_lspci_tree(read_captured(module, p["lspci_tree_file"])) if p["lspci_tree_file"] else None
    if lspci is not None and lspci["acs_lines"] == 0 and lspci["access_denied"]:
        warnings.append("lspci could not read PCIe capabilities (not root): ACS state unknown")

    iommu = read_iommu_groups(p["sysfs_root"])

    env_by_file = {}
    for path in p["env_files"]:
        if os.path.isfile(path):
            env_by_file[path] = parse_env_file(read_captured(module, path))

    outcome = evaluate_check(
        topo,
        p2p_by_mode={m: v["status"] for m, v in p2p_by_mode.items() if v["found"]},
        groups=p["groups"],
        expected_gpus=p["expected_gpus"],
        require_p2p=p["require_p2p"],
        worst_link_allowed=p["worst_link_allowed"],
        fail_on=p["fail_on"],
        lspci=lspci,
        tree=tree,
        gpu_bus_ids=bus_ids,
        iommu_groups=iommu,
        env_by_file=env_by_file,
        sysfs_root=p["sysfs_root"],
    )
    first_mode = next((m for m in p["p2p_modes"] if m in p2p_by_mode), None)
    judged = [v for v in outcome["verdicts"] if v["worst_pair"] is not None]
    worst_link = max((v["worst_link"] for v in judged), key=link_rank) if judged else None
    p2p_known = [v["p2p_ok"] for v in judged if v["p2p_ok"] is not None]
    result = dict(
        changed=False,
        gpus=topo["gpu_count"],
        nics={"count": topo["nics"]["count"], "names": topo["nics"]["names"]},
        links=topo["links"],
        numa_affinity=topo["numa_affinity"],
        cpu_affinity=topo["cpu_affinity"],
        gpu_numa_id=topo["gpu_numa_id"],
        p2p=p2p_by_mode[first_mode]["status"] if first_mode else {},
        p2p_by_mode={m: v["status"] for m, v in p2p_by_mode.items()},
        worst_link=worst_link,
        p2p_ok=all(p2p_known) if p2p_known else None,
        verdicts=outcome["verdicts"],
        problems=outcome["problems"],
        passed=outcome["passed"],
        acs={
            "checked": bool(lspci and lspci["acs_lines"]),
            "redirecting_bridges": sorted(
                d for d, i in ((lspci or {}).get("devices") or {}).items() if i["acs_redirect"]
            ),
            "access_denied": bool(lspci and lspci["access_denied"]),
        },
        iommu_groups={
            f"GPU{i}": iommu[normalize_bdf(b)] for i, b in enumerate(bus_ids or []) if normalize_bdf(b) in iommu
        },
        nccl_env={
            f: {k: v for k, v in e.items() if k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")}
            for f, e in env_by_file.items()
        },
        problem_lines=format_problems(outcome["problems"]),
        parse_warnings=warnings,
    )
    for w in warnings:
        module.warn(w)
    errors = [pr for pr in outcome["problems"] if pr["severity"] == "error"]
    for line in format_problems([pr for pr in outcome["problems"] if pr["severity"] == "warning"]):
        module.warn(line)
    if errors:
        lines = format_problems(errors)
        module.fail_json(
            msg="GPU topology check failed: {} error(s) on {} line(s): {}".format(
                len(errors), len(lines), " | ".join(lines)
            ),
            **result,
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
