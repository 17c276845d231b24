#!/usr/bin/env python3
"""Hub bytes and wall time of the model_weights role for 1, 2 and 4 hosts (printed, never asserted).

    ./rigops benchmark model_weights [--hosts 1,2,4] [--down] [--json]

For each fleet size, the real role stages the sharded tiny model (Hugging Face stand-in id
``Qwen/Qwen3.5-9B-Instruct``, revision ``main``) on every host twice:

- without fan-out: every host downloads from the hub itself (source ``huggingface``);
- with fan-out: source ``controller``: the first host downloads, the others get the
  files through the controller's cache (fetch + copy, verified on each host).

It prints the bytes the hub sent (from its request log: file downloads only) and the wall
time of the playbook. Hosts are sandbox containers of its own (``bench-mw1..4`` on SSH
ports 2355-2358, profile ``nogpu``, made with sandbox/fleet.py). Instead of the whole vLLM
runtime they get only the hub clients from the sandbox wheelhouse (installed once on the
controller with pip --target, copied in, run by the host's python through a wrapper).
The staged models live in ``/srv/rigops-bench/models``, removed before each run. The hub
stand-in is shared: another test downloading at the same time inflates the byte count.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import _sandbox as sb
from _sandbox import ENV, podman_exec

HUB = "http://127.0.0.1:18090"
BENCH_ROOT = "/srv/rigops-bench/models"
VENV = "/opt/rigops-bench/hubclients"
PORTS = [2355, 2356, 2357, 2358]
MODEL_ID = "Qwen/Qwen3.5-9B-Instruct"
PLAYBOOK = """---
- name: Benchmark | model_weights
  hosts: bench
  roles:
    - role: model_weights
"""


def hub_log() -> list[dict]:
    with urllib.request.urlopen(HUB + "/_admin/log", timeout=30) as resp:
        return json.loads(resp.read())


def hub_clients(workdir: Path) -> Path:
    """The hub clients (and their dependencies) installed once on the controller, from the wheelhouse."""
    target = workdir / "hubclients"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"--target={target}"]
    pip += ["--index-url=http://127.0.0.1:18070/simple", "modelscope==1.40.2", "huggingface_hub==2.4.0"]
    subprocess.run(pip, check=True, env=dict(ENV, PIP_CONFIG_FILE="/dev/null"))
    return target


def prepare_host(container: str, clients: Path) -> None:
    """The hub clients beside the host's own python (the image has no venv module), and the service group."""
    podman_exec(container, "sh", "-c", "getent group vllm || groupadd --system vllm", check=True)
    podman_exec(container, "rm", "-rf", VENV, check=True)
    podman_exec(container, "mkdir", "-p", f"{VENV}/bin", check=True)
    subprocess.run(["podman", "cp", str(clients), f"{container}:{VENV}/lib"], check=True, env=ENV)
    wrapper = f'#!/bin/sh\nPYTHONPATH={VENV}/lib exec /usr/bin/python3 "$@"\n'
    podman_exec(container, "sh", "-c", f"printf '{wrapper}' > {VENV}/bin/python && chmod 755 {VENV}/bin/python")
    podman_exec(container, f"{VENV}/bin/python", "-c", "import modelscope, huggingface_hub", check=True)


def inventory(hosts: list[dict], fanout: bool) -> str:
    model = {"id": MODEL_ID, "revision": "main"}
    model.update({"source": "controller", "hub": "huggingface"} if fanout else {"source": "huggingface"})
    return json.dumps(
        sb.inventory("bench", hosts, {"vllm_instances": [{"name": "bench", "port": 8000, "model": model}]})
    )


def run(workdir: Path, hosts: list[dict], fanout: bool) -> dict:
    (workdir / "inventory.json").write_text(inventory(hosts, fanout))
    cache = workdir / "controller-cache"
    for d in hosts:
        podman_exec(d["container"], "rm", "-rf", BENCH_ROOT)
    subprocess.run(["rm", "-rf", str(cache)], check=False)
    variables = {
        "model_weights_root": BENCH_ROOT,
        "model_weights_python": f"{VENV}/bin/python",
        "model_weights_controller_cache": str(cache),
        "model_weights_manifest": f"{BENCH_ROOT}/models.json",
    }
    start_log = len(hub_log())
    proc = sb.run_playbook(
        workdir / "bench.yml", [workdir / "inventory.json", sb.SANDBOX_GROUPS], "-e", json.dumps(variables)
    )
    entries = hub_log()[start_log:]
    files = [e for e in entries if e["method"] == "GET" and e["repo"] == MODEL_ID and e["file"]]
    if proc.rc != 0:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    return {
        "seconds": round(proc.seconds, 1),
        "rc": proc.rc,
        "hub_bytes": sum(e["bytes"] or 0 for e in files),
        "hub_file_gets": len(files),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="1,2,4", help="fleet sizes (default 1,2,4; at most 4)")
    parser.add_argument("--down", action="store_true", help="remove the benchmark hosts at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    if max(sizes) > len(PORTS):
        parser.error(f"at most {len(PORTS)} hosts")
    details = sb.fleet_up((f"bench-mw{i + 1}", "nogpu", PORTS[i]) for i in range(max(sizes)))
    results = []
    with tempfile.TemporaryDirectory(prefix="rigops-bench-mw-") as tmp:
        workdir = Path(tmp)
        clients = hub_clients(workdir)
        for d in details:
            prepare_host(d["container"], clients)
        (workdir / "bench.yml").write_text(PLAYBOOK)
        for n in sizes:
            for fanout in (False, True):
                r = run(workdir, details[:n], fanout)
                results.append({"hosts": n, "fanout": fanout, **r})
    for d in details:
        podman_exec(d["container"], "rm", "-rf", "/srv/rigops-bench")
    if args.down:
        sb.fleet_down(f"bench-mw{i + 1}" for i in range(max(sizes)))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"model_weights: {MODEL_ID}@main (sharded tiny model) staged on N sandbox hosts")
        print(f"  {'hosts':>5}  {'fan-out':>7}  {'hub bytes':>10}  {'file GETs':>9}  {'wall s':>7}  rc")
        for r in results:
            fan = "yes" if r["fanout"] else "no"
            row = f"  {r['hosts']:>5}  {fan:>7}  {r['hub_bytes']:>10}  {r['hub_file_gets']:>9}"
            print(f"{row}  {r['seconds']:>7.1f}  {r['rc']}")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
