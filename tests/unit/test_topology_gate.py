"""The gate policy (evaluate_gate) on real captures, and gpu_topology's main() end to end."""

import gpu_topology as gpu_topology_module
import pytest
from ansible.module_utils.gpu_topology import evaluate_gate, parse_lspci_vvv, parse_p2p_matrix, parse_topo_matrix

NODE_OK = dict(worst_link_allowed="NODE")


def kinds(result):
    return sorted(set(p["kind"] for p in result["problems"]))


def test_eight_pcie_gpus_across_numa_with_require_p2p_fail_naming_pairs(real):
    topo = parse_topo_matrix(real("t01_go_gpuallocator_8x4090_sys_nics.txt"))
    res = evaluate_gate(topo, groups=[list(range(8))], require_p2p=True, **NODE_OK)
    assert not res["passed"]
    verdict = res["verdicts"][0]
    assert verdict["worst_link"] == "SYS" and verdict["numa_nodes"] == ["0", "1"]
    pairs = {p["pair"] for p in res["problems"] if p["kind"] == "link_worse_than_allowed"}
    assert "GPU0-GPU5" in pairs and len(pairs) == 28
    cross = [p for p in res["problems"] if p["kind"] == "cross_numa"]
    assert cross and all(p["severity"] == "warning" for p in cross)
    assert "GPU0,GPU1,GPU2,GPU3 (NUMA 0)" in cross[0]["fix"]
    p2p = [p for p in res["problems"] if p["kind"] == "p2p_not_supported"]
    assert p2p and p2p[0]["severity"] == "error"


def test_same_numa_group_passes_when_node_allowed(real):
    topo = parse_topo_matrix(real("t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt"))
    p2p = parse_p2p_matrix(real("t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt"))["status"]
    res = evaluate_gate(topo, p2p_by_mode={"p": p2p}, groups=[[0, 1, 2, 3]], require_p2p=True, **NODE_OK)
    assert res["passed"], res["problems"]
    assert res["verdicts"][0]["worst_link"] == "NODE"
    assert res["verdicts"][0]["p2p_ok"] is True
    stricter = evaluate_gate(topo, p2p_by_mode={"p": p2p}, groups=[[0, 1, 2, 3]], worst_link_allowed="PHB")
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
    ok = evaluate_gate(topo, groups=[{"name": "small", "gpus": [0, 1]}, {"name": "other", "gpus": [2, 3]}], **NODE_OK)
    assert ok["passed"] and [v["name"] for v in ok["verdicts"]] == ["small", "other"]
    bad = evaluate_gate(topo, groups=[[0, 1, 2, 3]], **NODE_OK)
    assert not bad["passed"]
    assert "GPU0-GPU2" in {p["pair"] for p in bad["problems"] if p["severity"] == "error"}


def test_all_nv18_passes(real):
    topo = parse_topo_matrix(real("t08_vllm13855_dgx_h100_merged_cells_truncated.txt"))
    res = evaluate_gate(topo, groups=[list(range(8))], expected_gpus=8, worst_link_allowed="NV")
    assert res["passed"]
    assert res["verdicts"][0]["worst_link"] == "NV18"
    # cross-NUMA pairs are only warnings by default
    assert all(p["severity"] == "warning" for p in res["problems"])


def test_p2p_gns_consumer_cards(real):
    text = real("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt")
    res = evaluate_gate(
        parse_topo_matrix(text),
        p2p_by_mode={"r": parse_p2p_matrix(text)["status"]},
        require_p2p=True,
        worst_link_allowed="PHB",
    )
    (problem,) = res["problems"]
    assert problem["kind"] == "p2p_not_supported" and problem["pair"] == "GPU0-GPU1"
    assert "GNS" in problem["cause"] and "NVLink" in problem["fix"]
    assert res["verdicts"][0]["p2p_ok"] is False


def test_missing_gpus(real):
    topo = parse_topo_matrix(real("t19_aikitoria1_4gpu_phb_spaces_prompt_after.txt"))
    res = evaluate_gate(topo, expected_gpus=8, groups=[{"name": "main", "gpus": [0, 5]}])
    missing = [p for p in res["problems"] if p["kind"] == "gpu_missing"]
    assert {p["pair"] for p in missing} == {None, "GPU5"}
    assert all("lspci" in p["fix"] and p["severity"] == "error" for p in missing)
    assert not res["passed"]


def test_acs_redirect_from_grep_output_is_reported_with_bios_fix(real):
    topo = parse_topo_matrix(real("t19_aikitoria1_4gpu_phb_spaces_prompt_after.txt"))
    lspci = parse_lspci_vvv(real("l02_nccl629_grep_acsctl_redirect_tabs_truncated.txt"))
    res = evaluate_gate(topo, lspci=lspci, **NODE_OK)
    (acs,) = [p for p in res["problems"] if p["kind"] == "acs_redirect"]
    assert acs["pair"] == "GPU0,GPU1,GPU2,GPU3" and "BIOS" in acs["fix"]
    clean = evaluate_gate(topo, lspci=parse_lspci_vvv(real("l01_nccl606_grep_acsctl_srcvalid_only.txt")), **NODE_OK)
    assert clean["passed"] and not clean["problems"]


def test_acs_redirect_mapped_to_the_gpu_pair(lspci_vvv_synthetic):
    topo = parse_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-7\nGPU1\tPHB\t X \t0-7\n")
    res = evaluate_gate(
        topo, lspci=parse_lspci_vvv(lspci_vvv_synthetic), gpu_bus_ids=["00000000:02:00.0", "00000000:41:00.0"]
    )
    (acs,) = [p for p in res["problems"] if p["kind"] == "acs_redirect"]
    assert acs["pair"] == "GPU0-GPU1" and "0000:00:01.1" in acs["cause"]


def test_nccl_p2p_disable_in_env_file(real):
    topo = parse_topo_matrix(real("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt"))
    res = evaluate_gate(topo, env_by_file={"/etc/rigops/vllm-main.env": {"NCCL_P2P_DISABLE": "1"}})
    (p,) = res["problems"]
    assert p["kind"] == "nccl_p2p_disabled" and p["fix"].startswith(
        "remove NCCL_P2P_DISABLE from /etc/rigops/vllm-main.env"
    )
    level = evaluate_gate(topo, env_by_file={"/etc/environment": {"NCCL_P2P_LEVEL": "LOC"}})
    assert kinds(level) == ["nccl_p2p_disabled"]
    fine = evaluate_gate(topo, env_by_file={"/etc/environment": {"NCCL_P2P_LEVEL": "NVL", "NCCL_P2P_DISABLE": "0"}})
    assert fine["passed"] and not fine["problems"]


def test_iommu_split_is_a_warning_by_default(real):
    topo = parse_topo_matrix(real("t03_club3090_922_2x3090_phb_p2p_ok.txt"))
    res = evaluate_gate(
        topo, gpu_bus_ids=["0000:01:00.0", "0000:02:00.0"], iommu_groups={"0000:01:00.0": "12", "0000:02:00.0": "13"}
    )
    (p,) = res["problems"]
    assert p["kind"] == "iommu_split" and p["severity"] == "warning" and res["passed"]
    strict = evaluate_gate(
        topo,
        gpu_bus_ids=["0000:01:00.0", "0000:02:00.0"],
        iommu_groups={"0000:01:00.0": "12", "0000:02:00.0": "13"},
        fail_on=["iommu_split"],
    )
    assert not strict["passed"]


def test_unreadable_topology_fails():
    res = evaluate_gate(parse_topo_matrix("nothing here"))
    assert kinds(res) == ["topology_unreadable"] and not res["passed"]


def test_truncated_capture_reports_unreadable_links(real):
    topo = parse_topo_matrix(real("t09_k8s53497_trailing_spaces_truncated.txt"))
    res = evaluate_gate(topo, groups=[[4, 5, 6, 7]], worst_link_allowed="SYS")
    assert {p["pair"] for p in res["problems"]} == {"GPU5-GPU6", "GPU5-GPU7", "GPU6-GPU7"}


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
    assert "GPU0-GPU5 link_worse_than_allowed" in result["msg"]
    assert f"remove NCCL_P2P_DISABLE from {env}" in result["msg"]
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
    assert failed and result["p2p_by_mode"] == {mode: {"GPU0-GPU1": "GNS"}}
