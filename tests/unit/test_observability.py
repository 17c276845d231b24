"""Observability (roles/observability): what Prometheus scrapes, the alert rules (checked and unit-tested
with promtool), the metrics proxy that keeps vLLM on loopback, the Grafana dashboard, and the role's
templates rendered on the controller by ansible-playbook.

promtool comes with Debian's and Ubuntu's `prometheus` package; the tests that need it skip without it
(set RIGOPS_PROMTOOL to a promtool binary to point at one elsewhere).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.filter import observability as obs
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "observability"
PROXY = ROLE / "files" / "rigops-metrics-proxy"
DASHBOARD = ROLE / "files" / "grafana" / "rigops-vllm.json"
METRICS = ROOT / "tests" / "fixtures" / "bench" / "metrics"
KEY = "sk-observability-test-key-that-must-never-appear-0123456789"


PROMTOOL = os.environ.get("RIGOPS_PROMTOOL") or shutil.which("promtool")
needs_promtool = pytest.mark.needs("promtool")


def promtool(*args: str, cwd=None, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, check=False, cwd=cwd, timeout=120
    )


# --------------------------------------------------------------------------- what each host serves Prometheus

INSTANCES = [
    {"name": "alpha", "port": 8001, "model": {"served_name": "tiny-a"}},
    {"name": "beta", "port": 8002, "host": "0.0.0.0", "model": {"served_name": "tiny-b"}},
]


def test_a_cpu_rig_serves_its_instances_and_no_gpu_facts():
    t = obs.target({"instances": INSTANCES, "flavour": "cpu", "address_by_value": "127.0.0.1"}, "vs-rig")
    assert (t["metrics_proxy"], t["gpu"], t["dcgm"], t["node_exporter"]) == (True, False, False, True)
    assert t["instances"] == [
        {"name": "alpha", "port": 8001, "host": "127.0.0.1", "served_name": "tiny-a"},
        # bound to every address: the proxy still reads it on loopback
        {"name": "beta", "port": 8002, "host": "127.0.0.1", "served_name": "tiny-b"},
    ]
    assert t["address"] == "127.0.0.1"


def test_gpu_facts_follow_the_flavour_and_the_overrides():
    cuda = obs.target({"instances": [], "flavour": None}, "rig-5090")  # no flavour: the default cuda
    assert (cuda["metrics_proxy"], cuda["gpu"], cuda["instances"]) == (True, True, [])
    jetson = obs.target({"instances": [], "flavour": "jetson"}, "thor-01")
    assert (jetson["metrics_proxy"], jetson["gpu"]) == (False, False)  # nothing to proxy there
    off = obs.target({"instances": INSTANCES, "flavour": "cuda", "metrics_proxy": "false"}, "rig")
    assert (off["metrics_proxy"], off["gpu"], off["instances"]) == (False, False, [])
    forced = obs.target({"flavour": "cpu", "gpu_metrics": True, "dcgm": "yes", "address": "10.0.0.5"}, "rig")
    assert (forced["gpu"], forced["dcgm"], forced["address"]) == (True, True, "10.0.0.5")


def test_target_refuses_what_it_cannot_use():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="not true, false or auto"):
        obs.target({"metrics_proxy": "sometimes"}, "rig")
    with pytest.raises(AnsibleFilterError, match="without name or port"):
        obs.target({"instances": [{"name": "alpha"}]}, "rig")


SETTINGS = {
    "listen": "0.0.0.0:9090",
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "rule_files": ["/etc/prometheus/rules/rigops.rules.yml"],
    "alertmanagers": [],
    "node_port": 9100,
    "proxy_port": 9401,
    "dcgm_port": 9400,
    "gateway_targets": [],
}


def test_prometheus_scrapes_each_instance_through_its_rigs_proxy():
    targets = [
        obs.target({"instances": INSTANCES, "flavour": "cpu", "address_by_value": "10.0.0.7"}, "vs-rig"),
        obs.target({"flavour": "cuda", "dcgm": True, "address_by_value": "fd00::5"}, "rig-h100"),
        obs.target({"flavour": "jetson", "address_by_value": "thor-01.lan"}, "thor-01"),
    ]
    cfg = obs.prometheus_config(targets, SETTINGS)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"prometheus", "node", "vllm", "rigops_gpu", "dcgm"}  # no gateway target given
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["127.0.0.1:9090"]}]
    assert [g["targets"] for g in jobs["node"]["static_configs"]] == [
        ["10.0.0.7:9100"],
        ["[fd00::5]:9100"],
        ["thor-01.lan:9100"],
    ]
    vllm = jobs["vllm"]["static_configs"]
    assert [(g["targets"], g["labels"]["vllm_instance"], g["labels"]["__metrics_path__"]) for g in vllm] == [
        (["10.0.0.7:9401"], "alpha", "/vllm/alpha/metrics"),
        (["10.0.0.7:9401"], "beta", "/vllm/beta/metrics"),
    ]
    assert vllm[0]["labels"]["host"] == "vs-rig" and vllm[1]["labels"]["served_name"] == "tiny-b"
    assert jobs["rigops_gpu"]["metrics_path"] == "/gpu/metrics"
    assert [g["labels"]["host"] for g in jobs["rigops_gpu"]["static_configs"]] == ["rig-h100"]
    assert jobs["dcgm"]["static_configs"] == [{"targets": ["[fd00::5]:9400"], "labels": {"host": "rig-h100"}}]
    assert "alerting" not in cfg
    with_more = obs.prometheus_config(
        targets, dict(SETTINGS, alertmanagers=["am:9093"], gateway_targets=["gw:9113"], listen="127.0.0.1:9090")
    )
    assert with_more["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["am:9093"]}]}]}
    assert {j["job_name"]: j for j in with_more["scrape_configs"]}["gateway"]["static_configs"] == [
        {"targets": ["gw:9113"]}
    ]


def test_the_proxy_config_names_instances_and_ports_only():
    t = obs.target({"instances": INSTANCES, "flavour": "cpu"}, "vs-rig")
    cfg = obs.proxy_config(t, {"listen": "0.0.0.0", "port": 9401, "timeout": 5})
    assert cfg == {
        "listen": "0.0.0.0",
        "port": 9401,
        "timeout": 5.0,
        "gpu": False,
        "nvidia_smi": "nvidia-smi",
        "instances": {"alpha": {"host": "127.0.0.1", "port": 8001}, "beta": {"host": "127.0.0.1", "port": 8002}},
    }


# --------------------------------------------------------------------------- the role's files, rendered

RENDER = """\
- name: Render the observability role's files on the controller
  hosts: rig
  gather_facts: false
  vars_files:
    - {role}/defaults/main.yml
    - {role}/vars/main.yml
    - {out}/overrides.yml
  tasks:
    - name: What Prometheus scrapes (the role's own task)
      ansible.builtin.set_fact:
        observability__targets: "{{{{ observability__targets | default([]) + [observability__target] }}}}"
      loop: "{{{{ observability__scrape_hosts }}}}"
      vars:
        observability__hv: "{{{{ hostvars[item] }}}}"
        observability__target: >-
          {{{{ {{'instances': observability__hv.vllm_instances | default([]) | rigops.fleet.instances_public,
              'flavour': observability__hv.vllm_runtime_flavour | default(none),
              'metrics_proxy': observability__hv.observability_metrics_proxy | default('auto'),
              'gpu_metrics': observability__hv.observability_gpu_metrics | default('auto'),
              'dcgm': observability__hv.observability_dcgm_exporter | default(false),
              'address_by_value': observability__hv[observability_address_by] | default(none)}}
             | rigops.fleet.observability_target(item) }}}}
    - name: Files
      ansible.builtin.template:
        src: "{role}/templates/{{{{ item.src }}}}"
        dest: "{out}/{{{{ item.dest }}}}"
        mode: "0644"
      loop:
        - {{src: etc/prometheus/rules/rigops.rules.yml.j2, dest: rules/rigops.rules.yml}}
        - {{src: etc/prometheus/prometheus.yml.j2, dest: prometheus.yml}}
        - {{src: etc/rigops/metrics-proxy.json.j2, dest: metrics-proxy.json}}
        - {{src: etc/systemd/system/rigops-metrics-proxy.service.j2, dest: rigops-metrics-proxy.service}}
        - {{src: etc/default/prometheus.j2, dest: default-prometheus}}
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The role's templates, rendered by ansible-playbook for a rig with two instances (one with a key
    from the inventory) and a GPU rig, the rig also being the monitoring host."""
    out = tmp_path_factory.mktemp("observability")
    (out / "rules").mkdir()
    inventory = {
        "all": {
            "children": {
                "gpu-rigs": {
                    "hosts": {
                        "rig": {
                            "ansible_connection": "local",
                            "ansible_host": "10.0.0.7",
                            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                            "vllm_runtime_flavour": "cpu",
                            "vllm_instances": [
                                {"name": "alpha", "port": 8001, "model": {"served_name": "tiny-a"},
                                 "security": {"api_key": KEY}},
                                {"name": "beta", "port": 8002, "model": {"served_name": "tiny-b"}},
                            ],
                        },
                        "rig-h100": {"ansible_host": "10.0.0.8", "vllm_instances": []},
                    }
                },
                "monitoring": {"hosts": {"rig": {}}},
            }
        }
    }  # fmt: skip
    (out / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (out / "overrides.yml").write_text(f"observability__rules_file: {out}/rules/rigops.rules.yml\n")
    (out / "render.yml").write_text(RENDER.format(role=ROLE, out=out))
    proc = ansible_playbook("-i", out / "hosts.yml", out / "render.yml")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert KEY not in proc.stdout + proc.stderr
    return out


def test_rendered_files_carry_no_key(rendered):
    files = [p for p in rendered.rglob("*") if p.is_file() and p.name != "hosts.yml"]
    assert len(files) >= 7
    for path in files:
        assert KEY not in path.read_text(), path
    assert KEY in (rendered / "hosts.yml").read_text()  # it was there to leak


def test_rendered_scrape_config_and_proxy_config(rendered):
    cfg = yaml.safe_load((rendered / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert cfg["rule_files"] == [str(rendered / "rules" / "rigops.rules.yml")]
    assert [g["targets"][0] for g in jobs["node"]["static_configs"]] == ["10.0.0.7:9100", "10.0.0.8:9100"]
    assert [g["labels"]["__metrics_path__"] for g in jobs["vllm"]["static_configs"]] == [
        "/vllm/alpha/metrics",
        "/vllm/beta/metrics",
    ]
    # rig-h100 has no flavour in this inventory: the cuda default, GPU facts through its proxy
    assert [g["targets"][0] for g in jobs["rigops_gpu"]["static_configs"]] == ["10.0.0.8:9401"]
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["127.0.0.1:9090"]}]
    proxy = json.loads((rendered / "metrics-proxy.json").read_text())
    assert proxy["instances"] == {
        "alpha": {"host": "127.0.0.1", "port": 8001},
        "beta": {"host": "127.0.0.1", "port": 8002},
    }
    assert proxy["gpu"] is False and proxy["port"] == 9401
    assert (rendered / "default-prometheus").read_text().splitlines()[-1] == (
        'ARGS="--web.listen-address=127.0.0.1:9090 --storage.tsdb.retention.time=15d"'
    )


def test_rendered_proxy_unit_is_hardened_without_devices_on_a_cpu_rig(rendered):
    unit = (rendered / "rigops-metrics-proxy.service").read_text()
    for line in ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateDevices=yes",
                 "CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"):  # fmt: skip
        assert line in unit, line
    assert "DeviceAllow" not in unit


@needs_promtool
def test_promtool_accepts_the_rendered_config_and_rules(rendered):
    res = promtool("check", "config", str(rendered / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 12 rules found" in res.stdout + res.stderr


@needs_promtool
def test_promtool_refuses_a_broken_rule(rendered, tmp_path):
    broken = (rendered / "rules" / "rigops.rules.yml").read_text().replace('up{job="vllm"} == 0', "up{job=vllm == 0")
    (tmp_path / "broken.yml").write_text(broken)
    res = promtool("check", "rules", str(tmp_path / "broken.yml"))
    assert res.returncode != 0 and "VllmEngineDown" in res.stdout + res.stderr


# --------------------------------------------------------------------------- the alerts, on synthetic series

RULE_TESTS = """\
rule_files: [rigops.rules.yml]
evaluation_interval: 15s
# each expected alert with its labels and its text, as a person reads it
tests:
  # an instance whose /metrics stops answering: pending, then firing after 1m; the other stays quiet
  - interval: 15s
    input_series:
      - series: 'up{job="vllm", host="vs-rig", vllm_instance="beta", served_name="tiny-b"}'
        values: '1 1 0 0 0 0 0 0 0 0'
      - series: 'up{job="vllm", host="vs-rig", vllm_instance="alpha", served_name="tiny-a"}'
        values: '1x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: VllmEngineDown
        exp_alerts: []
      - eval_time: 2m
        alertname: VllmEngineDown
        exp_alerts:
          - exp_labels: {severity: critical, job: vllm, host: vs-rig, vllm_instance: beta, served_name: tiny-b}
            exp_annotations:
              summary: "vLLM instance beta (tiny-b) on vs-rig does not answer"
              description: >-
                Its /metrics does not answer through rigops-metrics-proxy. Check `systemctl status vllm@beta` and
                `journalctl -u vllm@beta` on vs-rig.
  # the engine died behind a live API server
  - interval: 15s
    input_series:
      - series: 'rigops_vllm_healthy{job="vllm", host="vs-rig", vllm_instance="alpha", served_name="tiny-a"}'
        values: '1 0x10'
    alert_rule_test:
      - eval_time: 2m
        alertname: VllmEngineUnhealthy
        exp_alerts:
          - exp_labels: {severity: critical, job: vllm, host: vs-rig, vllm_instance: alpha, served_name: tiny-a}
            exp_annotations:
              summary: "vLLM instance alpha on vs-rig: /health is not 200 (engine dead)"
              description: >-
                The API server answers but its engine died (/health 503); requests fail. Restart it:
                `systemctl restart vllm@alpha` on vs-rig, and read its journal.
  # KV cache full for 5 minutes (new metric name), the older name on another instance, a calm one
  - interval: 1m
    input_series:
      - series: 'vllm:kv_cache_usage_perc{host="r", vllm_instance="a", served_name="m", engine="0"}'
        values: '0.5 0.5 0.5 0.97x8'
      - series: 'vllm:gpu_cache_usage_perc{host="r", vllm_instance="old", served_name="o"}'
        values: '0.99x10'
      - series: 'vllm:kv_cache_usage_perc{host="r", vllm_instance="calm", served_name="c", engine="0"}'
        values: '0.5x10'
    alert_rule_test:
      - eval_time: 6m
        alertname: VllmKvCacheSaturated
        exp_alerts:
          - exp_labels: {severity: warning, host: r, vllm_instance: old, served_name: o}
            exp_annotations: &kv
              summary: "KV cache of old on r is 99% full"
              description: >-
                New requests wait or are preempted. Lower max_num_seqs or max_model_len, give the instance more GPU
                memory (gpu_memory_utilization), or spread the load over more instances.
      - eval_time: 9m
        alertname: VllmKvCacheSaturated
        exp_alerts:
          - exp_labels: {severity: warning, host: r, vllm_instance: a, served_name: m}
            exp_annotations:
              summary: "KV cache of a on r is 97% full"
              description: >-
                New requests wait or are preempted. Lower max_num_seqs or max_model_len, give the instance more GPU
                memory (gpu_memory_utilization), or spread the load over more instances.
          - exp_labels: {severity: warning, host: r, vllm_instance: old, served_name: o}
            exp_annotations: *kv
  # a waiting queue above the threshold that grows alerts; one that is high but flat does not
  - interval: 1m
    input_series:
      - series: 'vllm:num_requests_waiting{host="r", vllm_instance="busy", served_name="b", engine="0"}'
        values: '0+4x20'
      - series: 'vllm:num_requests_waiting{host="r", vllm_instance="flat", served_name="f", engine="0"}'
        values: '30x20'
    alert_rule_test:
      - eval_time: 12m
        alertname: VllmWaitingQueueGrowing
        exp_alerts:
          - exp_labels: {severity: warning, host: r, vllm_instance: busy, served_name: b}
            exp_annotations:
              summary: "48 request(s) waiting on busy (r), and growing"
              description: >-
                More requests arrive than the instance serves: clients see time to first token grow. Add capacity or
                route part of the load elsewhere (the gateway's fallback).
  # persistence mode off on one GPU for 10 minutes
  - interval: 1m
    input_series:
      - series: 'rigops_gpu_persistence_mode{job="rigops_gpu", host="rig-5090", gpu="3"}'
        values: '0x12'
      - series: 'rigops_gpu_persistence_mode{job="rigops_gpu", host="rig-5090", gpu="0"}'
        values: '1x12'
    alert_rule_test:
      - eval_time: 11m
        alertname: GpuPersistenceModeOff
        exp_alerts:
          - exp_labels: {severity: warning, job: rigops_gpu, host: rig-5090, gpu: "3"}
            exp_annotations:
              summary: "Persistence mode is off on GPU 3 of rig-5090"
              description: >-
                Without it the driver is initialised again and again and multi-GPU model loads are slow. The
                nvidia_driver role enables nvidia-persistenced: `systemctl status nvidia-persistenced` on rig-5090.
  # GPU memory near full, from nvidia-smi; DCGM on the same GPU does not double it; DCGM alone does alert
  - interval: 1m
    input_series:
      - series: 'rigops_gpu_memory_used_bytes{job="rigops_gpu", host="rig-5090", gpu="0"}'
        values: '33000000000x12'
      - series: 'rigops_gpu_memory_total_bytes{job="rigops_gpu", host="rig-5090", gpu="0"}'
        values: '33500000000x12'
      - series: 'DCGM_FI_DEV_FB_USED{job="dcgm", host="rig-5090", gpu="0", UUID="GPU-a"}'
        values: '32000x12'
      - series: 'DCGM_FI_DEV_FB_FREE{job="dcgm", host="rig-5090", gpu="0", UUID="GPU-a"}'
        values: '100x12'
      - series: 'DCGM_FI_DEV_FB_USED{job="dcgm", host="rig-h100", gpu="1", UUID="GPU-b"}'
        values: '80000x12'
      - series: 'DCGM_FI_DEV_FB_FREE{job="dcgm", host="rig-h100", gpu="1", UUID="GPU-b"}'
        values: '100x12'
    alert_rule_test:
      - eval_time: 11m
        alertname: GpuMemoryNearFull
        exp_alerts:
          - exp_labels: {severity: warning, job: rigops_gpu, host: rig-5090, gpu: "0"}
            exp_annotations:
              summary: "GPU 0 of rig-5090 is 98.51% full"
              description: &gpumem >-
                vLLM takes gpu_memory_utilization of the GPU at start; more than that in use means another process or a
                second instance shares it, and the next long request or start may run out of memory.
          - exp_labels: {severity: warning, job: dcgm, host: rig-h100, gpu: "1", UUID: GPU-b}
            exp_annotations:
              summary: "GPU 1 of rig-h100 is 99.88% full"
              description: *gpumem
  # the GPU health sentinel (textfile collector, job node): one GPU unhealthy and its instance; a sentinel that
  # stopped writing (its last round at time 0) while the other host's rounds go on
  - interval: 1m
    input_series:
      - series: 'rigops_gpu_healthy{job="node", host="rig-5090", bus_id="0000:81:00.0", index="5", uuid="GPU-a"}'
        values: '1 0x5'
      - series: 'rigops_gpu_healthy{job="node", host="rig-5090", bus_id="0000:01:00.0", index="0", uuid="GPU-b"}'
        values: '1x6'
      - series: 'rigops_vllm_instance_gpu_healthy{job="node", host="rig-5090", vllm_instance="right"}'
        values: '1 0x5'
      - series: 'rigops_gpu_health_last_check_timestamp_seconds{job="node", host="rig-old"}'
        values: '0x6'
      - series: 'rigops_gpu_health_last_check_timestamp_seconds{job="node", host="rig-5090"}'
        values: '0+60x6'
    alert_rule_test:
      - eval_time: 1m
        alertname: GpuUnhealthy
        exp_alerts:
          - exp_labels: {severity: critical, job: node, host: rig-5090, bus_id: "0000:81:00.0", index: "5", uuid: GPU-a}
            exp_annotations:
              summary: "GPU 0000:81:00.0 of rig-5090 is unhealthy"
              description: >-
                The GPU health sentinel found an Xid that needs a reset, a reboot or a new card, uncorrectable ECC
                errors, a missing GPU, a narrowed PCIe link or a hardware slowdown. `rigops-gpu-health status` on
                rig-5090 says which and what it needs.
      - eval_time: 1m
        alertname: VllmInstanceOnUnhealthyGpu
        exp_alerts:
          - exp_labels: {severity: critical, job: node, host: rig-5090, vllm_instance: right}
            exp_annotations:
              summary: "vLLM instance right on rig-5090 runs on an unhealthy GPU"
              description: >-
                Its answers may fail or hang while its port stays open. Take its traffic elsewhere, then deal with
                the GPU (`rigops-gpu-health status` on rig-5090).
      - eval_time: 2m
        alertname: GpuHealthSentinelSilent
        exp_alerts: []
      - eval_time: 4m
        alertname: GpuHealthSentinelSilent
        exp_alerts:
          - exp_labels: {severity: warning, job: node, host: rig-old}
            exp_annotations:
              summary: "The GPU health sentinel of rig-old has not completed a round for 4m 0s"
              description: >-
                Its GPU verdicts are stale: `systemctl status rigops-gpu-health` and `journalctl -u
                rigops-gpu-health` on rig-old.
  # a gateway upstream failing 20 % of its requests, another 1 %; a third marked down
  - interval: 1m
    input_series:
      - series: 'rigops_gateway_upstream_requests_total{upstream="rig-5090/chat", outcome="ok"}'
        values: '0+80x15'
      - series: 'rigops_gateway_upstream_requests_total{upstream="rig-5090/chat", outcome="error"}'
        values: '0+20x15'
      - series: 'rigops_gateway_upstream_requests_total{upstream="remote", outcome="ok"}'
        values: '0+99x15'
      - series: 'rigops_gateway_upstream_requests_total{upstream="remote", outcome="error"}'
        values: '0+1x15'
      - series: 'rigops_gateway_upstream_up{upstream="rig-h100/code"}'
        values: '0x15'
    alert_rule_test:
      - eval_time: 12m
        alertname: GatewayUpstreamFailing
        exp_alerts:
          - exp_labels: {severity: critical, upstream: rig-5090/chat}
            exp_annotations:
              summary: "Gateway upstream rig-5090/chat fails 20% of requests"
              description: >-
                Clients are sent to the fallback (if any) or get errors. Check the upstream's instance or provider.
      - eval_time: 12m
        alertname: GatewayUpstreamDown
        exp_alerts:
          - exp_labels: {severity: critical, upstream: rig-h100/code}
            exp_annotations:
              summary: "Gateway upstream rig-h100/code is down"
              description: The gateway marks the upstream unavailable; its requests go to the fallback or fail.
  # an exporter that stops answering
  - interval: 1m
    input_series:
      - series: 'up{job="node", host="rig-h100", instance="10.0.0.8:9100"}'
        values: '0x8'
    alert_rule_test:
      - eval_time: 6m
        alertname: ExporterDown
        exp_alerts:
          - exp_labels: {severity: warning, job: node, host: rig-h100, instance: "10.0.0.8:9100"}
            exp_annotations:
              summary: "node on rig-h100 does not answer Prometheus"
              description: >-
                The host, its exporter, or the path between Prometheus and it is down: its other alerts are blind.
"""


@needs_promtool
def test_each_alert_fires_on_what_users_hit_and_not_otherwise(rendered, tmp_path):
    shutil.copy(rendered / "rules" / "rigops.rules.yml", tmp_path / "rigops.rules.yml")
    (tmp_path / "tests.yml").write_text(RULE_TESTS)
    res = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


@needs_promtool
def test_the_rule_tests_can_fail(rendered, tmp_path):
    """The same tests against rules whose thresholds moved must fail: they check something."""
    rules = (rendered / "rules" / "rigops.rules.yml").read_text().replace("> 0.95", "> 0.99")
    (tmp_path / "rigops.rules.yml").write_text(rules)
    (tmp_path / "tests.yml").write_text(RULE_TESTS)
    res = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert res.returncode != 0 and "VllmKvCacheSaturated" in res.stdout + res.stderr


def test_every_alert_of_the_issue_is_there(rendered):
    rules = yaml.safe_load((rendered / "rules" / "rigops.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert alerts == {
        "VllmEngineDown",
        "VllmEngineUnhealthy",
        "VllmKvCacheSaturated",
        "VllmWaitingQueueGrowing",
        "GpuPersistenceModeOff",
        "GpuMemoryNearFull",
        "ExporterDown",
        "GatewayUpstreamFailing",
        "GatewayUpstreamDown",
        "GpuUnhealthy",
        "VllmInstanceOnUnhealthyGpu",
        "GpuHealthSentinelSilent",
    }
    for g in rules["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("critical", "warning") and r["annotations"]["summary"], r["alert"]


# --------------------------------------------------------------------------- the dashboard


def dashboard_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_the_dashboard_shows_what_the_alerts_watch(rendered):
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "rigops-vllm" and dash["__inputs"][0]["name"] == "DS_PROMETHEUS"
    text = " ".join(e for _, e in dashboard_exprs())
    watched = (
        'up{job="vllm"', "rigops_vllm_healthy", "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting",
        "vllm:num_requests_running", "vllm:time_to_first_token_seconds_bucket", "vllm:generation_tokens_total",
        "rigops_gpu_persistence_mode", "rigops_gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED",
        "rigops_gateway_upstream_requests_total", "ALERTS",
    )  # fmt: skip
    for metric in watched:
        assert metric in text, metric
    grid = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in dash["panels"]]
    assert len(grid) == len(set(grid)), "panels overlap"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for n, (title, expr) in enumerate(dashboard_exprs()):
        expr = expr.replace("$__rate_interval", "5m").replace("$host", ".*").replace("$instance", ".*")
        rules["groups"][0]["rules"].append({"record": f"dashboard:panel_{n}", "expr": expr, "labels": {"panel": title}})
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    res = promtool("check", "rules", str(tmp_path / "dashboard.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


# --------------------------------------------------------------------------- the proxy in front of vLLM


class FakeVllm(http.server.BaseHTTPRequestHandler):
    """vLLM's loopback server as the proxy sees it: /metrics (a real capture), /health, /tokenize."""

    health = 200
    seen: list[str] = []

    def do_GET(self):  # noqa: N802
        FakeVllm.seen.append(self.path)
        if self.path == "/metrics":
            body, code = (METRICS / "vllm-0.32.0-cpu-16-running.txt").read_bytes(), 200
        elif self.path == "/health":
            body, code = b"", FakeVllm.health
        else:
            body, code = b'{"tokens": [1, 2]}', 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def proxy(tmp_path):
    vllm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    threading.Thread(target=vllm.serve_forever, daemon=True).start()
    FakeVllm.health, FakeVllm.seen = 200, []
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        "echo '0, NVIDIA GeForce RTX 5090, GPU-26a733fc-0175-46d2-eaa7-e8a57ef90515, Enabled, 29000, 32607'\n"
        "echo '1, NVIDIA GeForce RTX 5090, GPU-c7164293-2ae3-639e-d08c-a0ecec50faad, Disabled, 12, 32607'\n"
        "echo '2, NVIDIA Thor, GPU-0, Enabled, [N/A], [N/A]'\n"
    )
    smi.chmod(0o755)
    port = free_port()
    dead = free_port()  # nothing listens there: an instance that is down
    config = {
        "listen": "127.0.0.1",
        "port": port,
        "timeout": 2,
        "gpu": True,
        "nvidia_smi": str(smi),
        "instances": {"alpha": {"host": "127.0.0.1", "port": vllm.server_address[1]},
                      "beta": {"host": "127.0.0.1", "port": dead}},
    }  # fmt: skip
    (tmp_path / "proxy.json").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, str(PROXY), str(tmp_path / "proxy.json")], stdout=subprocess.PIPE, text=True
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            urllib.request.urlopen(base + "/", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    yield base
    proc.terminate()
    proc.wait(timeout=5)
    vllm.shutdown()
    vllm.server_close()


def get(url, method="GET"):
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_proxy_forwards_an_instances_metrics_with_its_health(proxy):
    code, body = get(proxy + "/vllm/alpha/metrics")
    assert code == 200
    assert 'vllm:num_requests_running{engine="0",model_name="tiny-a"} 16.0' in body
    assert "\nrigops_vllm_healthy 1\n" in body and "rigops_vllm_scrape_seconds " in body
    FakeVllm.health = 503  # the engine died behind a live server
    assert "\nrigops_vllm_healthy 0\n" in get(proxy + "/vllm/alpha/metrics")[1]
    assert FakeVllm.seen.count("/metrics") == 2 and set(FakeVllm.seen) == {"/metrics", "/health"}


def test_proxy_says_503_for_an_instance_that_is_down(proxy):
    code, body = get(proxy + "/vllm/beta/metrics")
    assert code == 503 and "beta: /metrics did not answer" in body


@pytest.mark.parametrize(
    "path",
    ["/vllm/alpha/tokenize", "/vllm/alpha/health", "/vllm/gamma/metrics", "/vllm/../metrics", "/metrics",
     "/vllm/alpha/metrics/../../tokenize", "/vllm//metrics"],
)  # fmt: skip
def test_proxy_serves_nothing_else_of_vllm(proxy, path):
    code, _ = get(proxy + path)
    assert code == 404
    assert "/tokenize" not in FakeVllm.seen


def test_proxy_refuses_other_methods(proxy):
    assert get(proxy + "/vllm/alpha/metrics", method="POST")[0] == 405
    assert get(proxy + "/vllm/alpha/metrics", method="DELETE")[0] == 405
    assert FakeVllm.seen == []


def test_proxy_gpu_facts_from_nvidia_smi(proxy):
    code, body = get(proxy + "/gpu/metrics")
    assert code == 200
    lines = set(body.splitlines())
    assert 'rigops_gpu_persistence_mode{gpu="0"} 1' in lines and 'rigops_gpu_persistence_mode{gpu="1"} 0' in lines
    assert f'rigops_gpu_memory_used_bytes{{gpu="0"}} {29000 * 1024 * 1024}' in lines
    assert f'rigops_gpu_memory_total_bytes{{gpu="1"}} {32607 * 1024 * 1024}' in lines
    # a Jetson's unified memory: no figure rather than a zero
    assert not [ln for ln in lines if ln.startswith("rigops_gpu_memory") and 'gpu="2"' in ln]
    assert 'rigops_gpu_info{gpu="2",name="NVIDIA Thor",uuid="GPU-0"} 1' in lines
    assert "rigops_gpu_count 3" in lines


@needs_promtool
def test_proxy_output_is_valid_exposition_format(proxy, tmp_path):
    for path in ("/vllm/alpha/metrics", "/gpu/metrics"):
        body = get(proxy + path)[1]
        res = promtool("check", "metrics", stdin=body)
        # promtool lints naming style (vLLM's own names draw remarks), errors in the format fail
        assert "error while linting" not in res.stdout + res.stderr, res.stdout + res.stderr


def test_proxy_refuses_to_start_without_config(tmp_path):
    res = subprocess.run([sys.executable, str(PROXY)], capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "usage" in res.stderr


def test_proxy_path_pattern_allows_the_schemas_names_only():
    pattern = re.compile(
        re.search(r'_PATH = re.compile\(r"(.+)"\)', PROXY.read_text()).group(1)  # the proxy's own pattern
    )
    assert pattern.match("/vllm/alpha/metrics") and pattern.match("/vllm/qwen3.5-9b_x/metrics")
    for bad in ("/vllm/../metrics", "/vllm/a/b/metrics", "/vllm/.hidden/metrics", "/vllm/a%2F../metrics"):
        assert not pattern.match(bad), bad


def test_every_observability_default_is_documented():
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(defaults) <= set(spec), f"undocumented: {set(defaults) - set(spec)}"
    assert set(spec) - set(defaults) == {"observability_address"}  # a host's own, no default


def test_bench_role_variables_are_documented():
    role = ROOT / "roles" / "bench"
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    assert set(defaults) == set(spec), set(defaults) ^ set(spec)
