#!/usr/bin/env python3
"""Links like a site's: shape a sandbox container's network link with Linux tc (HTB).

    lab/sandbox/links.py shape NAME... --rate 200mbit     each container's link at that rate, both ways
    lab/sandbox/links.py clear NAME...                    back to the unshaped link
    lab/sandbox/links.py show NAME...

NAME is a sandbox host (``bench-mw1``), a service (``hub``) or a container name (``rigops-hub``).

A container's link is its veth pair on the sandbox network: what it sends leaves by its ``eth0`` in its
own network namespace (shaped there: its upload), what it receives leaves the peer end in the host's
namespace towards the bridge's port (shaped there: its download). Each end gets an HTB root whose one
class carries the rate (``rate`` = ``ceil``: a link, not a share), so a host's downloads and uploads
each get the rate, as on a site's switch port. The rates are set per run (the benchmarks shape the
hosts, the cache and the hub before they measure, and clear them after); a container recreated starts
unshaped. Needs root (nsenter into the container's namespace, tc on the host's).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

PREFIX = "rigops-"
RATE_RE = re.compile(r"\A\d+(\.\d+)?(bit|kbit|mbit|gbit)\Z")


def container(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def ends(name: str) -> tuple[list[list[str]], list[str]]:
    """The command prefixes that reach the link's two ends: [inside (nsenter ... eth0), outside (the veth)]."""
    pid = run("podman", "inspect", "--format", "{{.State.Pid}}", container(name)).stdout.strip()
    if not pid or pid == "0":
        raise SystemExit(f"links: {container(name)} is not running")
    inside = ["nsenter", "-t", pid, "-n"]
    shown = run(*inside, "ip", "-o", "link", "show", "eth0").stdout
    match = re.search(r"eth0@if(\d+)", shown)
    if not match:
        raise SystemExit(f"links: {container(name)} has no veth eth0 ({shown.strip()!r})")
    peer = match.group(1)
    for line in run("ip", "-o", "link").stdout.splitlines():
        index, dev = line.split(":", 2)[:2]
        if index.strip() == peer:
            return [[*inside, "tc"], ["tc"]], ["eth0", dev.strip().split("@")[0]]
    raise SystemExit(f"links: the host end of {container(name)}'s eth0 (interface {peer}) is not in this namespace")


def shape(name: str, rate: str) -> None:
    if not RATE_RE.match(rate):
        raise SystemExit(f"links: rate {rate!r} must be a number with bit, kbit, mbit or gbit (e.g. 200mbit)")
    prefixes, devs = ends(name)
    for tc, dev in zip(prefixes, devs, strict=True):
        run(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        # quantum: one full frame per round (HTB's rate/r2q default warns at these rates and changes nothing)
        run(*tc, "class", "replace", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
            "rate", rate, "ceil", rate, "quantum", "1514")  # fmt: skip


def clear(name: str) -> None:
    prefixes, devs = ends(name)
    for tc, dev in zip(prefixes, devs, strict=True):
        run(*tc, "qdisc", "del", "dev", dev, "root", check=False)


def show(name: str) -> dict:
    """{end: rate or None} of the link's two ends ("up": what the container sends, "down": what it receives)."""
    prefixes, devs = ends(name)
    out = {}
    for end, tc, dev in zip(("up", "down"), prefixes, devs, strict=True):
        text = run(*tc, "class", "show", "dev", dev).stdout
        match = re.search(r"class htb 1:10 .*?rate (\S+)", text)
        out[end] = match.group(1) if match else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_shape = sub.add_parser("shape")
    p_shape.add_argument("names", nargs="+")
    p_shape.add_argument("--rate", required=True)
    for cmd in ("clear", "show"):
        sub.add_parser(cmd).add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    for name in args.names:
        if args.cmd == "shape":
            shape(name, args.rate)
        elif args.cmd == "clear":
            clear(name)
        print(f"{container(name)}: {show(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
