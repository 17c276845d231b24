#!/usr/bin/env python3
"""Hub bytes and wall time of the model_weights role for 1, 2, 4 and 8 hosts (printed, never asserted).

    ./rigops benchmark model_weights [--hosts 1,2,4,8] [--down] [--json]

For each fleet size, the real role stages the sharded tiny model (Hugging Face stand-in id
``Qwen/Qwen3.5-9B-Instruct``, revision ``main``) on every host twice:

- without fan-out: every host downloads from the hub itself (source ``huggingface``);
- with fan-out: source ``controller``: the first host downloads, the others get the
  files through the controller's cache (fetch + copy, verified on each host);
- from the fleet cache: source ``fleet_cache``: a cache host (``bench-mwc``, SSH port 2369,
  the real fleet_cache role with nginx) filled once from the hub before the runs; every
  host pulls the files from it in parallel. Its hub bytes are the fill's, counted once.

It prints the bytes the hub sent (from its request log: file downloads only) and the wall
time of the playbook. Hosts are sandbox containers of its own (``bench-mw1..8`` on SSH
ports 2355-2358 and 2365-2368, profile ``nogpu``, made with sandbox/fleet.py). Instead of the whole vLLM
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
PORTS = [2355, 2356, 2357, 2358, 2365, 2366, 2367, 2368]
CACHE = ("bench-mwc", "nogpu", 2369)
CACHE_URL = "http://rigops-bench-mwc:8081"
PATHS = ("hub", "controller", "fleet_cache")
MODEL_ID = "Qwen/Qwen3.5-9B-Instruct"
PLAYBOOK = """---
- name: Benchmark | model_weights
  hosts: bench
  roles:
    - role: model_weights
"""
CACHE_PLAYBOOK = """---
- name: Benchmark | the fleet cache, filled once
  hosts: caches
  roles:
    - role: fleet_cache
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


def inventory(hosts: list[dict], path: str) -> str:
    model = {"id": MODEL_ID, "revision": "main"}
    model.update({"source": path, "hub": "huggingface"} if path != "hub" else {"source": "huggingface"})
    return json.dumps(
        sb.inventory("bench", hosts, {"vllm_instances": [{"name": "bench", "port": 8000, "model": model}]})
    )


def fill_cache(workdir: Path, cache: dict) -> dict:
    """The fleet cache with the benchmark's model, through the real role; the hub bytes of the fill."""
    variables = {
        "fleet_cache_clients": [],
        "fleet_cache_extra_models": [{"hub": "huggingface", "id": MODEL_ID, "revision": "main"}],
        "fleet_cache_wheelhouses": [],
    }
    (workdir / "cache.json").write_text(json.dumps(sb.inventory("caches", [cache])))
    (workdir / "cache.yml").write_text(CACHE_PLAYBOOK)
    podman_exec(cache["container"], "rm", "-rf", "/srv/rigops/cache/models")
    start_log = len(hub_log())
    proc = sb.run_playbook(
        workdir / "cache.yml", [workdir / "cache.json", sb.SANDBOX_GROUPS], "-e", json.dumps(variables)
    )
    if proc.rc != 0:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    files = [e for e in hub_log()[start_log:] if e["method"] == "GET" and e["repo"] == MODEL_ID and e["file"]]
    return {"seconds": round(proc.seconds, 1), "rc": proc.rc, "hub_bytes": sum(e["bytes"] or 0 for e in files)}


def run(workdir: Path, hosts: list[dict], path: str) -> dict:
    (workdir / "inventory.json").write_text(inventory(hosts, path))
    cache = workdir / "controller-cache"
    for d in hosts:
        podman_exec(d["container"], "rm", "-rf", BENCH_ROOT)
    subprocess.run(["rm", "-rf", str(cache)], check=False)
    variables = {
        "model_weights_root": BENCH_ROOT,
        "model_weights_python": f"{VENV}/bin/python",
        "model_weights_controller_cache": str(cache),
        "model_weights_manifest": f"{BENCH_ROOT}/models.json",
        "model_weights_fleet_cache_url": CACHE_URL,
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
    parser.add_argument("--hosts", default="1,2,4,8", help=f"fleet sizes (default 1,2,4,8; at most {len(PORTS)})")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"paths to measure (default {','.join(PATHS)})")
    parser.add_argument("--down", action="store_true", help="remove the benchmark hosts at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    try:
        sizes = sb.parse_sizes(args.hosts, len(PORTS))
    except ValueError as exc:
        parser.error(f"--hosts: {exc}")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths: a comma-separated subset of {','.join(PATHS)}")
    hosts = [(f"bench-mw{i + 1}", "nogpu", PORTS[i]) for i in range(max(sizes))]
    details = sb.fleet_up(hosts + ([CACHE] if "fleet_cache" in paths else []))
    cache, details = (details[-1], details[:-1]) if "fleet_cache" in paths else (None, details)
    results, fill = [], None
    with tempfile.TemporaryDirectory(prefix="rigops-bench-mw-") as tmp:
        workdir = Path(tmp)
        clients = hub_clients(workdir)
        for d in details:
            prepare_host(d["container"], clients)
        (workdir / "bench.yml").write_text(PLAYBOOK)
        if cache:
            fill = fill_cache(workdir, cache)
        for n in sizes:
            for path in paths:
                r = run(workdir, details[:n], path)
                results.append({"hosts": n, "path": path, **r})
    for d in details:
        podman_exec(d["container"], "rm", "-rf", "/srv/rigops-bench")
    if args.down:
        sb.fleet_down([h[0] for h in hosts] + ([CACHE[0]] if cache else []))
    one = {r["path"]: r["seconds"] for r in results if r["hosts"] == 1}
    for r in results:
        r["vs_one_host"] = round(r["seconds"] / one[r["path"]], 2) if one.get(r["path"]) else None
    if args.json:
        print(json.dumps({"cache_fill": fill, "runs": results}, indent=2))
    else:
        print(f"model_weights: {MODEL_ID}@main (sharded tiny model) staged on N sandbox hosts")
        if fill:
            took = f"{fill['seconds']:.1f} s, rc {fill['rc']}"
            print(f"  fleet cache filled once from the hub: {fill['hub_bytes']} hub bytes, {took}")
        print(f"  {'hosts':>5}  {'path':>11}  {'hub bytes':>10}  {'file GETs':>9}  {'wall s':>7}  {'vs 1 host':>9}  rc")
        for r in results:
            row = f"  {r['hosts']:>5}  {r['path']:>11}  {r['hub_bytes']:>10}  {r['hub_file_gets']:>9}"
            ratio = f"{r['vs_one_host']:.2f}x" if r["vs_one_host"] else "-"
            print(f"{row}  {r['seconds']:>7.1f}  {ratio:>9}  {r['rc']}")
    return 0 if all(r["rc"] == 0 for r in results) and (fill is None or fill["rc"] == 0) else 1


if __name__ == "__main__":
    sys.exit(main())
