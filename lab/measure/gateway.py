#!/usr/bin/env python3
"""What the LLM gateway adds (printed, never asserted): the same load direct and through the gateway.

    ./rigops measure gateway [--where sandbox|local] [--concurrency 1,8,32] [--seconds 8] [--stream]
                               [--upstream-ms MS] [--replicas N] [--policy POLICY] [--down] [--json]

An OpenAI-compatible stand-in upstream that answers at once (a chat completion, or a short stream
with --stream) isolates the gateway's own cost: vLLM's latency on the sandbox's CPU build is tens of
milliseconds with jitter larger than what is measured here. Against an upstream that answers at once,
the throughput ratio only restates the added latency; --upstream-ms 50 gives the stand-in a service
time like a short completion's, which is what the throughput goal is about. For each concurrency, closed-loop
clients (one keep-alive connection each) send chat completions for --seconds to the stand-in
directly (HTTP, with its key) and then through the gateway (HTTPS, a client key, routing by model,
the key swap, the access log). Printed per concurrency: median and p90 latency, requests per
second, and the ratios: added median latency (goal <= 1 ms) and throughput through the gateway
over direct (goal >= 0.95x).

- ``--replicas N`` (default 1): N stand-ins serve the name, each with its own key, so the gateway reaches them
  as a pool (plugins/filter/llm_gateway.py) of ``--policy`` (default session): what the pool's routing adds
  (the session key's hash, nginx's balancer, each replica's socket) is the figure against the direct path to
  the first stand-in.
- ``--where sandbox`` (default): a sandbox host of its own (bench-gw, profile nogpu, SSH port 2389)
  is the gateway and the "rig": the stand-in runs there as the instance `echo` (its key in
  /etc/vllm/echo/api_key), the gateway is deployed by playbooks/gateway.yml (the real role and
  stage), and the load runs in the same container. The host stays up unless --down.
- ``--where local``: on this machine (nginx and libnginx-mod-http-js installed): the role's preflight
  and configure render the config set into a temporary folder, nginx serves it on 127.0.0.1.

Load generator, stand-in and nginx share the machine's cores: on the 2-core sandbox the ratios
include that contention, as they would on a rig that also runs the gateway.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _sandbox as sb
import yaml

HOST = ("bench-gw", "nogpu", 2389)
CONTAINER = "rigops-bench-gw"
GOAL_MS, GOAL_RATIO = 1.0, 0.95
UPSTREAM_KEY = "bench-upstream-key-0123456789abcdef0123456789"
CLIENT_KEY = "bench-client-key-0123456789abcdef0123456789ab"
MODEL = "echo"

# The stand-in upstream: `python3 standin.py PORT KEY_FILE MS`. Answers /v1/models and
# /v1/chat/completions (stream or not) after MS milliseconds, with its key checked like vLLM does.
STANDIN = r"""
import json, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import time
PORT, KEY, DELAY = int(sys.argv[1]), open(sys.argv[2]).read().strip(), float(sys.argv[3]) / 1000
CHOICE = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
ANSWER = json.dumps({"object": "chat.completion", "model": "echo", "choices": [CHOICE]}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "echo", "object": "model"}]}).encode()
def chunk(t):
    event = {"model": "echo", "choices": [{"index": 0, "delta": {"content": t}}]}
    return ("data: " + json.dumps(event) + "\n\n").encode()
CHUNKS = [chunk("h"), chunk("i"), b"data: [DONE]\n\n"]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def setup(self):
        super().setup()  # headers and body go out in two writes: no Nagle wait between them
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def reply(self, status, body, ctype="application/json"):
        self.send_response(status); self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def ok(self):
        if self.headers.get("Authorization") == "Bearer " + KEY: return True
        self.reply(401, b'{"error": "Unauthorized"}'); return False
    def do_GET(self):
        if self.ok(): self.reply(200, MODELS)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.ok(): return
        if body.get("model") != "echo": return self.reply(404, b'{"error": {"message": "no such model"}}')
        if DELAY: time.sleep(DELAY)
        if not body.get("stream"): return self.reply(200, ANSWER)
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
        for c in CHUNKS: self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
        self.wfile.write(b"0\r\n\r\n")
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 256
ThreadingHTTPServer(("127.0.0.1", PORT), H).serve_forever()
"""

# The load: `python3 load.py SPEC_JSON`. Closed loop: each worker thread keeps one connection and
# sends the next request when the answer has been read; prints {label: {concurrency: figures}}.
LOAD = r"""
import http.client, json, ssl, sys, threading, time
spec = json.loads(sys.argv[1])
def conn(t):
    if t["tls"]:
        ctx = ssl.create_default_context(cafile=t["ca"])
        return http.client.HTTPSConnection("127.0.0.1", t["port"], context=ctx, timeout=30)
    return http.client.HTTPConnection("127.0.0.1", t["port"], timeout=30)
def run(t, c, seconds, stream):
    key = open(t["key_file"]).read().strip()
    body = json.dumps({"model": spec["model"], "max_tokens": 1, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    lat, errors, lock = [], [0], threading.Lock()
    stop = time.monotonic() + seconds
    def worker():
        h = conn(t)
        mine = []
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                h.request("POST", "/v1/chat/completions", body=body, headers=headers)
                r = r0 = h.getresponse(); data = r.read()
                ok = r.status == 200 and (b"[DONE]" in data if stream else b"choices" in data)
            except Exception:
                ok = False; h.close(); h = conn(t)
            if ok: mine.append(time.perf_counter() - t0)
            else:
                with lock: errors[0] += 1
        with lock: lat.extend(mine)
    threads = [threading.Thread(target=worker) for _ in range(c)]
    t0 = time.monotonic()
    for th in threads: th.start()
    for th in threads: th.join()
    wall = time.monotonic() - t0
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else None
    return {"requests": len(lat), "errors": errors[0], "rps": len(lat) / wall, "median_ms": q(0.5), "p90_ms": q(0.9)}
out = {}
for c in spec["concurrency"]:
    for t in spec["targets"]:
        run(t, c, min(1.0, spec["seconds"]), spec["stream"])  # warm-up: connections, caches
        out.setdefault(t["label"], {})[str(c)] = run(t, c, spec["seconds"], spec["stream"])
print(json.dumps(out))
"""


def ratios(results: dict) -> dict:
    """Per concurrency: added median latency (ms) and throughput through the gateway over direct."""
    out = {}
    for c, direct in results.get("direct", {}).items():
        via = results.get("gateway", {}).get(c)
        if not via or not direct["requests"] or not via["requests"]:
            continue
        out[c] = {
            "added_median_ms": round(via["median_ms"] - direct["median_ms"], 3),
            "throughput_ratio": round(via["rps"] / direct["rps"], 3) if direct["rps"] else None,
        }
    return out


def format_results(results: dict, where: str, stream: bool, upstream_ms: float = 0.0) -> str:
    answer = f"after {upstream_ms:g} ms" if upstream_ms else "at once"
    kind = "streamed" if stream else "plain"
    lines = [f"LLM gateway overhead ({where}; stand-in upstream answering {answer}; {kind} chat completions, "
             "max_tokens 1, one keep-alive connection per client)"]  # fmt: skip
    lines.append(f"  {'conc':>4}  {'path':<8} {'median ms':>10} {'p90 ms':>8} {'req/s':>9} {'errors':>7}")
    for c in results.get("direct", {}):
        for label in ("direct", "gateway"):
            r = results.get(label, {}).get(c)
            if r:
                med = "-" if r["median_ms"] is None else f"{r['median_ms']:.3f}"
                p90 = "-" if r["p90_ms"] is None else f"{r['p90_ms']:.3f}"
                lines.append(f"  {c:>4}  {label:<8} {med:>10} {p90:>8} {r['rps']:>9.1f} {r['errors']:>7}")
    for c, r in ratios(results).items():
        met = r["added_median_ms"] <= GOAL_MS and (r["throughput_ratio"] or 0) >= GOAL_RATIO
        lines.append(
            f"  concurrency {c}: +{r['added_median_ms']:.3f} ms median (goal <= {GOAL_MS} ms), throughput "
            f"{r['throughput_ratio']:.3f}x direct (goal >= {GOAL_RATIO}x): {'met' if met else 'missed'}"
        )
    return "\n".join(lines)


def spec(ports: dict, files: dict, args) -> dict:
    return {
        "model": MODEL,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "stream": args.stream,
        "targets": [
            {"label": "direct", "port": ports["upstream"], "tls": False, "key_file": files["upstream_key"]},
            {
                "label": "gateway",
                "port": ports["gateway"],
                "tls": True,
                "ca": files["ca"],
                "key_file": files["client_key"],
            },  # fmt: skip
        ],
    }


def gateway_vars(port: int, policy: str = "session") -> dict:
    return {
        "llm_gateway_port": port,
        "llm_gateway_default_policy": policy,
        "llm_gateway_clients": [
            {"name": "bench", "key": CLIENT_KEY, "models": "*", "rate": "100000r/s", "burst": 100000}
        ],  # fmt: skip
        "llm_gateway_aliases": {},
        "llm_gateway_remotes": [],
    }


def replicas(first_port: int, count: int) -> list[tuple[str, int, str]]:
    """(instance name, port, key) of each stand-in: `echo` alone, else echo-1 .. echo-N on consecutive ports."""
    if count == 1:
        return [("echo", first_port, UPSTREAM_KEY)]
    return [(f"echo-{i}", first_port + i - 1, f"{UPSTREAM_KEY}-{i}") for i in range(1, count + 1)]


def rig_vars(first_port: int, count: int = 1) -> dict:
    return {"vllm_instances": [{"name": name, "port": port, "model": {"source": "local", "path": "/srv/echo",
                                                                      "served_name": MODEL}}
                               for name, port, _key in replicas(first_port, count)]}  # fmt: skip


# --------------------------------------------------------------------------- on a sandbox host


def run_sandbox(args, workdir: Path) -> dict:
    details = sb.fleet_up([HOST])[0]
    ports = {"upstream": 18001, "gateway": 8443}
    podman = ["podman", "exec", "-i", details["container"]]  # -i: the files below go in through stdin
    stand_ins = replicas(ports["upstream"], args.replicas)
    sb.podman_exec(details["container"], "install", "-d", "-m", "0755", "/opt/bench",
                   *[f"/etc/vllm/{name}" for name, _port, _key in stand_ins], check=True)  # fmt: skip
    files = [(f"/etc/vllm/{name}/api_key", key + "\n", "600") for name, _port, key in stand_ins]
    files += [("/opt/bench/client_key", CLIENT_KEY + "\n", "600"),
              ("/opt/bench/standin.py", STANDIN, "644"), ("/opt/bench/load.py", LOAD, "644")]  # fmt: skip
    for name, text, mode in files:
        subprocess.run([*podman, "sh", "-c", f"cat > {name} && chmod {mode} {name}"], input=text, text=True,
                       check=True, env=sb.ENV)  # fmt: skip
    subprocess.run([*podman, "sh", "-c", "systemctl stop 'bench-echo*' 2>/dev/null; true"], check=False,
                   env=sb.ENV, capture_output=True)  # fmt: skip
    for name, port, _key in stand_ins:
        subprocess.run([*podman, "systemd-run", "--unit", f"bench-{name}", "python3", "/opt/bench/standin.py",
                        str(port), f"/etc/vllm/{name}/api_key", str(args.upstream_ms)],
                       check=True, env=sb.ENV, capture_output=True)  # fmt: skip
    host_vars = {**sb.ssh_vars(details), **rig_vars(ports["upstream"], args.replicas),
                 **gateway_vars(ports["gateway"], args.policy)}  # fmt: skip
    inventory = {"all": {"children": {"gateways": {"hosts": {HOST[0]: host_vars}},
                                      "gpu-rigs": {"hosts": {HOST[0]: {}}}}}}  # fmt: skip
    sb.write_json(workdir / "inventory.json", inventory)
    run = sb.run_playbook("playbooks/gateway.yml", [workdir / "inventory.json", sb.SANDBOX_GROUPS])
    if run.rc != 0:
        print(run.output[-4000:], file=sys.stderr)
        raise SystemExit("the gateway stage failed on bench-gw (see above)")
    files = {"upstream_key": f"/etc/vllm/{stand_ins[0][0]}/api_key", "client_key": "/opt/bench/client_key",
             "ca": "/etc/rigops-llm-gateway/tls/ca.pem"}  # fmt: skip
    out = subprocess.run([*podman, "python3", "/opt/bench/load.py", json.dumps(spec(ports, files, args))],
                         check=True, capture_output=True, text=True, env=sb.ENV)  # fmt: skip
    return json.loads(out.stdout)


# --------------------------------------------------------------------------- on this machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def run_local(args, workdir: Path) -> dict:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists() or not Path("/usr/lib/nginx/modules/ngx_http_js_module.so").exists():
        raise SystemExit("--where local needs nginx and its njs module: apt-get install nginx libnginx-mod-http-js")
    # the stand-ins on consecutive ports (replicas()), each checked free
    first = next(p for p in range(20000, 60000, 16) if all(port_free(p + i) for i in range(args.replicas)))
    ports = {"upstream": first, "gateway": free_port()}
    stand_ins = replicas(first, args.replicas)
    etc = workdir / "etc"
    for folder in ("etc/staging", "etc/tls", "log", "state", "state/replicas"):
        (workdir / folder).mkdir(parents=True, exist_ok=True)
    for name, _port, key in stand_ins:
        (workdir / f"{name}_key").write_text(key + "\n")
    (workdir / "client_key").write_text(CLIENT_KEY + "\n")
    (workdir / "standin.py").write_text(STANDIN)
    (workdir / "load.py").write_text(LOAD)
    upstreams = [subprocess.Popen([sys.executable, str(workdir / "standin.py"), str(port),
                                   str(workdir / f"{name}_key"), str(args.upstream_ms)])
                 for name, port, _key in stand_ins]  # fmt: skip
    gateway_host = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "llm_gateway_config_root": str(etc), "llm_gateway_log_dir": str(workdir / "log"),
        "llm_gateway_state_dir": str(workdir / "state"), "llm_gateway_pid_file": str(workdir / "nginx.pid"),
        "llm_gateway_tool_dir": str(sb.ROOT / "roles" / "llm_gateway" / "files"), "llm_gateway_nginx": nginx,
        # a temporary folder is root's alone: the workers reach the pool's replica sockets there
        "llm_gateway_worker_user": "root",
        "llm_gateway_listen": ["127.0.0.1"], "vllm_service_keys": {name: key for name, _port, key in stand_ins},
        **rig_vars(ports["upstream"], args.replicas), **gateway_vars(ports["gateway"], args.policy),
    }  # fmt: skip
    inventory = {"all": {"children": {"gateways": {"hosts": {"gw": gateway_host}}, "gpu-rigs": {"hosts": {"gw": {}}}}}}
    (workdir / "inventory.yml").write_text(yaml.safe_dump(inventory))
    play = [{"name": "llm_gateway preflight and configure", "hosts": "gateways", "gather_facts": False, "tasks": [
        {"name": "Preflight",
         "ansible.builtin.import_role": {"name": "rigops.fleet.llm_gateway", "tasks_from": "preflight"}},
        {"name": "Configure",
         "ansible.builtin.import_role": {"name": "rigops.fleet.llm_gateway", "tasks_from": "configure"}},
    ]}]  # fmt: skip
    (workdir / "play.yml").write_text(yaml.safe_dump(play))
    tool = sb.ROOT / "roles" / "llm_gateway" / "files" / "rigops-llm-gateway-config"
    conf = etc / "live" / "nginx.conf"
    try:
        run = sb.run_playbook(workdir / "play.yml", [workdir / "inventory.yml"])
        if run.rc != 0:
            print(run.output[-4000:], file=sys.stderr)
            raise SystemExit("rendering the gateway's config failed (see above)")
        subprocess.run([str(tool), "promote", str(etc)], check=True)
        subprocess.run([nginx, "-c", str(conf)], check=True)
        time.sleep(0.5)
        files = {"upstream_key": str(workdir / f"{stand_ins[0][0]}_key"), "client_key": str(workdir / "client_key"),
                 "ca": str(etc / "tls" / "ca.pem")}  # fmt: skip
        out = subprocess.run([sys.executable, str(workdir / "load.py"), json.dumps(spec(ports, files, args))],
                             check=True, capture_output=True, text=True)  # fmt: skip
        return json.loads(out.stdout)
    finally:
        subprocess.run([nginx, "-c", str(conf), "-s", "quit"], check=False, capture_output=True)
        for upstream in upstreams:
            upstream.terminate()
            upstream.wait(timeout=10)
        deadline = time.time() + 10
        while (workdir / "nginx.pid").exists() and time.time() < deadline:
            time.sleep(0.1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--where", choices=["sandbox", "local"], default="sandbox")
    parser.add_argument("--concurrency", default="1,8,32", help="concurrent clients (default 1,8,32)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of load per row (default 8)")
    parser.add_argument("--stream", action="store_true", help="streamed chat completions (server-sent events)")
    parser.add_argument(
        "--upstream-ms",
        type=float,
        default=0.0,
        help="the stand-in's service time per request (default 0: the gateway's own cost alone)",
    )
    parser.add_argument("--replicas", type=int, default=1, help="stand-ins serving the name: 2 or more, a pool")
    parser.add_argument("--policy", default="session", choices=["session", "least_busy", "round_robin", "failover"],
                        help="the pool's policy with --replicas 2 or more (default session)")  # fmt: skip
    parser.add_argument("--down", action="store_true", help="remove the sandbox host at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        args.concurrency = sb.parse_sizes(args.concurrency, 256)
    except ValueError as exc:
        parser.error(f"--concurrency {exc}")
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if not 1 <= args.replicas <= 16:
        parser.error("--replicas must be 1 to 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rigops-bench-gw-") as tmp:
        results = run_local(args, Path(tmp)) if args.where == "local" else run_sandbox(args, Path(tmp))
    if args.down and args.where == "sandbox":
        sb.fleet_down([HOST[0]])
    results["ratios"] = ratios(results)
    failed = [f"{label} at {c}" for label, rows in results.items() if label != "ratios"
              for c, row in rows.items() if not row["requests"]]  # fmt: skip
    if failed:
        print(f"no request succeeded: {', '.join(failed)}", file=sys.stderr)
    print(
        json.dumps(results, indent=2)
        if args.json
        else format_results(results, args.where, args.stream, args.upstream_ms)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
