"""The GPU health sentinel on the sandbox's NVLink rig with DCGM: a link down (counters: tests/unit).

drv-cuda: 8x H100 SXM, 18 NVLinks per GPU, DCGM installed (profile h100x8: the stand-in dcgmi), instance all
on every GPU, a round every 3 s, 2 healthy rounds before the instance is routable again (molecule.yml).
DCGM is read first: its NVLINK system verdict replaces the sentinel's own reading of nvidia-smi nvlink.
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


def findings(state, bus):
    (gpu,) = [g for g in state["gpus"] if g["bus_id"] == bus]
    return [(f["check"], f["severity"], f["detail"]) for f in gpu["findings"]]


def test_a_link_down_takes_the_instance_out_until_the_gpu_reset(host, gpu3):
    state = wait_for(host, "DCGM read", lambda s: s["healthy"] and len(s["dcgm"]) == 8, timeout=20)
    assert state["instances"]["all"]["routable"] and state["errors"] == []
    assert {v["expected"] for v in state["nvlink"].values()} == {18}  # learned from nvidia-smi nvlink -s
    host.run_test("nvidia-sim-fault set 3 nvlink_down --value 7")
    state = wait_for(host, "the link down", lambda s: not s["instances"]["all"]["healthy"])
    assert findings(state, gpu3) == [
        ("dcgm", "critical", "DCGM NVLINK system: Failure: GPU 3's NvLink link 7 is currently down")
    ]
    assert all(findings(state, g["bus_id"]) == [] for g in state["gpus"] if g["bus_id"] != gpu3)
    assert state["instances"]["all"]["unhealthy_gpus"] == [gpu3]
    host.run_test("nvidia-sim-fault clear 3")
    state = wait_for(host, "routable after the reset", lambda s: s["instances"]["all"]["routable"])
    assert findings(state, gpu3) == []
