#!/usr/bin/env python3
"""Wall time of the main job, `site.yml -l gpu-rigs`, first run and no-op rerun (printed, never asserted).

    ./rigops measure main_job [--rigs 1,2,4] [--mitogen] [--baseline COMMIT] [--down] [--json]

On sandbox rigs of its own (bench-mj-1..4, profile rtx5090x8, SSH ports 2391-2394), each
serving what the sandbox's rig-5090 serves (inventories/sandbox/host_vars/rig-5090).
For each fleet size N, every row starts from N bare rigs: the benchmark's rigs are
removed and N are created afresh (creation is not timed), then

- first run on the N bare rigs: wall time, and for the first row the time of each stage
  (from the run's report, reports/ JSON ``stage_seconds``);
- no-op rerun on the same N rigs: wall time, the changed count (0 expected) and the CPU it
  took: the controller's (ansible-playbook and what it waited for) and the rigs' (their
  containers' cgroups), and the controller's CPU per task per rig (the tasks of the rerun's
  PLAY RECAP: ok + failed + skipped, over its rigs), the figure docs/fleet-scale.md's
  calculator takes as --cpu-per-task;
- with ``--baseline COMMIT``, the same rigs run that earlier commit of the project first (a copy of
  its tree, ``git archive``, its own site.yml, ansible.cfg and sandbox groups): its first run from
  bare and its no-op rerun, then HEAD's run over what it left (HEAD's "first run" of that row) and
  HEAD's no-op rerun; the two reruns side by side: wall time, host tasks per rig, HEAD over the
  baseline (goal: at most 0.5x over SSH);
- with ``--mitogen``, one more no-op rerun under mitogen's strategy (strategy_plugins/), the
  same figures. The first run and the first rerun are over SSH, the default, whatever the
  caller exported (the driver stage reboots the rigs: mitogen-hq/mitogen#1251);

and at the end the ratio of the largest fleet's no-op rerun to the smallest's, per connection, beside
the floor this machine sets: the sandbox rigs share the controller's cores, so the largest rerun's
CPU spread over every core is the least wall time it can take (and never less than the smallest
fleet's: rigs in parallel take at least as long as one). The ratio over that floor is the figure
that carries to a machine with more cores: the goal for 4 rigs against 1 is at most 1.15x it.
For the same reason the ratio holds only on an idle machine: when other processes took more
than a tenth of a rerun's own CPU meanwhile, a NOT IDLE line says so.
The rigs of the last row stay up unless ``--down``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _sandbox as sb
import yaml

PROFILE = "rtx5090x8"
FIRST_PORT = 2391
MAX_RIGS = 4  # ports 2391-2394; 2396-2398 belong to tests/integration/test_fleet.py
FLOOR_GOAL = 1.15  # no-op rerun of 4 rigs against 1 rig, over the floor this machine sets
BASELINE_GOAL = 0.5  # HEAD's no-op rerun over the baseline commit's, on the same rigs, over SSH
NAMES = [f"bench-mj-{i}" for i in range(1, MAX_RIGS + 1)]


def inventory(hosts: list[dict]) -> dict:
    served = yaml.safe_load((sb.ROOT / "inventories/sandbox/host_vars/rig-5090/vllm_instances.yml").read_text())
    return sb.inventory("gpu-rigs", hosts, {"gpu_topology_expected_gpus": 8, **served})


def site(workdir: Path, limit: str, containers: list[str], connection: str = "ssh", root: Path = sb.ROOT) -> dict:
    """One run of ``root``'s site.yml (the project, or a baseline commit's tree) on the rigs of ``limit``."""
    hosts_before = sb.hosts_cpu_seconds(containers)
    run = sb.run_playbook(
        "site.yml",
        [workdir / "inventory.json", root / sb.SANDBOX_GROUPS.relative_to(sb.ROOT)],
        "-l",
        limit,
        "-e",
        f"rigops_report_dir={workdir / 'reports'}",
        # that tree's ansible.cfg (and so its collection, .collections), not the one ./rigops exports
        env={**sb.connection_env(connection), "ANSIBLE_CONFIG": str(root / "ansible.cfg")},
        cwd=root,
    )
    report_file = workdir / "reports" / "latest.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {"hosts": []}
    if run.rc != 0:
        print(run.output[-4000:], file=sys.stderr)
    hosts_after = sb.hosts_cpu_seconds(containers)
    rigs_cpu = None if hosts_before is None or hosts_after is None else round(hosts_after - hosts_before, 1)
    # what the rest of the machine took meanwhile (~0 on an idle machine; the kernel's share of
    # the SSH traffic is in it): with the rigs on the controller's cores, it slows the run
    others = None if rigs_cpu is None else round(max(0.0, run.machine_seconds - run.cpu_seconds - rigs_cpu), 1)
    return {
        "seconds": round(run.seconds, 1),
        "rc": run.rc,
        "changed": sb.changed_count(run.output),
        "tasks": sb.task_count(run.output),
        "cpu": {"controller": round(run.cpu_seconds, 1), "rigs": rigs_cpu},
        "others": others,
        "report": report,
    }


def bare_rigs(size: int) -> list[dict]:
    """``size`` freshly created rigs: every rig of the benchmark is removed first.

    Removing all of them (not only the first ``size``) also stops the services of the
    previous row, which would otherwise take the CPU and memory of this one.
    """
    sb.fleet_down(NAMES)
    return sb.fleet_up((name, PROFILE, FIRST_PORT + i) for i, name in enumerate(NAMES[:size]))


RERUN_KEYS = ("seconds", "rc", "changed", "tasks", "cpu", "others")
# Other processes' CPU during a rerun of the ratio, as a share of the rerun's own, above which the
# ratio is flagged: it was measured on a busy machine, which moves it a long way.
BUSY_SHARE = 0.1
# the no-op reruns: result key, connection
RERUNS = (("rerun", "SSH"), ("rerun_mitogen", "mitogen"))


def checkout(commit: str, workdir: Path) -> tuple[str, Path]:
    """The project's tree at ``commit`` (its full id, and the folder it is copied to under ``workdir``)."""
    git = ["git", "-C", str(sb.ROOT)]
    sha = subprocess.run(
        [*git, "rev-parse", "--verify", f"{commit}^{{commit}}"], check=False, capture_output=True, text=True
    )
    if sha.returncode != 0:
        raise ValueError(f"--baseline {commit}: not a commit of this repository ({sha.stderr.strip()})")
    full = sha.stdout.strip()
    tree = workdir / f"baseline-{full[:12]}"
    tree.mkdir()
    archive = subprocess.run([*git, "archive", full], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return full, tree


def measure(sizes: list[int], workdir: Path, mitogen: bool = False, baseline: str | None = None) -> dict:
    results: dict = {"sizes": {}}
    base = checkout(baseline, workdir) if baseline else None
    if base:
        results["baseline"] = base[0]
    for size in sizes:
        hosts = bare_rigs(size)
        sb.write_json(workdir / "inventory.json", inventory(hosts))
        limit = ",".join(h["instance"] for h in hosts)
        containers = [h["container"] for h in hosts]
        before = {}
        if base:
            base_first = site(workdir, limit, containers, root=base[1])
            base_rerun = site(workdir, limit, containers, root=base[1]) if base_first["rc"] == 0 else base_first
            before = {"first": {k: base_first[k] for k in ("seconds", "rc", "changed")},
                      "rerun": {k: base_rerun[k] for k in RERUN_KEYS}}  # fmt: skip
        first = site(workdir, limit, containers)
        rerun = site(workdir, limit, containers)
        row = results["sizes"][size] = {
            "first": {k: first[k] for k in ("seconds", "rc", "changed")},
            "rerun": {k: rerun[k] for k in RERUN_KEYS},
        }
        if before:
            row["baseline"] = before
        if mitogen and not (first["rc"] or rerun["rc"]):
            again = site(workdir, limit, containers, "mitogen")
            row["rerun_mitogen"] = {k: again[k] for k in RERUN_KEYS}
        if size == sizes[0]:
            results["stages"] = {h["host"]: h.get("stage_seconds", {}) for h in first["report"]["hosts"]}
        if first["rc"] or rerun["rc"] or row.get("rerun_mitogen", {}).get("rc") or before.get("rerun", {}).get("rc"):
            break
    for key, _ in RERUNS:
        ratio = rerun_ratio(results["sizes"], os.cpu_count() or 1, key)
        if ratio:
            results[f"{key}_ratio"] = ratio
    return results


def cpu_total(rerun: dict) -> float | None:
    """The rerun's CPU seconds, controller and rigs together; None when the rigs' could not be read."""
    cpu = rerun.get("cpu") or {}
    if cpu.get("rigs") is None:
        return None
    return cpu["controller"] + cpu["rigs"]


def rerun_ratio(sizes: dict, cores: int, key: str = "rerun") -> dict | None:
    """No-op rerun (``key``: "rerun", or "rerun_mitogen") of the largest fleet over that of the
    smallest, when both ran cleanly, and the floor of that ratio on this machine: the largest
    rerun's CPU time spread over ``cores`` (the rigs run on the controller's cores), over the
    smallest rerun's wall time."""
    ok = {n: r for n, r in sizes.items() if r["first"]["rc"] == 0 and r.get(key, {}).get("rc") == 0}
    if len(ok) < 2:
        return None
    small, large = min(ok, key=int), max(ok, key=int)
    base = ok[small][key]["seconds"]
    value = round(ok[large][key]["seconds"] / base, 2) if base else None
    out = {"rigs": int(large), "against": int(small), "value": value, "cores": cores}
    cpu = cpu_total(ok[large][key])
    if cpu is not None and base:
        out["cpu_seconds"] = round(cpu, 1)
        out["floor_seconds"] = round(cpu / cores, 1)
        out["floor"] = sb.cpu_floor(cpu, cores, base)
        if value is not None:
            out["over_floor"] = round(value / max(out["floor"], 1.0), 2)
    busy = {}
    for n in (small, large):
        own, others = cpu_total(ok[n][key]), ok[n][key].get("others")
        if own and others is not None and others > BUSY_SHARE * own:
            busy[int(n)] = {"others_seconds": others, "share": round(others / own, 2)}
    if busy:
        out["busy"] = busy
    return out


def _rigs(n: int) -> str:
    return f"{n} rig" if n == 1 else f"{n} rigs"


def _spent(rerun: dict) -> str:
    """A rerun's CPU as 'controller + rigs' ('?' for rigs that could not be read)."""
    cpu = rerun.get("cpu") or {}
    if not cpu:
        return "-"
    rigs = "?" if cpu.get("rigs") is None else f"{cpu['rigs']:.1f}s"
    return f"{cpu['controller']:.1f}s + {rigs}"


def baseline_lines(results: dict) -> list[str]:
    """The baseline commit's no-op rerun beside HEAD's, per row (with --baseline)."""
    if "baseline" not in results:
        return []
    lines = [f"  baseline {results['baseline'][:12]} first, on the same rigs (HEAD's first run is over what it left):"]
    for size, r in results["sizes"].items():
        base = r.get("baseline")
        if not base:
            continue
        if base["first"]["rc"] or base["rerun"]["rc"]:
            rc = base["first"]["rc"] or base["rerun"]["rc"]
            lines.append(f"  {_rigs(size)}: the baseline's run failed (rc {rc})")
            continue
        per_rig = [x["tasks"] // size for x in (base["rerun"], r["rerun"])]
        line = (
            f"  no-op rerun over SSH, {_rigs(size)}: baseline {base['rerun']['seconds']:.1f}s "
            f"({per_rig[0]} host tasks per rig), HEAD {r['rerun']['seconds']:.1f}s ({per_rig[1]} host tasks per rig)"
        )
        if base["rerun"]["seconds"] and r["rerun"]["rc"] == 0:
            ratio = r["rerun"]["seconds"] / base["rerun"]["seconds"]
            line += f" = {ratio:.2f}x (goal <= {BASELINE_GOAL}x: {'met' if ratio <= BASELINE_GOAL else 'missed'})"
        lines.append(line)
    return lines


def format_results(results: dict) -> str:
    lines = ["main job (site.yml -l gpu-rigs) on sandbox rigs, profile rtx5090x8, cpu vLLM, tiny model"]
    first = "HEAD's run over the baseline's" if "baseline" in results else "first run"
    for host, stages in results.get("stages", {}).items():
        lines.append(f"  {first} per stage on {host}: " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items()))
    lines.append(
        f"  {'rigs':>4}  {'first run':>10}  {'no-op rerun':>12}  {'rerun changed':>13}  "
        f"{'rerun CPU: controller + rigs':>28}"
    )
    for size, r in results["sizes"].items():
        note = "" if r["first"]["rc"] == 0 and r["rerun"]["rc"] == 0 else "  (failed, see above)"
        lines.append(
            f"  {size:>4}  {r['first']['seconds']:>9.1f}s  {r['rerun']['seconds']:>11.1f}s  "
            f"{r['rerun']['changed']:>13}  {_spent(r['rerun']):>28}{note}"
        )
    lines.append("  (each row starts from that many bare rigs, created afresh)")
    lines += baseline_lines(results)
    for size, r in results["sizes"].items():
        if "rerun_mitogen" in r:
            again = r["rerun_mitogen"]
            note = "" if again["rc"] == 0 else "  (failed, see above)"
            lines.append(
                f"  no-op rerun under mitogen, {_rigs(size)}: {again['seconds']:.1f}s, changed {again['changed']}, "
                f"CPU {_spent(again)}{note}"
            )
    for key, label in RERUNS:
        what = "rerun" if key == "rerun" else f"{label} rerun"
        for size, r in results["sizes"].items():
            cpu, tasks = (r.get(key, {}).get("cpu") or {}).get("controller"), r.get(key, {}).get("tasks")
            if cpu is not None and tasks:
                per_task = f"{cpu / tasks:.3f}s ({tasks} host tasks)"
                lines.append(f"  controller CPU per task per rig, {what} of {_rigs(size)}: {per_task}")
    for key, label in RERUNS:
        ratio = results.get(f"{key}_ratio")
        if not ratio or ratio["value"] is None:
            continue
        what = "no-op rerun" if key == "rerun" else f"no-op rerun under {label}"
        line = f"  {what}, {_rigs(ratio['rigs'])} / {_rigs(ratio['against'])}: {ratio['value']:.2f}x"
        lines.append(line)
        if "floor" in ratio:
            lines.append(
                f"  floor on this machine: the {what.removeprefix('no-op ')} of {_rigs(ratio['rigs'])} took "
                f"{ratio['cpu_seconds']:.1f} CPU-s, at least {ratio['floor_seconds']:.1f}s on "
                f"its {ratio['cores']} cores shared with the rigs = {ratio['floor']:.2f}x"
            )
            over = f"  wall over the floor (at least 1x): {ratio['over_floor']:.2f}x"
            if (ratio["rigs"], ratio["against"]) == (4, 1):
                over += f" (goal <= {FLOOR_GOAL}x: {'met' if ratio['over_floor'] <= FLOOR_GOAL else 'missed'})"
            lines.append(over)
        for n, b in ratio.get("busy", {}).items():
            lines.append(
                f"  NOT IDLE: other processes took {b['others_seconds']:.1f} CPU-s during the {what} of {_rigs(n)} "
                f"({b['share']:.0%} of its own): this ratio does not hold; measure on an idle machine"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rigs", default="1,2,4", help=f"fleet sizes (default 1,2,4; at most {MAX_RIGS})")
    parser.add_argument("--mitogen", action="store_true", help="one more no-op rerun, under mitogen's strategy")
    parser.add_argument(
        "--baseline", metavar="COMMIT", help="an earlier commit whose run and no-op rerun go first on the same rigs"
    )
    parser.add_argument("--down", action="store_true", help="remove the rigs at the end")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        args.sizes = sb.parse_sizes(args.rigs, MAX_RIGS)
    except ValueError as exc:
        parser.error(f"--rigs {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rigops-bench-") as tmp:
        try:
            results = measure(args.sizes, Path(tmp), args.mitogen, args.baseline)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    if args.down:
        sb.fleet_down(NAMES)
    print(json.dumps(results, indent=2) if args.json else format_results(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
