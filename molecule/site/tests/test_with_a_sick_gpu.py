"""GPU health drains at the gateway: a GPU of the rig falls off the bus under the instance `chat`; the sentinel
(role gpu_health) calls the instance unhealthy, the gateway's health feed (role llm_gateway) routes the alias
chat-any to its fallback (a hosted provider's stand-in on the rig) within 60 s, and every request for the alias
keeps succeeding, and the alerts GpuUnhealthy and VllmInstanceOnUnhealthyGpu fire in a real Prometheus reading
the sentinel's metrics (site_prometheus.py). The fault cleared and acknowledged, the instance comes back after
gpu_health_recover_checks healthy rounds. The CPU build of vLLM keeps answering through the fault (it uses no
GPU): what the gateway does is the feed's doing, not a dead upstream's.

It runs last (changes_state, and after test_tags.py in file order): a GPU that fell off the bus and came back
is not the rig the tag runs of test_tags.py expect to find unchanged."""

import json
import time

import pytest
from site_gateway import SERVED, chat

pytestmark = pytest.mark.changes_state

DRAINED = "/var/lib/rigops-llm-gateway/health/drained.json"
SENTINEL = "/usr/local/lib/rigops-gpu-health/rigops-gpu-health"
FEED = "rigops-llm-gateway-health"
TEXTFILE = "/var/lib/prometheus/node-exporter/rigops_gpu_health.prom"
ALERTS = ("GpuUnhealthy", "VllmInstanceOnUnhealthyGpu")


def drained(host):
    return json.loads(host.file(DRAINED).content_string)


def until(host, what, done, timeout=60):
    """Seconds until done(the feed's drained file), every request for chat-any meanwhile answered 200."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, model = chat(host, "chat-any")
        assert status == 200, (what, status, model)
        if done(drained(host)):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout} s; the feed's file: {drained(host)}")


def test_the_feed_runs_as_the_workers_user_and_drains_nothing_on_a_healthy_rig(host, standin, prometheus):
    feed = host.service(FEED)
    assert feed.is_running and feed.is_enabled
    assert host.check_output(f"ps -o user= -p $(systemctl show -p MainPID --value {FEED})").strip() == "www-data"
    doc = drained(host)
    assert doc["drained"] == [] and doc["hosts"] == {"site-rig": {"status": "ok", "detail": ""}}
    # the sentinel's state, as the feed reads it: the instance on GPUs 0 and 1 may take traffic
    state = json.loads(host.check_output("curl -sS http://127.0.0.1:9402/state"))
    assert state["instances"]["chat"]["routable"] and state["age_seconds"] < 3 * state["interval"]
    assert chat(host, "chat-any") == (200, SERVED)
    assert chat(host, "hosted-1") == (200, "hosted-1")
    # Prometheus reads the healthy rig's metrics (8 GPUs, the instance) and fires none of the GPU health alerts
    prometheus.feed(host)
    assert prometheus.until("GpuUnhealthy", lambda a: False, timeout=4) == []
    assert [r["value"][1] for r in prometheus.query('count(rigops_gpu_healthy{host="site-rig"} == 1)')] == ["8"]
    assert prometheus.alerts("VllmInstanceOnUnhealthyGpu") == []


def test_a_gpu_off_the_bus_drains_its_instance_and_the_alias_falls_back(host, standin, prometheus):
    (bus,) = [g["bus_id"] for g in json.loads(host.check_output(f"{SENTINEL} status"))["gpus"] if g["index"] == 0]
    host.run_test(f"nvidia-sim-fault set {bus} xid79")
    try:
        seconds = until(host, "drained", lambda d: d["drained"] == ["site-rig/chat"])
        assert seconds < 60
        print(f"GPU 0 off the bus -> site-rig/chat drained at the gateway: {seconds:.1f} s")
        assert "79" in " ".join(drained(host)["why"]["site-rig/chat"]["findings"])
        # the alias goes to its fallback; the model's own name has no other hop: 503 in the shape clients read
        assert chat(host, "chat-any") == (200, "hosted-1")
        assert chat(host, SERVED) == (503, "overloaded_error")
        assert f"drained site-rig/chat: GPU(s) {bus}" in host.check_output(f"journalctl -u {FEED} --no-pager -o cat")
        assert 'rigops_vllm_instance_routable{vllm_instance="chat"} 0' in host.file(TEXTFILE).content_string
        # the alerts fire (no `for:`: at the first evaluation after the scrape), for that GPU and that instance
        prometheus.feed(host)
        fired = prometheus.until("GpuUnhealthy", bool)
        assert [(a["labels"]["host"], a["labels"]["bus_id"], a["labels"]["severity"]) for a in fired] == [
            ("site-rig", bus, "critical")
        ]
        fired = prometheus.until("VllmInstanceOnUnhealthyGpu", bool)
        assert [a["labels"]["vllm_instance"] for a in fired] == ["chat"]
    finally:
        host.run(f"nvidia-sim-fault clear {bus}")
    # the card back (a reset), the Xid line acknowledged by the operator: back after 2 healthy rounds
    assert "acknowledged" in host.check_output(f"{SENTINEL} ack {bus}")
    seconds = until(host, "back", lambda d: d["drained"] == [])
    assert chat(host, "chat-any") == (200, SERVED) and chat(host, SERVED) == (200, SERVED)
    assert "back in service site-rig/chat" in host.check_output(f"journalctl -u {FEED} --no-pager -o cat")
    prometheus.feed(host)
    for name in ALERTS:
        assert prometheus.until(name, lambda a: not a) == [], name
    print(f"fault cleared and acknowledged -> site-rig/chat back at the gateway: {seconds:.1f} s")
