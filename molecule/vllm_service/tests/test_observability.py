"""observability on the converged rig vs-rig, also the scenario's Prometheus host (group monitoring):
Prometheus (Debian's package) reaches node exporter and every vLLM instance through rigops-metrics-proxy,
the rules load, vLLM stays on loopback, and a hung engine takes its target down and turns its alert on.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest

testinfra_hosts = ["vs-rig"]
INSTANCES = {"alpha": (8001, "tiny-a"), "beta": (8002, "tiny-b")}
PROM = "http://127.0.0.1:9090"


def api(host, path):
    """Prometheus's HTTP API, asked on the host (it listens on 127.0.0.1 only)."""
    out = host.check_output(f"curl -sf --max-time 10 '{PROM}{path}'")
    data = json.loads(out)
    assert data["status"] == "success", data
    return data["data"]


def targets(host):
    return {
        (t["labels"]["job"], t["labels"].get("vllm_instance", "")): t
        for t in api(host, "/api/v1/targets")["activeTargets"]
    }


def wait_for(what, check, timeout=90, every=2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


def all_up(host):
    found = targets(host)
    wanted = {("prometheus", ""), ("node", ""), ("vllm", "alpha"), ("vllm", "beta")}
    if wanted <= set(found) and all(found[k]["health"] == "up" for k in wanted):
        return found
    return None


def test_packages_and_services(host):
    for pkg in ("prometheus", "prometheus-node-exporter"):
        assert host.package(pkg).is_installed, pkg
    for unit in ("prometheus", "prometheus-node-exporter", "rigops-metrics-proxy"):
        svc = host.service(unit)
        assert svc.is_running and svc.is_enabled, unit


def test_prometheus_on_loopback_exporters_on_the_network_vllm_on_loopback(host):
    lines = host.check_output("ss -Hltn").splitlines()

    def listening(port):
        return {ln.split()[3].rsplit(":", 1)[0] for ln in lines if ln.split()[3].endswith(f":{port}")}

    assert listening(9090) == {"127.0.0.1"}
    assert listening(9401) == {"0.0.0.0"}
    assert listening(9100) & {"*", "0.0.0.0", "[::]"}
    for port, _ in INSTANCES.values():
        assert listening(port) == {"127.0.0.1"}, port


def test_config_and_rules_files_checked_by_promtool(host):
    for path in ("/etc/prometheus/prometheus.yml", "/etc/prometheus/rules/rigops.rules.yml"):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o644), path
    res = host.run("promtool check config /etc/prometheus/prometheus.yml")
    assert res.rc == 0 and "SUCCESS: 12 rules found" in res.stdout + res.stderr, res.stdout + res.stderr
    proxy = json.loads(host.file("/etc/rigops/metrics-proxy.json").content_string)
    assert proxy["instances"] == {n: {"host": "127.0.0.1", "port": p} for n, (p, _) in INSTANCES.items()}
    assert proxy["gpu"] is False  # cpu flavour
    for name in INSTANCES:
        key = host.check_output(f"cat /etc/vllm/{name}/api_key").strip()
        for path in ("/etc/rigops/metrics-proxy.json", "/etc/prometheus/prometheus.yml"):
            assert key not in host.file(path).content_string


def test_prometheus_reaches_every_instance_and_node_exporter(host):
    found = wait_for("every target up", lambda: all_up(host))
    assert found[("node", "")]["scrapeUrl"] == "http://vs-rig:9100/metrics"
    for name, (_, served) in INSTANCES.items():
        t = found[("vllm", name)]
        assert t["scrapeUrl"] == f"http://vs-rig:9401/vllm/{name}/metrics"
        assert (t["labels"]["host"], t["labels"]["served_name"]) == ("vs-rig", served)
    # vLLM's own series, labelled with the instance
    result = api(host, "/api/v1/query?query=vllm:num_requests_running")["result"]
    got = {(r["metric"]["vllm_instance"], r["metric"]["model_name"]) for r in result}
    assert got == {(n, served) for n, (_, served) in INSTANCES.items()}
    healthy = api(host, "/api/v1/query?query=rigops_vllm_healthy")["result"]
    assert {r["metric"]["vllm_instance"]: r["value"][1] for r in healthy} == {"alpha": "1", "beta": "1"}
    node = api(host, "/api/v1/query?query=node_memory_MemTotal_bytes")["result"]
    assert node and node[0]["metric"]["host"] == "vs-rig"


def test_the_rules_are_loaded_and_quiet(host):
    groups = {g["name"]: g for g in api(host, "/api/v1/rules")["groups"]}
    assert set(groups) == {"rigops-vllm", "rigops-gpu", "rigops-gpu-health", "rigops-gateway"}
    rules = [r for g in groups.values() for r in g["rules"]]
    assert len(rules) == 12 and {r["health"] for r in rules} == {"ok"}, [r.get("lastError") for r in rules]
    wait_for("every target up", lambda: all_up(host))
    firing = [a["labels"]["alertname"] for a in api(host, "/api/v1/alerts")["alerts"]]
    assert firing == []


def test_the_proxy_serves_metrics_and_nothing_else(host):
    def status(path, method="GET"):
        return host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' -X {method} 'http://127.0.0.1:9401{path}'")

    assert status("/vllm/alpha/metrics") == "200"
    for path in ("/vllm/alpha/tokenize", "/vllm/alpha/v1/models", "/vllm/gamma/metrics", "/gpu/metrics", "/metrics"):
        assert status(path) == "404", path
    assert status("/vllm/alpha/metrics", method="POST") == "405"
    pid = host.check_output("systemctl show -p MainPID --value rigops-metrics-proxy")
    uid = re.search(r"^Uid:\s+(\d+)", host.file(f"/proc/{pid}/status").content_string, re.M).group(1)
    assert uid != "0", "the proxy runs as its own dynamic user"


def test_from_outside_the_rig_only_the_proxy_and_node_exporter_answer(host):
    """From the controller, at the rig's address on the sandbox network: vLLM's ports are closed."""
    address = host.check_output("hostname -I").split()[0]

    def get(port, path):
        try:
            with urllib.request.urlopen(f"http://{address}:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except OSError as exc:
            return None, str(exc)

    code, body = get(9401, "/vllm/alpha/metrics")
    assert code == 200, f"the proxy at {address}:9401 from the controller: {body}"
    assert 'model_name="tiny-a"' in body
    assert get(9100, "/metrics")[0] == 200
    for port, _ in INSTANCES.values():
        assert get(port, "/metrics")[0] is None, f"vLLM answers on {address}:{port}"
    assert get(9090, "/-/ready")[0] is None, "Prometheus is on loopback only"


def test_the_dashboard_is_next_to_prometheus(host):
    dash = json.loads(host.file("/usr/local/share/rigops/grafana/rigops-vllm.json").content_string)
    assert dash["uid"] == "rigops-vllm" and len(dash["panels"]) >= 10


@pytest.mark.changes_state
def test_a_hung_engine_takes_its_target_down_and_alerts(host):
    """beta's server is frozen (SIGSTOP): its /metrics stops answering, the target goes down and
    VllmEngineDown turns pending; thawed (SIGCONT), it comes back without a restart."""
    wait_for("every target up", lambda: all_up(host))
    pid = host.check_output("systemctl show -p MainPID --value vllm@beta")
    host.run_expect([0], f"kill -STOP {pid}")
    try:
        down = wait_for("beta down", lambda: targets(host)[("vllm", "beta")]["health"] == "down" or None, timeout=60)
        assert down
        alert = wait_for(
            "VllmEngineDown pending for beta",
            lambda: [
                a
                for a in api(host, "/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == "VllmEngineDown" and a["labels"]["vllm_instance"] == "beta"
            ],
            timeout=60,
        )
        assert alert[0]["state"] in ("pending", "firing") and alert[0]["labels"]["severity"] == "critical"
        assert targets(host)[("vllm", "alpha")]["health"] == "up"
    finally:
        host.run(f"kill -CONT {pid}")
    wait_for("beta up again", lambda: targets(host)[("vllm", "beta")]["health"] == "up" or None, timeout=60)
    assert host.check_output("systemctl show -p MainPID --value vllm@beta") == pid
    assert host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8002/health") == "200"
