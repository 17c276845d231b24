#!/usr/bin/env python3
"""Wall time of a rollout against the sum of its per-host times (printed, never asserted).

    ./rigops measure rollout [--boards N] [--down] [--json]
    ./rigops measure rollout --report reports/rollout/<UTC time>/report.json

From the runner's JSON report (commands/rollout.py): the rollout's wall time, each board's time
(the sum of its steps: backup, stage, switch, restart, and rollback when there was one) and
their sum. The sum is what one board after the other would take; wall/sum shows what the
batches gave back (a canary alone, then the rest at once), and how much the batch with the
slowest board cost.

Without --report it makes the figures: N sandbox Jetsons of its own (bench-ro-1..N, N at most
4, alternately jetson-thor and jetson-orin, SSH ports 2411-2414, from the `runtime` stage
snapshot), the Jetson job on them (site.yml, not timed), then a rollout of a new runtime pin
(the sandbox lock plus one repeated entry: a new release, a full install on every board),
canary first then the rest (--batches 1,100%). The boards stay up unless --down.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import _sandbox as sb

FIRST_PORT = 2411  # 2411-2414: no scenario, inventory, test or other benchmark uses them
MAX_BOARDS = 4
NAMES = [f"bench-ro-{i}" for i in range(1, MAX_BOARDS + 1)]
PROFILES = ["jetson-thor", "jetson-orin"]


def figures(report: dict) -> dict:
    """The benchmark's figures from a runner report."""
    hosts = [
        {"host": h["host"], "batch": h.get("batch"), "status": h["status"], "seconds": h.get("host_seconds") or 0.0,
         "steps": h.get("stage_seconds") or {}}
        for h in report["hosts"]
    ]  # fmt: skip
    total = round(sum(h["seconds"] for h in hosts), 1)
    wall = report["wall_seconds"]
    batches = {}
    for h in hosts:
        if h["batch"] is not None:
            batches.setdefault(h["batch"], []).append(h["seconds"])
    return {
        "rollout": report.get("rollout"),
        "wall_seconds": wall,
        "host_seconds_sum": total,
        "ratio": round(wall / total, 2) if total else None,
        "batches": {
            str(n): {"boards": len(s), "slowest_s": max(s), "sum_s": round(sum(s), 1)} for n, s in batches.items()
        },
        "hosts": hosts,
    }


def format_figures(f: dict) -> str:
    lines = [
        f"rollout {f['rollout']}: wall {f['wall_seconds']:.1f}s against {f['host_seconds_sum']:.1f}s of board time"
    ]
    if f["ratio"] is not None:
        lines[0] += f" (wall/sum {f['ratio']:.2f})"
    lines.append(f"  {'board':<12} {'batch':>5} {'status':<12} {'seconds':>8}  steps")
    for h in f["hosts"]:
        steps = ", ".join(f"{k} {v:.1f}s" for k, v in h["steps"].items()) or "-"
        lines.append(f"  {h['host']:<12} {h['batch'] or '-':>5} {h['status']:<12} {h['seconds']:>7.1f}s  {steps}")
    for n, b in f["batches"].items():
        lines.append(f"  batch {n}: {b['boards']} board(s), slowest {b['slowest_s']:.1f}s, sum {b['sum_s']:.1f}s")
    return "\n".join(lines)


def lock_line(name: str) -> str:
    lock = (sb.ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
    m = re.search(rf"^({re.escape(name)}==\S+)\s*\\\s*\n\s*(--hash=sha256:[0-9a-f]{{64}})", lock, re.M)
    if not m:
        raise SystemExit(f"{name} is not in lab/sandbox/wheelhouse/cpu.lock")
    return f"{m.group(1)} {m.group(2)}"


def inventory(hosts: list[dict]) -> dict:
    """The boards in group jetson, each serving the tiny model (as the sandbox's thor-01 does)."""
    served = yaml_load(sb.ROOT / "inventories/sandbox/host_vars/thor-01/vllm_instances.yml")
    return sb.inventory("jetson", hosts, served)


def yaml_load(path: Path):
    import yaml  # noqa: PLC0415 (PyYAML comes with Ansible)

    return yaml.safe_load(path.read_text())


def measure(boards: int, workdir: Path) -> dict:
    specs = [(name, PROFILES[i % 2], FIRST_PORT + i) for i, name in enumerate(NAMES[:boards])]
    args = [f"--host={name}:{profile}:{port}:runtime" for name, profile, port in specs]
    hosts = json.loads(sb.fleet("up", "--json", *args))
    sb.write_json(workdir / "inventory.json", inventory(hosts))
    inventories = [workdir / "inventory.json", sb.SANDBOX_GROUPS]
    site = sb.run_playbook("site.yml", inventories, "-e", f"rigops_report_dir={workdir / 'reports'}")
    if site.rc != 0:
        print(site.output[-4000:], file=sys.stderr)
        raise SystemExit("the Jetson job failed on the benchmark's boards; see above")
    cmd = [sys.executable, str(sb.ROOT / "commands" / "rollout.py"), "--plain", "--batches", "1,100%"]
    for inv in inventories:
        cmd += ["-i", str(inv)]
    cmd += ["-e", json.dumps({"vllm_runtime_extra_requirements": [lock_line("idna")]})]
    cmd += ["--report-dir", str(workdir / "rollout")]
    proc = subprocess.run(cmd, cwd=sb.ROOT, env=sb.ENV, capture_output=True, text=True, check=False)
    reports = sorted((workdir / "rollout").glob("*/report.json"))
    if not reports:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
        raise SystemExit("the rollout wrote no report")
    return json.loads(reports[-1].read_text())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", type=Path, help="a runner report.json to read instead of running a rollout")
    parser.add_argument("--boards", type=int, default=4, help=f"sandbox Jetsons to roll out to (1-{MAX_BOARDS})")
    parser.add_argument("--down", action="store_true", help="remove the boards at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.boards <= MAX_BOARDS:
        parser.error(f"--boards must be between 1 and {MAX_BOARDS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report = json.loads(args.report.read_text())
    else:
        with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
            report = measure(args.boards, Path(tmp))
        if args.down:
            sb.fleet_down(NAMES)
    result = figures(report)
    print(json.dumps(result, indent=2) if args.json else format_figures(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
