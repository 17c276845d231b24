#!/usr/bin/env python3
"""Numbers for the sandbox runtime (printed, never asserted).

    python3 benchmarks/sandbox_runtime.py [--cold] [--no-vllm] [--json]

- wheelhouse build time, warm (cache hit) and cold (``--cold``: a fresh build into a
  temporary folder; pip's own HTTP cache still applies; without ``--cold`` the cold time
  recorded when the cached wheelhouse was built is shown)
- venv install time from the wheelhouse (``--cold``: a fresh install; otherwise the time
  recorded in the cached venv's stamp)
- vLLM (CPU) time-to-ready on the tiny model (127.0.0.1, API key, ``--enforce-eager``),
  its RSS with the engine process, first chat completion latency, and stop time after
  SIGTERM

Caches: ``$RIGOPS_CACHE`` (default ``~/.cache/rigops``).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sandbox" / "wheelhouse"))

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


def bench_vllm(python: Path, model: Path) -> dict:
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
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict = {}
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
        t1 = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            json.load(r)
        out["first_chat_s"] = round(time.monotonic() - t1, 2)
        out["rss_after_chat_mib"] = rss_kib(proc.pid) // 1024
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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cache = mkvenv.cache_root()
    inp = ROOT / "sandbox" / "wheelhouse" / "cpu.in"
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
        subprocess.run, [str(python), str(ROOT / "sandbox/model/make_tiny_model.py")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    model = Path(model_dir.stdout.strip().splitlines()[-1])
    results["tiny_model"] = {"path": str(model), "s": round(model_s, 2)}
    if not args.no_vllm:
        results["vllm"] = bench_vllm(python, model / "tiny-llama-sharded")

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
    v = results.get("vllm")
    if v and "error" in v:
        print(f"vLLM failed to start:\n{v['error']}")
    elif v:
        print(f"vLLM time-to-ready                 {v['ready_s']}s")
        print(f"vLLM RSS (server + engine)         {v['rss_mib']} MiB, {v['rss_after_chat_mib']} MiB after a chat")
        print(f"first chat completion (16 tokens)  {v['first_chat_s']}s")
        print(f"stop after SIGTERM                 {v['stop_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
