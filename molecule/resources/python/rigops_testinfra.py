"""Pytest plugin for Molecule verify steps: one testinfra host per sandbox container.

A scenario's ``tests/conftest.py`` says ``pytest_plugins = ["rigops_testinfra"]``. Tests then
take ``host`` (parametrized over the scenario's hosts, or the ones named in a module-level
``testinfra_hosts`` list of inventory names), ``profile`` (that host's hardware profile as a
dict) and ``hostname``; ``get_host(name)`` gives any host of the scenario. Commands go over SSH
as root (lab/sandbox/fleet.py authorizes the sandbox's key for root as well as for the user Ansible
logs in as; the host key recorded at create), one multiplexed master connection per host: a
command then costs a channel on that connection. Root, not the user and sudo: sudo would log
every command line, keys in curl headers included, to the journal that the tests search for
keys. `podman exec` cost each command ~0.1 CPU-s on the controller (podman, conmon, runc) and
seconds of latency when the machine is loaded (20 commands: 11.5 s against 0.9 s over SSH, both
lanes running).

Test modules that change the hosts (failure paths, reruns with other variables) say so
with ``pytestmark = pytest.mark.changes_state``: they run after every end-state test of
the scenario, in the order they are collected.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import testinfra
import yaml

ROOT = Path(__file__).resolve().parents[3]


def _instances() -> list[dict]:
    path = os.environ.get("MOLECULE_INSTANCE_CONFIG")
    if path and Path(path).exists():
        return yaml.safe_load(Path(path).read_text()) or []
    return []


def _platforms() -> dict[str, dict]:
    """Scenario platforms by name, from molecule.yml (profile, groups, ...)."""
    scenario = os.environ.get("MOLECULE_SCENARIO_DIRECTORY")
    if not scenario:
        return {}
    data = yaml.safe_load((Path(scenario) / "molecule.yml").read_text())
    return {p["name"]: p for p in data.get("platforms", [])}


def pytest_configure(config):
    config.addinivalue_line("markers", "changes_state: runs after the scenario's end-state tests")


def pytest_collection_modifyitems(config, items):
    # a stable sort: end-state tests first, then the ones that change the hosts
    items.sort(key=lambda item: item.get_closest_marker("changes_state") is not None)


def pytest_generate_tests(metafunc):
    if "hostname" not in metafunc.fixturenames and "host" not in metafunc.fixturenames:
        return
    names = [i["instance"] for i in _instances()] or list(_platforms())
    wanted = getattr(metafunc.module, "testinfra_hosts", None)
    if wanted:
        names = [n for n in names if n in wanted]
    metafunc.parametrize("hostname", names, scope="module")


def get_host(name: str):
    """The testinfra host of the scenario's host ``name`` (its Molecule instance config)."""
    found = [i for i in _instances() if i["instance"] == name]
    if not found:
        raise LookupError(f"{name} is not a host of this scenario (MOLECULE_INSTANCE_CONFIG)")
    inst = found[0]
    options = (
        f"-o UserKnownHostsFile={inst['known_hosts']} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes "
        "-o ServerAliveInterval=15 -o LogLevel=ERROR "
        # %C: a hash of the local host, remote host, port and user; short enough for a socket path
        "-o ControlMaster=auto -o ControlPersist=120s -o ControlPath=/tmp/rigops-testinfra-%C"
    )
    return testinfra.get_host(
        f"ssh://root@{inst['address']}:{inst['port']}",
        ssh_identity_file=inst["identity_file"],
        ssh_extra_args=options,
        timeout=60,
    )


@pytest.fixture(scope="module")
def host(hostname):
    return get_host(hostname)


@pytest.fixture(scope="module")
def platform(hostname):
    return _platforms().get(hostname, {})


@pytest.fixture(scope="module")
def profile(platform):
    return yaml.safe_load((ROOT / "lab" / "sandbox" / "profiles" / f"{platform['profile']}.yaml").read_text())


def playbook_command(playbook, *args: str, strategy: str = "") -> tuple[list[str], dict[str, str]]:
    """The command and environment that run a playbook against the scenario's inventory, as
    Molecule's converge did (for a run in the background; ansible_playbook runs it and waits).

    ``strategy``: "linear", Ansible's default, even in a scenario that runs under mitogen's
    (.config/molecule/config.yml), for a test of what a user's default run prints;
    "mitogen_linear", mitogen's (what RIGOPS_MITOGEN=1 runs), whatever the scenario runs under.
    """
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
    cmd = [
        "ansible-playbook",
        "-i",
        str(inventory),
        "-i",
        str(ROOT / "inventories" / "sandbox" / "groups.yml"),
        str(playbook),
        *args,
    ]
    # Molecule forces colour for its own runs; the recap lines are parsed, so none here
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="false", ANSIBLE_NOCOLOR="true")
    if strategy == "linear":
        for var in ("ANSIBLE_STRATEGY", "ANSIBLE_STRATEGY_PLUGINS"):
            env.pop(var, None)
    elif strategy:
        env.update(ANSIBLE_STRATEGY=strategy, ANSIBLE_STRATEGY_PLUGINS=str(ROOT / "strategy_plugins"))
    return cmd, env


def ansible_playbook(playbook, *args: str, strategy: str = "") -> tuple[int, str]:
    """Run a playbook (see playbook_command); the exit code and the output (stdout and stderr together)."""
    cmd, env = playbook_command(playbook, *args, strategy=strategy)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    # RIGOPS_PLAYBOOK_LOG: every run a test makes, appended whole (with ANSIBLE_CALLBACKS_ENABLED=
    # ansible.posix.profile_tasks, where a scenario's verify spends its time)
    if os.environ.get("RIGOPS_PLAYBOOK_LOG"):
        with open(os.environ["RIGOPS_PLAYBOOK_LOG"], "a", encoding="utf-8") as log:
            log.write(f"===== {shlex.join(cmd)}: rc {proc.returncode} in {time.monotonic() - start:.1f}s\n")
            log.write(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr


def recap(output: str, hostname: str) -> dict[str, int]:
    """One host's PLAY RECAP counters ({"ok": .., "changed": .., "unreachable": .., "failed": ..})."""
    m = re.search(
        rf"^{re.escape(hostname)}\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M
    )
    assert m, output[-3000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()), strict=True))


def alias_inventory(path: Path, of: str, aliases: dict[str, dict]) -> Path:
    """Write an inventory of aliases of the scenario's host ``of``: each reaches that host (its
    address, port, user and key from Molecule's inventory), has its variables and groups, and the
    alias's own variables on top. For refusals: one run with an alias per case judges every case
    (``-i path -l alias,...``), where a run per case costs an Ansible start each."""
    inventory = Path(os.environ["MOLECULE_INVENTORY_FILE"])
    connection = yaml.safe_load(inventory.read_text())["all"]["hosts"][of]
    own = yaml.safe_load((inventory.parent / "host_vars" / of).read_text()) or {}
    groups = _platforms()[of].get("groups", [])
    hosts = {name: {**connection, **own, **extra} for name, extra in aliases.items()}
    children = {group: {"hosts": dict.fromkeys(hosts)} for group in groups}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts, "children": children}}))
    return path


def per_host(output: str, host: str) -> str:
    """What a run printed about one host: its task results with their messages (the YAML callback
    indents a result's lines below its header), the loop items labelled with its name (the
    report's line) and its recap line."""
    marks = (f"[{host}]", f"(item={host})")
    kept, keep = [], False
    for line in output.splitlines():
        if line[:1] not in ("", " ", "\t"):
            head = re.split(r"=>\s*[{\[]", line, maxsplit=1)[0]  # not a one-line JSON result's text
            keep = any(mark in head for mark in marks) or re.match(rf"{re.escape(host)}\s*:", line) is not None
        if keep:
            kept.append(line)
    return "\n".join(kept)


def ansible_playbooks(runs: dict, workers: int = 4) -> dict:
    """Run several playbooks at once (runs: {key: (playbook, *args)}); {key: (rc, output)}.

    For refusals: each run stops in a preflight and changes nothing, so they need not wait
    for each other (most of a refused run is Ansible starting up and reading the inventory).
    """
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(ansible_playbook, *run) for key, run in runs.items()}
        return {key: future.result() for key, future in futures.items()}


def installed_packages(host, *patterns: str) -> list[str]:
    """The installed packages (dpkg status `ii`) matching the glob patterns, asked of dpkg itself.

    dpkg-query exits 1 when a pattern matches nothing: that, and only that, counts as "none"; any other
    failure (no dpkg-query, a broken database) fails the test instead of reading as "nothing installed".
    """
    quoted = " ".join("'" + p.replace("'", "") + "'" for p in patterns)
    result = host.run(f"dpkg-query -W -f '${{db:Status-Abbrev}} ${{Package}}\\n' {quoted}")
    misses = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.rc in (0, 1) and all("no packages found matching" in line for line in misses), (
        f"dpkg-query failed (rc {result.rc}): {result.stderr.strip()}"
    )
    return [line.split()[1] for line in result.stdout.splitlines() if line.startswith("ii ")]


# A hosted provider's stand-in (OpenAI's API, plain http on the host's loopback): /v1/models and
# /v1/chat/completions (streamed or not) for the model hosted-1, behind its own key; one JSON line per
# request with the headers it received (the gateway's tests check what reaches a provider).
STANDIN = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
KEY, LOG = open(sys.argv[1]).read().strip(), sys.argv[2]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def allowed(self, body):
        with open(LOG, "a") as fh:
            fh.write(json.dumps({"path": self.path, "headers": dict(self.headers),
                                 "model": (body or {}).get("model")}) + "\n")
        if self.headers.get("Authorization") == "Bearer " + KEY:
            return True
        self.reply(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
        return False
    def do_GET(self):
        if self.allowed(None):
            self.reply(200, {"object": "list", "data": [{"id": "hosted-1", "object": "model"}]})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self.allowed(body):
            return
        if body.get("model") != "hosted-1":
            return self.reply(404, {"error": {"message": "model not found", "type": "invalid_request_error"}})
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
            return self.reply(200, {"object": "chat.completion", "model": "hosted-1", "choices": [choice]})
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
        # as OpenAI's streams: the text's chunks, then one with an empty delta and the finish reason
        for delta, finish in (({"content": "h"}, None), ({"content": "i"}, None), ({}, "stop")):
            event = {"object": "chat.completion.chunk", "model": "hosted-1",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            chunk = ("data: " + json.dumps(event) + "\n\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk)); self.wfile.flush(); time.sleep(0.05)
        chunk = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", 9411), H).serve_forever()
"""


def start_hosted_standin(host, key: str, log: str) -> None:
    """The stand-in provider on ``host`` as the transient unit rigops-remote-standin, on 127.0.0.1:9411,
    its key in a root-only file (no command line carries it); returns once it answers."""
    folder = "/opt/rigops-standin"
    host.check_output(f"install -d -m 700 {folder} && cat > {folder}/standin.py <<'EOF'\n{STANDIN}\nEOF")
    host.check_output(f"install -m 600 /dev/null {folder}/key && cat > {folder}/key <<'EOF'\n{key}\nEOF")
    host.run("systemctl stop rigops-remote-standin")
    host.check_output(
        f"systemd-run --unit rigops-remote-standin /usr/bin/python3 {folder}/standin.py {folder}/key {log}"
    )
    for _ in range(50):
        if host.run("curl -s -o /dev/null http://127.0.0.1:9411/v1/models").rc == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the hosted provider's stand-in did not answer on 127.0.0.1:9411")


# ----------------------------------------------------------------------------- the GPU health sentinel
SENTINEL = "/usr/local/lib/rigops-gpu-health/rigops-gpu-health"
GPU_HEALTH_TEXTFILE = "/var/lib/prometheus/node-exporter/rigops_gpu_health.prom"


def gpu_health_status(host) -> dict:
    """The last state the host's sentinel wrote (`rigops-gpu-health status`: 0 healthy, 1 not)."""
    res = host.run(f"{SENTINEL} status")
    assert res.rc in (0, 1), res.stderr
    return json.loads(res.stdout)


def wait_for_gpu_health(host, what: str, predicate, timeout: float = 40) -> dict:
    """The sentinel's first state for which predicate(state) holds, within timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        state = gpu_health_status(host)
        if predicate(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; last state: {json.dumps(state)[:3000]}")
        time.sleep(1)
