"""plugins/module_utils/gpu_health.py on real captures (tests/fixtures/gpu-health/real/SOURCES.md).

Unhealthy nvidia-smi values that no public XML capture shows are derived here, at run
time, from real files (string replacement on the stored capture), never stored.
"""

import re
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.gpu_health import (
    XIDS,
    dcgm_findings,
    evaluate,
    instance_verdicts,
    nvlink_active,
    nvlink_findings,
    parse_dcgmi_discovery,
    parse_dcgmi_health,
    parse_kernel_log,
    parse_nvlink,
    prometheus,
    read_smi_xml,
)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import NvidiaSmiError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HEALTH = FIXTURES / "gpu-health" / "real"
A100 = FIXTURES / "nvidia-smi" / "real" / "x01_telegraf_a100_sxm4_80gb_mig_v12.xml"
GTX = FIXTURES / "nvidia-smi" / "real" / "x02_telegraf_gtx1070ti_minimal.xml"
T4 = HEALTH / "t01_telegraf_tesla_t4_link_x8_of_x16_throttle_names.xml"

# The populated <remapped_rows> of driver 590.44.01, as in influxdata/telegraf
# plugins/inputs/nvidia_smi/testdata/dual_a5000-v13.xml (too large to store), with
# pending/failure set by the caller; spliced into the real A100 capture, whose MIG
# mode reports <remapped_rows>N/A</remapped_rows>.
REMAPPED_ROWS_590 = (
    "<remapped_rows>\n\t\t\t<remapped_row_corr>0</remapped_row_corr>\n\t\t\t<remapped_row_unc>0</remapped_row_unc>\n"
    "\t\t\t<remapped_row_pending>{pending}</remapped_row_pending>\n"
    "\t\t\t<remapped_row_failure>{failure}</remapped_row_failure>\n\t\t</remapped_rows>"
)


def read(path):
    return Path(path).read_text(encoding="utf-8")


def a100(replace=()):
    text = read(A100)
    for old, new in replace:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def two_a100s():
    """The real A100 document with its <gpu> repeated at bus C2 (the bus of k01's Xid 79)."""
    text = read(A100)
    start, end = text.index("<gpu id="), text.index("</gpu>") + len("</gpu>")
    second = text[start:end].replace("00000000:01:00.0", "00000000:C2:00.0").replace("GPU-513536b6", "GPU-c2c2c2c2")
    return text[:end] + "\n    " + second + text[end:]


KERNEL_CASES = [
    ("k01_threestones_4x4090_xid79_journal_and_dmesg.txt", [("0000:c2:00.0", 79)] * 2),
    ("k02_gpu_operator1146_syslog_xid48_xid64.txt", [("0000:07:00.0", 48), ("0000:07:00.0", 64)]),
    ("k03_gpud46_diff_dmesg_ctime_xid13_xid109.txt", [("0000:cb:00.0", 13)] * 3 + [("0000:cb:00.0", 109)]),
    ("k04_ogkm1150_xid45_caused_by_previous_xid.txt", [(b, 45) for b in ("dc", "ed", "ba", "97", "dc", "ba", "ed")]),
    ("k05_m4logs_aws_monitor_prefix_xid63.txt", [("0000:10:1c.0", 63)]),
    ("k06_m4logs_aws_monitor_prefix_xid64_elided.txt", [("0000:90:1c.0", 64)]),
    ("k07_ogkm1151_journal_no_hostname_xid79_no_pid.txt", [("0000:2b:00.0", 79)]),
    ("k08_pastebin_old_bus_format_xid31.txt", [("0000:01:00.0", 31)]),
    ("k09_nvidia_doc_mig_contained_xid94.txt", [("0000:01:00.0", 94)]),
]


@pytest.mark.parametrize("name,expected", KERNEL_CASES, ids=[c[0][:3] for c in KERNEL_CASES])
def test_kernel_log_real_captures(name, expected):
    events = parse_kernel_log(read(HEALTH / name))
    expected = [(b if ":" in b else f"0000:{b}:00.0", x) for b, x in expected]
    assert [(e["bus_id"], e["xid"]) for e in events] == expected
    for event in events:
        assert "NVRM: Xid" in event["line"] and not event["detail"].startswith(("pid=", "name="))


def test_kernel_log_details_and_prefixes():
    k01 = parse_kernel_log(read(HEALTH / "k01_threestones_4x4090_xid79_journal_and_dmesg.txt"))
    assert k01[0]["detail"] == k01[1]["detail"] == "GPU has fallen off the bus."
    assert k01[0]["line"].startswith("6月 28 02:52:53 jjf-Super-Server kernel:")  # journal, localised month
    assert k01[1]["line"].startswith("[1590188.789226] ")  # dmesg
    k03 = parse_kernel_log(read(HEALTH / "k03_gpud46_diff_dmesg_ctime_xid13_xid109.txt"))
    assert k03[-1]["detail"] == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"  # pid=N, name=x stripped
    k04 = parse_kernel_log(read(HEALTH / "k04_ogkm1150_xid45_caused_by_previous_xid.txt"))
    assert {e["xid"] for e in k04} == {45}  # "caused by previous Xid 149" is not an event
    assert parse_kernel_log(read(HEALTH / "k06_m4logs_aws_monitor_prefix_xid64_elided.txt"))[0]["detail"] == "..."


def test_xml_real_captures():
    t4 = read_smi_xml(read(T4))
    assert t4 == [
        {
            "index": 0,
            "bus_id": "0000:00:1e.0",
            "uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
            "name": "Tesla T4",
            "persistence": False,
            "ecc_dbe_volatile": 0,
            "retired_pending": False,
            "remap_failure": None,
            "remap_pending": None,
            "link_width": {"current": 8, "max": 16},
            "link_gen": {"current": 3, "max": 3},
            "slowdown": [],
            "recovery_action": None,
        }
    ]
    (gpu,) = read_smi_xml(read(A100))
    assert (
        gpu["bus_id"] == "0000:01:00.0"
        and gpu["ecc_dbe_volatile"] == 0
        and gpu["link_width"] == {"current": 16, "max": 16}
    )
    assert gpu["retired_pending"] is None and gpu["remap_pending"] is None  # N/A under MIG


def test_na_values_are_none():
    (gpu,) = read_smi_xml(read(GTX))  # trimmed capture: no ECC, no max link, no persistence
    assert gpu["ecc_dbe_volatile"] is None and gpu["persistence"] is None
    assert gpu["link_width"] == {"current": 16, "max": None} and gpu["link_gen"] == {"current": 1, "max": None}
    assert evaluate([gpu], [])["healthy"] is True


def test_width_x8_of_x16_is_a_finding():
    result = evaluate(read_smi_xml(read(T4)), [])
    assert not result["healthy"]
    assert [(f["check"], f["severity"]) for f in result["gpus"][0]["findings"]] == [
        ("pcie_link", "critical"),
        ("persistence", "warning"),
    ]


def test_idle_link_generation_is_not_a_finding():
    gpus = read_smi_xml(a100([("<current_link_gen>4</current_link_gen>", "<current_link_gen>1</current_link_gen>")]))
    assert gpus[0]["link_gen"] == {"current": 1, "max": 4}
    assert [f["check"] for f in evaluate(gpus, [])["gpus"][0]["findings"]] == ["persistence"]


@pytest.mark.parametrize(
    "replace,check,severity",
    [
        (
            [("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>3</dram_uncorrectable>")],
            "ecc",
            "critical",
        ),
        (
            [("<remapped_rows>N/A</remapped_rows>", REMAPPED_ROWS_590.format(pending="Yes", failure="No"))],
            "row_remap",
            "warning",
        ),
        (
            [("<remapped_rows>N/A</remapped_rows>", REMAPPED_ROWS_590.format(pending="No", failure="Yes"))],
            "row_remap",
            "critical",
        ),
        (
            [
                ("hw_slowdown>Not Active<", "hw_slowdown>Active<"),
                ("power_brake_slowdown>Not Active<", "power_brake_slowdown>Active<"),
            ],
            "slowdown",
            "critical",
        ),
        ([("sw_thermal_slowdown>Not Active<", "sw_thermal_slowdown>Active<")], "slowdown", "warning"),
        (
            [
                (
                    "<persistence_mode>Disabled</persistence_mode>",
                    "<persistence_mode>Disabled</persistence_mode><gpu_recovery_action>Reset</gpu_recovery_action>",
                )
            ],
            "recovery_action",
            "critical",
        ),
    ],
    ids=["ecc_dbe", "remap_pending", "remap_failure", "hw_power_brake", "sw_thermal", "recovery_action"],
)
def test_unhealthy_values_derived_from_the_a100(replace, check, severity):
    result = evaluate(read_smi_xml(a100(replace)), [])
    found = [(f["check"], f["severity"]) for f in result["gpus"][0]["findings"] if f["check"] != "persistence"]
    assert found and set(found) == {(check, severity)}
    assert result["healthy"] is (severity != "critical")


def test_slowdown_reasons_and_old_element_names():
    gpus = read_smi_xml(
        a100(
            [
                ("hw_slowdown>Not Active<", "hw_slowdown>Active<"),
                ("hw_thermal_slowdown>Not Active<", "hw_thermal_slowdown>Active<"),
            ]
        )
    )
    assert gpus[0]["slowdown"] == ["hw_slowdown", "hw_thermal_slowdown"]
    t4 = read(T4).replace(
        "<clocks_throttle_reason_hw_power_brake_slowdown>Not Active",
        "<clocks_throttle_reason_hw_power_brake_slowdown>Active",
    )
    assert read_smi_xml(t4)[0]["slowdown"] == ["hw_power_brake_slowdown"]


def test_retired_pages_pending_from_the_t4():
    gpus = read_smi_xml(
        read(T4).replace("<pending_retirement>No</pending_retirement>", "<pending_retirement>Yes</pending_retirement>")
    )
    assert gpus[0]["retired_pending"] is True
    assert ("retired_pages", "critical") in [
        (f["check"], f["severity"]) for f in evaluate(gpus, [])["gpus"][0]["findings"]
    ]


def test_xid79_on_one_gpu_only_marks_that_gpu_and_its_instances():
    gpus = read_smi_xml(two_a100s())
    assert [g["bus_id"] for g in gpus] == ["0000:01:00.0", "0000:c2:00.0"]
    xids = parse_kernel_log(read(HEALTH / "k01_threestones_4x4090_xid79_journal_and_dmesg.txt"))
    result = evaluate(gpus, xids)
    assert [g["healthy"] for g in result["gpus"]] == [True, False] and not result["healthy"]
    (xid,) = [f for f in result["gpus"][1]["findings"] if f["check"] == "xid"]
    assert xid["xid"] == 79 and xid["severity"] == "critical" and xid["action"] == XIDS[79]["action"] == "reboot"
    assert "GPU has fallen off the bus" in xid["detail"] and "2 event(s)" in xid["detail"]
    verdicts = instance_verdicts(
        result,
        [
            {"name": "llama-a", "gpus": [0]},
            {"name": "llama-b", "gpus": ["00000000:C2:00.0"]},
            {"name": "llama-tp2", "gpus": ["GPU-513536b6-7d19-9063-b049-1e69664bb298", 1]},
        ],
    )
    assert {n: v["healthy"] for n, v in verdicts.items()} == {"llama-a": True, "llama-b": False, "llama-tp2": False}
    assert verdicts["llama-tp2"]["unhealthy_gpus"] == ["0000:c2:00.0"]
    assert any(f["check"] == "xid" and f["bus_id"] == "0000:c2:00.0" for f in verdicts["llama-b"]["findings"])


def test_application_xids_are_warnings_unknown_xids_critical():
    gpus = [{"index": 0, "bus_id": "0000:cb:00.0", "uuid": "GPU-x"}]
    k03 = parse_kernel_log(read(HEALTH / "k03_gpud46_diff_dmesg_ctime_xid13_xid109.txt"))
    result = evaluate(gpus, k03)
    assert result["healthy"] and {f["severity"] for f in result["gpus"][0]["findings"]} == {"warning"}
    assert [f["xid"] for f in result["gpus"][0]["findings"]] == [13, 109]  # ordered by last event
    unknown = [{"bus_id": "0000:cb:00.0", "xid": 154, "detail": "", "line": ""}]
    (finding,) = evaluate(gpus, unknown)["gpus"][0]["findings"]
    assert finding["action"] == "check" and finding["severity"] == "critical"


def test_missing_and_fallen_off_gpus():
    gpus = read_smi_xml(read(A100))
    result = evaluate(gpus, [], expected_bus_ids=["00000000:01:00.0", "0000:C2:00.0"])
    missing = result["gpus"][1]
    assert missing["index"] is None and missing["uuid"] is None and not missing["healthy"]
    assert [f["check"] for f in missing["findings"]] == ["missing"]
    # an Xid on a bus nvidia-smi no longer lists still gets an entry
    xids = parse_kernel_log(read(HEALTH / "k07_ogkm1151_journal_no_hostname_xid79_no_pid.txt"))
    assert [g["bus_id"] for g in evaluate(gpus, xids)["gpus"]] == ["0000:01:00.0", "0000:2b:00.0"]
    assert instance_verdicts(result, [{"name": "x", "gpus": [7]}])["x"]["unhealthy_gpus"] == [7]


LINE = re.compile(r'^[a-z_]+\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\} -?\d+$')


def test_prometheus_exposition_is_well_formed_and_deterministic():
    gpus = read_smi_xml(two_a100s())
    xids = parse_kernel_log(read(HEALTH / "k01_threestones_4x4090_xid79_journal_and_dmesg.txt"))
    result = evaluate(gpus, xids)
    verdicts = instance_verdicts(result, [{"name": "b", "gpus": [1]}, {"name": "a", "gpus": [0]}])
    text = prometheus(result, verdicts)
    assert text == prometheus(result, verdicts) and text.endswith("\n")
    families = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            families.append(line.split()[2])
            assert line.endswith(" gauge")
        elif not line.startswith("# HELP "):
            assert LINE.match(line), line
            assert "host=" not in line  # node exporter's scrape gives the host (its instance label)
    assert families == [
        "rigops_gpu_healthy",
        "rigops_gpu_health_findings",
        "rigops_gpu_xid_last",
        "rigops_vllm_instance_gpu_healthy",
    ]
    uuid = "GPU-c2c2c2c2-7d19-9063-b049-1e69664bb298"
    assert f'rigops_gpu_healthy{{bus_id="0000:c2:00.0",index="1",uuid="{uuid}"}} 0' in text
    assert 'rigops_gpu_xid_last{bus_id="0000:c2:00.0"} 79' in text
    assert text.index('instance="a"') < text.index('instance="b"')
    assert 'rigops_gpu_xid_last{bus_id="0000:01:00.0"' not in text
    missing = evaluate([], [], expected_bus_ids=["0000:3b:00.0"])
    assert 'rigops_gpu_healthy{bus_id="0000:3b:00.0",index="",uuid=""} 0' in prometheus(missing, {})


@pytest.mark.parametrize("garbage", ["", "\x00\xff", "NVRM: Xid (PCI:zz): x", "NVRM: Xid (PCI:0000:01:00): ", None])
def test_garbage_does_not_crash(garbage):
    assert parse_kernel_log(garbage) == []
    result = evaluate([], parse_kernel_log(garbage))
    assert result == {"healthy": True, "gpus": []}
    assert instance_verdicts(result, []) == {}
    assert prometheus(result, {}).count("# TYPE") == 4


@pytest.mark.parametrize("garbage", ["", "NVIDIA-SMI has failed", "<html/>", "<nvidia_smi_log><gpu>"])
def test_xml_garbage_raises_a_parse_error(garbage):
    with pytest.raises(NvidiaSmiError) as info:
        read_smi_xml(garbage)
    assert info.value.kind == "parse"


def test_xml_without_gpus_or_fields():
    assert read_smi_xml("<nvidia_smi_log/>") == []
    (gpu,) = read_smi_xml(
        "<nvidia_smi_log><gpu><pci><pci_gpu_link_info><link_widths><current_link_width>N/A</current_link_width></link_widths></pci_gpu_link_info></pci></gpu></nvidia_smi_log>"
    )
    assert gpu["bus_id"] is None and gpu["link_width"] == {"current": None, "max": None} and gpu["slowdown"] == []
    assert evaluate([gpu], [])["healthy"] is True


def test_xid_table_actions():
    assert {v["action"] for v in XIDS.values()} <= {"none", "restart_app", "reset_gpu", "reboot", "replace"}
    for xid in (13, 31, 43, 48, 63, 64, 74, 79, 94, 95, 119, 120):
        assert XIDS[xid]["meaning"]


# --------------------------------------------------------------------------- NVLink (nvidia-smi nvlink -s / -e)


def nvlink_text(name):
    return (HEALTH / name).read_text()


def test_nvlink_error_counters_of_a_real_a100():
    (uuid, gpu), *_ = parse_nvlink(nvlink_text("n01_a100_nvlink_e_535.txt")).items()
    assert uuid == "GPU-fde0a018-ad1a-bbec-ccf6-50a9f64bd178" and gpu["index"] == 0
    assert gpu["name"] == "NVIDIA A100-SXM4-40GB" and sorted(gpu["links"]) == [0, 1, 11]
    assert gpu["links"][11] == {"replay errors": 0, "recovery errors": 0, "crc errors": 0}


def test_nvlink_status_and_counters_of_a_real_h100_with_spaces_for_the_tab():
    (gpu,) = parse_nvlink(nvlink_text("n02_h100_nvlink_e_and_status.txt")).values()
    assert gpu["links"][0] == {"replay errors": 0, "recovery errors": 0, "crc errors": 0, "status": "26.562 GB/s"}
    assert gpu["links"][17] == {"crc errors": 0, "status": "26.562 GB/s"}
    assert nvlink_active(gpu["links"]) == 2  # the author elided links 1-16 of --status


def test_inactive_links_of_a_real_v100_and_a_b200_with_all_down():
    (v100,) = parse_nvlink(nvlink_text("n03_v100_nvlink_s_inactive.txt")).values()
    assert nvlink_active(v100["links"]) == 4
    found = nvlink_findings(v100, {}, {}, 6)
    assert [(f["severity"], f["detail"]) for f in found] == [
        ("critical", "NVLink down: 4 of 6 link(s) up (inactive: 3, 5)")
    ]
    assert nvlink_findings(v100, {}, {}, 4) == []  # the links it is known to have are up
    (b200,) = parse_nvlink(nvlink_text("n04_b200_nvlink_s_all_inactive.txt")).values()
    assert b200["all_inactive"] and b200["links"] == {}
    assert [f["detail"] for f in nvlink_findings(b200, {}, {}, 18)] == [
        "NVLink down: 0 of 18 link(s) up (inactive: all)"
    ]


def test_grown_counters_are_findings_derived_from_the_a100():
    """Counters only grow: what grew since the last round is a finding, replay and recovery critical (as DCGM's
    health watch), CRC a warning; the first round has nothing to compare with."""
    text = nvlink_text("n01_a100_nvlink_e_535.txt")
    (before,) = parse_nvlink(text).values()
    grown = re.sub(r"Link 1: Replay Errors: 0", "Link 1: Replay Errors: 2", text)
    grown = re.sub(r"Link 11: CRC Errors: 0", "Link 11: CRC Errors: 40", grown)
    (now,) = parse_nvlink(grown).values()
    status = {"links": {n: {"status": "25 GB/s"} for n in range(12)}, "all_inactive": False}
    assert nvlink_findings(status, now["links"], {}, 12) == []
    stored = {str(k): v for k, v in before["links"].items()}  # as the state file keeps them
    found = nvlink_findings(status, now["links"], stored, 12)
    assert [(f["severity"], f["detail"]) for f in found] == [
        ("warning", "NVLink crc errors grew since the last round: link 11 +40"),
        ("critical", "NVLink replay errors grew since the last round: link 1 +2"),
    ]
    result = evaluate(read_smi_xml(A100.read_text()), [], extra={read_smi_xml(A100.read_text())[0]["bus_id"]: found})
    assert not result["healthy"]


# --------------------------------------------------------------------------- DCGM (dcgmi health -c, discovery -l)


def test_dcgmi_health_of_a_real_l4_with_a_power_warning():
    health = parse_dcgmi_health(nvlink_text("d01_l4_dcgmi_health_c_power_warning_461.txt"))
    assert health["watches"] and health["overall"] == "Warning"
    assert health["gpus"] == {
        0: {
            "health": "Warning",
            "systems": {
                "Power system": {
                    "health": "Warning",
                    "message": "Detected clocks event due to power violation in GPU 0. Monitor the power conditions."
                    " This GPU can still perform workload.",
                }
            },
        }
    }
    (found,) = dcgm_findings(health["gpus"][0])
    assert (found["check"], found["severity"], found["system"]) == ("dcgm", "warning", "Power system")


def test_dcgmi_health_of_a_real_a100_with_nvlink_down_and_without_watches():
    health = parse_dcgmi_health(nvlink_text("d03_a100_dcgmi_health_nvlink_down_partial.txt"))
    system = health["gpus"][0]["systems"]["NVLINK system"]
    assert system["health"] == "Failure" and system["message"].startswith("GPU 0's NvLink link 0 is currently down")
    assert [f["severity"] for f in dcgm_findings(health["gpus"][0])] == ["critical"]
    assert parse_dcgmi_health(nvlink_text("d04_dcgmi_health_c_no_watches_461.txt")) == {
        "watches": False,
        "overall": None,
        "gpus": {},
    }
    assert parse_dcgmi_health("Error: unable to connect")["overall"] is None


def test_dcgmi_discovery_of_a_real_l4():
    assert parse_dcgmi_discovery(nvlink_text("d02_l4_dcgmi_discovery_l_461.txt")) == {0: "0000:00:03.0"}
