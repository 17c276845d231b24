#!/usr/bin/env python3
"""Model distribution over shaped links: cache-only against peer-assisted (printed, never asserted).

    ./rigops measure model_peers [--hosts 1,2,4,8] [--rate 100mbit] [--model-mb 384] [--batches 1,3,4]
                                 [--down] [--json]

A site whose cache has the same link as its hosts, scaled down to what this machine moves: every link
(the hosts', the fleet cache's, the hub's) shaped to ``--rate`` (the cache's and the hub's may differ:
``--cache-rate``, ``--hub-rate``) with Linux tc (lab/sandbox/links.py: HTB on both ends of each
container's veth), and a model of ``--model-mb`` MiB (random bytes in 8 files and a
config.json, put into the cache's store and listing by this script), so that a pull is bound by the links,
not by the CPU. For each fleet size the real model_weights role stages it on every host twice:

- cache-only: every host pulls every file from the fleet cache (source ``fleet_cache``), all at once;
- peers: ``model_weights_peers: true`` and the hosts in batches (``--batches``, a rollout's serial list,
  cut to the fleet size): the hosts of a batch pull from the cache and from the hosts of the batches
  before, which serve their verified copies (rigops-model-peer); the peers stop after the last batch.

It prints each run's wall time, the bytes the cache sent (its nginx log) and the peers sent (the
difference to N copies, checked against the peers' own logs), the hub's file downloads during the run
(none: the listing and the files come from the cache and the peers), and peers against cache-only.
Goal (issue 34): 8 hosts peer-assisted at most 0.6x cache-only.

Hosts: the model_weights benchmark's (``bench-mw1..8``, cache ``bench-mwc``); the staged models live in
``/srv/rigops-bench/models``, removed before each run; the shaping is cleared at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import _sandbox as sb
import model_weights as mwb
from _sandbox import podman_exec

sys.path.insert(0, str(sb.ROOT / "lab" / "sandbox"))
import links  # noqa: E402 (lab/sandbox is not a package)

MODEL_ID = "Bench/Shaped"
COMMIT = hashlib.sha1(b"rigops model_peers benchmark").hexdigest()  # noqa: S324 (a commit id's shape, no security)
STORE = "/srv/rigops/cache/models"
FOLDER = f"{STORE}/huggingface/{MODEL_ID}/{COMMIT}"
INDEX = f"{STORE}/index.json"
NGINX_LOG = "/var/log/nginx/rigops-fleet-cache.log"
FILES = 8
PEER_GOAL = 0.6  # 8 hosts peer-assisted against cache-only
PLAYBOOK = """---
- name: Benchmark | model_weights, {label}
  hosts: bench
  serial: {serial}
  gather_subset: ["!all", systemd]  # as the main job and the rollout gather
  roles:
    - role: rigops.fleet.model_weights

- name: Benchmark | the peers stop
  hosts: bench
  gather_facts: false
  tasks:
    - name: Benchmark | Stop serving
      ansible.builtin.include_role:
        name: rigops.fleet.model_weights
        tasks_from: peers_stop
      when: model_weights_peers | bool
"""


def put_model(cache: dict, megabytes: int) -> int:
    """The benchmark's model in the cache's store and listing (replacing an earlier one); its size in bytes."""
    container = cache["container"]
    each = (megabytes << 20) // FILES
    script = (
        f"rm -rf {FOLDER} && mkdir -p {FOLDER} && cd {FOLDER} && "
        f'echo \'{{"model_type": "bench"}}\' > config.json && '
        f"for i in $(seq 1 {FILES}); do head -c {each} /dev/urandom > weights-0000$i.bin; done && "
        f"chmod -R a+rX {STORE}/huggingface/Bench"
    )
    podman_exec(container, "sh", "-c", script, check=True)
    sums = podman_exec(container, "sh", "-c", f"cd {FOLDER} && sha256sum *", check=True).split()
    sizes = podman_exec(container, "sh", "-c", f"cd {FOLDER} && stat -c '%n %s' *", check=True).split()
    sha = dict(zip(sums[1::2], sums[0::2], strict=True))
    pairs = sorted(zip(sizes[0::2], sizes[1::2], strict=True))
    files = [{"path": p, "size": int(n), "sha256": sha[p]} for p, n in pairs]
    index = json.loads(podman_exec(container, "cat", f"{STORE}/index.json", check=True))
    index["models"] = [m for m in index["models"] if m.get("id") != MODEL_ID]
    index["models"].append({"hub": "huggingface", "id": MODEL_ID, "revision": "main", "commit": COMMIT, "files": files})
    subprocess.run(
        ["podman", "exec", "-i", container, "sh", "-c", f"cat > {STORE}/new.json && mv {STORE}/new.json {INDEX}"],
        input=json.dumps(index), text=True, check=True, env=sb.ENV,
    )  # fmt: skip
    return sum(f["size"] for f in files)


def cache_bytes(cache: dict, skip: int) -> tuple[int, int]:
    """(bytes the cache sent for the benchmark's model since line ``skip`` of its log, lines now)."""
    lines = podman_exec(cache["container"], "cat", NGINX_LOG).splitlines()
    sent = 0
    for line in lines[skip:]:
        parts = line.split('"')
        if len(parts) > 2 and f"/models/huggingface/{MODEL_ID}/" in parts[1]:
            sent += int(parts[2].split()[1])
    return sent, len(lines)


def batches(text: str, hosts: int) -> list[int]:
    """The serial list cut to ``hosts`` (the last batch takes what is left)."""
    out, left = [], hosts
    for n in [int(x) for x in text.split(",") if x.strip()]:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    if left > 0:
        out.append(left)
    return out


def run(workdir: Path, hosts: list[dict], cache: dict, serial: list[int] | int, peers: bool) -> dict:
    (workdir / "inventory.json").write_text(
        json.dumps(
            sb.inventory(
                "bench",
                hosts,
                {"vllm_instances": [{"name": "bench", "port": 8000,
                                     "model": {"source": "fleet_cache", "hub": "huggingface", "id": MODEL_ID,
                                               "revision": "main"}}]},
            )
        )
    )  # fmt: skip
    label = "peer-assisted" if peers else "cache-only"
    (workdir / "bench.yml").write_text(PLAYBOOK.format(label=label, serial=json.dumps(serial)))
    for d in hosts:
        podman_exec(d["container"], "rm", "-rf", mwb.BENCH_ROOT)
    variables = {
        "model_weights_root": mwb.BENCH_ROOT,
        "model_weights_python": f"{mwb.VENV}/bin/python",
        "model_weights_manifest": f"{mwb.BENCH_ROOT}/models.json",
        "model_weights_fleet_cache_url": mwb.CACHE_URL,
        "model_weights_peers": peers,
        "model_weights_peer_address": "rigops-{{ inventory_hostname }}",
        "model_weights_api_timeout": 120,
    }
    _, skip = cache_bytes(cache, 0)
    hub_before = len(mwb.hub_log())
    proc = sb.run_playbook(
        workdir / "bench.yml", [workdir / "inventory.json", sb.SANDBOX_GROUPS], "-e", json.dumps(variables)
    )
    sent, _ = cache_bytes(cache, skip)
    hub_files = [e for e in mwb.hub_log()[hub_before:] if e["method"] == "GET" and e["file"]]
    if proc.rc != 0:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
    return {"seconds": round(proc.seconds, 1), "rc": proc.rc, "cache_bytes": sent, "hub_file_gets": len(hub_files)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="1,2,4,8", help=f"fleet sizes (default 1,2,4,8; at most {len(mwb.PORTS)})")
    parser.add_argument("--rate", default="100mbit", help="the hosts' links, tc's units (default 100mbit)")
    parser.add_argument("--cache-rate", help="the fleet cache's link (default: --rate)")
    parser.add_argument("--hub-rate", help="the hub stand-in's link (default: --rate)")
    parser.add_argument("--model-mb", type=int, default=384, help="the model's size in MiB (default 384)")
    parser.add_argument("--batches", default="1,3,4", help="the peer-assisted runs' serial list (default 1,3,4)")
    parser.add_argument("--down", action="store_true", help="remove the benchmark hosts at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    try:
        sizes = sb.parse_sizes(args.hosts, len(mwb.PORTS))
    except ValueError as exc:
        parser.error(f"--hosts: {exc}")
    args.cache_rate, args.hub_rate = args.cache_rate or args.rate, args.hub_rate or args.rate
    for option, rate in (("--rate", args.rate), ("--cache-rate", args.cache_rate), ("--hub-rate", args.hub_rate)):
        if not links.RATE_RE.match(rate):
            parser.error(f"{option}: a number with bit, kbit, mbit or gbit, got {rate!r}")
    hosts = [(f"bench-mw{i + 1}", "nogpu", mwb.PORTS[i]) for i in range(max(sizes))]
    details = sb.fleet_up([*hosts, mwb.CACHE])
    cache, details = details[-1], details[:-1]
    rates = {d["container"]: args.rate for d in details}
    rates.update({cache["container"]: args.cache_rate, mwb.HUB_CONTAINER: args.hub_rate})
    results = []
    with tempfile.TemporaryDirectory(prefix="rigops-bench-mp-") as tmp:
        workdir = Path(tmp)
        clients = mwb.hub_clients(workdir)
        for d in details:
            mwb.prepare_host(d["container"], clients)
        fill = mwb.fill_cache(workdir, cache)  # nginx, the token-less store and its listing, through the role
        size = put_model(cache, args.model_mb)
        try:
            for name, rate in rates.items():
                links.shape(name, rate)
            for n in sizes:
                for peers in (False, True):
                    serial = batches(args.batches, n) if peers else n
                    r = run(workdir, details[:n], cache, serial, peers)
                    results.append({"hosts": n, "mode": "peers" if peers else "cache", "batches": serial, **r})
        finally:
            for name in rates:
                links.clear(name)
            podman_exec(cache["container"], "rm", "-rf", f"{STORE}/huggingface/Bench")
    for d in details:
        podman_exec(d["container"], "rm", "-rf", "/srv/rigops-bench")
    if args.down:
        sb.fleet_down([h[0] for h in hosts] + [mwb.CACHE[0]])
    cache_only = {r["hosts"]: r["seconds"] for r in results if r["mode"] == "cache"}
    for r in results:
        r["model_bytes"] = size
        r["peer_bytes"] = r["hosts"] * size - r["cache_bytes"]
        r["vs_cache_only"] = round(r["seconds"] / cache_only[r["hosts"]], 2)
    if args.json:
        shaped = {"hosts": args.rate, "cache": args.cache_rate, "hub": args.hub_rate}
        print(json.dumps({"rates": shaped, "model_bytes": size, "fill_rc": fill["rc"], "runs": results}, indent=2))
    else:
        print(
            f"model_peers: a {size / 2**20:.0f} MiB model, every link {args.rate} (tc HTB), staged on N sandbox hosts"
        )
        print(f"  {'hosts':>5}  {'mode':>5}  {'batches':>9}  {'wall s':>7}  {'cache MiB':>9}  {'peer MiB':>8}"
              f"  {'hub GETs':>8}  {'vs cache':>8}  rc")  # fmt: skip
        for r in results:
            b = ",".join(map(str, r["batches"])) if isinstance(r["batches"], list) else "all"
            print(
                f"  {r['hosts']:>5}  {r['mode']:>5}  {b:>9}  {r['seconds']:>7.1f}  {r['cache_bytes'] / 2**20:>9.0f}"
                f"  {r['peer_bytes'] / 2**20:>8.0f}  {r['hub_file_gets']:>8}  {r['vs_cache_only']:>7.2f}x  {r['rc']}"
            )
        for r in results:
            if r["mode"] == "peers" and r["hosts"] == 8:
                verdict = "met" if r["vs_cache_only"] <= PEER_GOAL else "missed"
                print(
                    f"  8 hosts peer-assisted: {r['vs_cache_only']:.2f}x cache-only (goal <= {PEER_GOAL}x: {verdict})"
                )
        print("  (cache MiB: what the cache's nginx sent; peer MiB: the rest of N copies; hub GETs: file downloads"
              " the hub served during the run)")  # fmt: skip
    return 0 if all(r["rc"] == 0 for r in results) and fill["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
