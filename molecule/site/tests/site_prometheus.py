"""A real Prometheus, on the controller, reading the site rig's GPU health sentinel: the distribution's own
server (the prometheus package ./rigops extracts into its cache for promtool: RIGOPS_PROMTOOL), the alert rules
and the scrape config rendered by the observability role's template and filter, evaluated every second.

The site rig runs no node exporter (the observability stage is not part of site.yml), so the job `node` of that
config scrapes a relay on the controller that serves what the test last copied from the rig's textfile
collector file, the file node exporter would serve from: `feed(host)` copies it, `alerts()` is Prometheus' own
answer. What is checked is the rule as shipped, on the sentinel's metrics as they are during the fault."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.filter import observability

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "observability"
TEXTFILE = "/var/lib/prometheus/node-exporter/rigops_gpu_health.prom"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, workdir: Path):
        self.dir = workdir
        self.metrics = workdir / "node.prom"
        self.metrics.write_text("")
        self.port = _free_port()

    def feed(self, host):
        """Serve, from now on, the rig's textfile collector file as it is now."""
        self.metrics.write_text(host.file(TEXTFILE).content_string)

    def alerts(self, name: str) -> list[dict]:
        """The firing alerts called `name`, as Prometheus' HTTP API lists them."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/alerts", timeout=5) as resp:
            found = json.load(resp)["data"]["alerts"]
        return [a for a in found if a["labels"]["alertname"] == name and a["state"] == "firing"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.load(resp)["data"]["result"]

    def until(self, name: str, done, timeout: float = 20) -> list[dict]:
        t0 = time.monotonic()
        while True:
            found = self.alerts(name)
            if done(found) or time.monotonic() - t0 > timeout:
                return found
            time.sleep(0.5)


def _relay(path: Path) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    promtool = os.environ.get("RIGOPS_PROMTOOL")
    if not promtool:
        pytest.fail("RIGOPS_PROMTOOL is not set: ./rigops test extracts the prometheus package and sets it")
    server_bin = Path(promtool).with_name("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    prom = Prometheus(work)
    relay = _relay(prom.metrics)
    rules = work / "rigops.rules.yml"
    # the role's template, rendered by Ansible with the role's defaults (the thresholds a site gets)
    render = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-c", "local", "-i", "localhost,",
         "-m", "ansible.builtin.template", "-e", f"ansible_python_interpreter={sys.executable}",
         "-e", f"@{ROLE / 'defaults' / 'main.yml'}",
         "-a", f"src={ROLE / 'templates/etc/prometheus/rules/rigops.rules.yml.j2'} dest={rules}"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert render.returncode == 0, render.stdout + render.stderr
    target = observability.target({"address": "127.0.0.1", "instances": [], "gpu_metrics": False}, "site-rig")
    config = observability.prometheus_config(
        [target],
        {"listen": f"127.0.0.1:{prom.port}", "scrape_interval": "1s", "evaluation_interval": "1s",
         "rule_files": [str(rules)], "alertmanagers": [], "node_port": relay.server_address[1],
         "proxy_port": 9401, "dcgm_port": 9400, "gateway_targets": []},
    )  # fmt: skip
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen(
        [str(server_bin), f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom.port}"],
        stdout=subprocess.DEVNULL, stderr=open(work / "prometheus.log", "w"),  # noqa: SIM115 (the server's log)
    )  # fmt: skip
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{prom.port}/-/ready", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not start: " + (work / "prometheus.log").read_text()[-2000:])
        # its discovery hands the targets to the scrapers a few seconds after the start
        for _ in range(60):
            if [r["value"][1] for r in prom.query('up{job="node"}')] == ["1"]:
                break
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never scraped the relay: " + (work / "prometheus.log").read_text()[-2000:])
        yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        relay.shutdown()
