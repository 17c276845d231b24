"""Parsers of plugins/module_utils/nvidia_topology.py, tested on real captures (tests/fixtures/nvidia-smi/real)."""

import os

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
    env_truthy,
    link_nccl_level,
    link_rank,
    nccl_level,
    normalize_bdf,
    pair_key,
    parse_env_file,
    parse_lspci_tree,
    parse_lspci_vvv,
    parse_p2p_matrix,
    parse_topo_matrix,
    read_iommu_groups,
    upstream_bridges,
)

# name, gpu_count, nic names, trailing columns, some links, numa_affinity subset, cpu_affinity subset, warnings?
TOPO_CASES = [
    (
        "t01_go_gpuallocator_8x4090_sys_nics.txt",
        8,
        ["NIC0", "NIC1"],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "SYS", "GPU6-GPU7": "SYS", "GPU0-GPU7": "SYS"},
        {"GPU0": "0", "GPU4": "1", "GPU7": "1"},
        {"GPU0": "0-55,112-167", "GPU7": "56-111,168-223"},
        False,
    ),
    (
        "t02_club3090_1229_2x5090_phb_with_p2p_rw.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "PHB"},
        {"GPU0": "0", "GPU1": "0"},
        {"GPU1": "0-63"},
        False,
    ),
    (
        "t03_club3090_922_2x3090_phb_p2p_ok.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "PHB"},
        {"GPU0": "0"},
        {"GPU0": "0-31"},
        False,
    ),
    (
        "t04_club3090_1125_indented_wrapped_legend_p2p_ns.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "NODE"},
        {"GPU0": "0", "GPU1": "0"},
        {"GPU0": "0-15"},
        False,
    ),
    (
        "t05_club3090_46_5gpu_cross_numa_spaces.txt",
        5,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "SYS", "GPU1-GPU2": "PHB", "GPU1-GPU3": "NODE", "GPU3-GPU4": "PHB"},
        {"GPU0": "1", "GPU1": "0", "GPU4": "0"},
        {"GPU0": "8-15,24-31", "GPU1": "0-7,16-23"},
        False,
    ),
    (
        "t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt",
        5,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU4": "NODE", "GPU3-GPU4": "PHB"},
        {"GPU2": "0"},
        {"GPU2": "0-63"},
        False,
    ),
    (
        "t07_aikitoria12_header_on_prompt_line.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "PHB"},
        {"GPU0": "0"},
        {"GPU0": "0-23"},
        False,
    ),
    (
        "t08_vllm13855_dgx_h100_merged_cells_truncated.txt",
        8,
        [f"NIC{i}" for i in range(12)],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "NV18", "GPU3-GPU4": "NV18", "GPU6-GPU7": "NV18"},
        {"GPU3": "0", "GPU4": "1"},
        {"GPU5": "56-111,168-223"},
        True,  # the NIC0 row is cut off in the paste
    ),
    (
        "t09_k8s53497_trailing_spaces_truncated.txt",
        8,
        ["mlx4_0"],
        ["CPU Affinity"],
        {
            "GPU0-GPU1": "PIX",
            "GPU0-GPU2": "PHB",
            "GPU2-GPU3": "PIX",
            "GPU4-GPU5": "PIX",
            "GPU4-GPU7": "PHB",
            "GPU5-GPU6": None,
        },
        {"GPU0": None},
        {"GPU0": "0-9,20-29", "GPU4": "10-19,30-39", "GPU5": None},
        True,
    ),
    (
        "t10_sysuest_v100_nvlink_cpu_affinity_only.txt",
        4,
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        ["CPU Affinity"],
        {"GPU0-GPU1": "NV2", "GPU0-GPU2": "NV1", "GPU0-GPU3": "NODE", "GPU2-GPU3": "NV2"},
        {"GPU0": None},
        {"GPU3": "14-27"},
        False,
    ),
    (
        "t11_ethz_titanx_zsh_prompt_no_gpu_numa_id.txt",
        4,
        ["mlx4_0", "mlx4_1"],
        ["CPU Affinity", "NUMA Affinity"],
        {"GPU0-GPU1": "PHB", "GPU1-GPU2": "SYS", "GPU2-GPU3": "PHB"},
        {"GPU0": "0", "GPU3": "1"},
        {"GPU2": "6-11"},
        False,
    ),
    (
        "t12_a100_nv12_damaged_row_nic_legend.txt",
        8,
        [f"mlx5_{i}" for i in range(8)],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU7": "NV12", "GPU3-GPU5": "NV12"},
        {"GPU0": "0-3"},
        {"GPU0": "0-115"},  # 'PH0-115': the damaged cell is repaired and reported
        True,
    ),
    (
        "t13_c_comment_prefixed_4gpu_nics.txt",
        4,
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "NODE", "GPU0-GPU2": "SYS", "GPU2-GPU3": "NODE"},
        {"GPU1": "0", "GPU2": "1"},
        {"GPU3": "32-63,96-127"},
        False,
    ),
    (
        "t14_v100_dgx1_slurm_noise_before_header.txt",
        8,
        ["mlx5_0", "mlx5_1"],
        ["CPU Affinity", "NUMA Affinity"],
        {"GPU0-GPU1": "NV1", "GPU0-GPU2": "NV2", "GPU0-GPU4": "SYS", "GPU0-GPU7": "NV2", "GPU3-GPU4": "NV1"},
        {"GPU0": "0", "GPU7": "1"},
        {"GPU7": "12-23,36-47"},
        False,
    ),
    (
        "t15_megatron_v100_indented_cpu_affinity_only.txt",
        8,
        ["mlx5_0"],
        ["CPU Affinity"],
        {"GPU0-GPU3": "NV2", "GPU0-GPU5": "SYS", "GPU6-GPU7": "NV2"},
        {"GPU0": None},
        {"GPU0": "0-11,24-35"},
        False,
    ),
    (
        "t16_rtxpro6000_header_without_leading_tab.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "NODE"},
        {"GPU0": "0"},
        {"GPU0": "0-23"},
        False,
    ),
    (
        "t17_club3090_rig_report_2x3090_nv4_with_p2p.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "NV4"},
        {"GPU0": "0"},
        {"GPU1": "0-5"},
        False,
    ),
    (
        "t18_cuda_samples284_2xl4_sys_numa0_numa2.txt",
        2,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU1": "SYS"},
        {"GPU0": "0", "GPU1": "2"},
        {"GPU1": "16-23,48-55"},
        False,
    ),
    (
        "t19_aikitoria1_4gpu_phb_spaces_prompt_after.txt",
        4,
        [],
        ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"],
        {"GPU0-GPU3": "PHB"},
        {"GPU3": "0"},
        {"GPU3": "0-15"},
        False,
    ),
]


@pytest.mark.parametrize("name,count,nics,columns,links,numa,cpu,warns", TOPO_CASES, ids=[c[0][:3] for c in TOPO_CASES])
def test_topo_real_captures(real, name, count, nics, columns, links, numa, cpu, warns):
    topo = parse_topo_matrix(real(name))
    assert topo["found"]
    assert topo["gpu_count"] == count
    assert topo["gpus"] == [f"GPU{i}" for i in range(count)]
    assert topo["nics"]["names"] == nics
    assert topo["nics"]["count"] == len(nics)
    assert topo["columns"] == columns
    # every unordered pair exactly once, keyed with i < j
    assert len(topo["links"]) == count * (count - 1) // 2
    for key, code in links.items():
        assert topo["links"][key] == code, key
    for gpu, value in numa.items():
        assert topo["numa_affinity"][gpu] == value
    for gpu, value in cpu.items():
        assert topo["cpu_affinity"][gpu] == value
    assert set(topo["gpu_numa_id"].values()) <= {None}  # N/A everywhere in these captures
    assert bool(topo["warnings"]) == warns


def test_topo_all_fixtures_have_a_source():
    sources = os.path.join(os.path.dirname(__file__), "..", "fixtures", "nvidia-smi", "real", "SOURCES.md")
    text = open(sources).read()
    real_dir = os.path.dirname(sources)
    for name in os.listdir(real_dir):
        if name != "SOURCES.md":
            assert name in text, f"{name} is not listed in SOURCES.md"


def test_topo_ansi_header_and_crlf(real):
    """A terminal underlines the header with ANSI escapes; a Windows paste adds CR."""
    text = real("t01_go_gpuallocator_8x4090_sys_nics.txt")
    lines = text.split("\n")
    lines[0] = "\x1b[4m" + lines[0] + "\x1b[0m"
    mangled = "\r\n".join(lines)
    assert parse_topo_matrix(mangled)["links"] == parse_topo_matrix(text)["links"]
    # ESC lost in a copy-paste leaves '[4m' behind
    assert parse_topo_matrix(text.replace("\tGPU0", "[4m\tGPU0", 1))["gpu_count"] == 8


def test_topo_markdown_quote_and_nv_two_digits():
    text = "> \tGPU0\tGPU1\tCPU Affinity\n> GPU0\t X \tNV4\t0-7\n> GPU1\tNV4\t X \t0-7\n"
    topo = parse_topo_matrix(text)
    assert topo["links"] == {"GPU0-GPU1": "NV4"}
    assert link_rank("NV4") == link_rank("NV18") == 0


def test_topo_absent():
    topo = parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert not topo["found"] and topo["gpu_count"] == 0 and topo["links"] == {}


def test_topo_single_gpu():
    topo = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n")
    assert topo["found"] and topo["gpu_count"] == 1 and topo["links"] == {}
    assert topo["numa_affinity"] == {"GPU0": "0"} and topo["gpu_numa_id"] == {"GPU0": None}


P2P_CASES = [
    ("p01_club3090_1124_2x5090_gns_tabs.txt", {"GPU0-GPU1": "GNS"}),
    ("p02_club3090_1130_2x5090_gns_spaces.txt", {"GPU0-GPU1": "GNS"}),
    ("t02_club3090_1229_2x5090_phb_with_p2p_rw.txt", {"GPU0-GPU1": "GNS"}),
    ("t03_club3090_922_2x3090_phb_p2p_ok.txt", {"GPU0-GPU1": "OK"}),
    ("t04_club3090_1125_indented_wrapped_legend_p2p_ns.txt", {"GPU0-GPU1": "NS"}),
    (
        "t06_aikitoria13_5gpu_prompts_topo_then_p2p.txt",
        {pair_key(a, b): "OK" for a in range(5) for b in range(a + 1, 5)},
    ),
    ("t17_club3090_rig_report_2x3090_nv4_with_p2p.txt", {"GPU0-GPU1": "OK"}),
]


@pytest.mark.parametrize("name,status", P2P_CASES, ids=[c[0][:3] for c in P2P_CASES])
def test_p2p_real_captures(real, name, status):
    parsed = parse_p2p_matrix(real(name))
    assert parsed["found"]
    assert parsed["status"] == status


def test_p2p_is_not_confused_with_topo(real):
    # a topo-only capture has no p2p matrix; a p2p-only capture has no topo matrix
    assert not parse_p2p_matrix(real("t01_go_gpuallocator_8x4090_sys_nics.txt"))["found"]
    assert not parse_topo_matrix(real("p01_club3090_1124_2x5090_gns_tabs.txt"))["found"]


def test_p2p_all_codes_and_directions():
    text = (
        " \tGPU0\tGPU1\tGPU2\tGPU3\t\n GPU0\tX\tOK\tCNS\tTNS\t\n GPU1\tOK\tX\tDR\tU\t\n"
        " GPU2\tCNS\tDR\tX\tNS\t\n GPU3\tTNS\tOK\tNS\tX\t\n"
    )
    parsed = parse_p2p_matrix(text)
    assert parsed["status"] == {
        "GPU0-GPU1": "OK",
        "GPU0-GPU2": "CNS",
        "GPU0-GPU3": "TNS",
        "GPU1-GPU2": "DR",
        "GPU1-GPU3": "U",  # directions differ (U / OK): the one that is not OK wins
        "GPU2-GPU3": "NS",
    }
    assert parsed["warnings"]


# ----------------------------------------------------------------------- lspci


def test_lspci_grep_output_without_device_context(real):
    only_srcvalid = parse_lspci_vvv(real("l01_nccl606_grep_acsctl_srcvalid_only.txt"))
    assert only_srcvalid["acs_lines"] == 9
    assert not any(f["ReqRedir"] or f["CmpltRedir"] for f in only_srcvalid["orphan_acs"])
    redirect = parse_lspci_vvv(real("l02_nccl629_grep_acsctl_redirect_tabs_truncated.txt"))
    assert redirect["acs_lines"] == 16
    assert sum(1 for f in redirect["orphan_acs"] if f.get("ReqRedir")) == 4
    assert redirect["devices"] == {}


def test_lspci_tree_real_capture(real):
    parents = parse_lspci_tree(real("l03_stelline_esc8000a_lspci_tv_4gpu.txt"))
    assert parents["0000:01:00.0"] == "0000:00:01.1"
    assert parents["0000:41:00.0"] == "0000:40:01.1"
    assert parents["0000:c1:00.0"] == "0000:c0:01.1"
    assert parents["0000:e1:00.0"] == "0000:e0:01.1"
    assert parents["0000:00:01.1"] is None
    # nested switches: NVMe behind two switch levels on bus 0x60
    assert parents["0000:65:00.0"] == "0000:64:10.0"
    assert parents["0000:64:10.0"] == "0000:63:00.0"
    assert upstream_bridges("01:00.0", tree=parents) == ["0000:00:01.1"]
    assert upstream_bridges("0000:65:00.0", tree=parents)[-1] == "0000:60:01.1"


def test_lspci_vvv_blocks_and_bus_ranges(lspci_vvv_synthetic):
    parsed = parse_lspci_vvv(lspci_vvv_synthetic)
    assert parsed["devices"]["0000:00:01.1"]["acs_redirect"] is True
    assert parsed["devices"]["0000:01:00.0"]["acs_redirect"] is False
    assert parsed["devices"]["0000:02:00.0"]["nvidia_gpu"] is True
    assert upstream_bridges("0000:02:00.0", lspci=parsed) == ["0000:01:00.0", "0000:00:01.1"]
    assert upstream_bridges("00000000:41:00.0", lspci=parsed) == ["0000:40:01.1"]


def test_upstream_from_sysfs_symlinks(tmp_path):
    dev = tmp_path / "devices" / "pci0000:00" / "0000:00:01.1" / "0000:01:00.0" / "0000:02:08.0" / "0000:03:00.0"
    dev.mkdir(parents=True)
    links = tmp_path / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:03:00.0").symlink_to(dev)
    assert upstream_bridges("0000:03:00.0", sysfs_root=str(tmp_path)) == [
        "0000:02:08.0",
        "0000:01:00.0",
        "0000:00:01.1",
    ]


def test_iommu_groups_from_sysfs_tree(tmp_path):
    for group, bdf in (("12", "0000:01:00.0"), ("12", "0000:01:00.1"), ("30", "0000:41:00.0")):
        d = tmp_path / "kernel" / "iommu_groups" / group / "devices"
        d.mkdir(parents=True, exist_ok=True)
        (d / bdf).touch()
    assert read_iommu_groups(str(tmp_path)) == {"0000:01:00.0": "12", "0000:01:00.1": "12", "0000:41:00.0": "30"}
    assert read_iommu_groups(str(tmp_path / "nope")) == {}


@pytest.mark.parametrize(
    "value,expected",
    [
        ("01:00.0", "0000:01:00.0"),
        ("00000000:19:00.0", "0000:19:00.0"),
        ("0000:C1:00.0", "0000:c1:00.0"),
        ("junk", None),
    ],
)
def test_normalize_bdf(value, expected):
    assert normalize_bdf(value) == expected


# -------------------------------------------------------------------- environment

ENV_TEXT = """\
# /etc/environment
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
export NCCL_P2P_DISABLE=1   # left over from a debugging session
NCCL_DEBUG='INFO'
; systemd also accepts this comment style
NCCL_P2P_LEVEL = "PIX"
EMPTY=
QUOTED="a \\"b\\" c"
not a variable line
"""


def test_env_file_syntax():
    env = parse_env_file(ENV_TEXT)
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_P2P_LEVEL"] == "PIX"
    assert env["PATH"].startswith("/usr/local/sbin")
    assert env["EMPTY"] == ""
    assert env["QUOTED"] == 'a "b" c'
    assert "not" not in env


@pytest.mark.parametrize(
    "value,level", [("LOC", 0), ("nvl", 1), ("PIX", 2), ("SYS", 5), ("3", 3), (None, None), ("bogus", None)]
)
def test_nccl_level(value, level):
    assert nccl_level(value) == level


def test_link_rank_order():
    assert [link_rank(c) for c in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS")] == sorted(
        link_rank(c) for c in ("NV18", "PIX", "PXB", "PHB", "NODE", "SYS")
    )
    assert link_rank("SOC") == link_rank("SYS") < link_rank(None)


@pytest.mark.parametrize(
    "code,level", [("NV18", 1), ("NV4", 1), ("PIX", 2), ("PXB", 3), ("PHB", 4), ("NODE", 4), ("SYS", 5), ("SOC", 5)]
)
def test_link_nccl_level(code, level):
    assert link_nccl_level(code) == level
    # an unreadable link needs the most permissive level
    assert link_nccl_level(None) == 5


@pytest.mark.parametrize("value,on", [("1", True), ("TRUE", True), (" yes ", True), ("0", False), ("", False)])
def test_env_truthy(value, on):
    assert env_truthy(value) is on
    assert env_truthy(None) is False
