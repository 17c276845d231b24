"""The GPU health sentinel on the sandbox's NVLink rig: a link down (counters that grow: tests/unit).

drv-cuda: 8x H100 SXM, 18 NVLinks per GPU (profile h100x8), instance all on every GPU, a round every 2 s,
2 healthy rounds before the instance is routable again (molecule.yml).
"""

import pytest
from rigops_testinfra import wait_for_gpu_health as wait_for

testinfra_hosts = ["drv-cuda"]


@pytest.fixture
def gpu3(host):
    """The bus id of GPU 3; its faults are cleared (a GPU reset) after the test, whatever happens."""
    out = host.check_output("nvidia-smi -i 3 --query-gpu=pci.bus_id --format=csv,noheader")
    yield out.strip().lower()[4:]
    host.run("nvidia-sim-fault clear 3")


def nvlink_findings(state, bus):
    (gpu,) = [g for g in state["gpus"] if g["bus_id"] == bus]
    return [(f["severity"], f["detail"]) for f in gpu["findings"] if f["check"] == "nvlink"]


def test_a_link_down_takes_the_instance_out_until_the_gpu_reset(host, gpu3):
    state = wait_for(host, "a healthy rig", lambda s: s["healthy"] and s["instances"]["all"]["routable"])
    assert {v["expected"] for v in state["nvlink"].values()} == {18}  # learned from nvidia-smi nvlink -s
    host.run_test("nvidia-sim-fault set 3 nvlink_down --value 7")
    state = wait_for(host, "the link down", lambda s: not s["instances"]["all"]["healthy"])
    found = nvlink_findings(state, gpu3)
    assert ("critical", "NVLink down: 17 of 18 link(s) up (inactive: 7)") in found
    assert all(nvlink_findings(state, g["bus_id"]) == [] for g in state["gpus"] if g["bus_id"] != gpu3)
    assert state["instances"]["all"]["unhealthy_gpus"] == [gpu3]
    host.run_test("nvidia-sim-fault clear 3")
    state = wait_for(host, "routable after the reset", lambda s: s["instances"]["all"]["routable"])
    assert nvlink_findings(state, gpu3) == []
