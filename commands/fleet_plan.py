#!/usr/bin/env python
"""Estimate a rollout's wall time and the controller's load for N devices (a plan, not a measurement).

    ./rigops python commands/fleet_plan.py [--devices 10,100,1000] [--forks N] [--batches 1,10%,50%,100%]
        [--connection ssh|mitogen] [--model-gb GB] [--cache-gbps GBIT] [--caches-per-site N] [--sites N]
        [--device-gbps GBIT] [--peers] [--peer-gbps GBIT] [--tasks-per-host N] [--cpu-per-task S]
        [--mem-per-fork MB] [--controller-cores N]
        [--controller-memory-gb GB] [--inputs PATH] [--json | --markdown]

Measured figures come from the project's measurements (docs/measurements.yml: value, unit, the
command that measured it, its date); everything else is an option, printed as "assumed". The model, for
playbooks/rollout.yml under Ansible's linear strategy (docs/fleet-scale.md):

- batches: the devices split as Ansible splits `serial` (--batches, as commands/rollout.py takes it);
- a board's step: its own work (the measured canary's time less its tasks' SSH cost) + tasks x the
  connection's cost per task + its model pull; a batch runs in waves of --forks boards;
- model pull: the boards pulling at once share their site's caches (--caches-per-site x
  --cache-gbps), no faster than one board's measured cache throughput (cache_pull) when known nor
  than its link (--device-gbps); with --peers, the boards of the site that finished in earlier
  batches serve it too, each at --peer-gbps (default: the device link), and the caches still
  send the hub's bytes once;
- controller CPU: tasks x CPU-seconds per task (measured on the main job's no-op reruns for the
  connection when the measurements have it, else 0.25 CPU per busy fork); a batch lasts at least
  its CPU-seconds / cores;
- the plan play before the batches: the measured rollout's time outside its batches, per wave;
- the limit that binds: the one whose removal (forks = devices, unlimited cache or CPU, free
  tasks, boards that do their own work instantly, unlimited board downloads) shortens the
  estimate most; controller memory (forks x memory per fork) over the controller's binds first.
"""

from __future__ import annotations

import argparse
import configparser
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ROOT / "docs" / "measurements.yml"
ANSIBLE_CFG = ROOT / "ansible.cfg"
SERIAL = (1, "10%", "50%", "100%")  # playbooks/rollout.yml's default rollout_batches
BATCHES = ",".join(str(b) for b in SERIAL)
CONNECTIONS = ("ssh", "mitogen")
FIELDS = ("value", "unit", "command", "date")
# the measured figures the estimate needs, and the benchmark that measures each
REQUIRED = {
    "task_cost_ssh_1_host": "lab/measure/connection_cost.py",
    "task_cost_mitogen_1_host": "lab/measure/connection_cost.py",
    "rollout_wall": "lab/measure/rollout.py",
    "rollout_canary_board": "lab/measure/rollout.py",
    "rollout_batch2_slowest": "lab/measure/rollout.py",
}
CACHE_PULL = "cache_pull"
# The controller's CPU per task per host, measured: the main job's no-op reruns (lab/measure/main_job.py)
# record the controller's CPU-seconds for N rigs over each connection and the host tasks per rig.
MAIN_JOB_TASKS = "main_job_host_tasks_per_rig"
MAIN_JOB_CPU = {
    "ssh": re.compile(r"main_job_noop_rerun_cpu_controller_(\d+)_rigs"),
    "mitogen": re.compile(r"main_job_noop_rerun_mitogen_cpu_controller_(\d+)_rigs"),
}
# Assumptions: no benchmark of this repository measures them (the CPU one only while the main job's are
# missing). Red Hat's automation controller estimates one fork of Ansible at 0.25 CPU and 100 MB
# (SYSTEM_TASK_FORKS_CPU, SYSTEM_TASK_FORKS_MEM).
CPU_PER_BUSY_FORK = 0.25
MEM_PER_FORK_MB = 100.0
TASKS_PER_HOST = 120
MODEL_GB = 18.0  # a 9B model in bf16
CACHE_GBPS = 10.0  # one 10 GbE link per cache
CONTROLLER_CORES = 8.0
CONTROLLER_MEMORY_GB = 16.0
BOARD_TIME = "board time"
ADVICE = {
    "controller memory": "fewer forks per controller, or one controller per site (an automation controller "
    "driving ansible-runner on each)",
    "cache bandwidth": "peer-assisted distribution (--peers), more caches per site (--caches-per-site) or faster "
    "cache links; stage the weights before the rollout",
    "forks": "raise forks (each ~0.25 CPU and ~100 MB on the controller); strategy: free so a board does not "
    "wait for the slowest of its wave",
    "controller CPU": "mitogen (--connection mitogen), more cores, or one controller per site (an automation "
    "controller driving ansible-runner on each)",
    "per-task cost": "mitogen (--connection mitogen), or fewer tasks per host",
    "board download": "the boards' own links: more caches or peers do not help; stage the weights before the rollout",
    BOARD_TIME: "nothing on the controller: fewer batches after the canary, or a shorter step on the boards",
}
# what to do when mitogen is on already
ADVICE_MITOGEN = {
    "controller CPU": "more cores, or one controller per site (an automation controller driving ansible-runner "
    "on each)",
    "per-task cost": "fewer tasks per host (mitogen is on already)",
}


def ansible_settings(path: Path = ANSIBLE_CFG) -> tuple[int, float]:
    """forks and ControlPersist (seconds) of the project's ansible.cfg; Ansible's defaults (5, 60 s) otherwise."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(path)
    forks = cfg.getint("defaults", "forks", fallback=5)
    match = re.search(r"ControlPersist=(\d+)([smh]?)", cfg.get("ssh_connection", "ssh_args", fallback=""))
    persist = 60.0
    if match:
        persist = int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    return forks, float(persist)


FORKS, CONTROL_PERSIST_S = ansible_settings()


class InputError(Exception):
    """A measured input is missing, not measured yet, or malformed."""


@dataclass(frozen=True)
class Plan:
    """What is planned: the fleet, the rollout's settings, and the assumptions."""

    devices: int
    serial: tuple = SERIAL
    forks: int = FORKS
    connection: str = "ssh"
    model_gb: float = MODEL_GB
    cache_gbps: float = CACHE_GBPS
    caches_per_site: int = 1
    sites: int = 1
    device_gbps: float | None = None  # a board's link; None: only the measured cache pull caps a pull
    peers: bool = False  # boards of earlier batches serve the model to later ones on their site
    peer_gbps: float | None = None  # what a peer sends; None: the device link (else the cache pull, the cache link)
    tasks_per_host: int = TASKS_PER_HOST
    cpu_per_task: float | None = None  # None: CPU_PER_BUSY_FORK x the connection's seconds per task
    mem_per_fork_mb: float = MEM_PER_FORK_MB
    controller_cores: float = CONTROLLER_CORES
    controller_memory_gb: float = CONTROLLER_MEMORY_GB
    control_persist_s: float = CONTROL_PERSIST_S


@dataclass(frozen=True)
class Measured:
    """The measured figures the estimate uses, for one connection."""

    task_s: float  # seconds per task per host over the plan's connection (1 host)
    board_s: float  # a board's own work in a rollout step (the canary's time less its tasks' SSH cost)
    outside_s: float  # the measured rollout's time outside its batches (plan play, start-up): one wave
    host_gbps: float | None  # one board's throughput from a cache; None: not measured yet
    cpu_task: float | None = None  # the controller's CPU-s per task per host, measured; None: not measured


# --------------------------------------------------------------------------- batches


def parse_batches(text: str) -> list[int | str]:
    """--batches as commands/rollout.py passes it to the playbook (``1,10%,100%`` -> [1, '10%', '100%']), checked."""
    serial = [int(b) if b.strip().isdigit() else b.strip() for b in text.split(",")]
    for entry in serial:
        if isinstance(entry, int):
            ok = entry >= 1
        else:
            match = re.fullmatch(r"(\d+)%", entry)
            ok = bool(match) and 1 <= int(match.group(1)) <= 100
        if not ok:
            raise ValueError(f"{entry!r}: each batch is a host count of at least 1 or a percentage 1%-100%")
    if serial[0] != 1:
        raise ValueError(f"the first batch is the canary, one host (got {serial[0]!r}), e.g. 1,10%,50%,100%")
    return serial


def split_batches(devices: int, serial: list[int | str] | tuple) -> list[int]:
    """Batch sizes as Ansible's ``serial`` splits ``devices`` hosts: the last entry repeats until all are done."""
    sizes: list[int] = []
    left, item = devices, 0
    while left > 0:
        entry = serial[item]
        if isinstance(entry, str) and entry.endswith("%"):
            size = int(int(entry[:-1]) / 100.0 * devices) or 1
        else:
            size = int(entry)
        if size <= 0:
            sizes.append(left)
            break
        sizes.append(min(size, left))
        left -= sizes[-1]
        item = min(item + 1, len(serial) - 1)
    return sizes


# --------------------------------------------------------------------------- inputs


def load_inputs(path: Path) -> dict[str, dict]:
    """The measured figures of an inputs file, each checked to have value, unit, command and date."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read the inputs: {exc}") from exc
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a mapping of figures")
    for key, entry in data.items():
        missing = [f for f in FIELDS if not isinstance(entry, dict) or f not in entry]
        if missing:
            raise InputError(f"{path}: {key}: needs value, unit, command and date (missing: {', '.join(missing)})")
        if not isinstance(entry["command"], str) or not entry["command"].strip():
            raise InputError(f"{path}: {key}: command must be the command that measured it")
        value = entry["value"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise InputError(f"{path}: {key}: value must be a number >= 0 or null (got {value!r})")
    return data


def figure(inputs: dict[str, dict], key: str) -> float:
    """A measured value; InputError when the file lacks it or it is not measured yet."""
    if key not in inputs:
        where = REQUIRED.get(key, "a benchmark")
        raise InputError(f"{key}: missing from the inputs file (measure it with {where}; see docs/fleet-scale.md)")
    if inputs[key]["value"] is None:
        raise InputError(f"{key}: not measured yet (run {inputs[key]['command']})")
    return float(inputs[key]["value"])


def cache_pull(inputs: dict[str, dict]) -> float | None:
    """One board's measured throughput from a cache (Gbit/s); None while it is not measured."""
    entry = inputs.get(CACHE_PULL)
    if not entry or entry["value"] is None:
        return None
    if not str(entry["unit"]).startswith("Gbit/s") or not entry["value"] > 0:
        raise InputError(f"{CACHE_PULL}: a value > 0 in Gbit/s per host (got {entry['value']!r} {entry['unit']!r})")
    return float(entry["value"])


def controller_cpu(inputs: dict[str, dict], connection: str) -> tuple[float | None, list[str]]:
    """The controller's CPU-seconds per task per host over ``connection``, measured: the most of the main
    job's no-op reruns (controller CPU over N rigs x host tasks per rig; the 1-rig run carries the play's
    own start-up, so the most errs towards a busier controller), with the keys it read; (None, []) while
    the measurements have none."""
    tasks = (inputs.get(MAIN_JOB_TASKS) or {}).get("value")
    if not tasks:
        return None, []
    per_task = {}
    for key, entry in inputs.items():
        match = MAIN_JOB_CPU[connection].fullmatch(key)
        if match and entry["value"]:
            per_task[key] = entry["value"] / (int(match.group(1)) * tasks)
    if not per_task:
        return None, []
    return round(max(per_task.values()), 3), [*per_task, MAIN_JOB_TASKS]


def _what(entry: dict) -> str:
    """What a figure is, when the measurements file says (its `what`)."""
    return f" ({entry['what']})" if entry.get("what") else ""


def cache_pull_note(inputs: dict[str, dict]) -> str:
    """What the estimate knows about one board's pull from a cache."""
    entry = inputs.get(CACHE_PULL)
    if not entry:
        return f"cache pull: not in the inputs file (add {CACHE_PULL}: measured with lab/measure/model_weights.py)"
    if entry["value"] is None:
        return f"cache pull: not measured yet (run {entry['command']})"
    return f"cache pull: {entry['value']} {entry['unit']}{_what(entry)} [{entry['command']}, {entry['date']}]"


def measured(inputs: dict[str, dict], connection: str, tasks_per_host: int) -> Measured:
    """The figures for one connection. The measured rollout ran over SSH: its canary's time less
    tasks x SSH's cost per task is the board's own work."""
    if connection not in CONNECTIONS:
        raise InputError(f"connection {connection!r}: one of {', '.join(CONNECTIONS)}")
    ssh = figure(inputs, "task_cost_ssh_1_host")
    canary = figure(inputs, "rollout_canary_board")
    board = canary - tasks_per_host * ssh
    if board < 0:
        raise ValueError(
            f"--tasks-per-host {tasks_per_host} x {ssh} s per task over SSH ({tasks_per_host * ssh:.1f} s) is more "
            f"than the measured canary's {canary} s: at most {int(canary / ssh)}"
        )
    outside = figure(inputs, "rollout_wall") - canary - figure(inputs, "rollout_batch2_slowest")
    return Measured(
        task_s=figure(inputs, f"task_cost_{connection}_1_host"),
        board_s=round(board, 3),
        outside_s=round(max(outside, 0.0), 3),
        host_gbps=cache_pull(inputs),
        cpu_task=controller_cpu(inputs, connection)[0],
    )


# --------------------------------------------------------------------------- the estimate


def cpu_per_task(plan: Plan, m: Measured) -> float:
    """Controller CPU-seconds per task per host: the option, else the measured figure, else 0.25 CPU per busy
    fork x seconds per task."""
    if plan.cpu_per_task is not None:
        return plan.cpu_per_task
    return m.cpu_task if m.cpu_task is not None else CPU_PER_BUSY_FORK * m.task_s


def device_cap(plan: Plan, m: Measured) -> float:
    """The most one board's pull carries: its link and the measured cache pull, whichever is lower."""
    caps = [c for c in (plan.device_gbps, m.host_gbps) if c]
    return min(caps) if caps else math.inf


def peer_rate(plan: Plan, m: Measured) -> float:
    """What one peer sends to the boards of later batches (Gbit/s)."""
    return plan.peer_gbps or plan.device_gbps or m.host_gbps or plan.cache_gbps


def estimate(plan: Plan, m: Measured) -> dict:
    """The rollout of ``plan.devices`` boards: wall time, pull time, controller CPU, connections, memory."""
    sizes = split_batches(plan.devices, plan.serial)
    tasks, cpu_task = plan.tasks_per_host, cpu_per_task(plan, m)
    model_gbit = plan.model_gb * 8
    wall = m.outside_s * math.ceil(plan.devices / plan.forks)  # the plan play visits every board first
    pull_total = cpu_total = by_peers = 0.0
    done = 0
    for size in sizes:
        waves = math.ceil(size / plan.forks)
        pulling_per_site = math.ceil(min(size, plan.forks) / plan.sites)
        caches = plan.caches_per_site * plan.cache_gbps
        # the boards of earlier batches on the site, each verified what it serves (the boards spread evenly)
        peers = (done // plan.sites) * peer_rate(plan, m) if plan.peers else 0.0
        rate = min((caches + peers) / pulling_per_site, device_cap(plan, m))
        pull = model_gbit / rate if model_gbit else 0.0
        board = m.board_s + tasks * m.task_s + pull
        cpu = size * tasks * cpu_task
        wall += max(waves * board, cpu / plan.controller_cores)
        pull_total += waves * pull
        cpu_total += cpu
        by_peers += size * peers / (caches + peers)  # each source sends its share of what is pulled
        done += size
    if plan.connection == "mitogen":
        peak = plan.devices  # ansible_mitogen keeps one connection per host until the run ends
    else:
        # a ControlPersist master stays open control_persist_s after a host's last task: the plan
        # play keeps every host's open when one task goes round the fleet faster than that
        in_window = plan.forks * plan.control_persist_s / m.task_s if m.task_s else plan.devices
        # (and so the previous batch's masters, while the next batch opens its own)
        batches = max(a + b for a, b in zip([0, *sizes], sizes, strict=False)) if plan.control_persist_s else max(sizes)
        peak = min(plan.devices, max(batches, math.ceil(in_window)))
    return {
        "devices": plan.devices,
        "batches": sizes,
        "forks": plan.forks,
        "connection": plan.connection,
        "wall_s": round(wall, 1),
        "pull_s": round(pull_total, 1),
        "cpu_s": round(cpu_total, 1),
        "peak_ssh": peak,
        "memory_gb": round(min(plan.forks, plan.devices) * plan.mem_per_fork_mb / 1024, 2),
        "hosts_per_cache": math.ceil(plan.devices / (plan.sites * plan.caches_per_site)),
        # the model's bytes the boards got from peers, over all they pulled; None without --peers
        "peer_share": round(by_peers / plan.devices, 3) if plan.peers else None,
    }


def relaxed(plan: Plan, m: Measured) -> dict[str, tuple[Plan, Measured]]:
    """The plan with each limit removed in turn (board time: boards that do their own work instantly)."""
    out = {
        BOARD_TIME: (plan, replace(m, board_s=0.0)),
        "forks": (replace(plan, forks=plan.devices), m),
        "cache bandwidth": (replace(plan, cache_gbps=math.inf), m),
        "controller CPU": (replace(plan, controller_cores=math.inf), m),
        # the connection's latency only: the controller's CPU per task stays what it was
        "per-task cost": (replace(plan, cpu_per_task=cpu_per_task(plan, m)), replace(m, task_s=0.0)),
    }
    if device_cap(plan, m) < math.inf:
        out["board download"] = (replace(plan, device_gbps=None), replace(m, host_gbps=None))
    return out


def binding(plan: Plan, m: Measured) -> tuple[str, dict[str, float]]:
    """The limit that binds, and the seconds removing each limit would save."""
    wall = estimate(plan, m)["wall_s"]
    savings = {name: round(wall - estimate(p, mm)["wall_s"], 1) for name, (p, mm) in relaxed(plan, m).items()}
    if min(plan.forks, plan.devices) * plan.mem_per_fork_mb / 1024 > plan.controller_memory_gb:
        return "controller memory", savings
    return max(savings, key=savings.get), savings


def plan_rows(plans: list[Plan], m: Measured) -> list[dict]:
    """One row per plan: the estimate, the limit that binds, what to do then."""
    rows = []
    for plan in plans:
        row = estimate(plan, m)
        row["binds"], row["savings_s"] = binding(plan, m)
        advice = ADVICE_MITOGEN if plan.connection == "mitogen" else {}
        row["then"] = advice.get(row["binds"], ADVICE[row["binds"]])
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- output


def duration(seconds: float) -> str:
    """1234.5 -> '20m 35s'; hours above an hour."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


HEADERS = (
    "devices",
    "batches",
    "forks",
    "est. wall",
    "model pull",
    "controller CPU-s",
    "peak SSH conns",
    "controller memory",
    "hosts/cache",
    "by peers",
    "limit that binds",
)


def cells(row: dict) -> list[str]:
    return [
        str(row["devices"]),
        "+".join(str(b) for b in row["batches"]),
        str(row["forks"]),
        duration(row["wall_s"]),
        duration(row["pull_s"]),
        f"{row['cpu_s']:.0f}",
        str(row["peak_ssh"]),
        f"{row['memory_gb']:.1f} GB",
        str(row["hosts_per_cache"]),
        "-" if row["peer_share"] is None else f"{row['peer_share']:.0%}",
        row["binds"],
    ]


def notes(plan: Plan, m: Measured, inputs: dict[str, dict], inputs_path: Path) -> list[str]:
    """What the estimate rests on: measured figures with their commands, and the assumptions."""
    task_key = f"task_cost_{plan.connection}_1_host"
    used = [task_key, "task_cost_ssh_1_host", "rollout_canary_board", "rollout_wall", "rollout_batch2_slowest"]
    shown = inputs_path.resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
    lines = [f"measured ({shown}):"]
    for key in dict.fromkeys(used):
        e = inputs[key]
        lines.append(f"  {key} = {e['value']} {e['unit']}{_what(e)} [{e['command']}, {e['date']}]")
    lines.append(
        f"  derived: a board's own work {m.board_s:.1f} s (canary less tasks x SSH cost), the rollout's time "
        f"outside its batches {m.outside_s:.1f} s (wall less canary less batch 2's slowest)"
    )
    lines.append(cache_pull_note(inputs))
    cpu_value, cpu_keys = controller_cpu(inputs, plan.connection)
    if cpu_value is not None:
        e = inputs[cpu_keys[0]]
        sizes = ",".join(MAIN_JOB_CPU[plan.connection].fullmatch(k).group(1) for k in cpu_keys[:-1])
        key = MAIN_JOB_CPU[plan.connection].pattern.replace("(\\d+)", "{" + sizes + "}")
        lines.append(
            f"controller CPU: {cpu_value} CPU-s per task per host over {plan.connection}, the most of the main job's "
            f"no-op reruns ({key} over N rigs x {MAIN_JOB_TASKS}; --cpu-per-task sets another) "
            f"[{e['command']}, {e['date']}]"
        )
    if m.host_gbps is None and plan.device_gbps is None:
        lines.append(
            f"  so a pull is limited only by the site's caches: --cache-gbps {plan.cache_gbps:g} Gbit/s per cache "
            "(assumed), shared evenly by the boards pulling at once"
        )
    if plan.cpu_per_task is None and m.cpu_task is not None:
        cpu = None  # measured, above
    elif plan.cpu_per_task is None:
        cpu = (
            f"{cpu_per_task(plan, m):.3f} CPU-s per task per host (--cpu-per-task; 0.25 CPU per busy fork, "
            f"automation controller's default, x {m.task_s} s per task)"
        )
    else:
        cpu = f"{plan.cpu_per_task} CPU-s per task per host (--cpu-per-task)"
    lines += [
        "assumed (options, not measured):",
        f"  model {plan.model_gb:g} GB pulled by every board (--model-gb; 0: a runtime-only rollout)",
        f"  cache link {plan.cache_gbps:g} Gbit/s per cache (--cache-gbps), {plan.caches_per_site} cache(s) per "
        f"site (--caches-per-site), {plan.sites} site(s) (--sites)",
        f"  a board's link: {f'{plan.device_gbps:g} Gbit/s' if plan.device_gbps else 'not limited'} (--device-gbps)",
        (
            f"  peers: each board that finished an earlier batch serves the model to its site's later batches at "
            f"{peer_rate(plan, m):g} Gbit/s (--peers, --peer-gbps); the caches still fetch each file from the hub once"
            if plan.peers
            else "  peers: none (--peers: boards of earlier batches serve the model to later ones)"
        ),
        f"  {plan.tasks_per_host} tasks per host in a rollout (--tasks-per-host)",
        *([f"  controller: {cpu}"] if cpu else []),
        f"  controller: {plan.mem_per_fork_mb:g} MB per fork (--mem-per-fork; automation controller's default), "
        f"{plan.controller_cores:g} cores (--controller-cores), {plan.controller_memory_gb:g} GB "
        "(--controller-memory-gb)",
        f"settings: forks {plan.forks} (ansible.cfg: {FORKS}), ControlPersist {plan.control_persist_s:g} s "
        f"(ansible.cfg), batches {','.join(str(b) for b in plan.serial)}, connection {plan.connection}",
    ]
    return lines


def weights(row: dict) -> str:
    """The time the two heaviest limits cost, as ' (saved without: forks 1h 30m, ...)'."""
    top = sorted(row["savings_s"].items(), key=lambda kv: -kv[1])[:2]
    parts = [f"{name} {duration(saved)}" for name, saved in top if saved > 0]
    return f" (saved without: {', '.join(parts)})" if parts else ""


def format_text(rows: list[dict], lines: list[str]) -> str:
    table = [list(HEADERS)] + [cells(r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    out = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in table]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("")
    out += [f"{r['devices']} devices: {r['binds']} binds{weights(r)}; then: {r['then']}" for r in rows]
    return "\n".join(out + [""] + lines)


def format_markdown(rows: list[dict], lines: list[str]) -> str:
    out = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _header in HEADERS) + "|"]
    out += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    out.append("")
    out += [f"- {r['devices']} devices: **{r['binds']}** binds{weights(r)}; then: {r['then']}" for r in rows]
    out.append("")
    return "\n".join(out + ["```", *lines, "```"])


# --------------------------------------------------------------------------- command line


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return value


def _number(minimum: float, strict: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > minimum if strict else value >= minimum) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"{text!r}: a number {'>' if strict else '>='} {minimum:g}")
        return value

    return parse


def _devices(text: str) -> list[int]:
    return [_positive_int(n.strip()) for n in text.split(",")]


def _batches(text: str) -> list[int | str]:
    try:
        return parse_batches(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--devices", type=_devices, default=[10, 100, 1000], help="fleet sizes, one row each (default 10,100,1000)")
    add("--forks", type=_positive_int, default=FORKS, help=f"the controller's forks (default {FORKS}, ansible.cfg)")
    add("--batches", type=_batches, default=parse_batches(BATCHES), help=f"as ./rigops rollout (default {BATCHES})")
    add("--connection", choices=CONNECTIONS, default="ssh", help="SSH with pipelining (default) or mitogen")
    add("--model-gb", type=_number(0, False), default=MODEL_GB, help=f"assumed model size (default {MODEL_GB:g})")
    add("--cache-gbps", type=_number(0, True), default=CACHE_GBPS, help="assumed Gbit/s per cache (default 10)")
    add("--caches-per-site", type=_positive_int, default=1, help="fleet caches per site (default 1)")
    add("--sites", type=_positive_int, default=1, help="sites, the devices spread evenly (default 1)")
    add("--device-gbps", type=_number(0, True), help="assumed link of a board, Gbit/s (default: not limited)")
    add("--peers", action="store_true", help="boards of earlier batches serve the model to later ones on their site")
    add("--peer-gbps", type=_number(0, True), help="assumed Gbit/s a peer sends (default: --device-gbps)")
    add("--tasks-per-host", type=_positive_int, default=TASKS_PER_HOST, help="assumed (default 120)")
    add("--cpu-per-task", type=_number(0, False), help="controller CPU-s per task per host (default: measured)")
    add("--mem-per-fork", type=_number(0, True), default=MEM_PER_FORK_MB, help="assumed MB per fork (default 100)")
    add("--controller-cores", type=_number(0, True), default=CONTROLLER_CORES, help="assumed (default 8)")
    add("--controller-memory-gb", type=_number(0, True), default=CONTROLLER_MEMORY_GB, help="assumed (default 16)")
    add("--inputs", type=Path, default=INPUTS, help="measured figures (default docs/measurements.yml)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_argument("--markdown", action="store_true", help="a README-ready table")
    return parser.parse_args(argv)


def plans_from(args: argparse.Namespace) -> list[Plan]:
    return [
        Plan(
            devices=n,
            serial=tuple(args.batches),
            forks=args.forks,
            connection=args.connection,
            model_gb=args.model_gb,
            cache_gbps=args.cache_gbps,
            caches_per_site=args.caches_per_site,
            sites=args.sites,
            device_gbps=args.device_gbps,
            peers=args.peers,
            peer_gbps=args.peer_gbps,
            tasks_per_host=args.tasks_per_host,
            cpu_per_task=args.cpu_per_task,
            mem_per_fork_mb=args.mem_per_fork,
            controller_cores=args.controller_cores,
            controller_memory_gb=args.controller_memory_gb,
        )
        for n in args.devices
    ]


def main(argv: list[str] | None = None, out=None) -> int:
    args = parse_args(argv)
    out = out or sys.stdout
    try:
        inputs = load_inputs(args.inputs)
        m = measured(inputs, args.connection, args.tasks_per_host)
    except (InputError, ValueError) as exc:
        print(f"fleet_plan: {exc}", file=sys.stderr)
        return 2
    plans = plans_from(args)
    rows = plan_rows(plans, m)
    lines = notes(plans[0], m, inputs, args.inputs)
    if args.json:
        report = {
            "rows": rows,
            "measured": {k: {**v, "date": str(v["date"]) if v["date"] else None} for k, v in inputs.items()},
            "derived": asdict(m),
            "cache_pull": cache_pull_note(inputs),
            "plan": {k: v for k, v in asdict(plans[0]).items() if k != "devices"},
            "notes": lines,
        }
        print(json.dumps(report, indent=2), file=out)
    elif args.markdown:
        print(format_markdown(rows, lines), file=out)
    else:
        print(format_text(rows, lines), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
