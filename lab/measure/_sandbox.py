"""What the benchmarks share: sandbox hosts of their own, their inventory, timed ansible-playbook runs.

A benchmark script imports it as ``import _sandbox`` (Python puts the script's folder,
``lab/measure/``, first on ``sys.path``), so each stays runnable as
``./rigops python lab/measure/<name>.py``.

- hosts: ``fleet_up`` / ``fleet_down`` call ``lab/sandbox/fleet.py`` (the one mechanism of the
  demo and the Molecule scenarios) with ``--host NAME:PROFILE:PORT``; ``fleet_up`` returns
  each host's connection details (``fleet.py up --json``); ``hosts_cpu_seconds`` reads the
  CPU time the hosts' containers used, from their cgroups;
- inventory: ``ssh_vars`` connects like ``inventories/sandbox`` does (SSH to 127.0.0.1:<port>
  as the sandbox user with sudo, the sandbox key pair, host key checking on);
- playbooks: ``run_playbook`` times one ``ansible-playbook`` run from the project root
  with the project's ``ansible.cfg`` and takes its CPU time on the controller and the
  machine's (``proc_stat``: every process, the hosts' too); ``changed_count``, ``task_count``
  and ``recap`` read its output.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Podman only with the project's settings (runc, ulimits), as ./rigops and lab/sandbox/fleet.py run it.
ENV = dict(os.environ, CONTAINERS_CONF=str(ROOT / "lab" / "sandbox" / "podman" / "containers.conf"))
# Connection settings a caller may have exported (RIGOPS_MITOGEN=1 ./rigops ...): a benchmark
# drops them and sets its own, MITOGEN (the project's shim over mitogen's strategy) or none (SSH).
STRATEGY_VARS = ("ANSIBLE_STRATEGY", "ANSIBLE_STRATEGY_PLUGINS")
MITOGEN = {"ANSIBLE_STRATEGY": "mitogen_linear", "ANSIBLE_STRATEGY_PLUGINS": str(ROOT / "strategy_plugins")}
# The sandbox's groups (and so inventories/sandbox/group_vars), as a second inventory source.
SANDBOX_GROUPS = ROOT / "inventories" / "sandbox" / "groups.yml"
CGROUP_ROOT = Path("/sys/fs/cgroup")


# --------------------------------------------------------------------------- hosts


def fleet(*args: str) -> str:
    """Run ``lab/sandbox/fleet.py`` with these arguments; its stdout (its log goes to stderr)."""
    cmd = [sys.executable, str(ROOT / "lab" / "sandbox" / "fleet.py"), *args]
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True, env=ENV).stdout
    except subprocess.CalledProcessError as exc:
        print(exc.stderr[-4000:], file=sys.stderr)  # fleet.py's log, which says why
        raise


def host_arg(name: str, profile: str, port: int) -> str:
    """The ``--host`` argument of ``fleet.py up`` for one host."""
    return f"--host={name}:{profile}:{port}"


def fleet_up(hosts: Iterable[tuple[str, str, int]]) -> list[dict]:
    """Create or start these (name, profile, port) hosts; their connection details, in order.

    Idempotent like ``fleet.py up``: a host that is already up is kept as it is.
    """
    return json.loads(fleet("up", "--json", *[host_arg(*h) for h in hosts]))


def fleet_down(names: Iterable[str]) -> None:
    """Remove these hosts (absent ones are fine)."""
    args = [f"--host={n}" for n in names]
    if args:
        fleet("down", *args)


def podman_exec(container: str, *argv: str, check: bool = False) -> str:
    """Run a command in a host's container (as root); its stdout, empty on failure unless ``check``."""
    proc = subprocess.run(["podman", "exec", container, *argv], check=False, capture_output=True, text=True, env=ENV)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{container}: {' '.join(argv)} failed: {proc.stderr[-2000:]}")
    return proc.stdout if proc.returncode == 0 else ""


def hosts_cpu_seconds(containers: Iterable[str]) -> float | None:
    """CPU time (user + system, seconds) these hosts' containers have used since they started, from
    each container's cgroup (``podman inspect``'s ``CgroupPath``): cgroup v2's ``cpu.stat``, else
    v1's ``cpuacct.usage``. None when one of them cannot be read (a host that is down, another
    cgroup layout): a figure for some of the hosts would be a wrong figure for all of them."""
    names = list(containers)
    if not names:
        return 0.0
    proc = subprocess.run(
        ["podman", "inspect", "--format", "{{.State.CgroupPath}}", *names],
        capture_output=True, text=True, check=False, env=ENV,
    )  # fmt: skip
    paths = proc.stdout.split()
    if proc.returncode != 0 or len(paths) != len(names):
        return None
    total = 0.0
    for path in paths:
        v2 = CGROUP_ROOT / path.lstrip("/") / "cpu.stat"
        v1 = CGROUP_ROOT / "cpuacct" / path.lstrip("/") / "cpuacct.usage"
        if v2.is_file():
            usage = re.search(r"^usage_usec (\d+)$", v2.read_text(), re.M)
            if not usage:
                return None
            total += int(usage.group(1)) / 1e6
        elif v1.is_file():
            total += int(v1.read_text()) / 1e9
        else:
            return None
    return total


# --------------------------------------------------------------------------- inventory


def ssh_vars(details: Mapping) -> dict:
    """Host variables that reach a sandbox host over SSH like a real rig (``fleet.py up --json`` details)."""
    return {
        "ansible_host": details["address"],
        "ansible_port": details["port"],
        "ansible_user": details["user"],
        "ansible_become": True,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": details["identity_file"],
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={details['known_hosts']} -o StrictHostKeyChecking=yes",
    }


def inventory(group: str, hosts: Iterable[Mapping], extra: Mapping | None = None) -> dict:
    """A JSON inventory: one group of these hosts, reached over SSH, each with ``extra`` variables."""
    return {group: {"hosts": {h["instance"]: {**ssh_vars(h), **(extra or {})} for h in hosts}}}


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


# --------------------------------------------------------------------------- playbooks


def proc_stat() -> tuple[float, float]:
    """(busy, idle) CPU seconds of all cores since boot, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / hz, (idle + iowait) / hz


@dataclass
class Run:
    """One timed ansible-playbook run; ``cpu_seconds``: the CPU time (user + system) of
    ansible-playbook and of the processes it waited for (its forks, ssh), on the controller;
    ``machine_seconds``: the busy CPU time of the whole machine meanwhile (every process, the
    sandbox hosts' included)."""

    seconds: float
    rc: int
    stdout: str
    stderr: str
    cpu_seconds: float = 0.0
    machine_seconds: float = 0.0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def ansible_playbook() -> str:
    """The project venv's ansible-playbook (beside this Python), else the one on PATH."""
    exe = Path(sys.executable).parent / "ansible-playbook"
    return str(exe if exe.exists() else "ansible-playbook")


def playbook_cmd(playbook: str | Path, inventories: Iterable[str | Path], *extra: str) -> list[str]:
    cmd = [ansible_playbook()]
    for inv in inventories:
        cmd += ["-i", str(inv)]
    return [*cmd, str(playbook), *extra]


def connection_env(connection: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ENV) without the caller's strategy settings; with MITOGEN for "mitogen"."""
    env = {k: v for k, v in (ENV if base is None else base).items() if k not in STRATEGY_VARS}
    return {**env, **MITOGEN} if connection == "mitogen" else env


def run_playbook(
    playbook: str | Path,
    inventories: Iterable[str | Path],
    *extra: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = ROOT,
) -> Run:
    """Run ansible-playbook from the project root, or ``cwd`` (another checkout of it: its ansible.cfg
    applies); only the run itself is timed."""
    cmd = playbook_cmd(playbook, inventories, *extra)
    before, busy_before = resource.getrusage(resource.RUSAGE_CHILDREN), proc_stat()[0]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=dict(env or ENV))
    seconds = time.monotonic() - start
    after, busy_after = resource.getrusage(resource.RUSAGE_CHILDREN), proc_stat()[0]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(seconds, proc.returncode, proc.stdout, proc.stderr, cpu, busy_after - busy_before)


def cpu_floor(cpu_seconds: float, cores: int, base_seconds: float) -> float:
    """The least a run's wall time can be against ``base_seconds`` on this machine: its CPU spread over
    every core (the sandbox hosts share the controller's cores), as a ratio."""
    return round(cpu_seconds / cores / base_seconds, 2)


def changed_count(output: str) -> int:
    """The sum of ``changed=N`` over the PLAY RECAP lines of a run's output."""
    return sum(int(n) for n in re.findall(r"\bchanged=(\d+)", output))


def task_count(output: str) -> int:
    """The tasks a run ran, summed over its hosts: ok + failed + skipped of each PLAY RECAP line."""
    counts = re.findall(r"\bok=(\d+)\s+changed=\d+\s+unreachable=\d+\s+failed=(\d+)\s+skipped=(\d+)", output)
    return sum(int(ok) + int(failed) + int(skipped) for ok, failed, skipped in counts)


def recap(output: str) -> str:
    """The first host's PLAY RECAP counters, or "no recap"."""
    m = re.search(r"ok=\d+\s+changed=\d+\s+unreachable=\d+\s+failed=\d+", output)
    return m.group(0) if m else "no recap"


def parse_sizes(text: str, maximum: int) -> list[int]:
    """``"4,1,2"`` -> ``[1, 2, 4]``: host counts, ascending, each 1..maximum (ValueError otherwise)."""
    try:
        sizes = sorted({int(n) for n in text.split(",") if n.strip()})
    except ValueError as exc:
        raise ValueError(f"{text!r}: expected numbers separated by commas, for example 1,2,4") from exc
    if not sizes:
        raise ValueError("no host count given")
    if sizes[0] < 1 or sizes[-1] > maximum:
        raise ValueError(f"{text!r}: each host count must be between 1 and {maximum}")
    return sizes
