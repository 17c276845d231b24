"""The topology check's policy (plugins/module_utils/gpu_topology.py) on real captures, its grouped lines, and
gpu_topology's main() end to end. The example inventory on sandbox profiles: test_topology_example.py."""

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.gpu_topology import (
    CAUSE_CLASSES,
    DEFAULT_FAIL_ON,
    PROBLEM_KINDS,
    evaluate_check,
    format_problems,
    gpu_set,
    pairs_text,
)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
    parse_lspci_vvv,
    parse_p2p_matrix,
    parse_topo_matrix,
)
from ansible_collections.rigops.fleet.plugins.modules import gpu_topology as gpu_topology_module

NODE_OK = dict(worst_link_allowed="NODE")


def kinds(result):
    return sorted(set(p["kind"] for p in result["problems"]))


def test_eight_pcie_gpus_across_numa_with_require_p2p_fail_naming_pairs(real):
    topo = parse_topo_matrix(real("t01_go_gpuallocator_8x4090_sys_nics.txt"))
    res = evaluate_check(topo, groups=[list(range(8))], require_p2p=True, **NODE_OK)
    assert not res["passed"]
    verdict = res["verdicts"][0]
    assert verdict["worst_link"] == "SYS" and verdict["numa_nodes"] == ["0", "1"]
    pairs = {p["pair"] for p in res["problems"] if p["kind"] == "link_worse_than_allowed"}
    assert "GPU0-GPU5" in pairs and len(pairs) == 28
    assert {p["cause_class"] for p in res["problems"] if p["kind"] == "link_worse_than_allowed"} == {"layout"}
    cross = [p for p in res["problems"] if p["kind"] == "cross_numa"]
    assert cross and all(p["severity"] == "warning" and p["cause_class"] == "layout" for p in cross)
    assert "GPU0,GPU1,GPU2,GPU3 (NUMA 0)" in cross[0]["fix"]
    # no 'topo -p2p' status was read: P2P is required, so that is an error (evidence missing)
    p2p = [p for p in res["problems"] if p["kind"] == "p2p_not_supported"]
    assert p2p and p2p[0]["severity"] == "error" and p2p[0]["cause_class"] == "evidence"
    # one line per kind, not one per pair
    lines = format_problems(res["problems"])
    assert lines[0].startswith("[group0] all pairs of GPU[0-7] (28 pairs) link_worse_than_allowed [error, layout]: ")
    assert len(lines) == 3 and len(res["problems"]) == 28 + 16 + 1


def test_same_numa_group_passes_when_node_allowed(real):
    topo = parse_topo_matrix(real("t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt"))
    p2p = parse_p2p_matrix(real("t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt"))["status"]
    res = evaluate_check(topo, p2p_by_mode={"p": p2p}, groups=[[0, 1, 2, 3]], require_p2p=True, **NODE_OK)
    assert res["passed"], res["problems"]
    assert res["verdicts"][0]["worst_link"] == "NODE"
    assert res["verdicts"][0]["p2p_ok"] is True
    stricter = evaluate_check(topo, p2p_by_mode={"p": p2p}, groups=[[0, 1, 2, 3]], worst_link_allowed="PHB")
    assert not stricter["passed"]
    assert {p["pair"] for p in stricter["problems"]} == {
        "GPU0-GPU1",
        "GPU0-GPU2",
        "GPU0-GPU3",
        "GPU1-GPU2",
        "GPU1-GPU3",
        "GPU2-GPU3",
    }


def test_four_gpu_group_on_one_numa_node_of_a_two_socket_box(real):
    topo = parse_topo_matrix(real("t13_c_comment_prefixed_4gpu_nics.txt"))
    ok = evaluate_check(topo, groups=[{"name": "small", "gpus": [0, 1]}, {"name": "other", "gpus": [2, 3]}], **NODE_OK)
    assert ok["passed"] and [v["name"] for v in ok["verdicts"]] == ["small", "other"]
    bad = evaluate_check(topo, groups=[[0, 1, 2, 3]], **NODE_OK)
    assert not bad["passed"]
    assert "GPU0-GPU2" in {p["pair"] for p in bad["problems"] if p["severity"] == "error"}


def test_all_nv18_passes(real):
    topo = parse_topo_matrix(real("t08_vllm13855_dgx_h100_merged_cells_truncated.txt"))
    res = evaluate_check(topo, groups=[list(range(8))], expected_gpus=8, worst_link_allowed="NV")
    assert res["passed"]
    assert res["verdicts"][0]["worst_link"] == "NV18"
    # cross-NUMA pairs are only warnings by default
    assert all(p["severity"] == "warning" for p in res["problems"])


@pytest.mark.parametrize(
    "topo_name,p2p_name",
    [
        ("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt", "t02_club3090_1229_2x5090_phb_with_p2p_rw.txt"),
        ("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt", "p01_club3090_1124_2x5090_gns_tabs.txt"),
        ("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt", "p02_club3090_1130_2x5090_gns_spaces.txt"),
    ],
)
def test_p2p_gns_consumer_cards_warn_with_the_cost_and_the_layout(real, topo_name, p2p_name):
    """GeForce on NVIDIA's stock driver (real 2x RTX 5090 captures): GNS on the pair is the product."""
    p2p = {"r": parse_p2p_matrix(real(p2p_name))["status"]}
    topo = parse_topo_matrix(real(topo_name))
    res = evaluate_check(topo, p2p_by_mode=p2p, require_p2p=True, worst_link_allowed="PHB")
    (problem,) = res["problems"]
    assert problem["kind"] == "p2p_unsupported_by_product" and problem["pair"] == "GPU0-GPU1"
    assert problem["severity"] == "warning" and problem["cause_class"] == "product"
    assert "GNS" in problem["cause"] and "NVLink" in problem["fix"]
    assert "host memory (SHM)" in problem["summary"] and "roughly half" in problem["summary"]
    assert "tensor parallel already stays inside one NUMA node (GPU[0-1] on NUMA 0)" in problem["fix"]
    assert res["passed"] and res["verdicts"][0]["p2p_ok"] is False
    assert res["verdicts"][0]["p2p_product_pairs"] == ["GPU0-GPU1"]
    # an operator who wants P2P or nothing says so in fail_on
    strict = evaluate_check(
        topo,
        p2p_by_mode=p2p,
        require_p2p=True,
        worst_link_allowed="PHB",
        fail_on=DEFAULT_FAIL_ON + ("p2p_unsupported_by_product",),
    )
    assert not strict["passed"] and strict["problems"][0]["severity"] == "error"


def test_missing_gpus(real):
    topo = parse_topo_matrix(real("t19_aikitoria1_4gpu_phb_spaces_prompt_after.txt"))
    res = evaluate_check(topo, expected_gpus=8, groups=[{"name": "main", "gpus": [0, 5]}])
    missing = [p for p in res["problems"] if p["kind"] == "gpu_missing"]
    assert {p["pair"] for p in missing} == {None, "GPU5"}
    assert all("lspci" in p["fix"] and p["severity"] == "error" for p in missing)
    assert not res["passed"]


def test_acs_redirect_from_grep_output_is_reported_with_bios_fix(real):
    topo = parse_topo_matrix(real("t19_aikitoria1_4gpu_phb_spaces_prompt_after.txt"))
    lspci = parse_lspci_vvv(real("l02_nccl629_grep_acsctl_redirect_tabs_truncated.txt"))
    res = evaluate_check(topo, lspci=lspci, **NODE_OK)
    (acs,) = [p for p in res["problems"] if p["kind"] == "acs_redirect"]
    assert acs["pair"] == "GPU0,GPU1,GPU2,GPU3" and "BIOS" in acs["fix"]
    clean = evaluate_check(topo, lspci=parse_lspci_vvv(real("l01_nccl606_grep_acsctl_srcvalid_only.txt")), **NODE_OK)
    assert clean["passed"] and not clean["problems"]


def test_acs_redirect_mapped_to_the_gpu_pair(lspci_vvv_synthetic):
    topo = parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n")
    res = evaluate_check(
        topo, lspci=parse_lspci_vvv(lspci_vvv_synthetic), gpu_bus_ids=["00000000:02:00.0", "00000000:41:00.0"]
    )
    (acs,) = [p for p in res["problems"] if p["kind"] == "acs_redirect"]
    assert acs["pair"] == "GPU0-GPU1" and "0000:00:01.1" in acs["cause"]


def test_nccl_p2p_disable_in_env_file(real):
    topo = parse_topo_matrix(real("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt"))
    res = evaluate_check(topo, env_by_file={"/etc/rigops/vllm-main.env": {"NCCL_P2P_DISABLE": "1"}})
    (p,) = res["problems"]
    assert p["kind"] == "nccl_p2p_disabled" and p["fix"].startswith(
        "remove NCCL_P2P_DISABLE from /etc/rigops/vllm-main.env"
    )
    level = evaluate_check(topo, env_by_file={"/etc/environment": {"NCCL_P2P_LEVEL": "LOC"}})
    assert kinds(level) == ["nccl_p2p_disabled"]
    fine = evaluate_check(topo, env_by_file={"/etc/environment": {"NCCL_P2P_LEVEL": "NVL", "NCCL_P2P_DISABLE": "0"}})
    assert fine["passed"] and not fine["problems"]


def test_iommu_split_is_a_warning_by_default(real):
    topo = parse_topo_matrix(real("t03_club3090_922_2x3090_phb_p2p_ok.txt"))
    res = evaluate_check(
        topo, gpu_bus_ids=["0000:01:00.0", "0000:02:00.0"], iommu_groups={"0000:01:00.0": "12", "0000:02:00.0": "13"}
    )
    (p,) = res["problems"]
    assert p["kind"] == "iommu_split" and p["severity"] == "warning" and res["passed"]
    strict = evaluate_check(
        topo,
        gpu_bus_ids=["0000:01:00.0", "0000:02:00.0"],
        iommu_groups={"0000:01:00.0": "12", "0000:02:00.0": "13"},
        fail_on=["iommu_split"],
    )
    assert not strict["passed"]


def test_unreadable_topology_fails():
    res = evaluate_check(parse_topo_matrix("nothing here"))
    assert kinds(res) == ["topology_unreadable"] and not res["passed"]


def test_truncated_capture_reports_unreadable_links(real):
    topo = parse_topo_matrix(real("t09_k8s53497_trailing_spaces_truncated.txt"))
    res = evaluate_check(topo, groups=[[4, 5, 6, 7]], worst_link_allowed="SYS")
    assert {p["pair"] for p in res["problems"]} == {"GPU5-GPU6", "GPU5-GPU7", "GPU6-GPU7"}


# ------------------------------------------------------------------ cause classes

# Two sockets, two GPUs each: GPU0-GPU1 and GPU2-GPU3 under one switch (PXB), SYS across.
TWO_SOCKETS = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tPXB\tSYS\tSYS\t0-31\t0\t\tN/A\n"
    "GPU1\tPXB\t X \tSYS\tSYS\t0-31\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tPXB\t32-63\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tPXB\t X \t32-63\t1\t\tN/A\n"
)
BUS_IDS = ["0000:01:00.0", "0000:02:00.0", "0000:81:00.0", "0000:82:00.0"]


def p2p_matrix(codes):
    """'topo -p2p r' text for 4 GPUs from {(i, j): code}; OK where not given."""
    rows = [" \t" + "".join(f"GPU{j}\t" for j in range(4))]
    for i in range(4):
        cells = ["X" if i == j else codes.get((min(i, j), max(i, j)), "OK") for j in range(4)]
        rows.append(f" GPU{i}\t" + "".join(c + "\t" for c in cells))
    return "\n".join(rows) + "\n"


def two_socket_check(codes, **kw):
    kw.setdefault("worst_link_allowed", "SYS")
    return evaluate_check(
        parse_topo_matrix(TWO_SOCKETS),
        p2p_by_mode={"r": parse_p2p_matrix(p2p_matrix(codes))["status"]},
        groups=[{"name": "main", "gpus": [0, 1, 2, 3]}],
        require_p2p=True,
        gpu_bus_ids=BUS_IDS,
        **kw,
    )


def by_pair(res, kind):
    return {p["pair"]: p for p in res["problems"] if p["kind"] == kind}


def test_cns_across_sockets_is_the_platform_inside_a_socket_a_setting():
    cross = {(a, b): "CNS" for a in (0, 1) for b in (2, 3)}
    res = two_socket_check(cross)
    assert res["passed"]
    product = by_pair(res, "p2p_unsupported_by_product")
    assert set(product) == {"GPU0-GPU2", "GPU0-GPU3", "GPU1-GPU2", "GPU1-GPU3"}
    assert all(p["cause_class"] == "product" and p["severity"] == "warning" for p in product.values())
    assert "CNS (chipset not supported)" in product["GPU0-GPU2"]["summary"]
    assert "socket interconnect" in product["GPU0-GPU2"]["summary"]
    inside = two_socket_check({**cross, (0, 1): "CNS"})
    (blocked,) = by_pair(inside, "p2p_not_supported").values()
    assert blocked["pair"] == "GPU0-GPU1" and blocked["cause_class"] == "fixable" and blocked["severity"] == "error"
    assert "disable ACS" in blocked["fix"] and not inside["passed"]


@pytest.mark.parametrize(
    "code,cause_class,fix_words",
    [("TNS", "layout", "move the cards"), ("DR", "fixable", "NVreg_"), ("NS", "fixable", "iommu=pt")],
)
def test_other_p2p_codes_inside_a_socket_fail_with_their_fix(code, cause_class, fix_words):
    res = two_socket_check({(2, 3): code})
    (p,) = [p for p in res["problems"] if p["kind"].startswith("p2p_")]
    assert not res["passed"]
    assert (p["kind"], p["pair"], p["cause_class"], p["severity"]) == (
        "p2p_not_supported",
        "GPU2-GPU3",
        cause_class,
        "error",
    )
    assert fix_words in p["fix"] and f"reports {code}" in p["cause"]


def test_tns_across_sockets_is_the_platform():
    res = two_socket_check({(1, 2): "TNS"})
    (p,) = [p for p in res["problems"] if p["kind"].startswith("p2p_")]
    assert res["passed"]
    assert p["kind"] == "p2p_unsupported_by_product" and p["cause_class"] == "product"


def test_a_pair_missing_from_the_p2p_matrix_is_missing_evidence():
    res = evaluate_check(
        parse_topo_matrix(TWO_SOCKETS),
        p2p_by_mode={"r": {"GPU0-GPU1": "OK"}},
        groups=[[0, 1, 2]],
        require_p2p=True,
        worst_link_allowed="SYS",
    )
    missing = by_pair(res, "p2p_not_supported")
    assert set(missing) == {"GPU0-GPU2", "GPU1-GPU2"} and not res["passed"]
    assert all(p["cause_class"] == "evidence" and "capture" in p["fix"] for p in missing.values())


def test_acs_and_iommu_are_informational_where_the_product_has_no_p2p(lspci_vvv_synthetic):
    topo = parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n")
    kw = dict(
        lspci=parse_lspci_vvv(lspci_vvv_synthetic),
        gpu_bus_ids=["00000000:02:00.0", "00000000:41:00.0"],
        iommu_groups={"0000:02:00.0": "12", "0000:41:00.0": "30"},
        fail_on=DEFAULT_FAIL_ON + ("iommu_split",),
    )
    capable = evaluate_check(topo, p2p_by_mode={"r": {"GPU0-GPU1": "OK"}}, **kw)
    assert not capable["passed"]
    assert {(p["kind"], p["cause_class"], p["severity"]) for p in capable["problems"]} == {
        ("acs_redirect", "fixable", "error"),
        ("iommu_split", "fixable", "error"),
    }
    geforce = evaluate_check(topo, p2p_by_mode={"r": {"GPU0-GPU1": "GNS"}}, **kw)
    assert geforce["passed"]
    assert {(p["kind"], p["cause_class"], p["severity"]) for p in geforce["problems"]} == {
        ("acs_redirect", "informational", "warning"),
        ("iommu_split", "informational", "warning"),
    }
    assert all("offers no P2P on these pairs" in p["cause"] for p in geforce["problems"])
    # NCCL_P2P_DISABLE is ours to remove: it fails even where the product has no P2P today
    env = evaluate_check(
        topo, p2p_by_mode={"r": {"GPU0-GPU1": "GNS"}}, env_by_file={"/etc/environment": {"NCCL_P2P_DISABLE": "1"}}
    )
    (p,) = env["problems"]
    assert (p["kind"], p["cause_class"], p["severity"]) == ("nccl_p2p_disabled", "fixable", "error")


def test_iommu_split_between_nvlinked_gpus_is_informational(real):
    topo = parse_topo_matrix(real("t08_vllm13855_dgx_h100_merged_cells_truncated.txt"))
    bus = [f"0000:{b}:00.0" for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    res = evaluate_check(
        topo,
        groups=[list(range(8))],
        worst_link_allowed="NV",
        gpu_bus_ids=bus,
        iommu_groups={b: str(n) for n, b in enumerate(bus)},
        fail_on=DEFAULT_FAIL_ON + ("iommu_split",),
    )
    iommu = [p for p in res["problems"] if p["kind"] == "iommu_split"]
    assert len(iommu) == 28 and res["passed"]
    assert {p["cause_class"] for p in iommu} == {"informational"} and "NVLink" in iommu[0]["cause"]


def test_every_kind_and_class_is_documented():
    assert set(DEFAULT_FAIL_ON) < set(PROBLEM_KINDS) and "p2p_unsupported_by_product" not in DEFAULT_FAIL_ON
    assert set(CAUSE_CLASSES) == {"product", "fixable", "informational", "layout", "inventory", "evidence"}
    doc = open(gpu_topology_module.__file__).read()
    for kind in PROBLEM_KINDS:
        assert kind in doc
    for cause_class in CAUSE_CLASSES:
        assert f"C({cause_class})" in doc


def test_unreadable_link_counts_as_the_worst_link():
    topo = {"found": True, "gpu_count": 3, "links": {"GPU0-GPU1": None, "GPU0-GPU2": "PIX", "GPU1-GPU2": "PIX"}}
    (verdict,) = evaluate_check(topo, worst_link_allowed="SYS")["verdicts"]
    assert (verdict["worst_link"], verdict["worst_pair"]) == (None, "GPU0-GPU1")
    (p,) = evaluate_check(topo, worst_link_allowed="SYS")["problems"]
    assert p["kind"] == "link_worse_than_allowed" and p["cause_class"] == "evidence"


# ------------------------------------------------------------------ grouped lines


@pytest.mark.parametrize(
    "gpus,text",
    [([5], "GPU5"), ([0, 1, 2, 3], "GPU[0-3]"), ([6, 0, 1, 3, 2], "GPU[0-3,6]"), ([1, 3], "GPU[1,3]"), ([], "")],
)
def test_gpu_set(gpus, text):
    assert gpu_set(gpus) == text


def keys(pairs):
    return [f"GPU{a}-GPU{b}" for a, b in pairs]


@pytest.mark.parametrize(
    "pairs,text",
    [
        ([(0, 4)], "GPU0-GPU4"),
        ([(a, b) for a in range(8) for b in range(a + 1, 8)], "all pairs of GPU[0-7] (28 pairs)"),
        ([(a, b) for a in range(4) for b in range(4, 8)], "GPU[0-3] x GPU[4-7] (16 pairs)"),
        ([(0, b) for b in (1, 2, 3)], "GPU0 x GPU[1-3] (3 pairs)"),
        (
            [(a, b) for a in range(8) for b in range(a + 1, 8) if a // 2 != b // 2],
            "GPU[0-1] x GPU[2-7], GPU[2-3] x GPU[4-7], GPU[4-5] x GPU[6-7] (24 pairs)",
        ),
        ([(0, 1), (0, 2), (1, 2), (4, 5), (4, 6), (5, 6)], "all pairs of GPU[0-2]; all pairs of GPU[4-6] (6 pairs)"),
        ([(0, 1), (2, 3)], "GPU0-GPU1; GPU2-GPU3 (2 pairs)"),
        ([(0, 1), (0, 2), (1, 3)], "GPU0 x GPU[1-2], GPU1-GPU3 (3 pairs)"),
    ],
)
def test_pairs_text_is_short_and_deterministic(pairs, text):
    assert pairs_text(keys(pairs)) == text
    assert pairs_text(list(reversed(keys(pairs)))) == text


def test_format_problems_one_line_per_instance_and_kind(real):
    topo = parse_topo_matrix(real("t01_go_gpuallocator_8x4090_sys_nics.txt"))
    res = evaluate_check(
        topo,
        expected_gpus=9,
        groups=[{"name": "left", "gpus": [0, 1, 2, 3]}, {"name": "wide", "gpus": [2, 3, 4, 5, 9]}],
        worst_link_allowed="NODE",
        env_by_file={"/etc/environment": {"NCCL_P2P_LEVEL": "PIX"}},
    )
    lines = format_problems(res["problems"])
    assert lines == sorted(lines, key=lambda x: not x.startswith("[host]"))  # host first
    assert lines[0].startswith("[host] gpu_missing [error, inventory]: expected 9 GPUs, nvidia-smi shows 8. Fix: ")
    left = [line for line in lines if line.startswith("[left] ")]
    wide = [line for line in lines if line.startswith("[wide] ")]
    assert len(left) == 2
    assert left[0].startswith("[left] all pairs of GPU[0-3] (6 pairs) link_worse_than_allowed [error, layout]: ")
    assert left[1].startswith("[left] GPU[0-3] nccl_p2p_disabled [error, fixable]: NCCL_P2P_LEVEL=PIX in ")
    assert wide[0] == next(line for line in wide if " gpu_missing " in line)  # kinds in PROBLEM_KINDS order
    assert wide[0].startswith("[wide] GPU9 gpu_missing [error, inventory]: the instance uses GPUs the host does not")
    assert any(line.startswith("[wide] GPU[2-3] x GPU[4-5] (4 pairs) cross_numa [warning, layout]: ") for line in wide)
    # errors before warnings within an instance
    tags = [("warning" in line.split(": ")[0]) for line in wide]
    assert tags == sorted(tags)
    # the same pair in two instances is judged in each
    shared = [p for p in res["problems"] if p["pair"] == "GPU2-GPU3" and p["kind"] == "link_worse_than_allowed"]
    assert {p["instance"] for p in shared} == {"left", "wide"}
    assert len(lines) < len(res["problems"])


# ------------------------------------------------------------------ main() e2e


def test_module_passes_on_nvlink_capture(run_module, real_path, tmp_path):
    failed, result = run_module(
        gpu_topology_module.main,
        {
            "topo_file": real_path("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt"),
            "p2p_file": real_path("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt"),
            "groups": [{"name": "main", "gpus": [0, 1]}],
            "require_p2p": True,
            "worst_link_allowed": "NV",
            "expected_gpus": 2,
            "sysfs_root": str(tmp_path),
            "env_files": [str(tmp_path / "missing.env")],
            "lspci_file": real_path("l01_nccl606_grep_acsctl_srcvalid_only.txt"),
        },
    )
    assert not failed, result
    assert result["passed"] and result["gpus"] == 2 and result["links"] == {"GPU0-GPU1": "NV4"}
    assert result["p2p"] == {"GPU0-GPU1": "OK"} and result["p2p_by_mode"] == {"r": {"GPU0-GPU1": "OK"}}
    assert result["verdicts"][0]["name"] == "main" and result["acs"]["checked"]
    assert result["changed"] is False


def test_module_fails_naming_pairs_and_fixes(run_module, real_path, tmp_path):
    env = tmp_path / "vllm.env"
    env.write_text("export NCCL_P2P_DISABLE=1\n")
    failed, result = run_module(
        gpu_topology_module.main,
        {
            "topo_file": real_path("t01_go_gpuallocator_8x4090_sys_nics.txt"),
            "groups": [list(range(8))],
            "require_p2p": True,
            "worst_link_allowed": "NODE",
            "sysfs_root": str(tmp_path),
            "env_files": [str(env)],
            "lspci_file": real_path("l01_nccl606_grep_acsctl_srcvalid_only.txt"),
        },
    )
    assert failed
    # one line per kind in the message, the pairs compressed; every pair in the findings
    assert "[group0] all pairs of GPU[0-7] (28 pairs) link_worse_than_allowed [error, layout]" in result["msg"]
    assert any(p["pair"] == "GPU0-GPU5" and p["kind"] == "link_worse_than_allowed" for p in result["problems"])
    assert f"remove NCCL_P2P_DISABLE from {env}" in result["msg"]
    assert result["problem_lines"] == format_problems(result["problems"])
    assert len(result["problem_lines"]) == 4  # links, cross-NUMA, no P2P status, NCCL_P2P_DISABLE
    assert result["nics"] == {"count": 2, "names": ["NIC0", "NIC1"]}
    assert result["nccl_env"] == {str(env): {"NCCL_P2P_DISABLE": "1"}}


def test_module_rejects_bad_groups(run_module, real_path):
    failed, result = run_module(
        gpu_topology_module.main,
        {"topo_file": real_path("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt"), "groups": ["zero"]},
    )
    assert failed and "groups" in result["msg"]


@pytest.mark.parametrize("mode", ["r", "w"])
def test_module_p2p_file_counts_as_first_mode(run_module, real_path, tmp_path, mode):
    failed, result = run_module(
        gpu_topology_module.main,
        {
            "topo_file": real_path("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt"),
            "p2p_file": real_path("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt"),
            "p2p_modes": [mode],
            "require_p2p": True,
            "sysfs_root": str(tmp_path),
            "env_files": [],
            "lspci_file": real_path("l01_nccl606_grep_acsctl_srcvalid_only.txt"),
        },
    )
    assert result["p2p_by_mode"] == {mode: {"GPU0-GPU1": "GNS"}}
    # GNS on a GeForce pair is the product: a warning that names the mode the file was read as
    assert not failed and result["passed"]
    (problem,) = result["problems"]
    assert (
        problem["kind"] == "p2p_unsupported_by_product"
        and f"'nvidia-smi topo -p2p {mode}' reports GNS" in (problem["cause"])
    )
