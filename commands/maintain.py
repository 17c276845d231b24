#!/usr/bin/env python
"""Maintain GPU rigs batch by batch without dropping a request (playbooks/maintain.yml), and report it.

    ./rigops maintain [-i INVENTORY ...] [-l LIMIT] [--hosts PATTERN] [--batches 1,50%,100%]
                      [--change none|reboot|driver|tasks] [--tasks FILE] [-e VARS ...] [--check]
                      [--report-dir DIR] [--plain] [--save-events FILE]

The rigs (--hosts, default gpu-rigs, narrowed by -l) in inventory order go in batches like a
play's serial (--batches; default 1: one rig at a time, the first one the canary). Each batch is
one run of playbooks/maintain.yml through ansible-runner (maintain_hosts = the batch): drain at
the gateways, idle, bench, the change, topology gate, services and endpoint gate, bench, undrain.
A batch where a rig failed (or a gateway failed to drain or undrain) stops the job: the failed rig
stays drained, the later batches are not touched. The other switches (maintain_idle_timeout,
maintain_bench*, nvidia_driver_* for --change driver) go in -e.

While it runs: the rollout's live table on a terminal, one line per change otherwise (--plain).
At the end: reports/maintain/<UTC time>/report.json and summary.txt (the table; the bench results
beside them), the table printed, and the exit code: 0 when every rig was maintained, 1 when any
rig failed, could not be reached or was not started (a stopped job), 2 when the job could not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# the rollout's runner beside this file (a script's folder is the first entry of its import path)
from rollout import SAVED_EVENTS, HostState, LiveDisplay, PlainDisplay, given_vars, utc_id

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "playbooks" / "maintain.yml"
CONFIG = ROOT / "ansible.cfg"
OK = ("maintained", "check")
STATUSES = ("maintained", "check", "failed", "unreachable", "not_started")
CHANGES = ("none", "reboot", "driver", "tasks")


def batches(hosts: list[str], spec: list) -> list[list[str]]:
    """``hosts`` cut like a play's ``serial`` list: sizes or percentages of all, the last one repeated."""
    from ansible.utils.helpers import pct_to_int  # noqa: PLC0415 (the controller's Ansible)

    out, rest, index = [], list(hosts), 0
    while rest:
        size = pct_to_int(spec[min(index, len(spec) - 1)], len(hosts))
        size = max(1, size)
        out.append(rest[:size])
        rest = rest[size:]
        index += 1
    return out


class Maintenance:
    """The state of a maintenance, built from ansible-runner events only (``handle`` takes each one)."""

    title = "maintenance"

    def __init__(self, job_id: str = "", change: str = "none", clock=time.time):
        self.id, self.change, self.clock = job_id, change, clock
        self.started = clock()
        self.finished: float | None = None
        self.hosts: dict[str, HostState] = {}
        self.batches: list[list[str]] = []
        # hosts outside the batch: the controller (refused switches), a gateway (a drain or undrain that failed)
        self.other_failures: list[str] = []
        self.runner: list[dict] = []
        self.events = 0

    def host(self, name: str) -> HostState:
        if name not in self.hosts:
            self.hosts[name] = HostState(name)
        return self.hosts[name]

    def plan(self, planned: list[list[str]]) -> None:
        for batch in planned:
            for name in batch:
                self.host(name)

    def start_batch(self, batch: list[str]) -> list[str]:
        self.batches.append(batch)
        number = len(self.batches)
        for name in batch:
            self.host(name).batch, self.host(name).stage = number, "queued"
        return [f"{'canary' if number == 1 else 'batch'} {number}: {', '.join(batch)}"]

    def handle(self, event: dict) -> list[str]:
        """Take one event; the changes worth showing, as lines."""
        self.events += 1
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        name = data.get("host")
        res = data.get("res") or {}
        facts = (res.get("ansible_facts") if isinstance(res, dict) else None) or {}
        mine = name in self.hosts
        lines: list[str] = []
        if kind == "runner_on_ok" and mine:
            if "maintain_plan" in facts:
                state = self.host(name)
                state.before = facts["maintain_plan"].get("before") or {}
                lines.append(f"{name}: planned, driver {state.before.get('driver') or '-'}")
            if "maintain__stage" in facts:
                self.host(name).stage = facts["maintain__stage"]
                lines.append(f"{name}: {facts['maintain__stage']}")
            if "maintain_result" in facts:
                state = self.host(name)
                state.result = facts["maintain_result"]
                state.stage = state.result["status"]
                lines.append(self._result_line(state))
            if data.get("task_action", "").endswith("vllm_endpoint"):
                instance = data.get("task", "").rsplit(" ", 1)[-1]
                if res.get("kind", "ok") == "ok":
                    text = f"gate ok: chat {res.get('chat_s')}s ttft {res.get('ttft_s')}s"
                else:  # a gate whose failure the role judges itself (failed_when: false)
                    text = f"gate FAILED ({res.get('kind')})"
                self.host(name).gates[instance] = text
                lines.append(f"{name}: {instance} {text}")
        elif kind == "runner_on_failed" and name and not data.get("ignore_errors"):
            msg = " ".join(str(res.get("msg", "")).split())[:300]
            if not mine:
                self.other_failures.append(f"{name}: {data.get('task', '?')}: {msg}")
                lines.append(f"{name}: FAILED {data.get('task', '?')}: {msg[:160]}")
            elif data.get("task") != "Maintain | Verdict":
                self.host(name).last_failure = f"{data.get('task', '?')}: {msg}"
        elif kind == "runner_on_unreachable" and name:
            where = f"unreachable at {data.get('task', '?')}: {' '.join(str(res.get('msg', '')).split())[:300]}"
            if mine:
                self.host(name).unreachable = where
            else:
                self.other_failures.append(f"{name}: {where}")
            lines.append(f"{name}: {where}")
        return lines

    def _result_line(self, state: HostState) -> str:
        r = state.result or {}
        line = f"{state.name}: {r['status']}"
        if r.get("drained"):
            line += " (left drained)"
        if r.get("reason"):
            line += f": {r['reason'][:200]}"
        return line

    def batch_ok(self, batch: list[str], rc: int | None) -> bool:
        return rc == 0 and not self.other_failures and all(self.host(h).status in OK for h in batch)

    def finish_batch(self, rc: int | None, status: str | None) -> None:
        self.runner.append({"rc": rc, "status": status})

    def finish(self) -> None:
        self.finished = self.clock()

    def stopped(self) -> str | None:
        waiting = [h.name for h in self.hosts.values() if h.batch is None]
        if not waiting:
            return None
        failed = self.batches[-1] if self.batches else []
        what = "the canary" if len(self.batches) == 1 else f"batch {len(self.batches)}"
        return f"{what} ({', '.join(failed)}) did not pass: {', '.join(waiting)} not started, nothing changed there"

    def report(self) -> dict:
        order = sorted(self.hosts.values(), key=lambda h: (h.batch is None, h.batch or 0, h.name))
        hosts = []
        for state in order:
            r = state.result or {}
            seconds = r.get("stage_seconds") or {}
            status = state.status
            hosts.append(
                {
                    "host": state.name,
                    "batch": state.batch,
                    "canary": state.batch == 1,
                    "status": status,
                    # a rig that failed after the drain (or was drained before the job) stays drained;
                    # None: unknown (no result: the drain itself or the rig's connection failed)
                    "drained": bool(r.get("drained")) if r else None,
                    "before": r.get("before") or state.before,
                    "after": r.get("after") or {},
                    "rebooted": bool(r.get("after"))
                    and (r.get("before") or {}).get("boot_id") != (r.get("after") or {}).get("boot_id"),
                    "stage_seconds": seconds,
                    "host_seconds": round(sum(seconds.values()), 1),
                    "gate": r.get("gate") or {},
                    "bench": r.get("bench") or {},
                    "reason": r.get("reason")
                    or state.unreachable
                    or (state.last_failure if not r else None)
                    or (f"not maintained: {self.other_failures[0]}" if state.batch and self.other_failures else None),
                }
            )
        counts = {s: sum(1 for h in hosts if h["status"] == s) for s in STATUSES}
        ok = bool(hosts) and all(h["status"] in OK for h in hosts) and not self.other_failures
        return {
            "maintenance": self.id,
            "change": self.change,
            "started": datetime.datetime.fromtimestamp(self.started, datetime.UTC).isoformat(),
            "wall_seconds": round((self.finished or self.clock()) - self.started, 1),
            "runner": self.runner,
            "events": self.events,
            "batches": self.batches,
            "canary": self.batches[0][0] if self.batches and self.batches[0] else None,
            "stopped": self.stopped(),
            "other_failures": self.other_failures,
            "counts": {k: v for k, v in counts.items() if v},
            "ok": ok,
            "exit_code": 2 if not hosts else (0 if ok else 1),
            "hosts": hosts,
        }


def _bench_text(bench: dict) -> str:
    before, after = bench.get("before") or {}, bench.get("after") or {}
    return (
        "; ".join(f"{n} {before.get(n, '-')} -> {after.get(n, '-')}" for n in sorted(set(before) | set(after))) or "-"
    )


def summary_table(report: dict) -> str:
    """The human summary: one row per rig (driver before and after, reboot, steps, bench, drained or not)."""
    rows = [("host", "batch", "status", "driver before -> after", "rebooted", "steps (s)", "bench tok/s", "drained")]
    for h in report["hosts"]:
        steps = " ".join(f"{k} {v}" for k, v in (h.get("stage_seconds") or {}).items()) or "-"
        rows.append(
            (
                h["host"] + (" (canary)" if h.get("canary") else ""),
                str(h.get("batch") or "-"),
                h["status"],
                f"{(h.get('before') or {}).get('driver') or '-'} -> {(h.get('after') or {}).get('driver') or '-'}",
                "yes" if h.get("rebooted") else "no",
                steps,
                _bench_text(h.get("bench") or {}),
                {True: "yes", False: "no"}.get(h.get("drained"), "?"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = ", ".join(f"{v} {k}" for k, v in report["counts"].items()) or "no rig"
    tail = [
        "",
        f"maintenance {report['maintenance']} ({report['change']}): {counts}; "
        f"wall {report['wall_seconds']}s; exit {report['exit_code']}",
    ]
    if report.get("stopped"):
        tail.append(f"stopped: {report['stopped']}")
    tail += [f"failed: {f}" for f in report.get("other_failures") or []]
    for h in report["hosts"]:
        if h.get("reason") and h["status"] not in OK:
            tail.append(f"{h['host']}: {h['reason']}")
        if h.get("drained") and h["status"] not in OK:
            tail.append(
                f"{h['host']}: left drained at the gateways; once fixed, run the maintenance again for it "
                f"(-l {h['host']}) or ./rigops undrain {h['host']}"
            )
    return "\n".join(lines + tail)


def write_report(report: dict, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.txt").write_text(summary_table(report) + "\n")
    path = folder / "report.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", action="append", default=[], help="inventory (repeatable)")
    parser.add_argument("-l", "--limit", help="host pattern (as ansible-playbook -l)")
    parser.add_argument("--hosts", default="gpu-rigs", help="the rigs to maintain (a host pattern; default gpu-rigs)")
    parser.add_argument("--batches", default="1", help="batch sizes like serial, the first one the canary (default 1)")
    parser.add_argument("--change", choices=CHANGES, default="none", help="what the maintenance does (default none)")
    parser.add_argument("--tasks", type=Path, help="the operator's tasks file (with --change tasks)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], help="JSON, @FILE or key=value (repeatable)")
    parser.add_argument("--check", action="store_true", help="a dry run (Ansible's check mode)")
    parser.add_argument(
        "--report-dir", type=Path, default=Path("reports") / "maintain", help="default reports/maintain"
    )
    parser.add_argument("--plain", action="store_true", help="one line per change even on a terminal")
    parser.add_argument("--save-events", type=Path, help="write the events it reads as JSON lines to this file")
    args = parser.parse_args(argv)
    spec = [b.strip() for b in args.batches.split(",") if b.strip()]
    if not spec or not all(b.isdigit() and int(b) > 0 or (b.endswith("%") and b[:-1].isdigit()) for b in spec):
        parser.error(f"--batches: sizes or percentages separated by commas, e.g. 1,50%,100% (got {args.batches!r})")
    args.batch_spec = [int(b) if b.isdigit() else b for b in spec]
    if (args.change == "tasks") != (args.tasks is not None):
        parser.error("--tasks FILE goes with --change tasks, and only with it")
    return args


def extra_vars(args: argparse.Namespace) -> dict:
    out = given_vars(args.extra_vars)
    out["maintain_change"] = args.change
    if args.tasks:
        out["maintain_tasks"] = str(args.tasks.resolve())
    return out


def inventory_hosts(inventories: list[str], pattern: str, limit: str | None) -> list[str]:
    """The hosts of ``pattern`` (narrowed by ``limit``) in inventory order, from the controller's Ansible."""
    from ansible.inventory.manager import InventoryManager  # noqa: PLC0415
    from ansible.parsing.dataloader import DataLoader  # noqa: PLC0415

    manager = InventoryManager(loader=DataLoader(), sources=inventories or None)
    if limit:
        manager.subset(limit)
    return [h.name for h in manager.get_hosts(pattern=pattern)]


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    import ansible_runner  # noqa: PLC0415 (the production venv has it; --help works without)

    os.environ.setdefault("ANSIBLE_CONFIG", str(CONFIG))
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    inventories = [str(Path(i).resolve()) for i in args.inventory]
    hosts = inventory_hosts(inventories, args.hosts, args.limit)
    if not hosts:
        print(
            f"maintain: no host matches {args.hosts!r}" + (f" limited to {args.limit!r}" if args.limit else ""),
            file=sys.stderr,
        )
        return 2
    job_id = utc_id()
    folder = args.report_dir / job_id
    job = Maintenance(job_id, args.change)
    planned = batches(hosts, args.batch_spec)
    job.plan(planned)
    live = out.isatty() and not args.plain and os.environ.get("TERM") != "dumb"
    display = LiveDisplay(job, out) if live else PlainDisplay(job, out)
    saved = args.save_events.open("w") if args.save_events else None

    def on_event(event: dict) -> bool:
        if saved and event.get("event") in SAVED_EVENTS:
            saved.write(json.dumps(event, default=str) + "\n")
        display.show(job.handle(event))
        return False  # the events live in our report, not in the runner's artifacts

    given = extra_vars(args)
    for batch in planned:
        display.show(job.start_batch(batch))
        variables = {
            **given,
            "maintain_hosts": batch,
            "maintain_id": job_id,
            "maintain_batch": len(job.batches),
            "maintain_report_dir": str(folder.resolve()),
        }
        with tempfile.TemporaryDirectory(prefix="rigops-maintain-") as private:
            result = ansible_runner.run(
                private_data_dir=private,
                project_dir=str(ROOT),
                playbook=str(PLAYBOOK),
                inventory=inventories or None,
                extravars=variables,
                cmdline="--check" if args.check else None,
                envvars={"ANSIBLE_FORCE_COLOR": "0", **({"ANSIBLE_CONFIG": str(CONFIG)} if CONFIG.exists() else {})},
                event_handler=on_event,
                quiet=True,
            )
        job.finish_batch(result.rc, result.status)
        if not job.batch_ok(batch, result.rc):
            break
    if saved:
        saved.close()
    job.finish()
    display.close()
    report = job.report()
    path = write_report(report, folder)
    print(summary_table(report), file=out)
    print(f"Report: {path}", file=out)
    return report["exit_code"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("maintenance interrupted: the rigs of the batch under way may be drained; rerun it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
