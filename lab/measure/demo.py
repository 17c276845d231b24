#!/usr/bin/env python3
"""What the gateway adds to `./rigops demo` (printed, never asserted).

    ./rigops measure demo [--json]

Twice from a demo fleet made afresh (``fleet.py down`` then ``up``: every host of
inventories/sandbox, bare), the same commands as ``./rigops demo``:

- without the gateway, what the demo ran before it had one: ``site.yml -l gpu-rigs``;
- with it, what the demo runs now: ``site.yml -l gpu-rigs,gateways``, then the demo client's
  settings (``playbooks/clients.yml -e llm_clients_client=demo``).

The difference is what the gateway costs a person trying rigops. On a new machine the demo
first builds what this machine has cached (host image, wheelhouse, tiny model); none of that
depends on the gateway, whose host installs its packages (nginx, njs) from the distribution's
archive at every fresh start, cached or not: the same difference applies there. The fleet is
left up, as after ``./rigops demo``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import _sandbox

INVENTORY = _sandbox.ROOT / "inventories" / "sandbox"


def fresh_fleet() -> float:
    """Every demo host removed and made again, bare; the seconds ``up`` took."""
    _sandbox.fleet("down")
    start = time.monotonic()
    _sandbox.fleet("up")
    return time.monotonic() - start


def timed(*runs: tuple[str, ...]) -> dict:
    """Run these playbooks one after the other (playbook, args...); their seconds and the machine's CPU."""
    seconds = machine = 0.0
    for playbook, *args in runs:
        run = _sandbox.run_playbook(_sandbox.ROOT / playbook, [INVENTORY], *args)
        if run.rc != 0:
            sys.exit(f"{playbook} {' '.join(args)} failed (rc {run.rc}):\n{run.output[-4000:]}")
        seconds += run.seconds
        machine += run.machine_seconds
    return {"seconds": round(seconds, 1), "machine_cpu_seconds": round(machine, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args(argv)
    results = {"date": time.strftime("%Y-%m-%d")}
    results["up_without_gateway_s"] = round(fresh_fleet(), 1)
    results["without_gateway"] = timed(("site.yml", "-l", "gpu-rigs"))
    results["up_with_gateway_s"] = round(fresh_fleet(), 1)
    results["with_gateway"] = timed(
        ("site.yml", "-l", "gpu-rigs,gateways"), ("playbooks/clients.yml", "-e", "llm_clients_client=demo")
    )
    results["gateway_adds_s"] = round(results["with_gateway"]["seconds"] - results["without_gateway"]["seconds"], 1)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"demo without the gateway (site.yml -l gpu-rigs):      {results['without_gateway']['seconds']:7.1f} s")
    print(f"demo with the gateway (site.yml + clients.yml):        {results['with_gateway']['seconds']:7.1f} s")
    print(f"what the gateway adds:                                 {results['gateway_adds_s']:7.1f} s")
    print(f"fleet made afresh (fleet.py up), each time:            {results['up_with_gateway_s']:7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
