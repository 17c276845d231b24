"""dcgmi stand-in (NVIDIA DCGM's command-line client), on profiles with ``dcgm: true``.

``dcgmi health -s a`` sets every health watch, ``dcgmi health -c`` checks them, ``dcgmi health --clear``
unsets them, ``dcgmi discovery -l`` lists the GPUs. The tables are laid out as real DCGM 4.6.1 output
(tests/fixtures/gpu-health/real/d0*.txt, SOURCES.md there): two columns 28 and 60 wide, a message wrapped
at 54 characters. The watches live in /run (a reboot restarts the host engine, which forgets them).

Incidents come from the faults in effect (nvidia-sim-fault), with DCGM's own message texts:

* ``xid48``: Memory system, Failure, ``Detected N volatile double-bit ECC error(s) in GPU I.``
  (NVIDIA/DCGM ``dcgm_errors.h``);
* ``nvlink_down``: NVLINK system, Failure, ``GPU I's NvLink link L is currently down`` (a real capture);
* ``nvlink_errors``: NVLINK system, Failure, ``Detected N datalink layer replay error counter NvLink errors
  on GPU I's NVLink (should be 0)`` (the message of DCGM 4.x quoted by a public monitoring agent's tests);
* ``power_brake``: Power system, Warning, the power violation message of the real L4 capture.

Thermal slowdowns, PCIe replays and the other systems are not modelled: nvidia-smi shows those.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

from . import faults, kmod, paths
from .profile import Gpu, Profile, ProfileError, load

WATCHES = "/run/nvidia-sim/dcgm-watches.json"
USAGE = "Usage: dcgmi health -s a | -c | --clear; dcgmi discovery -l (rigops sandbox stand-in)\n"
NO_ENGINE = (
    "Error: unable to establish a connection to the specified host: localhost\n"
    "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
)


def _row(left: str, right: str) -> str:
    return f"| {left:<26}| {right:<57}|"


RULE = "+" + "-" * 27 + "+" + "-" * 58 + "+"


def incidents(prof: Profile) -> dict[int, list[tuple[str, str, str]]]:
    """GPU index -> [(system, result, message)] from the faults in effect."""
    active = faults.active()
    out: dict[int, list[tuple[str, str, str]]] = {}
    for g in faults.apply(Profile(prof.data, prof.source)).gpus:
        mine = active.get(g.bdf, {})
        found = []
        if "xid48" in mine:
            n = int(mine["xid48"].get("value", 1))
            found.append(
                ("Memory system", "Failure", f"Detected {n} volatile double-bit ECC error(s) in GPU {g.index}.")
            )
        nvlink = []
        if "nvlink_down" in mine:
            nvlink.append(f"GPU {g.index}'s NvLink link {int(mine['nvlink_down'].get('value', 0))} is currently down")
        if "nvlink_errors" in mine:
            n = int(mine["nvlink_errors"].get("value", 1))
            what = "datalink layer replay error counter NvLink errors"
            nvlink.append(f"Detected {n} {what} on GPU {g.index}'s NVLink (should be 0)")
        if nvlink:
            found.append(("NVLINK system", "Failure", ", ".join(nvlink)))
        if "power_brake" in mine:
            found.append(
                (
                    "Power system",
                    "Warning",
                    f"Detected clocks event due to power violation in GPU {g.index}. Monitor the power "
                    "conditions. This GPU can still perform workload.",
                )
            )
        if found:
            out[g.index] = found
    return out


def health_table(prof: Profile) -> str:
    found = incidents(prof)
    results = [r for items in found.values() for _s, r, _m in items]
    overall = "Failure" if "Failure" in results else ("Warning" if results else "Healthy")
    lines = [RULE, f"| {'Health Monitor Report':<85}|", RULE.replace("-", "="), _row("Overall Health", overall)]
    if found:
        lines.append(_row("GPU", ""))
    for index, items in sorted(found.items()):
        worst = "Failure" if any(r == "Failure" for _s, r, _m in items) else "Warning"
        lines += [_row(f"-> {index}", worst), _row("   -> Errors", "")]
        for system, result, message in items:
            lines.append(_row(f"      -> {system}", result))
            lines += [_row("", part) for part in textwrap.wrap(message, 54)]
    lines.append(RULE)
    return "\n".join(lines) + "\n"


def discovery(prof: Profile) -> str:
    gpus: list[Gpu] = faults.apply(Profile(prof.data, prof.source)).gpus
    rule = "+--------+" + "-" * 70 + "+"
    lines = [f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} found (Active).", rule,
             f"| GPU ID | {'Device Information':<69}|", rule]  # fmt: skip
    for g in gpus:
        lines += [
            f"| {g.index:<7}| {'Name: ' + g['name']:<69}|",
            f"| {'':<7}| {'PCI Bus ID: ' + g.bus_id:<69}|",
            f"| {'':<7}| {'Device UUID: ' + g.uuid:<69}|",
            rule,
        ]
    lines += ["0 NvSwitches found.", "+-----------+", "| Switch ID |", "+-----------+", "+-----------+"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    try:
        prof = load()
    except ProfileError as e:
        sys.stderr.write(f"dcgmi: {e}\n")
        return 1
    if not prof.data.get("dcgm"):
        sys.stderr.write("dcgmi: DCGM is not installed on this machine (profile dcgm: false)\n")
        return 127
    if not kmod.is_loaded("nvidia"):  # the host engine cannot start without the driver
        sys.stdout.write(NO_ENGINE)
        return 1
    watches = paths.p(WATCHES)
    if argv == ["discovery", "-l"]:
        sys.stdout.write(discovery(prof))
    elif argv == ["health", "-s", "a"]:
        os.makedirs(os.path.dirname(watches), exist_ok=True)
        with open(watches, "w", encoding="utf-8") as fh:
            json.dump({"watches": "a"}, fh)
        sys.stdout.write("Health monitor systems set successfully.\n")
    elif argv == ["health", "--clear"]:
        if os.path.exists(watches):
            os.unlink(watches)
        sys.stdout.write("Health monitor systems cleared successfully.\n")
    elif argv == ["health", "-c"]:
        if not os.path.exists(watches):
            sys.stdout.write("Health watches not enabled.\nPlease enable watches.\n")
            return 0
        sys.stdout.write(health_table(prof))
    else:
        sys.stderr.write(USAGE)
        return 2
    return 0
