#!/usr/bin/env python3
"""Install time of the vllm_runtime role, cold and warm (printed, never asserted).

    ./rigops measure vllm_runtime [--host NAME] [--port PORT] [--keep] [--down] [--json]

Runs the real role with ansible-playbook against a sandbox host of its own (made with
lab/sandbox/fleet.py, profile ``nogpu``; the sandbox's settings: cpu flavour from the
hash-locked wheelhouse):

- cold: a new release into an empty runtime root (venv, pip install of the whole lock
  from the wheelhouse, smoke test, switch of ``current``);
- warm: the same run again: preflight only, nothing installed, ``current`` untouched.

The runtime root is ``/opt/rigops-bench/vllm`` on the host, removed before the cold run
and, unless ``--keep``, after. ``--down`` removes the host at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import _sandbox as sb
from _sandbox import podman_exec, recap

BENCH_ROOT = "/opt/rigops-bench/vllm"
PLAYBOOK = """---
- name: Benchmark | vllm_runtime
  hosts: bench
  roles:
    - role: rigops.fleet.vllm_runtime
"""


def inventory(details: dict) -> str:
    return json.dumps(sb.inventory("bench", [details]))


def playbook(workdir: Path, *extra: str) -> tuple[float, int, str]:
    run = sb.run_playbook(
        workdir / "bench.yml",
        [workdir / "inventory.json", sb.SANDBOX_GROUPS],
        "-e",
        f"vllm_runtime_root={BENCH_ROOT}",
        *extra,
    )
    return run.seconds, run.rc, run.output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="bench-vr", help="sandbox host name (default bench-vr)")
    parser.add_argument("--port", type=int, default=2349, help="its SSH port (default 2349)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's runtime root on the host")
    parser.add_argument("--down", action="store_true", help="remove the host at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    details = sb.fleet_up([(args.host, "nogpu", args.port)])[0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "inventory.json").write_text(inventory(details))
        (workdir / "bench.yml").write_text(PLAYBOOK)
        container = details["container"]
        podman_exec(container, "rm", "-rf", BENCH_ROOT)
        for phase in ("cold", "warm"):
            seconds, rc, out = playbook(workdir)
            results[phase] = {"seconds": round(seconds, 1), "rc": rc, "recap": recap(out)}
            if rc != 0:
                print(out[-4000:], file=sys.stderr)
                break
        size = podman_exec(container, "du", "-sb", f"{BENCH_ROOT}/releases").split()
        results["release_bytes"] = int(size[0]) if size else None
        if not args.keep:
            podman_exec(container, "rm", "-rf", "/opt/rigops-bench")
    if args.down:
        sb.fleet_down([args.host])

    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"vllm_runtime on sandbox host {args.host} (cpu flavour, sandbox wheelhouse)")
        for phase in ("cold", "warm"):
            if phase in results:
                r = results[phase]
                print(f"  {phase:5s} install: {r['seconds']:7.1f} s   rc={r['rc']}   {r['recap']}")
        if results.get("release_bytes"):
            print(f"  release size:  {results['release_bytes'] / 1024**3:.2f} GiB")
    return 0 if all(results.get(p, {}).get("rc") == 0 for p in ("cold", "warm")) else 1


if __name__ == "__main__":
    sys.exit(main())
