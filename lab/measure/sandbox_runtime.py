#!/usr/bin/env python3
"""Numbers for the sandbox runtime (printed, never asserted).

    python3 lab/measure/sandbox_runtime.py [--cold] [--no-vllm] [--json]

- wheelhouse build time, warm (cache hit) and cold (``--cold``: a fresh build into a
  temporary folder; pip's own HTTP cache still applies; without ``--cold`` the cold time
  recorded when the cached wheelhouse was built is shown)
- venv install time from the wheelhouse (``--cold``: a fresh install; otherwise the time
  recorded in the cached venv's stamp)
- vLLM (CPU) time-to-ready on the tiny model (127.0.0.1, API key, ``--enforce-eager``),
  its RSS with the engine process, first chat completion latency, its CPU while idle, and stop
  time after SIGTERM; once with the kernel's timer slack (50 us) and once with the slack of
  ``--timer-slack-ns`` (what ``vllm_service_timer_slack_nsec`` gives the units: an idle CPU
  engine holds threads that wake every 10 ms, gloo's, and a coarser slack lets them sleep longer)

Caches: ``$RIGOPS_CACHE`` (default ``~/.cache/rigops``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab" / "sandbox" / "wheelhouse"))

import build as wheelhouse_build  # noqa: E402
import mkvenv  # noqa: E402


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    res = fn(*a, **kw)
    return res, time.monotonic() - t0


def rss_kib(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ticks(pid: int) -> int:
    """utime + stime of the process group's processes (all their threads), in clock ticks."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pid:  # field 5, pgrp (the server leads its own session and group)
            total += int(fields[11]) + int(fields[12])
    return total


def set_timer_slack(ns: int) -> None:
    """prctl(PR_SET_TIMERSLACK) in the child before exec: what systemd's TimerSlackNSec= does; threads
    and children inherit it."""
    if ns and ctypes.CDLL(None, use_errno=True).prctl(29, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_TIMERSLACK)")


def bench_vllm(python: Path, model: Path, slack_ns: int = 0, idle_s: float = 20) -> dict:
    port, key = free_port(), "sk-bench"
    scratch = Path(tempfile.mkdtemp(prefix="rigops-vllm-"))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(VLLM_CACHE_ROOT=str(scratch / "cache"), TMPDIR=str(scratch), VLLM_RPC_BASE_PATH=str(scratch))
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
        "--enforce-eager", "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20),
    ]  # fmt: skip
    log = (scratch / "vllm.log").open("w")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: set_timer_slack(slack_ns),
    )  # fmt: skip
    out: dict = {"timer_slack_ns": slack_ns or int(Path("/proc/self/timerslack_ns").read_text())}
    try:
        while time.monotonic() - t0 < 300 and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    out["ready_s"] = round(time.monotonic() - t0, 1)
                    break
            except OSError:
                time.sleep(0.5)
        if "ready_s" not in out:
            out["error"] = (scratch / "vllm.log").read_text()[-2000:]
            return out
        out["rss_mib"] = rss_kib(proc.pid) // 1024
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )  # fmt: skip
        chats = []
        for _ in range(5):
            t1 = time.monotonic()
            with urllib.request.urlopen(req, timeout=60) as r:
                json.load(r)
            chats.append(time.monotonic() - t1)
        out["first_chat_s"] = round(chats[0], 3)
        out["later_chat_s"] = round(sorted(chats[1:])[len(chats[1:]) // 2], 3)  # the median of the next four
        out["rss_after_chat_mib"] = rss_kib(proc.pid) // 1024
        time.sleep(2)
        before = cpu_ticks(proc.pid)
        time.sleep(idle_s)
        out["idle_cpu_percent"] = round(100 * (cpu_ticks(proc.pid) - before) / os.sysconf("SC_CLK_TCK") / idle_s, 2)
    finally:
        t2 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
            out["stop_s"] = round(time.monotonic() - t2, 1)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            out["stop_s"] = "killed after 30s"
        log.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold", action="store_true", help="also time a fresh wheelhouse build and venv install")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument(
        "--timer-slack-ns", type=int, default=100_000_000,
        help="the second vLLM run's timer slack (default: 100 ms, the sandbox inventory's)",
    )  # fmt: skip
    ap.add_argument("--idle-seconds", type=float, default=20, help="how long the idle CPU is measured")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cache = mkvenv.cache_root()
    inp = ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.in"
    lock = inp.with_suffix(".lock")
    wh = cache / "wheelhouse" / "cpu"
    results: dict = {"cache": str(cache)}

    first, _ = timed(wheelhouse_build.do_build, inp, lock, wh)
    results["wheelhouse_first_call"] = {"state": first["state"], "s": round(first["seconds"], 1)}
    warm, _ = timed(wheelhouse_build.do_build, inp, lock, wh)
    results["wheelhouse_warm_s"] = round(warm["seconds"], 3)
    results["wheelhouse_cold_recorded_s"] = first.get("build-seconds")
    results["wheelhouse_bytes"] = first.get("bytes")
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="rigops-wh-") as tmp:
            cold, _ = timed(wheelhouse_build.do_build, inp, lock, Path(tmp) / "cpu")
            results["wheelhouse_cold_s"] = round(cold["seconds"], 1)

    venv = mkvenv.make_venv(wh)
    stamp = json.loads((Path(venv["venv"]) / mkvenv.STAMP).read_text())
    results["venv_first_call"] = {"state": venv["state"], "s": round(venv["seconds"], 1)}
    results["venv_install_recorded_s"] = stamp.get("install-seconds")
    if args.cold:
        with tempfile.TemporaryDirectory(prefix="rigops-venv-") as tmp:
            cold = mkvenv.make_venv(wh, Path(tmp) / "venv", force=True)
            results["venv_install_cold_s"] = round(cold["seconds"], 1)
    python = Path(venv["venv"]) / "bin" / "python"

    model_dir, model_s = timed(
        subprocess.run, [str(python), str(ROOT / "lab/sandbox/model/make_tiny_model.py")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    model = Path(model_dir.stdout.strip().splitlines()[-1])
    results["tiny_model"] = {"path": str(model), "s": round(model_s, 2)}
    if not args.no_vllm:
        results["vllm"] = [
            bench_vllm(python, model / "tiny-llama-sharded", slack, args.idle_seconds)
            for slack in (0, args.timer_slack_ns)
        ]

    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"cache root                         {results['cache']}")
    print(f"wheelhouse build, this call        {first['state']} {first['seconds']:.1f}s")
    print(f"wheelhouse build, warm (cached)    {results['wheelhouse_warm_s']:.3f}s")
    print(f"wheelhouse build, cold (recorded)  {results['wheelhouse_cold_recorded_s']}s, "
          f"{(results['wheelhouse_bytes'] or 0) / 2**30:.2f} GiB")  # fmt: skip
    if "wheelhouse_cold_s" in results:
        print(f"wheelhouse build, cold (now)       {results['wheelhouse_cold_s']}s")
    print(f"venv from wheelhouse, this call    {venv['state']} {venv['seconds']:.1f}s")
    print(f"venv install (recorded)            {results['venv_install_recorded_s']}s")
    if "venv_install_cold_s" in results:
        print(f"venv install, cold (now)           {results['venv_install_cold_s']}s")
    print(f"tiny model                         {results['tiny_model']['s']}s  {model}")
    for v in results.get("vllm", []):
        if "error" in v:
            print(f"vLLM failed to start:\n{v['error']}")
            continue
        print(f"vLLM with a timer slack of         {v['timer_slack_ns']} ns")
        print(f"  time-to-ready                    {v['ready_s']}s")
        print(f"  RSS (server + engine)            {v['rss_mib']} MiB, {v['rss_after_chat_mib']} MiB after the chats")
        print(f"  chat completion (16 tokens)      first {v['first_chat_s']}s, then {v['later_chat_s']}s (median)")
        print(f"  CPU while idle                   {v['idle_cpu_percent']}% of a core")
        print(f"  stop after SIGTERM               {v['stop_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
