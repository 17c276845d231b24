#!/usr/bin/env python3
"""What a client of the gateway sees of a maintenance (printed, never asserted).

    ./rigops measure maintain [--change driver|reboot|none] [--keep] [--json]

Two sandbox rigs (bench-mt-1 and bench-mt-2, 8x RTX 5090 profile, from the `runtime` stage
snapshot, SSH ports 2421-2422) serve the same model (the sandbox rig's instance `chat`) behind a
gateway on a host of its own (bench-mt-gw, no GPU, port 2423): a name served by two rigs is a pool
of two replicas (policy session), and a rig drained for its maintenance leaves it. The main job
(site.yml) runs on the three of them with the driver branch 590 (not timed). Then, with a
closed-loop client at concurrency 4 sending chat completions through the gateway for the whole
time (from the gateway host itself: the load and nginx share its container, as in
`./rigops measure gateway`):

- `./rigops maintain --change driver -e nvidia_driver_branch=595` on both rigs, one after the other
  (the branch change loads a new module: each rig reboots);
- a planted Xid 79 on GPU 0 of bench-mt-1 (`nvidia-sim-fault`), timed until the gateway's health
  feed drains the instance (the sentinel's and the feed's default intervals), then cleared and
  acknowledged.

Printed: requests sent and failed during the maintenance (the goal: 0), their p50 and p99 latency
before and during the maintenance, the maintenance's wall time and each rig's seconds per step, and
the seconds from the planted fault to the drain (the goal: within 60 s). The hosts are removed at
the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _sandbox as sb
import yaml

RIGS = [("bench-mt-1", "rtx5090x8", 2421), ("bench-mt-2", "rtx5090x8", 2422)]
GATEWAY = ("bench-mt-gw", "nogpu", 2423)  # 2421-2423: no scenario, inventory, test or other benchmark uses them
NAMES = [r[0] for r in RIGS] + [GATEWAY[0]]
CLIENT_KEY = "bench-maintain-client-key-0123456789abcdef0123"
SERVED = "qwen3.5-9b"
CONCURRENCY = 4
LOG = "/var/log/rigops-bench-maintain.jsonl"
CA = "/etc/rigops-llm-gateway/tls/ca.pem"
DRAINED = "/var/lib/rigops-llm-gateway/health/drained.json"

# Closed-loop clients through the gateway: `python3 loop.py KEY_FILE CONCURRENCY LOG`, one JSON line per answer
# ({"t": end time, "s": seconds, "code": HTTP status or 0 for no answer, and for no answer "err": the exception and
# "reused": whether the connection had carried an answer before}) until the file LOG.stop exists. No retry: a
# request without an answer is counted failed, where the SDKs would retry it (the OpenAI SDK twice, by default).
LOOP = r"""
import http.client, json, os, ssl, sys, threading, time
KEY = open(sys.argv[1]).read().strip(); N = int(sys.argv[2]); LOG = sys.argv[3]
CTX = ssl.create_default_context(cafile="/etc/rigops-llm-gateway/tls/ca.pem"); CTX.check_hostname = False
BODY = json.dumps({"model": "qwen3.5-9b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
HEAD = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
lock = threading.Lock(); out = open(LOG, "a", buffering=1)
def client():
    conn = None; used = False
    while not os.path.exists(LOG + ".stop"):
        t0 = time.time(); code = 0; line = {}
        try:
            if conn is None:
                conn = http.client.HTTPSConnection("127.0.0.1", 8443, context=CTX, timeout=120); used = False
            conn.request("POST", "/v1/chat/completions", BODY, HEAD)
            resp = conn.getresponse(); resp.read(); code = resp.status; used = True
        except Exception as e:
            line = {"err": repr(e)[:200], "reused": used}; conn = None
        with lock:
            out.write(json.dumps({"t": time.time(), "s": round(time.time() - t0, 4), "code": code, **line}) + "\n")
threads = [threading.Thread(target=client) for _ in range(N)]
[t.start() for t in threads]; [t.join() for t in threads]
"""


def inventory(rigs: list[dict], gateway: dict) -> dict:
    # binding every address of the rig (a gateway on a host of its own, as the demo fleet's: the sandbox network
    # reaches the rig's container by name: inventories/sandbox/group_vars/gateways/llm_gateway.yml)
    served = yaml.safe_load((sb.ROOT / "inventories/sandbox/host_vars/rig-5090/vllm_instances.yml").read_text())
    return {
        "gpu-rigs": {
            "hosts": {h["instance"]: sb.ssh_vars(h) for h in rigs},
            "vars": {
                "gpu_topology_expected_gpus": 8,
                "nvidia_driver_branch": "590",
                "vllm_service_allow_remote_bind": True,
                **served,
            },  # fmt: skip
        },
        "gateways": {
            "hosts": {gateway["instance"]: sb.ssh_vars(gateway)},
            # a closed loop asks as fast as answers come: above the default client rate (10r/s) it would
            # measure the gateway's 429s
            "vars": {"llm_gateway_clients": [{"name": "bench", "key": CLIENT_KEY, "models": "*", "rate": "1000r/s"}]},
        },
    }


CONTAINERS: dict[str, str] = {}  # host -> its container (fleet.py up's details)


def on_gateway(*argv: str, check: bool = True) -> str:
    return sb.podman_exec(CONTAINERS[GATEWAY[0]], *argv, check=check)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000, 1)


def window(lines: list[dict], start: float, end: float) -> dict:
    chosen = [x for x in lines if start <= x["t"] <= end]
    ok = [x["s"] for x in chosen if x["code"] == 200]
    return {
        "requests": len(chosen),
        "failed": sum(1 for x in chosen if x["code"] != 200),
        "codes": {str(c): sum(1 for x in chosen if x["code"] == c) for c in sorted({x["code"] for x in chosen})},
        "p50_ms": percentile(ok, 0.5),
        "p99_ms": percentile(ok, 0.99),
        "median_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
        # each failure: seconds after the window's start, the answer's code, and for no answer the exception
        "failures": [
            {"at_s": round(x["t"] - start, 1), "code": x["code"], "err": x.get("err"), "reused": x.get("reused")}
            for x in chosen
            if x["code"] != 200
        ],
    }


def fault_to_drain(rig: str) -> float | None:
    """Seconds from an Xid 79 planted on GPU 0 of ``rig`` to its instance drained at the gateway."""
    container = CONTAINERS[rig]
    status = json.loads(sb.podman_exec(container, "/usr/local/lib/rigops-gpu-health/rigops-gpu-health", "status"))
    (bus,) = [g["bus_id"] for g in status["gpus"] if g["index"] == 0]
    sb.podman_exec(container, "nvidia-sim-fault", "set", bus, "xid79", check=True)
    start, seconds = time.monotonic(), None
    try:
        while time.monotonic() - start < 180:
            doc = json.loads(on_gateway("cat", DRAINED, check=False) or "{}")
            if f"{rig}/chat" in doc.get("drained", []):
                seconds = round(time.monotonic() - start, 1)
                break
            time.sleep(0.5)
    finally:
        sb.podman_exec(container, "nvidia-sim-fault", "clear", bus, check=False)
        sb.podman_exec(container, "/usr/local/lib/rigops-gpu-health/rigops-gpu-health", "ack", bus, check=False)
    return seconds


def measure(change: str, workdir: Path) -> dict:
    sb.fleet_down(NAMES)
    rigs = json.loads(sb.fleet("up", "--json", *[f"--host={n}:{p}:{port}:runtime" for n, p, port in RIGS]))
    (gateway,) = sb.fleet_up([GATEWAY])
    CONTAINERS.update({h["instance"]: h["container"] for h in [*rigs, gateway]})
    inventories = [sb.write_json(workdir / "inventory.json", inventory(rigs, gateway)), sb.SANDBOX_GROUPS]
    # the rigs come from the runtime stage snapshot (driver 595): going to 590 loads another module, a reboot
    setup = {"rigops_report_dir": str(workdir / "reports"), "nvidia_driver_reboot_allowed": True}
    site = sb.run_playbook("site.yml", inventories, "-e", json.dumps(setup))
    if site.rc != 0:
        print("\n".join(x for x in site.output.splitlines() if "msg:" in x or "fatal:" in x), file=sys.stderr)
        print(site.output[-4000:], file=sys.stderr)
        raise SystemExit("the main job failed on the benchmark's hosts; see above")
    # the key through stdin into a root-only file: no command line carries it
    subprocess.run(["podman", "exec", "-i", CONTAINERS[GATEWAY[0]], "sh", "-c", "umask 077; cat > /root/bench-key"],
                   input=CLIENT_KEY, text=True, check=True, env=sb.ENV)  # fmt: skip
    on_gateway("rm", "-f", LOG, f"{LOG}.stop")
    on_gateway("sh", "-c", f"cat > /root/loop.py <<'EOF'\n{LOOP}\nEOF")
    on_gateway("systemd-run", "--unit", "rigops-bench-maintain", "/usr/bin/python3", "/root/loop.py",
               "/root/bench-key", str(CONCURRENCY), LOG, check=True)  # fmt: skip
    time.sleep(20)  # "before": the rigs serving, the loop warmed up
    begin = time.time()
    cmd = [sys.executable, str(sb.ROOT / "commands" / "maintain.py"), "--plain", "--change", change]
    for inv in inventories:
        cmd += ["-i", str(inv)]
    # The bench before and after the change shares two cores with the client loop and the other rig taking the
    # drained rig's traffic: its throughput moves by 10 % between two runs of the same rig, so the comparison
    # (maintain_bench_tolerance, 10 % by default) would stop the job on noise. Half the default prompts, a 50 %
    # tolerance: the step runs as a site's would, and what is measured here is what the clients see.
    extra = {"maintain_bench_prompts": 8, "maintain_bench_tolerance": 0.5}
    if change == "driver":
        extra["nvidia_driver_branch"] = "595"
    cmd += ["-e", json.dumps(extra)]
    cmd += ["--report-dir", str(workdir / "maintain")]
    proc = subprocess.run(cmd, cwd=sb.ROOT, env=sb.ENV, capture_output=True, text=True, check=False)
    end = time.time()
    time.sleep(5)
    drain_seconds = fault_to_drain(RIGS[0][0]) if proc.returncode == 0 else None
    on_gateway("touch", f"{LOG}.stop")
    time.sleep(3)
    lines = [json.loads(x) for x in on_gateway("cat", LOG).splitlines() if x.strip()]
    reports = sorted((workdir / "maintain").glob("*/report.json"))
    if not reports:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
        raise SystemExit("the maintenance wrote no report")
    report = json.loads(reports[-1].read_text())
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
    first = min(x["t"] for x in lines)
    return {
        "change": change,
        "concurrency": CONCURRENCY,
        "maintenance": {
            "exit_code": proc.returncode,
            "wall_seconds": report["wall_seconds"],
            "hosts": {
                h["host"]: {
                    "status": h["status"],
                    "steps": h["stage_seconds"],
                    "rebooted": h["rebooted"],
                    "driver": [h["before"].get("driver"), h["after"].get("driver")],
                }
                for h in report["hosts"]
            },
        },  # fmt: skip
        "before": window(lines, first, begin),
        "during": window(lines, begin, end),
        "fault_to_drain_seconds": drain_seconds,
    }


def format_figures(f: dict) -> str:
    m = f["maintenance"]
    lines = [
        f"maintenance ({f['change']}) of {len(m['hosts'])} rigs under a client loop at concurrency {f['concurrency']}: "
        f"exit {m['exit_code']}, wall {m['wall_seconds']:.1f}s"
    ]
    for host, h in m["hosts"].items():
        steps = ", ".join(f"{k} {v:.1f}s" for k, v in h["steps"].items()) or "-"
        lines.append(f"  {host}: {h['status']}, driver {h['driver'][0]} -> {h['driver'][1]}, "
                     f"rebooted {'yes' if h['rebooted'] else 'no'}; {steps}")  # fmt: skip
    for name in ("before", "during"):
        w = f[name]
        lines.append(
            f"  {name:<7} {w['requests']:>6} requests, {w['failed']} failed (goal 0 during), "
            f"p50 {w['p50_ms']} ms, p99 {w['p99_ms']} ms; answers {w['codes']}"
        )
    for x in f["during"]["failures"]:
        lines.append(f"  failed at {x['at_s']}s into the maintenance: code {x['code']} {x['err'] or ''}"
                     f"{' (on a reused connection)' if x['reused'] else ''}")  # fmt: skip
    lines.append(f"  planted Xid 79 -> drained at the gateway: {f['fault_to_drain_seconds']} s (goal: within 60 s)")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--change", choices=["driver", "reboot", "none"], default="driver")
    parser.add_argument("--keep", action="store_true", help="leave the hosts up at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
            result = measure(args.change, Path(tmp))
    finally:
        if not args.keep:
            sb.fleet_down(NAMES)
    print(json.dumps(result, indent=2) if args.json else format_figures(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
