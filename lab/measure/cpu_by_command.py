#!/usr/bin/env python3
"""Where a command's CPU time goes, by process name, from the kernel's process accounting
(printed, never asserted).

    ./rigops measure cpu_by_command [--top 25] [--json PATH] -- ./rigops test

Runs the command with process accounting on (acct(2), root only): the kernel appends one record
per process when it ends (its name, user, CPU time), the short-lived ones included, which
sampling misses (most of an Ansible run is processes of a fraction of a second: a worker per task
and host, a module's Python on the host). The records are system-wide: the sandbox hosts'
processes (podman's containers are processes of this machine) count with the controller's, and so
does anything else that ends meanwhile, so run it on an otherwise idle machine. Processes still
running when the command ends (the sandbox's service containers) are not counted.

Printed: the command's wall time and exit code, the machine's CPU time over the same span from
/proc/stat (busy and idle, all cores), the CPU time of the records, and their sum per process name
and user (root or not), largest first. A name is the kernel's: the first 15 bytes of what the
process ran, or what it set (``VLLM::EngineCore``); a child forked without exec keeps its parent's
name (``ansible-playboo``: Ansible's workers; ``*`` marks them). Users are numbers: a container's
users are not this machine's.

Why by hand: the ``acct`` package (``accton``, ``sa``, ``lastcomm``) is not on every machine, and
the record is a fixed 64-byte struct (``struct acct_v3``, linux/acct.h) that ``struct`` reads.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _sandbox import proc_stat

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_V3 = 3
AFORK = 0x01  # forked but did not exec
AHZ = 100  # comp_t times are in 1/AHZ seconds


@dataclass
class Process:
    name: str
    uid: int
    forked: bool
    cpu_s: float


def comp_t(value: int) -> int:
    """A comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (((value >> 13) & 0x7) * 3)


def parse(data: bytes) -> list[Process]:
    """The records of an accounting file (version 3 only: the kernel's choice, CONFIG_BSD_PROCESS_ACCT_V3)."""
    if len(data) % RECORD.size:
        raise ValueError(f"{len(data)} bytes is not a whole number of {RECORD.size}-byte records")
    out = []
    for fields in RECORD.iter_unpack(data):
        flag, version, _tty, _exit, uid, _gid, _pid, _ppid, _btime, _etime, utime, stime, *_rest, comm = fields
        if version & 0x0F != ACCT_V3:
            raise ValueError(f"accounting record version {version & 0x0F}, not {ACCT_V3}")
        name = comm.split(b"\0", 1)[0].decode(errors="replace")
        cpu = (comp_t(utime) + comp_t(stime)) / AHZ
        out.append(Process(name, uid, bool(flag & AFORK), cpu))
    return out


def summarise(processes: list[Process]) -> list[dict]:
    """CPU seconds and process count per (name, forked, root or not), largest first."""
    cpu: dict[tuple, float] = collections.defaultdict(float)
    count: collections.Counter = collections.Counter()
    for p in processes:
        key = (p.name + ("*" if p.forked else ""), "root" if p.uid == 0 else "other")
        cpu[key] += p.cpu_s
        count[key] += 1
    rows = [{"name": k[0], "user": k[1], "cpu_s": round(v, 2), "processes": count[k]} for k, v in cpu.items()]
    return sorted(rows, key=lambda r: (-r["cpu_s"], r["name"]))


def account(path: str | None) -> None:
    """Turn process accounting on (to path) or off (None)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"acct({path!r}): {os.strerror(err)} (process accounting needs root)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top", type=int, default=25, help="rows printed (default 25)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command after --, e.g. -- ./rigops test")
    with tempfile.TemporaryDirectory(prefix="rigops-acct-") as folder:
        records = os.path.join(folder, "pacct")
        Path(records).touch(mode=0o600)
        account(records)
        try:
            busy0, idle0 = proc_stat()
            start = time.monotonic()
            rc = subprocess.run(command, check=False).returncode
            wall = time.monotonic() - start
            busy1, idle1 = proc_stat()
        finally:
            account(None)
        processes = parse(Path(records).read_bytes())
    rows = summarise(processes)
    total = sum(p.cpu_s for p in processes)
    busy, idle = busy1 - busy0, idle1 - idle0
    print(f"\n{' '.join(command)}: exit {rc}, {wall:.1f} s wall")
    share = 100 * busy / max(busy + idle, 1e-9)
    print(f"machine: {busy:.1f} CPU-s busy, {idle:.1f} idle ({share:.1f}% busy, {os.cpu_count()} cores)")
    print(f"processes that ended: {len(processes)}, {total:.1f} CPU-s")
    print(f"{'CPU-s':>9} {'share':>6} {'count':>6}  user   name")
    for row in rows[: args.top]:
        share = 100 * row["cpu_s"] / max(total, 1e-9)
        print(f"{row['cpu_s']:9.1f} {share:5.1f}% {row['processes']:6d}  {row['user']:<6} {row['name']}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command, "exit": rc, "wall_s": round(wall, 1),
                    "machine_busy_s": round(busy, 1), "machine_idle_s": round(idle, 1),
                    "processes": len(processes), "cpu_s": round(total, 1), "by_name": rows,
                },
                indent=1,
            )
            + "\n"
        )  # fmt: skip
    return rc


if __name__ == "__main__":
    sys.exit(main())
