#!/usr/bin/env python3
"""Run every test of the project, in order, and print how long each step took.

    ./rigops test                      everything
    ./rigops test --only lint,unit     some stages (lint, unit, image, molecule, integration)
    ./rigops test --scenario sandbox   one Molecule scenario (repeatable)
    ./rigops test --keep-going         run the next stages after a failure

Stages: lint (yamllint, ansible-lint profile production, ruff), unit (pytest), image
(sandbox host image, cached by recipe), molecule (each scenario under molecule/, in the
order a rig goes through the roles, each phase of Molecule's test sequence as read from
.config/molecule/config.yml or the scenario's own molecule.yml), integration (pytest
tests/integration against the sandbox services).

The end of the output: why a step failed (if one did), the time of every step and of
every scenario, the total against the suite's budget (35 minutes with warm caches, 50
on a fresh machine, on 2 cores), and the count of passed and failed steps. The same
figures go to reports/test-timings.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["lint", "unit", "image", "molecule", "integration"]
# Scenarios in the order a rig goes through the roles: a scenario that starts from a
# cached stage snapshot (sandbox/fleet.py) finds it made by the one before it.
SCENARIO_ORDER = ["sandbox", "nvidia_driver", "gpu_topology", "vllm_runtime", "model_weights", "vllm_service", "site"]
# Budget of the whole run on 2 cores (issue: the suite budget).
BUDGET_WARM_S = 35 * 60
BUDGET_FRESH_S = 50 * 60
TIMINGS_FILE = ROOT / "reports" / "test-timings.json"
# lines worth repeating at the end when a step fails: CI shows only the tail of the output
WHY = re.compile(r"fatal:|failed:|\[ERROR\]|ERROR|CRITICAL|Traceback|^E |FAILED|msg:|AssertionError|Error:")


def run_step(cmd: list[str], env: dict[str, str]) -> tuple[bool, list[str]]:
    """Run one step, streaming its output; return success and the lines that say why it failed."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    why: collections.deque[str] = collections.deque(maxlen=40)
    last: collections.deque[str] = collections.deque(maxlen=15)
    for line in proc.stdout:
        sys.stdout.write(line)
        line = line.rstrip()
        last.append(line)
        if WHY.search(line) and "glob failed" not in line:
            why.append(line[:400])
    ok = proc.wait() == 0
    return ok, [*why, "  ...", *last]


def scenarios() -> list[str]:
    found = {p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml")}
    return [s for s in SCENARIO_ORDER if s in found] + sorted(found - set(SCENARIO_ORDER))


def molecule_phases(scenario: str) -> list[str]:
    """The scenario's test sequence (its molecule.yml, else the shared base), as commands.

    `molecule create` runs the prepare playbook too, so a `prepare` right after `create`
    is not a command of its own.
    """
    base = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    own = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text()) or {}
    sequence = (own.get("scenario") or {}).get("test_sequence") or base["scenario"]["test_sequence"]
    phases = []
    for phase in sequence:
        if phase == "prepare" and phases and phases[-1] == "create":
            continue
        phases.append(phase)
    return phases


def caches_warm() -> bool:
    """Warm when the host image of the current recipe and the wheelhouse are already built."""
    sys.path.insert(0, str(ROOT / "sandbox"))
    import fleet  # noqa: PLC0415 (the sandbox machinery, only needed here)

    image = fleet.podman("image", "exists", fleet.image_tag(), check=False).returncode == 0
    wheelhouse = (fleet.CACHE / "wheelhouse" / "cpu" / ".rigops-wheelhouse.json").exists()
    return image and wheelhouse


def steps(only: list[str], chosen: list[str]) -> list[tuple[str, str, list[str]]]:
    py = sys.executable
    plan = []
    if "lint" in only:
        plan += [
            ("lint", "yamllint", ["yamllint", "--strict", "."]),
            ("lint", "ansible-lint", ["ansible-lint", "--profile", "production"]),
            ("lint", "ruff check", ["ruff", "check", "."]),
            ("lint", "ruff format", ["ruff", "format", "--check", "."]),
        ]
    if "unit" in only:
        plan.append(("unit", "pytest tests/unit", [py, "-m", "pytest", "-q", "tests/unit"]))
    if "image" in only:
        plan.append(("image", "sandbox image", [py, "sandbox/fleet.py", "image"]))
    if "molecule" in only:
        for name in chosen or scenarios():
            # One command per phase, so each phase's time shows; destroy runs at the end
            # whatever happened (see main).
            for phase in molecule_phases(name):
                plan.append(("molecule", f"{name} {phase}", ["molecule", phase, "-s", name]))
    if "integration" in only and (ROOT / "tests" / "integration").is_dir():
        plan.append(("integration", "pytest tests/integration", [py, "-m", "pytest", "-q", "tests/integration"]))
    return plan


def scenario_seconds(results) -> dict[str, float]:
    per_scenario: dict[str, float] = collections.defaultdict(float)
    for stage, name, secs, _ in results:
        if stage == "molecule":
            per_scenario[name.split()[0]] += secs
    return dict(per_scenario)


def write_timings(results, total: float, budget: float, warm: bool, only: list[str]) -> None:
    TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "stages": only,
        "caches": "warm" if warm else "fresh",
        "total_seconds": round(total, 1),
        "budget_seconds": budget,
        "within_budget": total <= budget,
        "steps": [
            {
                "stage": stage,
                "name": name,
                "seconds": round(secs, 1),
                "status": "skipped" if ok is None else ("ok" if ok else "failed"),
            }
            for stage, name, secs, ok in results
        ],
        "scenarios": {k: round(v, 1) for k, v in scenario_seconds(results).items()},
    }
    TIMINGS_FILE.write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(STAGES), help="comma-separated stages")
    parser.add_argument("--scenario", action="append", default=[], help="Molecule scenario to run")
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    missing = sorted(set(args.scenario) - set(scenarios()))
    if missing:
        parser.error(f"unknown scenario(s) {', '.join(missing)}; choose from {', '.join(scenarios())}")
    env = dict(os.environ, RIGOPS_INTEGRATION="1", PY_COLORS="0", ANSIBLE_FORCE_COLOR="0")
    warm = caches_warm()
    budget = BUDGET_WARM_S if warm else BUDGET_FRESH_S
    results: list[tuple[str, str, float, bool | None]] = []
    reasons: list[tuple[str, list[str]]] = []
    failed_once = False
    total = time.monotonic()
    for stage, name, cmd in steps(only, args.scenario):
        # after a failure, still clean up sandbox hosts (destroy) but run nothing else
        cleanup = cmd[:2] == ["molecule", "destroy"]
        if failed_once and not args.keep_going and not cleanup:
            results.append((stage, name, 0.0, None))
            continue
        print(f"\n===== [{stage}] {name}: {' '.join(cmd)}", flush=True)
        start = time.monotonic()
        ok, why = run_step(cmd, env)
        results.append((stage, name, time.monotonic() - start, ok))
        if not ok:
            reasons.append((name, why))
        failed_once |= not ok
    elapsed = time.monotonic() - total
    for name, why in reasons:
        print(f"\n===== why '{name}' failed (lines picked from its output above)")
        print("\n".join(why))
    print("\n===== timings")
    for stage, name, secs, ok in results:
        status = "skipped" if ok is None else ("ok" if ok else "FAILED")
        print(f"  {stage:<12} {name:<32} {secs:7.1f}s  {status}")
    for name, secs in scenario_seconds(results).items():
        print(f"  {'scenario':<12} {name:<32} {secs:7.1f}s")
    write_timings(results, elapsed, budget, warm, only)
    verdict = "within" if elapsed <= budget else "OVER"
    print(
        f"  {'total':<12} {'':<32} {elapsed:7.1f}s  = {elapsed / 60:.1f} min, {verdict} the budget of "
        f"{budget // 60} min ({'warm caches' if warm else 'fresh machine: images, wheelhouse or model built'})"
    )
    print(f"timings: {TIMINGS_FILE.relative_to(ROOT)}")
    passed = sum(1 for r in results if r[3] is True)
    failed = sum(1 for r in results if r[3] is False)
    skipped = sum(1 for r in results if r[3] is None)
    tail = f", {skipped} skipped" if skipped else ""
    print(f"steps: {passed} passed, {failed} failed{tail}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
