#!/usr/bin/env python3
"""How a pool's policy spreads a multi-turn trace, and what it does to vLLM's prefix cache (printed, never asserted).

    ./rigops measure pools [--sessions 8] [--turns 12] [--policies session,round_robin,failover] [--keep] [--json]

One sandbox rig (bench-pl, 8x RTX 5090 profile, from the `runtime` stage snapshot, SSH port 2431) serves the
tiny model twice under one name (instances `a` on GPUs 0-1 and `b` on GPUs 2-3, both `qwen3.5-9b`): a pool of two
replicas behind the gateway on the same host (the main job, site.yml, not timed). For each policy, the gateway
stage again with it as llm_gateway_default_policy (playbooks/gateway.yml, not timed), then a trace from the rig
itself through the gateway (HTTPS, a client key, streamed answers): --sessions conversations at once, each
--turns turns of a growing conversation (a shared system prompt of a coding agent's kind, the conversation's own
first message, then each answer and a tool's output of a few hundred words), one after the other within a
conversation. A short trace first warms both replicas up (not counted). Each policy's
conversations start with their own first messages: no conversation's prefix is in a cache from an earlier policy,
the shared system prompt is (as it would be on a fleet serving many clients).

Printed per policy, from vLLM's own counters (`/metrics` of each replica, before and after the trace): the prefix
cache's hit rate (hits over queries, in tokens, summed over the replicas; the goal with `session`: at least 0.85),
the requests each replica finished (the goal: both serve), and from the trace: time to first token p50 and p90
(the first streamed token), output tokens per second over the trace's wall time, failed requests. What the
routing adds to a request against plain forwarding is `./rigops measure gateway --replicas 2`'s figure.
The host is removed at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _sandbox as sb

HOST = ("bench-pl", "rtx5090x8", 2431)  # 2431: no scenario, inventory, test or other benchmark uses it
CLIENT_KEY = "bench-pools-client-key-0123456789abcdef01234567"
SERVED = "qwen3.5-9b"
REPLICAS = {"a": (8000, [0, 1]), "b": (8001, [2, 3])}
POLICIES = ("session", "least_busy", "round_robin", "failover")
LOG = "/var/log/rigops-bench-pools.jsonl"

# The trace, run on the rig: `python3 trace.py KEY_FILE SESSIONS TURNS SALT LOG`. One thread per conversation;
# each turn a streamed chat completion (usage in the last chunk), then the answer and a new question appended.
# One JSON line per request: conversation, turn, HTTP status, time to the first content chunk, total time,
# completion tokens.
TRACE = r"""
import http.client, json, ssl, sys, threading, time
KEY = open(sys.argv[1]).read().strip(); N, T, SALT, LOG = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
CTX = ssl.create_default_context(cafile="/etc/rigops-llm-gateway/tls/ca.pem"); CTX.check_hostname = False
HEAD = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
WORDS = ("build test deploy rollback gateway replica cache prefix token driver kernel module "
         "service socket request answer stream budget report").split()
def text(seed, n):
    return " ".join(WORDS[(seed * 7 + i * 3) % len(WORDS)] for i in range(n))
SYSTEM = "You are a coding agent. Tools and rules: " + text(1, 500)
lock = threading.Lock(); out = open(LOG, "a", buffering=1)
def conversation(i):
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Task %s-%d: %s" % (SALT, i, text(i + 11, 200))}]
    conn = http.client.HTTPSConnection("127.0.0.1", 8443, context=CTX, timeout=300)
    for turn in range(T):
        body = json.dumps({"model": "qwen3.5-9b", "messages": messages, "max_tokens": 16, "stream": True,
                           "stream_options": {"include_usage": True}})
        t0 = time.time(); first = None; answer = ""; tokens = 0; code = 0
        try:
            conn.request("POST", "/v1/chat/completions", body, HEAD)
            resp = conn.getresponse(); code = resp.status
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if first is None:  # the first token's chunk (the tiny model's text may be empty)
                        first = time.time() - t0
                    answer += (choice.get("delta") or {}).get("content") or ""
                tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
        except Exception:  # no answer: counted failed (code 0), and a new connection for the next turn
            conn = http.client.HTTPSConnection("127.0.0.1", 8443, context=CTX, timeout=300)
        with lock:
            out.write(json.dumps({"session": i, "turn": turn, "code": code, "ttft": first,
                                  "seconds": time.time() - t0, "tokens": tokens}) + "\n")
        # the answer, then what a tool gave back: a conversation grows by a few hundred words a turn
        messages += [{"role": "assistant", "content": answer or "ok"},
                     {"role": "user", "content": "Tool output %d: %s" % (turn, text(i + turn, 300))}]
threads = [threading.Thread(target=conversation, args=(i,)) for i in range(N)]
[t.start() for t in threads]; [t.join() for t in threads]
"""


def inventory(rig: dict) -> dict:
    instances = [
        {
            "name": name,
            "port": port,
            "gpus": gpus,
            "model": {
                "source": "modelscope",
                "id": "Qwen/Qwen3.5-9B",
                "revision": "master",
                "served_name": SERVED,
                "max_model_len": 16384,
            },
            "engine": {"tensor_parallel_size": 1},
        }  # fmt: skip
        for name, (port, gpus) in REPLICAS.items()
    ]
    return {
        "gpu-rigs": {
            "hosts": {rig["instance"]: sb.ssh_vars(rig)},
            # 16384 positions: longer than the tiny model's config says (sandbox_long_context allows it)
            "vars": {"gpu_topology_expected_gpus": 8, "sandbox_long_context": True, "vllm_instances": instances},
        },
        "gateways": {
            "hosts": {rig["instance"]: {}},
            # the trace's conversations ask as fast as answers come: above the default client rate (10r/s)
            "vars": {"llm_gateway_clients": [{"name": "bench", "key": CLIENT_KEY, "models": "*", "rate": "1000r/s"}]},
        },
    }


def metrics(container: str) -> dict[str, dict[str, float]]:
    """Per replica, the counters read: prefix cache queries and hits (tokens), requests finished."""
    wanted = {
        "queries": "vllm:prefix_cache_queries_total",
        "hits": "vllm:prefix_cache_hits_total",
        "requests": "vllm:request_success_total",
    }
    out = {}
    for name, (port, _gpus) in REPLICAS.items():
        text = sb.podman_exec(container, "curl", "-sf", f"http://127.0.0.1:{port}/metrics", check=True)
        out[name] = {
            key: sum(float(v) for v in re.findall(rf"^{re.escape(metric)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))
            for key, metric in wanted.items()
        }
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000, 1)


def one_policy(container: str, inventories: list, policy: str, sessions: int, turns: int) -> dict:
    policy_var = json.dumps({"llm_gateway_default_policy": policy})
    run = sb.run_playbook("playbooks/gateway.yml", inventories, "-e", policy_var)
    if run.rc != 0:
        print(run.output[-4000:], file=sys.stderr)
        raise SystemExit(f"the gateway stage with policy {policy} failed; see above")
    before = metrics(container)
    sb.podman_exec(container, "rm", "-f", LOG)
    start = time.monotonic()
    sb.podman_exec(container, "python3", "/root/trace.py", "/root/bench-key", str(sessions), str(turns), policy, LOG,
                   check=True)  # fmt: skip
    wall = time.monotonic() - start
    after = metrics(container)
    lines = [json.loads(x) for x in sb.podman_exec(container, "cat", LOG, check=True).splitlines() if x.strip()]
    delta = {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in REPLICAS}
    queries = sum(d["queries"] for d in delta.values())
    ok = [x for x in lines if x["code"] == 200]
    ttft = [x["ttft"] for x in ok if x["ttft"] is not None]
    return {
        "policy": policy,
        "requests": len(lines),
        "failed": len(lines) - len(ok),
        "hit_rate": round(sum(d["hits"] for d in delta.values()) / queries, 3) if queries else None,
        "prompt_tokens_queried": int(queries),
        "per_replica": {n: int(d["requests"]) for n, d in delta.items()},
        "ttft_p50_ms": percentile(ttft, 0.5),
        "ttft_p90_ms": percentile(ttft, 0.9),
        "output_tokens_per_s": round(sum(x["tokens"] for x in ok) / wall, 1),
        "wall_s": round(wall, 1),
    }


def measure(policies: list[str], sessions: int, turns: int, workdir: Path) -> dict:
    sb.fleet_down([HOST[0]])
    (rig,) = json.loads(sb.fleet("up", "--json", f"--host={HOST[0]}:{HOST[1]}:{HOST[2]}:runtime"))
    container = rig["container"]
    inventories = [sb.write_json(workdir / "inventory.json", inventory(rig)), sb.SANDBOX_GROUPS]
    site = sb.run_playbook("site.yml", inventories, "-e", json.dumps({"rigops_report_dir": str(workdir / "reports")}))
    if site.rc != 0:
        print("\n".join(x for x in site.output.splitlines() if "msg:" in x or "fatal:" in x), file=sys.stderr)
        print(site.output[-4000:], file=sys.stderr)
        raise SystemExit("the main job failed on the benchmark's host; see above")
    # the key through stdin into a root-only file: no command line carries it
    subprocess.run(["podman", "exec", "-i", container, "sh", "-c", "umask 077; cat > /root/bench-key"],
                   input=CLIENT_KEY, text=True, check=True, env=sb.ENV)  # fmt: skip
    sb.podman_exec(container, "sh", "-c", f"cat > /root/trace.py <<'EOF'\n{TRACE}\nEOF", check=True)
    # both replicas warmed up (the first requests of a fresh engine are slow), by a trace of their own
    sb.podman_exec(container, "python3", "/root/trace.py", "/root/bench-key", "4", "2", "warm-up", LOG, check=True)
    results = [one_policy(container, inventories, policy, sessions, turns) for policy in policies]
    return {"date": time.strftime("%Y-%m-%d"), "sessions": sessions, "turns": turns, "policies": results}


def format_figures(f: dict) -> str:
    lines = [
        f"a pool of 2 replicas ({', '.join(REPLICAS)}) of the tiny model behind the gateway; {f['sessions']} "
        f"conversations of {f['turns']} turns each, at once, per policy",
        f"  {'policy':<12} {'hit rate':>8} {'per replica':>14} {'ttft p50':>9} {'ttft p90':>9} {'out tok/s':>9} "
        f"{'failed':>6} {'wall':>7}",
    ]
    for p in f["policies"]:
        spread = "/".join(str(p["per_replica"][n]) for n in REPLICAS)
        lines.append(
            f"  {p['policy']:<12} {p['hit_rate']!s:>8} {spread:>14} {p['ttft_p50_ms']!s:>7}ms "
            f"{p['ttft_p90_ms']!s:>7}ms {p['output_tokens_per_s']:>9} {p['failed']:>6} {p['wall_s']:>6}s"
        )
    lines.append("  goals: session's hit rate at least 0.85, with both replicas serving")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=8, help="conversations at once (default 8)")
    parser.add_argument("--turns", type=int, default=12, help="turns of each conversation (default 12)")
    parser.add_argument("--policies", default="session,round_robin,failover",
                        help=f"comma-separated, of {', '.join(POLICIES)}")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="leave the host up at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    args.policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown or not args.policies:
        parser.error(f"--policies: {', '.join(unknown) or 'none given'}; allowed: {', '.join(POLICIES)}")
    if args.sessions < 1 or args.turns < 1:
        parser.error("--sessions and --turns must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
            result = measure(args.policies, args.sessions, args.turns, Path(tmp))
    finally:
        if not args.keep:
            sb.fleet_down([HOST[0]])
    print(json.dumps(result, indent=2) if args.json else format_figures(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
