#!/usr/bin/env python3
"""Install time of the vllm_runtime role, cold and warm (printed, never asserted).

    python3 benchmarks/vllm_runtime.py [--host NAME] [--port PORT] [--keep] [--down] [--json]

Runs the real role with ansible-playbook against a sandbox host of its own (made with
sandbox/fleet.py, profile ``nogpu``; the sandbox's settings: cpu flavour from the
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
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_ROOT = "/opt/rigops-bench/vllm"
PLAYBOOK = """---
- name: Benchmark | vllm_runtime
  hosts: bench
  roles:
    - role: vllm_runtime
"""


ENV = dict(os.environ, CONTAINERS_CONF=str(ROOT / "sandbox" / "podman" / "containers.conf"))


def fleet(*args: str) -> str:
    cmd = [sys.executable, str(ROOT / "sandbox" / "fleet.py"), *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=ENV).stdout


def podman_exec(container: str, *argv: str) -> str:
    """Run a command in the host's container (as root); its stdout, empty on failure."""
    proc = subprocess.run(["podman", "exec", container, *argv], check=False, capture_output=True, text=True, env=ENV)
    return proc.stdout if proc.returncode == 0 else ""


def inventory(details: dict) -> str:
    host = {
        "ansible_host": details["address"],
        "ansible_port": details["port"],
        "ansible_user": details["user"],
        "ansible_become": True,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": details["identity_file"],
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={details['known_hosts']} -o StrictHostKeyChecking=yes",
    }
    return json.dumps({"bench": {"hosts": {details["instance"]: host}}})


def playbook(workdir: Path, *extra: str) -> tuple[float, int, str]:
    ansible = Path(sys.executable).parent / "ansible-playbook"
    cmd = [
        str(ansible if ansible.exists() else "ansible-playbook"),
        "-i",
        str(workdir / "inventory.json"),
        "-i",
        str(ROOT / "inventories" / "sandbox" / "groups.yml"),
        str(workdir / "bench.yml"),
        "-e",
        f"vllm_runtime_root={BENCH_ROOT}",
        *extra,
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    return time.monotonic() - start, proc.returncode, proc.stdout + proc.stderr


def recap(output: str) -> str:
    m = re.search(r"ok=\d+\s+changed=\d+\s+unreachable=\d+\s+failed=\d+", output)
    return m.group(0) if m else "no recap"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="bench-vr", help="sandbox host name (default bench-vr)")
    parser.add_argument("--port", type=int, default=2349, help="its SSH port (default 2349)")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark's runtime root on the host")
    parser.add_argument("--down", action="store_true", help="remove the host at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    details = json.loads(fleet("up", "--json", f"--host={args.host}:nogpu:{args.port}"))[0]
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
        fleet("down", f"--host={args.host}")

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
