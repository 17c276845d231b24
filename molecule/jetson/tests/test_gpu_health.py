"""The GPU health sentinel on a sandbox Jetson board: tegrastats against the board's thermal trip points.

jet-3: an AGX Orin (profile jetson-orin: its thermal zones and NVIDIA's trips, 99 C throttle), instance chat,
a round every 2 s, 2 cool rounds before the instance is routable again (molecule.yml). The thermal fault of
the simulated stack raises tegrastats' gpu@ and tj@ to the value given.
"""

import json

import pytest
from rigops_testinfra import GPU_HEALTH_TEXTFILE as TEXTFILE
from rigops_testinfra import wait_for_gpu_health as wait_for

testinfra_hosts = ["jet-3"]


@pytest.fixture
def hot(host):
    """The board's GPU at 101 C (above its 99 C throttle trip); cleared after the test, whatever happens."""
    host.run_test("nvidia-sim-fault set 0 thermal --value 101")
    yield
    host.run("nvidia-sim-fault clear")


def test_the_sentinel_reads_tegrastats_and_the_boards_trip_points(host):
    service = host.service("rigops-gpu-health")
    assert service.is_running and service.is_enabled
    config = json.loads(host.file("/etc/rigops/gpu-health.json").content_string)
    assert (config["source"], config["tegrastats"], config["sysfs_root"]) == (
        "tegrastats",
        ["tegrastats"],
        "/etc/nvidia-sim/sys",
    )
    assert config["instances"] == [{"name": "chat", "indices": [], "gpus": ["integrated"]}]
    state = wait_for(host, "a first round", lambda s: s["healthy"])
    assert state["errors"] == [] and [g["bus_id"] for g in state["gpus"]] == ["integrated"]
    assert state["instances"]["chat"]["routable"] is True
    assert 'rigops_vllm_instance_routable{vllm_instance="chat"} 1' in host.file(TEXTFILE).content_string


def test_a_board_at_its_throttle_point_takes_its_instances_out_until_it_cooled(host, hot):
    state = wait_for(host, "the hot board", lambda s: not s["healthy"])
    findings = {f["sensor"]: f for f in state["gpus"][0]["findings"]}
    assert set(findings) == {"gpu", "tj"}
    assert findings["gpu"]["severity"] == "critical"
    assert findings["gpu"]["detail"] == (
        "gpu at 101 C, its throttle point is 99 C (gpu-thermal trip 0 (passive)): clocks slowed"
    )
    assert state["instances"]["chat"] | {"findings": None} == {
        "healthy": False,
        "routable": False,
        "healthy_streak": 0,
        "unhealthy_gpus": ["integrated"],
        "findings": None,
    }
    # what the gateway's health feed reads
    served = json.loads(host.check_output("curl -sS --noproxy '*' http://127.0.0.1:9402/state"))
    assert served["instances"]["chat"]["routable"] is False
    assert 'rigops_vllm_instance_gpu_healthy{vllm_instance="chat"} 0' in host.file(TEXTFILE).content_string
    host.run_test("nvidia-sim-fault clear")
    state = wait_for(host, "routable after 2 cool rounds", lambda s: s["instances"]["chat"]["routable"])
    assert state["healthy"] and state["instances"]["chat"]["healthy_streak"] >= 2
