"""plugins/module_utils/nvidia_smi.py and the nvidia_gpu_facts module."""

from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import (
    MISSING_MSG,
    QUERY_GPU_ARGS,
    NvidiaSmiError,
    build_gpu_facts,
    classify_failure,
    find_nvidia_smi,
    normalize_bus_id,
    parse_mib,
    parse_query_gpu_csv,
    parse_smi_xml,
    run_nvidia_smi,
)
from ansible_collections.rigops.fleet.plugins.modules import nvidia_gpu_facts as facts_module

ROOT = Path(__file__).resolve().parents[2]

XML_CASES = [
    (
        "x01_telegraf_a100_sxm4_80gb_mig_v12.xml",
        {"driver_version": "535.54.03", "cuda_version": "12.2", "attached_gpus": 4},
        {
            "index": 0,
            "product_name": "NVIDIA A100-SXM4-80GB",
            "product_architecture": "Ampere",
            "persistence_mode": "Disabled",
            "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
            "pci_bus_id": "0000:01:00.0",
            "memory_total_mib": 81920,  # the GPU's, not a MIG slice's 19968
            "minor_number": 1,
        },
    ),
    (
        "x02_telegraf_gtx1070ti_minimal.xml",
        {"driver_version": None, "cuda_version": None, "attached_gpus": None},
        {
            "index": 0,
            "product_name": "GeForce GTX 1070 Ti",
            "product_architecture": None,
            "persistence_mode": None,
            "uuid": "GPU-f9ba66fc-a7f5-94c5-da19-019ef2f9c665",
            "pci_bus_id": "0000:01:00.0",  # from <gpu id=...> when <pci_bus_id> is absent
            "memory_total_mib": 4096,
            "minor_number": None,
        },
    ),
]


@pytest.mark.parametrize("name,top,gpu0", XML_CASES, ids=["a100", "gtx1070ti"])
def test_xml_real_captures(real, name, top, gpu0):
    parsed = parse_smi_xml(real(name))
    for key, value in top.items():
        assert parsed[key] == value
    assert len(parsed["gpus"]) == 1
    assert parsed["gpus"][0] == gpu0


def test_xml_garbage_raises():
    with pytest.raises(NvidiaSmiError) as info:
        parse_smi_xml("NVIDIA-SMI has failed")
    assert info.value.kind == "parse"


def test_query_csv_default_fields():
    text = (
        "0, GPU-aaaa, NVIDIA GeForce RTX 5090, 32607, 595.45.04, 12.0, Enabled, 00000000:01:00.0\n"
        "1, GPU-bbbb, NVIDIA GeForce RTX 5090, 32607, 595.45.04, 12.0, Disabled, 00000000:41:00.0\n"
    )
    rows = parse_query_gpu_csv(text)
    assert rows[1] == {
        "index": 1,
        "uuid": "GPU-bbbb",
        "name": "NVIDIA GeForce RTX 5090",
        "memory.total": 32607,
        "driver_version": "595.45.04",
        "compute_cap": "12.0",
        "persistence_mode": "Disabled",
        "pci.bus_id": "0000:41:00.0",
    }
    assert QUERY_GPU_ARGS[0].startswith("--query-gpu=index,uuid,name,memory.total")


def test_query_csv_real_captures_with_units_and_other_fields(real):
    rows = parse_query_gpu_csv(
        real("q01_rtxpro6000_query_gpu_units_custom_order.txt"),
        fields=("index", "name", "uuid", "memory.total", "driver_version", "pci.bus_id"),
    )
    assert [r["index"] for r in rows] == [0, 1]
    assert rows[0]["memory.total"] == 97887 and rows[1]["pci.bus_id"] == "0000:68:00.0"
    assert rows[0]["name"] == "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    rows = parse_query_gpu_csv(
        real("q02_club3090_query_gpu_index_name_driver.txt"), fields=("index", "name", "driver_version")
    )
    assert rows == [
        {"index": 0, "name": "NVIDIA GeForce RTX 3090", "driver_version": "610.43.02"},
        {"index": 1, "name": "NVIDIA GeForce RTX 3090", "driver_version": "610.43.02"},
    ]


def test_build_facts_merges_sources(real):
    xml = parse_smi_xml(real("x01_telegraf_a100_sxm4_80gb_mig_v12.xml"))
    csv = parse_query_gpu_csv(
        "0, GPU-513536b6-7d19-9063-b049-1e69664bb298, NVIDIA A100-SXM4-80GB, 81920, 535.54.03, 8.0, Disabled, "
        "00000000:01:00.0\n"
    )
    facts = build_gpu_facts(xml, csv)
    assert facts["gpu_count"] == 1 and facts["driver_version"] == "535.54.03" and facts["cuda_version"] == "12.2"
    assert facts["gpus"][0]["compute_capability"] == "8.0"
    assert facts["gpus"][0]["architecture"] == "Ampere"
    assert facts["gpus"][0]["persistence_enabled"] is False
    only_csv = build_gpu_facts(None, csv)
    assert only_csv["gpus"][0]["architecture"] is None and only_csv["driver_version"] == "535.54.03"


@pytest.mark.parametrize(
    "value,mib", [("32607 MiB", 32607), ("32607", 32607), ("[N/A]", None), ("80 GiB", 81920), ("junk", None)]
)
def test_parse_mib(value, mib):
    assert parse_mib(value) == mib


def test_normalize_bus_id():
    assert normalize_bus_id("00000000:C1:00.0") == "0000:c1:00.0"
    assert normalize_bus_id("N/A") is None


def test_missing_binary_message():
    with pytest.raises(NvidiaSmiError) as info:
        find_nvidia_smi(search_path="/nonexistent", isfile=lambda p: False)
    assert info.value.kind == "missing"
    assert info.value.message.startswith(
        "nvidia-smi not found in PATH: the NVIDIA driver is not installed; run the nvidia_driver role"
    )
    with pytest.raises(NvidiaSmiError):
        find_nvidia_smi(path="/opt/nope/nvidia-smi")


@pytest.mark.parametrize(
    "rc,out,kind",
    [
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
            "NVIDIA driver is installed and running.",
            "driver_not_loaded",
        ),
        (18, "Failed to initialize NVML: Driver/library version mismatch", "driver_not_loaded"),
        (6, "No devices were found", "driver_not_loaded"),
        (2, "Invalid combination of input arguments.", "failed"),
    ],
)
def test_classify_failure(rc, out, kind):
    err = classify_failure(rc, out, "")
    assert err.kind == kind
    if kind == "driver_not_loaded":
        assert "modprobe nvidia" in err.message and "reboot" in err.message


def test_run_nvidia_smi_uses_runner():
    calls = []

    def run(argv):
        calls.append(argv)
        return 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", ""

    with pytest.raises(NvidiaSmiError) as info:
        run_nvidia_smi(run, "/usr/bin/nvidia-smi", ["-q", "-x"])
    assert calls == [["/usr/bin/nvidia-smi", "-q", "-x"]] and info.value.kind == "driver_not_loaded"


# ------------------------------------------------------------------ main() e2e


def test_module_reads_captured_files(run_module, real_path):
    failed, result = run_module(facts_module.main, {"xml_file": real_path("x01_telegraf_a100_sxm4_80gb_mig_v12.xml")})
    assert not failed
    fact = result["ansible_facts"]["nvidia_gpu"]
    assert fact["driver_version"] == "535.54.03" and fact["gpu_count"] == 1
    assert fact["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
    assert result["sources"] == {"xml": real_path("x01_telegraf_a100_sxm4_80gb_mig_v12.xml")}
    assert result["changed"] is False


def test_module_missing_nvidia_smi(run_module, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(
        "ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi.os.path.isfile", lambda p: False
    )
    failed, result = run_module(facts_module.main, {})
    assert failed and result["reason"] == "missing" and result["msg"].startswith(MISSING_MSG[:40])


def test_module_driver_not_loaded(run_module, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    fake.chmod(0o755)
    failed, result = run_module(facts_module.main, {"nvidia_smi_path": str(fake)})
    assert failed and result["reason"] == "driver_not_loaded" and "modprobe nvidia" in result["msg"]


def test_module_runs_nvidia_smi(run_module, tmp_path, real_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  -q) cat "{}" ;;\n'
        '  *) echo "0, GPU-513536b6-7d19-9063-b049-1e69664bb298, NVIDIA A100-SXM4-80GB, 81920, 535.54.03, '
        "8.0, Disabled, "
        '00000000:01:00.0" ;;\n'
        "esac\n".format(real_path("x01_telegraf_a100_sxm4_80gb_mig_v12.xml"))
    )
    fake.chmod(0o755)
    failed, result = run_module(facts_module.main, {"nvidia_smi_path": str(fake)})
    assert not failed, result
    assert result["ansible_facts"]["nvidia_gpu"]["gpus"][0]["compute_capability"] == "8.0"
    assert result["sources"] == {"xml": "command", "query": "command"}
