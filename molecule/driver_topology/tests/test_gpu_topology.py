"""The topology check's verdicts, read the way an operator reads them: playbooks/validate.yml."""

import json
import os
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
testinfra_hosts = ["drv-archive"]


def validate(*extra):
    return ansible_playbook(ROOT / "playbooks" / "validate.yml", *extra)


@pytest.fixture(scope="module")
def fleet_report():
    return validate()


def report_line(output, host):
    """The report message of one host, joined back from the callback's wrapped lines."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if f"{host}: PASS" in line or f"{host}: FAIL" in line:
            msg = [line.strip()]
            for cont in lines[i + 1 :]:
                if not cont.startswith("        "):
                    break
                msg.append(cont.strip())
            return " ".join(msg)
    raise AssertionError(output[-3000:])


def test_fleet_report_has_one_line_per_rig(fleet_report):
    rc, out = fleet_report
    assert rc != 0  # the broken rig fails the run
    assert "drv-archive: PASS" in report_line(out, "drv-archive")
    assert "drv-cuda: PASS" in report_line(out, "drv-cuda")
    line = report_line(out, "drv-broken")
    assert "drv-broken: FAIL" in line


def test_h100_all_nvlink(fleet_report):
    line = report_line(fleet_report[1], "drv-cuda")
    assert "worst_link=NV18" in line and "p2p=ok" in line and "gpus=8" in line


def test_5090_groups_within_a_numa_node_pass(fleet_report):
    line = report_line(fleet_report[1], "drv-archive")
    assert "gpus=8" in line and "driver=595.45.04" in line


@pytest.mark.parametrize(
    ("kind", "fix_words"),
    [
        ("gpu_missing", "seated and powered"),
        ("acs_redirect", "ACS"),
        ("nccl_p2p_disabled", "NCCL_P2P_DISABLE"),
    ],
)
def test_broken_rig_reports_each_planted_problem_with_its_fix(fleet_report, kind, fix_words):
    line = report_line(fleet_report[1], "drv-broken")
    assert kind in line, line
    assert fix_words.lower() in line.lower(), line


def test_8_gpu_group_across_numa_with_p2p_required_fails(host):
    instances = [{"name": "big", "gpus": list(range(8)), "engine": {"tensor_parallel_size": 8}}]
    rc, out = validate("-l", "drv-archive", "-e", json.dumps({"vllm_instances": instances}))
    assert rc != 0
    line = report_line(out, "drv-archive")
    assert "FAIL" in line
    # the pairs across the two NUMA nodes, grouped in one line
    assert "GPU[0-3] x GPU[4-7] (16 pairs) link_worse_than_allowed [error, layout]" in line
    # the stock GeForce driver offers no P2P: a warning that says what it costs
    assert "p2p_unsupported_by_product [warning, product]" in line
    assert "SYS" in line
    assert "NUMA" in line  # the fix: pin the instance to one node's GPUs


def test_tensor_parallel_larger_than_group_is_refused(host):
    instances = [{"name": "x", "gpus": [0, 1], "engine": {"tensor_parallel_size": 4}}]
    rc, out = validate("-l", "drv-archive", "-e", json.dumps({"vllm_instances": instances}))
    assert rc != 0
    assert "tensor_parallel_size" in out
