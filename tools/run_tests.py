#!/usr/bin/env python3
"""Run every test of the project, in order, and print how long each step took.

    ./rigops test                      everything
    ./rigops test --only lint,unit     some stages (lint, unit, image, molecule, integration)
    ./rigops test --scenario sandbox   one Molecule scenario (repeatable)
    ./rigops test --keep-going         run the next stages after a failure

Stages: lint (yamllint, ansible-lint profile production, ruff), unit (pytest), image
(sandbox host image, cached by recipe), molecule (each scenario under molecule/: create,
converge, idempotence, verify, destroy), integration (pytest tests/integration against
the sandbox services). The last line is the count of passed and failed steps.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["lint", "unit", "image", "molecule", "integration"]
# `molecule create` runs the scenario's prepare playbook too
MOLECULE_PHASES = ["destroy", "syntax", "create", "converge", "idempotence", "verify", "destroy"]
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
    return sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


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
            for phase in MOLECULE_PHASES:
                plan.append(("molecule", f"{name} {phase}", ["molecule", phase, "-s", name]))
    if "integration" in only and (ROOT / "tests" / "integration").is_dir():
        plan.append(("integration", "pytest tests/integration", [py, "-m", "pytest", "-q", "tests/integration"]))
    return plan


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
    env = dict(os.environ, RIGOPS_INTEGRATION="1", PY_COLORS="0", ANSIBLE_FORCE_COLOR="0")
    results: list[tuple[str, str, float, bool]] = []
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
    for name, why in reasons:
        print(f"\n===== why '{name}' failed (lines picked from its output above)")
        print("\n".join(why))
    print("\n===== timings")
    for stage, name, secs, ok in results:
        status = "skipped" if ok is None else ("ok" if ok else "FAILED")
        print(f"  {stage:<12} {name:<32} {secs:7.1f}s  {status}")
    print(f"  {'total':<12} {'':<32} {time.monotonic() - total:7.1f}s")
    passed = sum(1 for r in results if r[3] is True)
    failed = sum(1 for r in results if r[3] is False)
    skipped = sum(1 for r in results if r[3] is None)
    tail = f", {skipped} skipped" if skipped else ""
    print(f"steps: {passed} passed, {failed} failed{tail}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
