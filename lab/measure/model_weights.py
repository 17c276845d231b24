#!/usr/bin/env python3
"""Hub bytes and wall time of the model_weights role for 1, 2, 4 and 8 hosts (printed, never asserted).

    ./rigops measure model_weights [--hosts 1,2,4,8] [--paths ...] [--mitogen] [--down] [--json]

For each fleet size, the real role stages the sharded tiny model (Hugging Face stand-in id
``Qwen/Qwen3.5-9B-Instruct``, revision ``main``) on every host twice:

- without fan-out: every host downloads from the hub itself (source ``huggingface``);
- with fan-out: source ``controller``: the first host downloads, the others get the
  files through the controller's cache (fetch + copy, verified on each host);
- from the fleet cache: source ``fleet_cache``: a cache host (``bench-mwc``, SSH port 2369,
  the real fleet_cache role with nginx) filled once from the hub before the runs; every
  host pulls the files from it in parallel. Its hub bytes are the fill's, counted once.

It prints the bytes the hub sent (from its request log: file downloads only), the wall
time of the playbook against one host's, and the CPU the run took on this machine (the
controller's, and the hosts', the hub stand-in's and the cache's containers') with the floor it
sets: that CPU spread over the machine's cores, against one host's wall time, is the least the
ratio can be here (and never under 1x). The ratio over that floor is what carries to a machine with more
cores: the goal for the fleet_cache path is 8 hosts within 1.15x it, over SSH and under mitogen.
With ``--mitogen`` each path runs once more under mitogen's strategy (strategy_plugins/), the
caller's strategy settings dropped for the SSH runs; its ratios are against one host's run
under mitogen.

With the fleet_cache path it then measures what one host's pull from the cache can carry
(``--pull-mb``, default 512; 0 skips it): a file of that size, random bytes, on the cache
host's store, pulled by the role's own code on the hosts (``model_staging.cache_pull``, then the
sha256 check ``model_weights.verify_files`` runs, both run by the host's python from a copy of
Ansible's module_utils and the project's), first by one host, then by N at once for each fleet
size. Its figure for one host is ``cache_pull`` in docs/measurements.yml: the code's rate on
this machine's CPU over the podman network, where cache and hosts share 2 cores, not a LAN's.

Hosts are sandbox containers of its own (``bench-mw1..8`` on SSH ports 2355-2358 and
2365-2368, profile ``nogpu``, made with lab/sandbox/fleet.py). Instead of the whole vLLM runtime
they get only the hub clients from the sandbox wheelhouse (installed once on the
controller with pip --target, copied in, run by the host's python through a wrapper).
The staged models live in ``/srv/rigops-bench/models``, removed before each run. The hub
stand-in is shared: another test downloading at the same time inflates the byte count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _sandbox as sb
import ansible.module_utils
from _sandbox import ENV, podman_exec

HUB = "http://127.0.0.1:18090"
BENCH_ROOT = "/srv/rigops-bench/models"
VENV = "/opt/rigops-bench/hubclients"
PORTS = [2355, 2356, 2357, 2358, 2365, 2366, 2367, 2368]
CACHE = ("bench-mwc", "nogpu", 2369)
CACHE_URL = "http://rigops-bench-mwc:8081"
PULL_DIR = "/opt/rigops-bench/pull"  # on the hosts: Ansible's module_utils and the collection's
PULL_STORE = "/srv/rigops/cache/models/_bench"  # on the cache host, served under /models/_bench/
PULL_SCRIPT = """
import json, os, sys, time
from ansible_collections.rigops.fleet.plugins.module_utils.model_weights import cache_pull
from ansible_collections.rigops.fleet.plugins.module_utils.model_weights_plan import verify_files
url, size, sha256, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
start = time.time()
why = cache_pull(url, os.path.join(folder, "pull.bin"), size, {}, 120)
pulled = time.time()
check = verify_files(folder, [{"path": "pull.bin", "size": size, "sha256": sha256}], full=True)
done = time.time()
print(json.dumps({"error": why, "ok": check["ok"], "start": start, "pulled": pulled, "done": done}))
"""
PATHS = ("hub", "controller", "fleet_cache")
FLOOR_GOAL = 1.15  # 8 hosts of the fleet_cache path against one, over the floor
MODEL_ID = "Qwen/Qwen3.5-9B-Instruct"
PLAYBOOK = """---
- name: Benchmark | model_weights
  hosts: bench
  roles:
    - role: rigops.fleet.model_weights
"""
CACHE_PLAYBOOK = """---
- name: Benchmark | the fleet cache, filled once
  hosts: caches
  roles:
    - role: rigops.fleet.fleet_cache
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


def prepare_pull(containers: list[str]) -> None:
    """The pull code on each host: Ansible's module_utils (open_url) and the collection's, as a module gets them."""
    ansible_utils = Path(ansible.module_utils.__file__).parent
    ours = "ansible_collections/rigops/fleet/plugins/module_utils"
    for container in containers:
        podman_exec(container, "rm", "-rf", PULL_DIR, check=True)
        podman_exec(container, "mkdir", "-p", f"{PULL_DIR}/ansible", f"{PULL_DIR}/{ours}", check=True)
        podman_exec(container, "touch", f"{PULL_DIR}/ansible/__init__.py", check=True)
        subprocess.run(
            ["podman", "cp", str(ansible_utils), f"{container}:{PULL_DIR}/ansible/module_utils"], check=True, env=ENV
        )
        # the whole folder: the pull's modules import others of it, as a module's payload carries them
        source = sb.ROOT / "plugins" / "module_utils"
        subprocess.run(["podman", "cp", f"{source}/.", f"{container}:{PULL_DIR}/{ours}"], check=True, env=ENV)


def pull_once(container: str, size: int, sha256: str) -> dict:
    folder = "/srv/rigops-bench/pull"
    podman_exec(container, "rm", "-rf", folder)
    out = podman_exec(
        container, "env", f"PYTHONPATH={PULL_DIR}", "python3", "-c", PULL_SCRIPT,
        f"{CACHE_URL}/models/_bench/pull.bin", str(size), sha256, folder, check=True,
    )  # fmt: skip
    podman_exec(container, "rm", "-rf", folder)
    r = json.loads(out)
    if r["error"] or not r["ok"]:
        raise RuntimeError(f"{container}: the pull failed: {r}")
    return r


def measure_pull(cache: dict, hosts: list[dict], sizes: list[int], megabytes: int) -> dict:
    """One host's pull from the cache, then N hosts' at once: seconds and Gbit/s per host and in all."""
    size = megabytes << 20
    podman_exec(cache["container"], "mkdir", "-p", PULL_STORE, check=True)
    podman_exec(cache["container"], "sh", "-c", f"head -c {size} /dev/urandom > {PULL_STORE}/pull.bin", check=True)
    podman_exec(cache["container"], "chmod", "-R", "a+rX", PULL_STORE, check=True)
    sha256 = podman_exec(cache["container"], "sha256sum", f"{PULL_STORE}/pull.bin", check=True).split()[0]
    prepare_pull([h["container"] for h in hosts[: max(sizes)]])
    rows = []
    try:
        for n in sizes:
            with ThreadPoolExecutor(max_workers=n) as pool:
                each = list(pool.map(lambda h: pull_once(h["container"], size, sha256), hosts[:n]))
            rows.append(pull_row(size, each))
    finally:
        podman_exec(cache["container"], "rm", "-rf", PULL_STORE)
    return {"megabytes": megabytes, "rows": rows}


def pull_row(size: int, each: list[dict]) -> dict:
    """The figures of N hosts' pulls of ``size`` bytes at once, from each host's own clock (start, pulled,
    done: seconds since the epoch; the hosts share the machine's clock): a host's rate is its bytes
    over its own pull + sha256 time, all hosts' is their bytes from the first start to the last end
    (Gbit/s, 10^9 bits); podman exec's own start-up is outside both."""
    per_host = [size * 8 / (r["done"] - r["start"]) / 1e9 for r in each]
    wall = max(r["done"] for r in each) - min(r["start"] for r in each)
    return {
        "hosts": len(each),
        "wall_s": round(wall, 2),
        "pull_s": round(max(r["pulled"] - r["start"] for r in each), 2),
        "verify_s": round(max(r["done"] - r["pulled"] for r in each), 2),
        "host_gbps_min": round(min(per_host), 2),
        "host_gbps_max": round(max(per_host), 2),
        "all_gbps": round(len(each) * size * 8 / wall / 1e9, 2),
    }


def format_runs(results: list[dict], cores: int) -> list[str]:
    lines = [
        f"  {'hosts':>5}  {'path':>19}  {'hub bytes':>10}  {'file GETs':>9}  {'wall s':>7}  {'vs 1 host':>9}"
        f"  {'CPU s':>6}  {'floor':>6}  {'over floor':>10}  rc"
    ]
    for r in results:
        path = r["path"] + (" mitogen" if r["connection"] == "mitogen" else "")
        row = f"  {r['hosts']:>5}  {path:>19}  {r['hub_bytes']:>10}  {r['hub_file_gets']:>9}"
        ratio = f"{r['vs_one_host']:.2f}x" if r["vs_one_host"] else "-"
        cpu = "?" if r.get("cpu_seconds") is None else f"{r['cpu_seconds']:.1f}"
        floor = f"{r['floor']:.2f}x" if r.get("floor") is not None else "-"
        over = f"{r['over_floor']:.2f}x" if r.get("over_floor") is not None else "-"
        lines.append(f"{row}  {r['seconds']:>7.1f}  {ratio:>9}  {cpu:>6}  {floor:>6}  {over:>10}  {r['rc']}")
    lines.append(
        f"  (CPU s: the controller's and the containers' the run used; floor: that CPU over this machine's {cores}"
        " cores, against one host's wall time: the least 'vs 1 host' can be here, the hosts sharing its cores;"
        " over floor: 'vs 1 host' over the floor, at least 1x;"
        f" goal for 8 hosts of fleet_cache, either connection: <= {FLOOR_GOAL}x)"
    )
    return lines


def format_pull(pull: dict) -> list[str]:
    lines = [
        f"  cache pull: a {pull['megabytes']} MiB file from the fleet cache's nginx, by model_staging.cache_pull"
        " then model_weights' sha256 check, on N hosts at once",
        f"  {'hosts':>5}  {'wall s':>7}  {'pull s':>7}  {'sha256 s':>8}  {'Gbit/s per host':>15}"
        f"  {'Gbit/s in all':>13}",
    ]
    for r in pull["rows"]:
        spread = f"{r['host_gbps_min']:.2f}-{r['host_gbps_max']:.2f}" if r["hosts"] > 1 else f"{r['host_gbps_min']:.2f}"
        lines.append(
            f"  {r['hosts']:>5}  {r['wall_s']:>7.2f}  {r['pull_s']:>7.2f}  {r['verify_s']:>8.2f}  {spread:>15}"
            f"  {r['all_gbps']:>13.2f}"
        )
    lines.append(
        "  (wall s: first start to last end on the hosts' clock; pull s, sha256 s: the slowest host's;"
        " per host: its bytes over its own pull + sha256 time)"
    )
    return lines


HUB_CONTAINER = "rigops-hub"


def run(workdir: Path, hosts: list[dict], path: str, fleet_cache: dict | None, connection: str) -> dict:
    """One run of the role on ``hosts`` over ``path`` (``connection``: "ssh" or "mitogen", the
    strategy it runs under): wall time, hub bytes, and the CPU it took on
    this machine: the controller's (ansible-playbook and its forks) and the containers' it used
    (the hosts, the hub stand-in, the fleet cache on its path)."""
    (workdir / "inventory.json").write_text(inventory(hosts, path))
    containers = [h["container"] for h in hosts] + [HUB_CONTAINER]
    if path == "fleet_cache" and fleet_cache:
        containers.append(fleet_cache["container"])
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
    before = sb.hosts_cpu_seconds(containers)
    proc = sb.run_playbook(
        workdir / "bench.yml",
        [workdir / "inventory.json", sb.SANDBOX_GROUPS],
        "-e",
        json.dumps(variables),
        env=sb.connection_env(connection),
    )
    after = sb.hosts_cpu_seconds(containers)
    entries = hub_log()[start_log:]
    files = [e for e in entries if e["method"] == "GET" and e["repo"] == MODEL_ID and e["file"]]
    if proc.rc != 0:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    return {
        "seconds": round(proc.seconds, 1),
        "rc": proc.rc,
        "hub_bytes": sum(e["bytes"] or 0 for e in files),
        "hub_file_gets": len(files),
        "cpu_seconds": None if before is None or after is None else round(proc.cpu_seconds + after - before, 1),
    }


def add_ratios(results: list[dict], cores: int) -> None:
    """Each run against one host's run of the same path and connection (``vs_one_host``), and the least that ratio can
    be on this machine (``floor``): the run's CPU spread over its ``cores``, which the sandbox hosts
    share with the controller, over one host's wall time."""
    one = {(r["path"], r["connection"]): r["seconds"] for r in results if r["hosts"] == 1}
    for r in results:
        base = one.get((r["path"], r["connection"]))
        r["vs_one_host"] = round(r["seconds"] / base, 2) if base else None
        r["floor"] = sb.cpu_floor(r["cpu_seconds"], cores, base) if base and r.get("cpu_seconds") is not None else None
        r["over_floor"] = round(r["vs_one_host"] / max(r["floor"], 1.0), 2) if r["floor"] is not None else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="1,2,4,8", help=f"fleet sizes (default 1,2,4,8; at most {len(PORTS)})")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"paths to measure (default {','.join(PATHS)})")
    parser.add_argument(
        "--pull-mb", type=int, default=512, help="size of the file of the cache pull measurement (default 512; 0: skip)"
    )
    parser.add_argument("--mitogen", action="store_true", help="each path once more, under mitogen's strategy")
    parser.add_argument("--down", action="store_true", help="remove the benchmark hosts at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    try:
        sizes = sb.parse_sizes(args.hosts, len(PORTS))
    except ValueError as exc:
        parser.error(f"--hosts: {exc}")
    if args.pull_mb < 0:
        parser.error("--pull-mb: a size in MiB, 0 to skip")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths: a comma-separated subset of {','.join(PATHS)}")
    hosts = [(f"bench-mw{i + 1}", "nogpu", PORTS[i]) for i in range(max(sizes))]
    details = sb.fleet_up(hosts + ([CACHE] if "fleet_cache" in paths else []))
    cache, details = (details[-1], details[:-1]) if "fleet_cache" in paths else (None, details)
    results, fill, pull = [], None, None
    with tempfile.TemporaryDirectory(prefix="rigops-bench-mw-") as tmp:
        workdir = Path(tmp)
        clients = hub_clients(workdir)
        for d in details:
            prepare_host(d["container"], clients)
        (workdir / "bench.yml").write_text(PLAYBOOK)
        if cache:
            fill = fill_cache(workdir, cache)
        connections = ("ssh", "mitogen") if args.mitogen else ("ssh",)
        for n in sizes:
            for connection in connections:
                for path in paths:
                    r = run(workdir, details[:n], path, cache, connection)
                    results.append({"hosts": n, "path": path, "connection": connection, **r})
        if cache and args.pull_mb:
            try:
                pull = measure_pull(cache, details, sizes, args.pull_mb)
            except (RuntimeError, subprocess.CalledProcessError) as exc:  # the runs' figures still print
                pull = {"megabytes": args.pull_mb, "rows": [], "error": str(exc)[-2000:]}
    for d in details:
        podman_exec(d["container"], "rm", "-rf", "/srv/rigops-bench", PULL_DIR)
    if args.down:
        sb.fleet_down([h[0] for h in hosts] + ([CACHE[0]] if cache else []))
    add_ratios(results, os.cpu_count() or 1)
    if args.json:
        print(json.dumps({"cache_fill": fill, "runs": results, "cache_pull": pull}, indent=2))
    else:
        print(f"model_weights: {MODEL_ID}@main (sharded tiny model) staged on N sandbox hosts")
        if fill:
            took = f"{fill['seconds']:.1f} s, rc {fill['rc']}"
            print(f"  fleet cache filled once from the hub: {fill['hub_bytes']} hub bytes, {took}")
        print("\n".join(format_runs(results, os.cpu_count() or 1)))
        if pull:
            print("\n".join(format_pull(pull)))
    if pull and pull.get("error"):
        print(f"cache pull: failed: {pull['error']}", file=sys.stderr)
    ok = all(r["rc"] == 0 for r in results) and (fill is None or fill["rc"] == 0)
    return 0 if ok and not (pull and pull.get("error")) else 1


if __name__ == "__main__":
    sys.exit(main())
