#!/usr/bin/env python
"""Run a rolling change of what a fleet serves (playbooks/rollout.yml) and report it per host.

    ./rigops rollout [-i INVENTORY ...] [-l LIMIT] [-e VARS ...] [--batches 1,10%,50%,100%]
                     [--max-fail-percentage N] [--check] [--report-dir DIR] [--plain] [--save-events FILE]

The playbook runs through ansible-runner; its event stream is the source of everything shown
and reported (never Ansible's text output): the plan of each host (versions before), the
batches, each host's step (backup, stage, switch, restart, rollback, ...), every gate
(vllm_endpoint: chat and first-token seconds, or why it failed), and each host's result
(status, versions before and after, seconds per step, gate figures, rolled back or not).

While it runs: a live table on a terminal, one line per change otherwise (--plain forces it).
At the end: reports/rollout/<UTC time>/report.json and summary.txt (the table), the table
printed, and the exit code: 0 when every host ended updated or unchanged, 1 when any host was
rolled back, failed, could not be reached or was never started (a stopped rollout), 2 when the
rollout could not run at all.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOK = ROOT / "playbooks" / "rollout.yml"
CONFIG = ROOT / "ansible.cfg"
OK = ("updated", "unchanged", "check")
# the kinds of events Rollout.handle reads (and --save-events keeps)
SAVED_EVENTS = (
    "playbook_on_play_start",
    "runner_on_ok",
    "runner_on_failed",
    "runner_on_unreachable",
    "playbook_on_stats",
)
# the order of the summary's counts
STATUSES = ("updated", "unchanged", "check", "rolled_back", "failed", "rollback_failed", "unreachable", "not_started")


@dataclass
class HostState:
    name: str
    job: str | None = None
    batch: int | None = None
    stage: str = "planned"
    before: dict = field(default_factory=dict)
    result: dict | None = None
    unreachable: str | None = None
    last_failure: str | None = None
    gates: dict = field(default_factory=dict)  # instance -> text of its last gate

    @property
    def status(self) -> str:
        if self.result:
            return self.result["status"]
        if self.unreachable:
            return "unreachable"
        if self.batch is None:
            return "not_started"
        return "failed"

    def entry(self) -> dict:
        result = self.result or {}
        seconds = result.get("stage_seconds") or {}
        return {
            "host": self.name,
            "job": self.job,
            "batch": self.batch,
            "canary": self.batch == 1,
            "status": self.status,
            "rolled_back": bool(result.get("rolled_back")),
            "before": result.get("before") or self.before,
            "after": result.get("after") or (self.before if self.status in ("not_started", "unreachable") else {}),
            "stage_seconds": seconds,
            "host_seconds": round(sum(seconds.values()), 1),
            "gate": result.get("gate") or {},
            "rollback_gate": result.get("rollback_gate") or {},
            "reason": result.get("reason") or self.unreachable or (self.last_failure if not result else None),
        }


def _short_release(release: str | None) -> str:
    """A release id's content hash (its last field), enough to tell releases apart in a table."""
    return str(release).rsplit("-", 1)[-1] if release else "-"


def _gate_text(gate: dict) -> str:
    parts = []
    for name, figures in sorted((gate or {}).items()):
        chat, ttft = figures.get("chat_s"), figures.get("ttft_s")
        parts.append(
            f"{name}: chat {chat if chat is not None else '-'}s, first token {ttft if ttft is not None else '-'}s"
        )
    return "; ".join(parts) or "-"


class Rollout:
    """The state of a rollout, built from ansible-runner events only (``handle`` takes each one)."""

    title = "rollout"

    def __init__(self, rollout_id: str = "", clock=time.time):
        self.id = rollout_id
        self.clock = clock
        self.started = clock()
        self.finished: float | None = None
        self.hosts: dict[str, HostState] = {}
        self.batches: list[list[str]] = []
        self.runner_rc: int | None = None
        self.runner_status: str | None = None
        self.stats: dict = {}
        self.events = 0

    def host(self, name: str) -> HostState:
        if name not in self.hosts:
            self.hosts[name] = HostState(name)
        return self.hosts[name]

    def handle(self, event: dict) -> list[str]:
        """Take one event; the changes worth showing, as lines."""
        self.events += 1
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        name = data.get("host")
        res = data.get("res") or {}
        facts = res.get("ansible_facts") if isinstance(res, dict) else None
        facts = facts or {}
        lines: list[str] = []
        if kind == "runner_on_ok":
            if "rollout_plan" in facts:
                plan = facts["rollout_plan"]
                state = self.host(plan.get("host") or name)
                state.job, state.before = plan.get("job"), plan.get("before") or {}
                serving = _short_release(state.before.get("runtime"))
                lines.append(f"{state.name}: planned ({state.job}), serving runtime {serving}")
            if "rollout__batches_seen" in facts:
                seen = [list(batch) for batch in facts["rollout__batches_seen"]]
                for batch in seen[len(self.batches) :]:
                    number = len(self.batches) + 1
                    self.batches.append(batch)
                    for member in batch:
                        self.host(member).batch = number
                        self.host(member).stage = "queued"
                    what = "canary" if number == 1 else "batch"
                    lines.append(f"{what} {number}: {', '.join(batch)}")
            if "rollout__stage" in facts and name:
                state = self.host(name)
                state.stage = facts["rollout__stage"]
                lines.append(f"{name}: {state.stage}")
            if "rollout_result" in facts:
                result = facts["rollout_result"]
                state = self.host(result.get("host") or name)
                state.result = result
                state.stage = result["status"]
                lines.append(self._result_line(state))
            if data.get("task_action", "").endswith("vllm_endpoint") and name:
                instance = data.get("task", "").rsplit(" ", 1)[-1]
                text = f"gate ok: chat {res.get('chat_s')}s ttft {res.get('ttft_s')}s"
                self.host(name).gates[instance] = text
                lines.append(f"{name}: {instance} {text}")
        elif kind == "runner_on_failed" and name:
            state = self.host(name)
            msg = " ".join(str(res.get("msg", "")).split())[:300]
            if data.get("task_action", "").endswith("vllm_endpoint"):
                instance = data.get("task", "").rsplit(" ", 1)[-1]
                state.gates[instance] = f"gate FAILED ({res.get('kind', '?')})"
                lines.append(f"{name}: {instance} gate FAILED ({res.get('kind', '?')}): {msg[:160]}")
            elif data.get("task") != "Rollout | Verdict":
                state.last_failure = f"{data.get('task', '?')}: {msg}"
        elif kind == "runner_on_unreachable" and name:
            state = self.host(name)
            state.unreachable = (
                f"unreachable at {data.get('task', '?')}: {' '.join(str(res.get('msg', '')).split())[:300]}"
            )
            lines.append(f"{name}: {state.unreachable}")
        elif kind == "playbook_on_stats":
            self.stats = {k: data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "rescued", "skipped")}
        return lines

    def _result_line(self, state: HostState) -> str:
        r = state.result or {}
        before, after = (r.get("before") or {}).get("runtime"), (r.get("after") or {}).get("runtime")
        line = f"{state.name}: {r['status']} (runtime {_short_release(before)} -> {_short_release(after)})"
        if r.get("reason"):
            line += f": {r['reason'][:200]}"
        return line

    def finish(self, rc: int | None, status: str | None) -> None:
        self.finished = self.clock()
        self.runner_rc, self.runner_status = rc, status

    def stopped(self) -> str | None:
        """Why hosts were never started: a failed canary, a batch over max_fail_percentage, or a run that died."""
        waiting = [h for h in self.hosts.values() if h.status == "not_started"]
        if not waiting:
            return None
        first = self.batches[0] if self.batches else []
        if first and all(self.host(h).status not in OK for h in first):
            return f"the canary {', '.join(first)} failed: no other host was touched"
        return "a batch failed more than rollout_max_fail_percentage allows, or the run stopped"

    def report(self) -> dict:
        order = sorted(self.hosts.values(), key=lambda h: (h.batch is None, h.batch or 0, h.name))
        hosts = [state.entry() for state in order]
        for entry in hosts:
            # tasks that changed something on the host, over the whole run (Ansible's recap)
            entry["changed_tasks"] = (self.stats.get("changed") or {}).get(entry["host"], 0) if self.stats else None
        counts = {status: sum(1 for h in hosts if h["status"] == status) for status in STATUSES}
        ok = bool(hosts) and all(h["status"] in OK for h in hosts)
        wall = round((self.finished or self.clock()) - self.started, 1)
        return {
            "rollout": self.id,
            "started": datetime.datetime.fromtimestamp(self.started, datetime.UTC).isoformat(),
            "wall_seconds": wall,
            "host_seconds_sum": round(sum(h["host_seconds"] for h in hosts), 1),
            "runner": {"rc": self.runner_rc, "status": self.runner_status, "events": self.events},
            "batches": self.batches,
            "canary": self.batches[0][0] if self.batches and self.batches[0] else None,
            "stopped": self.stopped(),
            "counts": {k: v for k, v in counts.items() if v},
            "ok": ok,
            "exit_code": exit_code(hosts, self.runner_rc),
            "hosts": hosts,
        }


def exit_code(hosts: list[dict], runner_rc: int | None) -> int:
    if not hosts:
        return 2
    if all(h["status"] in OK for h in hosts) and runner_rc in (0, None):
        return 0
    return 1


def summary_table(report: dict) -> str:
    """The human summary: one row per host (versions before and after, steps, gate, rolled back or not)."""
    rows = [
        (
            "host",
            "batch",
            "status",
            "runtime before -> after",
            "models before -> after",
            "steps (s)",
            "gate",
            "rolled back",
        )
    ]
    for h in report["hosts"]:
        before, after = h.get("before") or {}, h.get("after") or {}

        def commits(v):
            return ",".join(
                f"{n}@{(i.get('commit') or '-')[:8]}" for n, i in sorted((v.get("instances") or {}).items())
            )

        steps = " ".join(f"{k} {v}" for k, v in (h.get("stage_seconds") or {}).items()) or "-"
        gate = _gate_text(h.get("rollback_gate") if h.get("rolled_back") else h.get("gate"))
        rows.append(
            (
                h["host"] + (" (canary)" if h.get("canary") else ""),
                str(h.get("batch") or "-"),
                h["status"],
                f"{_short_release(before.get('runtime'))} -> {_short_release(after.get('runtime'))}",
                f"{commits(before) or '-'} -> {commits(after) or '-'}",
                steps,
                gate,
                "yes" if h.get("rolled_back") else "no",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = ", ".join(f"{v} {k}" for k, v in report["counts"].items()) or "no host"
    tail = [
        "",
        f"rollout {report['rollout']}: {counts}; wall {report['wall_seconds']}s against "
        f"{report['host_seconds_sum']}s of host time; exit {report['exit_code']}",
    ]
    if report.get("stopped"):
        tail.append(f"stopped: {report['stopped']}")
    for h in report["hosts"]:
        if h.get("reason") and h["status"] not in OK:
            tail.append(f"{h['host']}: {h['reason']}")
    return "\n".join(lines + tail)


class PlainDisplay:
    """One line per change, with the time since the start (logs, CI, pipes)."""

    def __init__(self, rollout: Rollout, out=sys.stdout):
        self.rollout, self.out = rollout, out

    def show(self, lines: list[str]) -> None:
        for line in lines:
            print(f"[{self.rollout.clock() - self.rollout.started:7.1f}s] {line}", file=self.out, flush=True)

    def close(self) -> None:
        pass


class LiveDisplay:
    """A table redrawn in place on a terminal: batch, host, step, last gate, result."""

    def __init__(self, rollout: Rollout, out=sys.stdout):
        self.rollout, self.out = rollout, out
        self.drawn = 0
        self.last = ""

    def show(self, lines: list[str]) -> None:
        if lines:
            self.last = lines[-1]
        self.draw()

    def draw(self) -> None:
        r = self.rollout
        elapsed = r.clock() - r.started
        rows = [f"{r.title} {r.id}  batch {len(r.batches)}  {elapsed:6.0f}s  {self.last[:100]}"]
        for state in r.hosts.values():
            gate = "; ".join(f"{k}: {v}" for k, v in sorted(state.gates.items())) or "-"
            rb = " rolled back" if (state.result or {}).get("rolled_back") else ""
            rows.append(f"  {state.name:<16} batch {state.batch or '-':<3} {state.stage:<14} {gate[:60]:<60}{rb}")
        if self.drawn:
            self.out.write(f"\x1b[{self.drawn}F")
        for row in rows:
            self.out.write("\x1b[2K" + row[:200] + "\n")
        self.out.flush()
        self.drawn = len(rows)

    def close(self) -> None:
        self.draw()


def utc_id() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")


def write_report(report: dict, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    json_path, text_path = folder / "report.json", folder / "summary.txt"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    text_path.write_text(summary_table(report) + "\n")
    return json_path, text_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--inventory", action="append", default=[], help="inventory (repeatable)")
    parser.add_argument("-l", "--limit", help="host pattern (as ansible-playbook -l)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], help="JSON or key=value (repeatable)")
    parser.add_argument("--batches", help="serial batches, the first one the canary: e.g. 1,10%%,50%%,100%%")
    parser.add_argument("--max-fail-percentage", type=int, help="stop after a batch where more hosts failed (0-99)")
    parser.add_argument("--check", action="store_true", help="a dry run (Ansible's check mode)")
    # reports/ of the current folder (./rigops runs from the checkout), not of ROOT: from an installed
    # collection that is inside the collection
    parser.add_argument("--report-dir", type=Path, default=Path("reports") / "rollout", help="default reports/rollout")
    parser.add_argument("--plain", action="store_true", help="one line per change even on a terminal")
    parser.add_argument("--save-events", type=Path, help="write the events it reads as JSON lines to this file")
    parser.add_argument("--playbook", type=Path, default=PLAYBOOK, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def given_vars(texts: list[str]) -> dict:
    """-e arguments as ansible-playbook reads them: JSON, @FILE (JSON) or key=value pairs (text)."""
    out: dict = {}
    for text in texts:
        text = text.strip()
        if text.startswith("@"):
            out.update(json.loads(Path(text[1:]).read_text()))
        elif text.startswith("{"):
            out.update(json.loads(text))
        else:
            for pair in text.split():
                key, _sep, value = pair.partition("=")
                out[key] = value
    return out


def extra_vars(args: argparse.Namespace, rollout_id: str) -> dict:
    out: dict = {"rollout_id": rollout_id, **given_vars(args.extra_vars)}
    if args.batches:
        out["rollout_batches"] = [int(b) if b.strip().isdigit() else b.strip() for b in args.batches.split(",")]
    if args.max_fail_percentage is not None:
        out["rollout_max_fail_percentage"] = args.max_fail_percentage
    return out


def run(args: argparse.Namespace, out=sys.stdout) -> int:
    import ansible_runner  # noqa: PLC0415 (the production venv has it; --help works without)

    rollout_id = utc_id()
    rollout = Rollout(rollout_id)
    live = out.isatty() and not args.plain and os.environ.get("TERM") != "dumb"
    display = LiveDisplay(rollout, out) if live else PlainDisplay(rollout, out)
    saved = args.save_events.open("w") if args.save_events else None

    def on_event(event: dict) -> bool:
        if saved and event.get("event") in SAVED_EVENTS:
            saved.write(json.dumps(event, default=str) + "\n")
        display.show(rollout.handle(event))
        return False  # the events live in our report, not in the runner's artifacts

    # ansible-playbook of the same virtualenv as this Python (./rigops puts it first in PATH too)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    inventories = [str(Path(i).resolve()) for i in args.inventory] or None
    with tempfile.TemporaryDirectory(prefix="rigops-rollout-") as private:
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(ROOT),
            playbook=str(args.playbook.resolve()),
            inventory=inventories,
            limit=args.limit,
            extravars=extra_vars(args, rollout_id),
            cmdline="--check" if args.check else None,
            # the checkout's ansible.cfg; an installed collection has none (the user's own applies)
            envvars={"ANSIBLE_FORCE_COLOR": "0", **({"ANSIBLE_CONFIG": str(CONFIG)} if CONFIG.exists() else {})},
            event_handler=on_event,
            quiet=True,
        )
    if saved:
        saved.close()
    rollout.finish(result.rc, result.status)
    display.close()
    report = rollout.report()
    json_path, _summary = write_report(report, args.report_dir / rollout_id)
    print(summary_table(report), file=out)
    print(f"Report: {json_path}", file=out)
    return report["exit_code"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("rollout interrupted: hosts of the batch under way may be half-way; rerun it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
