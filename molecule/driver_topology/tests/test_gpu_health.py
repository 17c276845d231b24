"""The GPU health sentinel on a sandbox rig, with faults planted at run time in the simulated NVIDIA stack.

drv-archive: 8x RTX 5090, instances left (GPUs 0-3) and right (GPUs 4-7), a round every 2 s, 2 healthy
rounds before an instance is routable again (molecule.yml).
"""

import os
import time
from pathlib import Path

import pytest
from rigops_testinfra import GPU_HEALTH_TEXTFILE as TEXTFILE
from rigops_testinfra import SENTINEL, ansible_playbook
from rigops_testinfra import gpu_health_status as status
from rigops_testinfra import wait_for_gpu_health as wait_for

testinfra_hosts = ["drv-archive"]
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
CONFIG = "/etc/rigops/gpu-health.json"


def bus_of(host, index):
    out = host.check_output(f"nvidia-smi -i {index} --query-gpu=pci.bus_id --format=csv,noheader")
    return out.strip().lower()[4:]  # 00000000:81:00.0 -> 0000:81:00.0


def findings(state, bus):
    (gpu,) = [g for g in state["gpus"] if g["bus_id"] == bus]
    return gpu["findings"]


@pytest.fixture
def fault(host):
    """Plant faults with nvidia-sim-fault; every one is cleared after the test, whatever happens."""
    planted = []

    def plant(gpu, kind):
        host.run_test(f"nvidia-sim-fault set {gpu} {kind}")
        planted.append(gpu)

    yield plant
    for gpu in planted:
        host.run(f"nvidia-sim-fault clear {gpu}")
    host.run(f"{SENTINEL} ack")


def test_the_sentinel_runs_and_finds_the_rig_healthy(host):
    service = host.service("rigops-gpu-health")
    assert service.is_running and service.is_enabled
    config = host.file(CONFIG)
    assert config.user == "root" and config.mode == 0o644
    state = wait_for(host, "a first round", lambda s: s["healthy"])
    assert len(state["gpus"]) == 8 and state["errors"] == []
    assert {name: v["routable"] for name, v in state["instances"].items()} == {"left": True, "right": True}
    # an idle GPU's link runs at a lower generation than its maximum, by design: no finding
    xml = host.check_output("nvidia-smi -i 0 -q -x")
    assert "<current_link_gen>1</current_link_gen>" in xml and "<max_link_gen>5</max_link_gen>" in xml
    assert all(g["findings"] == [] for g in state["gpus"])
    metrics = host.file(TEXTFILE)
    assert metrics.mode == 0o644
    assert metrics.content_string.count("rigops_gpu_healthy{") == 8
    assert 'rigops_vllm_instance_routable{vllm_instance="right"} 1' in metrics.content_string


def test_a_gpu_off_the_bus_takes_only_its_instance_out_until_acknowledged(host, fault):
    bus = bus_of(host, 5)
    fault(bus, "xid79")
    # a round may read nvidia-smi before the fault and the kernel log after it: wait for both findings
    state = wait_for(host, "GPU 5 off the bus", lambda s: {"missing", "xid"} <= {f["check"] for f in findings(s, bus)})
    assert not state["instances"]["right"]["healthy"] and not state["instances"]["right"]["routable"]
    assert state["instances"]["left"]["healthy"] and state["instances"]["left"]["routable"]
    xid = [f for f in findings(state, bus) if f["check"] == "xid"][0]
    assert "79" in xid["detail"] and xid["severity"] == "critical"
    metrics = host.file(TEXTFILE).content_string
    assert 'rigops_vllm_instance_gpu_healthy{vllm_instance="right"} 0' in metrics
    assert 'rigops_vllm_instance_gpu_healthy{vllm_instance="left"} 1' in metrics

    # the card is back (a reset, a reseat): the Xid line stays in this boot's log, and so does the finding
    host.run_test(f"nvidia-sim-fault clear {bus}")
    time.sleep(5)
    state = status(host)
    assert [f["check"] for f in findings(state, bus)] == ["xid"]
    assert not state["instances"]["right"]["routable"]

    # acknowledged: healthy at once, routable after 2 healthy rounds in a row
    assert "acknowledged" in host.check_output(f"{SENTINEL} ack {bus}")
    state = wait_for(host, "the instance routable again", lambda s: s["instances"]["right"]["routable"])
    assert state["healthy"] and state["instances"]["right"]["healthy_streak"] >= 2


def test_a_narrowed_link_is_a_finding_and_a_thermal_slowdown_too(host, fault):
    link, hot = bus_of(host, 1), bus_of(host, 6)
    fault(link, "link_x8")
    fault(hot, "thermal")
    state = wait_for(host, "both faults seen", lambda s: findings(s, link) and findings(s, hot), timeout=20)
    assert [f["check"] for f in findings(state, link)] == ["pcie_link"]
    assert "slowdown" in {f["check"] for f in findings(state, hot)}
    host.run_test(f"nvidia-sim-fault clear {link}")
    host.run_test(f"nvidia-sim-fault clear {hot}")
    wait_for(host, "healthy again", lambda s: s["healthy"], timeout=20)


def test_a_config_that_is_not_the_sentinels_is_refused_and_left_as_it_is(host):
    """It records the GPUs the rig expects: a cut file stops the role, names the variable, and stays."""
    good = host.file(CONFIG).content_string
    host.run_test(f"cp -p {CONFIG} {CONFIG}.test && head -c 40 {CONFIG}.test > {CONFIG}")
    try:
        cut = host.file(CONFIG).content_string
        rc, out = ansible_playbook(SCENARIO / "gpu_health.yml", "-l", "drv-archive")
        assert rc != 0
        assert "the config the host has (gpu_health_config_file) is not JSON" in out, out[-3000:]
        assert "remove it to start again" in out
        assert host.file(CONFIG).content_string == cut
        assert host.service("rigops-gpu-health").is_running
    finally:
        host.run_test(f"mv {CONFIG}.test {CONFIG}")
    assert host.file(CONFIG).content_string == good
