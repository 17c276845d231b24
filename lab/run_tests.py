#!/usr/bin/env python3
"""Run every test of the project and print how long each step took.

    ./rigops test                      everything
    ./rigops test --only lint,unit     some stages (lint, unit, image, molecule, integration)
    ./rigops test --scenario sandbox   one Molecule scenario (repeatable)
    ./rigops test --lanes 1            the sandbox stages one after the other
    ./rigops test --keep-going         run the next steps after a failure

Stages: image (sandbox host image, cached by recipe) first; then, side by side, lint
(yamllint, ansible-lint profile production, ruff, and the collection's checks: COLLECTION_STEPS)
and the lanes: unit (pytest tests/unit, in two steps: see UNIT_OTHER_LANE)
and the sandbox stages: Molecule scenarios (each phase of Molecule's test sequence as read
from .config/molecule/config.yml or the scenario's own molecule.yml is a step; its destroy is
the command molecule/resources/destroy.yml runs, and the leading ones are one step before
the lanes) and integration (pytest tests/integration). Lint needs no host: it runs while the lanes'
first scenarios make theirs.

The sandbox stages and the unit tests run in two lanes at once (LANES): most of the
sandbox's time is spent waiting on hosts (package installs, reboots, vLLM loading a
model), so two lanes share the two cores better than one. Each step's output is printed
whole when the step ends. Lanes hold scenarios that do not share hosts.

The end of the output: why a step failed (if one did), the time of every step, scenario
and lane, the total against the suite's budget (35 minutes with warm caches, 50 on a
fresh machine, on 2 cores), and the count of passed and failed steps. The same figures go
to reports/test-timings.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["lint", "unit", "image", "molecule", "integration"]
# Two lanes run side by side: the sandbox stages, each lane in the order a rig goes
# through the roles (a scenario that starts from a stage snapshot finds it cached, or
# lab/sandbox/fleet.py builds it), and the unit tests, which need no host. model_weights
# counts the hub stand-in's requests: it runs first in its lane, while the other lane's
# first scenarios download no model (fleet_cache counts its own hosts' requests by address).
# site, sandbox and the unit tests sit where they balance the lanes (site and sandbox need their
# own hosts only; the unit tests none): the unit test files of UNIT_OTHER_LANE are a step of their
# own ("unit-b"), the rest is "unit". Scenarios not listed run at the end of the shorter lane.
LANES = [
    ["driver_topology", "vllm_runtime", "jetson", "site", "sandbox"],
    ["model_weights", "fleet_cache", "vllm_service", "unit", "unit-b", "integration"],
]
# The unit tests that run the main job's plays on the example inventory: a step of their own, which
# can go to whichever lane ends first (reports/test-timings.json): the CPU is busy only while both run.
UNIT_OTHER_LANE = ["tests/unit/test_main_job.py"]
# The collection's checks need no host: steps of the lint stage, left out of the unit steps. The artifact built,
# installed into an empty folder and run from outside the checkout; ansible-test sanity on it (slower on a new
# machine: its virtualenvs come from PyPI into ~/.ansible/test); ansible-builder create of the execution
# environment.
COLLECTION_STEPS = {
    "collection build+install": "tests/unit/test_collection.py",
    "ansible-test sanity": "tests/unit/test_ansible_test_sanity.py",
    "ansible-builder create": "tests/unit/test_execution_environment.py",
}
# Budget of the whole run on 2 cores (issue: the suite budget).
BUDGET_WARM_S = 35 * 60
BUDGET_FRESH_S = 50 * 60
TIMINGS_FILE = ROOT / "reports" / "test-timings.json"
# Runs where the connection changes nothing that is tested go under mitogen's strategy, which
# keeps one Python per host and its imports between tasks: a no-op task costs a fraction of what
# it costs over SSH, and a task on the local connection a fifth (without it, every task's Python
# compiles Ansible's module code anew from its zip). They are every scenario's idempotence run,
# those that converge over SSH included (sandbox, driver_topology, site: they reboot hosts,
# which mitogen cannot yet, mitogen-hq/mitogen#1251: a run that changes nothing reboots nothing,
# and whether a task changes does not depend on the connection), and the unit tests' playbook
# runs on localhost (the scenarios run the same plays over SSH as users do; the README has the
# figures). RIGOPS_SCENARIO_STRATEGY=linear runs them all with Ansible's default strategy
# (.config/molecule/config.yml).
FAST_STRATEGY = os.environ.get("RIGOPS_SCENARIO_STRATEGY") or "mitogen_linear"
FAST_STRATEGY_ENV = {"ANSIBLE_STRATEGY": FAST_STRATEGY, "ANSIBLE_STRATEGY_PLUGINS": str(ROOT / "strategy_plugins")}
# Molecule's state of each scenario the runner runs (its instance config, inventory, created or
# not), emptied at the start of a run: see clean_slate.
MOLECULE_STATE = ROOT / "lab" / "sandbox" / ".state" / "molecule"
# lines worth repeating at the end when a step fails: CI shows only the tail of the output
WHY = re.compile(r"fatal:|failed:|\[ERROR\]|ERROR|CRITICAL|Traceback|^E |FAILED|msg:|AssertionError|Error:")
PRINT = threading.Lock()


@dataclass
class Step:
    stage: str
    name: str
    cmd: list[str]
    lane: int | None = None  # None: not in a lane (image before the lanes, lint beside them)
    env: dict[str, str] = field(default_factory=dict)  # added to the run's environment
    cleanup: bool = False  # runs even after a failure
    seconds: float = 0.0
    cpu: float | None = None  # the machine's CPU busy (all cores) while it ran, 0..1
    ok: bool | None = None  # None: not run
    why: list[str] = field(default_factory=list)


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot (/proc/stat): the machine's, not one process's."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def busy_since(mark: tuple[int, int]) -> float | None:
    """The share of the machine's CPU busy since ``mark`` (cpu_ticks): where it stays low, waits dominate and
    another lane would fit; near 1, only less work makes the suite faster."""
    busy, total = cpu_ticks()
    return (busy - mark[0]) / (total - mark[1]) if total > mark[1] else None


def run_step(step: Step, env: dict[str, str]) -> None:
    """Run one step; print its output whole when it ends (lanes run at once); keep why it failed."""
    start, ticks = time.monotonic(), cpu_ticks()
    proc = subprocess.run(
        step.cmd, check=False, cwd=ROOT, env={**env, **step.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace",
    )  # fmt: skip
    step.seconds = time.monotonic() - start
    step.cpu = busy_since(ticks)
    step.ok = proc.returncode == 0
    lines = proc.stdout.splitlines()
    if not step.ok:
        why = [ln[:400] for ln in lines if WHY.search(ln) and "glob failed" not in ln][-40:]
        step.why = [*why, "  ...", *lines[-15:]]
    with PRINT:
        lane = f" (lane {step.lane + 1})" if step.lane is not None else ""
        print(f"\n===== [{step.stage}] {step.name}{lane}: {' '.join(step.cmd)}", flush=True)
        print(proc.stdout, end="" if proc.stdout.endswith("\n") else "\n")
        print(f"===== [{step.stage}] {step.name}: {'ok' if step.ok else 'FAILED'} in {step.seconds:.1f}s", flush=True)


def scenarios() -> list[str]:
    found = {p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")}
    laned = [s for lane in LANES for s in lane if s in found]
    return laned + sorted(found - set(laned))


def molecule_phases(scenario: str) -> list[str]:
    """The scenario's test sequence (its molecule.yml, else the shared base), as commands.

    `molecule create` runs the prepare playbook too, so a `prepare` right after `create`
    is not a command of its own. The leading `destroy` (what an earlier, interrupted run left)
    is done for every scenario at once by clean_slate.
    """
    base = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    own = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text()) or {}
    sequence = (own.get("scenario") or {}).get("test_sequence") or base["scenario"]["test_sequence"]
    phases = []
    for phase in sequence:
        if phase == "prepare" and phases and phases[-1] == "create":
            continue
        phases.append(phase)
    return phases[1:] if phases[:1] == ["destroy"] else phases


def platforms(scenario: str) -> list[str]:
    data = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text()) or {}
    return [p["name"] for p in data.get("platforms", [])]


def remove_hosts(name: str, scenarios_: list[str]) -> Step:
    """What molecule/resources/destroy.yml does (lab/sandbox/fleet.py down of the scenarios' hosts), as
    one command: `molecule destroy` adds a Molecule and an Ansible start, ~5 s, to each."""
    hosts = [f"--host={host}" for scenario in scenarios_ for host in platforms(scenario)]
    return Step("molecule", name, [sys.executable, "lab/sandbox/fleet.py", "down", *hosts], cleanup=True)


def clean_slate(chosen: list[str]) -> list[Step]:
    """Each scenario's leading destroy, for all of them at once: the hosts an earlier (interrupted)
    run left are removed and each scenario's Molecule state starts empty (the runner gives each
    scenario its own MOLECULE_EPHEMERAL_DIRECTORY, so a scenario's `create` always creates)."""
    if not chosen:
        return []
    for scenario in chosen:
        shutil.rmtree(MOLECULE_STATE / scenario, ignore_errors=True)
    step = remove_hosts("hosts an earlier run left", chosen)
    step.stage = "image"
    return [step]


def caches_warm() -> bool:
    """Warm when the host image of the current recipe and the wheelhouse are already built."""
    sys.path.insert(0, str(ROOT / "lab" / "sandbox"))
    import fleet  # noqa: PLC0415 (the sandbox machinery, only needed here)

    image = fleet.podman("image", "exists", fleet.image_tag(), check=False).returncode == 0
    wheelhouse = (fleet.CACHE / "wheelhouse" / "cpu" / ".rigops-wheelhouse.json").exists()
    return image and wheelhouse


def image_steps(only: list[str]) -> list[Step]:
    """What every lane's hosts start from."""
    if "image" not in only:
        return []
    return [Step("image", "sandbox image", [sys.executable, "lab/sandbox/fleet.py", "image"])]


def lint_steps(only: list[str]) -> list[Step]:
    if "lint" not in only:
        return []
    return [
        Step("lint", "yamllint", ["yamllint", "--strict", "."]),
        Step("lint", "ansible-lint", ["ansible-lint", "--profile", "production"]),
        Step("lint", "ruff check", ["ruff", "check", "."]),
        Step("lint", "ruff format", ["ruff", "format", "--check", "."]),
        *(Step("lint", name, [sys.executable, "-m", "pytest", "-q", test]) for name, test in COLLECTION_STEPS.items()),
    ]


def unit_step(item: str, whole: bool) -> Step:
    """pytest of the unit tests: all of them (whole), the files of UNIT_OTHER_LANE ("unit-b") or the rest."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "--durations=10",
        *(f"--ignore={test}" for test in COLLECTION_STEPS.values()),
    ]
    env = dict(FAST_STRATEGY_ENV)
    if whole:
        return Step("unit", "pytest tests/unit", [*cmd, "tests/unit"], env=env)
    if item == "unit-b":
        return Step("unit", f"pytest {' '.join(UNIT_OTHER_LANE)}", [*cmd, *UNIT_OTHER_LANE], env=env)
    ignored = [f"--ignore={path}" for path in UNIT_OTHER_LANE]
    return Step("unit", "pytest tests/unit (the rest)", [*cmd, *ignored, "tests/unit"], env=env)


def lane_steps(only: list[str], chosen: list[str], lanes: int) -> list[list[Step]]:
    """The sandbox stages' steps, per lane."""
    py = sys.executable
    if chosen:
        layout = [["unit", *chosen]]
    else:
        known = set(scenarios()) | {"integration", "unit", "unit-b"}
        layout = [[item for item in lane if item in known] for lane in LANES]
        extra = [s for s in scenarios() if not any(s in lane for lane in LANES)]
        min(layout, key=len).extend(extra)
        if lanes == 1:
            layout = [[item for lane in layout for item in lane]]
    out = []
    for number, items in enumerate(layout):
        steps = []
        for item in items:
            if item in ("unit", "unit-b"):
                if "unit" in only:
                    steps.append(unit_step(item, whole=bool(chosen)))
            elif item == "integration":
                if "integration" in only and (ROOT / "tests" / "integration").is_dir():
                    steps.append(
                        Step(
                            "integration",
                            "pytest tests/integration",
                            [py, "-m", "pytest", "-q", "--durations=10", "tests/integration"],
                        )
                    )
            elif "molecule" in only:
                # One command per phase, so each phase's time shows; destroy runs at the end
                # whatever happened (see Run).
                state = {"MOLECULE_EPHEMERAL_DIRECTORY": str(MOLECULE_STATE / item)}
                for phase in molecule_phases(item):
                    if phase == "destroy":
                        steps.append(remove_hosts(f"{item} destroy", [item]))
                        continue
                    env = {**state, **FAST_STRATEGY_ENV} if phase == "idempotence" else state
                    steps.append(Step("molecule", f"{item} {phase}", ["molecule", phase, "-s", item], env=env))
        for step in steps:
            step.lane = number
        out.append(steps)
    return [lane for lane in out if lane]


class Run:
    """Shared state of the run: after a failure, only clean-up steps (a scenario's destroy) run."""

    def __init__(self, env: dict[str, str], keep_going: bool):
        self.env = env
        self.keep_going = keep_going
        self.failed = threading.Event()

    def run(self, steps: list[Step]) -> None:
        for step in steps:
            if self.failed.is_set() and not self.keep_going and not step.cleanup:
                continue
            run_step(step, self.env)
            if not step.ok:
                self.failed.set()


def scenario_seconds(steps: list[Step]) -> dict[str, float]:
    per_scenario: dict[str, float] = collections.defaultdict(float)
    for step in steps:
        if step.stage == "molecule":
            per_scenario[step.name.split()[0]] += step.seconds
    return dict(per_scenario)


def write_timings(steps, lanes, total: float, cpu: float | None, budget: float, warm: bool, only: list[str]) -> None:
    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "stages": only,
        "caches": "warm" if warm else "fresh",
        "total_seconds": round(total, 1),
        "cpu_busy": round(cpu, 2) if cpu is not None else None,
        "budget_seconds": budget,
        "within_budget": total <= budget,
        "steps": [
            {
                "stage": s.stage,
                "name": s.name,
                "lane": s.lane + 1 if s.lane is not None else None,
                "seconds": round(s.seconds, 1),
                "cpu_busy": round(s.cpu, 2) if s.cpu is not None else None,
                "status": "skipped" if s.ok is None else ("ok" if s.ok else "failed"),
            }
            for s in steps
        ],
        "scenarios": {k: round(v, 1) for k, v in scenario_seconds(steps).items()},
        "lanes_seconds": [round(x, 1) for x in lanes],
    }
    TIMINGS_FILE.write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(STAGES), help="comma-separated stages")
    parser.add_argument("--scenario", action="append", default=[], help="Molecule scenario to run")
    parser.add_argument("--lanes", type=int, choices=[1, 2], default=2, help="sandbox lanes run at once")
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    missing = sorted(set(args.scenario) - set(scenarios()))
    if missing:
        parser.error(f"unknown scenario(s) {', '.join(missing)}; choose from {', '.join(scenarios())}")
    # RIGOPS_REQUIRE_TOOLS: a test that needs a tool fails when it is missing (tests/conftest.py): this
    # run installed every tool first, so a missing one is a failure, never a skip.
    env = dict(os.environ, RIGOPS_INTEGRATION="1", RIGOPS_REQUIRE_TOOLS="1", PY_COLORS="0", ANSIBLE_FORCE_COLOR="0")
    warm = caches_warm()
    budget = BUDGET_WARM_S if warm else BUDGET_FRESH_S
    run = Run(env, args.keep_going)
    total, ticks = time.monotonic(), cpu_ticks()

    lanes = lane_steps(only, args.scenario, args.lanes)
    chosen = list(dict.fromkeys(s.name.split()[0] for lane in lanes for s in lane if s.stage == "molecule"))
    image, lint = image_steps(only) + clean_slate(chosen), lint_steps(only)
    run.run(image)
    lane_seconds = [0.0] * len(lanes)

    def lane_worker(number: int, steps: list[Step]) -> None:
        start = time.monotonic()
        run.run(steps)
        lane_seconds[number] = time.monotonic() - start

    threads = [threading.Thread(target=lane_worker, args=(n, steps)) for n, steps in enumerate(lanes)]
    threads.append(threading.Thread(target=run.run, args=(lint,)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed, cpu = time.monotonic() - total, busy_since(ticks)
    steps = lint + image + [s for lane in lanes for s in lane]

    for step in steps:
        if step.ok is False:
            print(f"\n===== why '{step.name}' failed (lines picked from its output above)")
            print("\n".join(step.why))
    print("\n===== timings (cpu: the machine's CPU busy while the step ran, all cores)")
    for step in steps:
        status = "skipped" if step.ok is None else ("ok" if step.ok else "FAILED")
        lane = f"lane {step.lane + 1}" if step.lane is not None else ""
        cpu_text = f"cpu {step.cpu:4.0%}" if step.cpu is not None else ""
        print(f"  {step.stage:<12} {step.name:<32} {step.seconds:7.1f}s  {status:<8} {lane:<7} {cpu_text}")
    for name, secs in scenario_seconds(steps).items():
        print(f"  {'scenario':<12} {name:<32} {secs:7.1f}s")
    for number, secs in enumerate(lane_seconds):
        print(f"  {'lane':<12} {number + 1:<32} {secs:7.1f}s")
    write_timings(steps, lane_seconds, elapsed, cpu, budget, warm, only)
    verdict = "within" if elapsed <= budget else "OVER"
    print(
        f"  {'total':<12} {'':<32} {elapsed:7.1f}s  = {elapsed / 60:.1f} min, {verdict} the budget of "
        f"{budget // 60} min ({'warm caches' if warm else 'fresh machine: images, wheelhouse or model built'})"
        + (f", cpu {cpu:.0%} busy" if cpu is not None else "")
    )
    print(f"timings: {TIMINGS_FILE.relative_to(ROOT)}")
    passed = sum(1 for s in steps if s.ok is True)
    failed = sum(1 for s in steps if s.ok is False)
    skipped = sum(1 for s in steps if s.ok is None)
    tail = f", {skipped} skipped" if skipped else ""
    print(f"steps: {passed} passed, {failed} failed{tail}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
