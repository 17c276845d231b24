#!/usr/bin/env python3
"""The sandbox fleet: local systemd containers that stand in for GPU rigs and Jetsons.

One mechanism for the demo and the tests: ``./rigops sandbox up`` creates the hosts of
``inventories/sandbox``; Molecule's create/destroy playbooks call ``up --host`` and
``down --host`` for theirs.

    fleet.py image                     build the host image if its recipe changed
    fleet.py snapshot STAGE            build a converged stage's image if its recipe changed
    fleet.py up [--inventory DIR] [--host NAME:PROFILE:PORT[:STAGE] ...] [--json]
    fleet.py list
    fleet.py down [--inventory DIR] [--host NAME ...] [--all]

Every command is idempotent: ``up`` twice creates nothing the second time and says so.
A host made ``:STAGE`` starts from a converged stage snapshot (``lab/sandbox/stages/``): the
host image after the stage's playbook ran on it, committed once and reused until a file
that produced it changes, so a scenario for a later role does not reinstall the runtime.
Hosts are reached like real rigs, over SSH on 127.0.0.1:<port>, with a sandbox key pair
and their host keys recorded in ``lab/sandbox/.state/known_hosts`` (read from each container,
not trusted on first use). Podman runs with the project's ``CONTAINERS_CONF`` only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "lab" / "sandbox"
STATE = Path(os.environ.get("RIGOPS_SANDBOX_STATE", SANDBOX / ".state"))
CACHE = Path(os.environ.get("RIGOPS_CACHE", Path.home() / ".cache" / "rigops"))
CONTAINERS_CONF = SANDBOX / "podman" / "containers.conf"
DEBIAN_MIRROR = os.environ.get("RIGOPS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
NETWORK = "rigops"
PREFIX = "rigops-"
LABEL = "rigops.sandbox"
IMAGE_REPO = "localhost/rigops-host"
DEFAULT_INVENTORY = ROOT / "inventories" / "sandbox"
SSH_USER = "rigops"


class FleetError(Exception):
    """A failure with a message that says what to do."""


_HELD: dict[str, int] = {}


@contextlib.contextmanager
def fleet_lock(name: str):
    """An exclusive lock across processes (the test runner's lanes call `up` at once), held
    while shared things are made: the image, a stage snapshot, the network, the services,
    the key pair, the known_hosts file. Re-entrant within one process."""
    if _HELD.get(name):
        _HELD[name] += 1
        try:
            yield
        finally:
            _HELD[name] -= 1
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".lock-{name}", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD[name] = 1
        try:
            yield
        finally:
            _HELD[name] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def yaml_load(path: Path):
    import yaml  # noqa: PLC0415 (PyYAML comes with Ansible in the project venv)

    return yaml.safe_load(path.read_text())


def log(msg: str) -> None:
    print(f"[fleet] {msg}", file=sys.stderr, flush=True)


def podman_command() -> list[str]:
    """podman, with overlay's metacopy where podman runs as root on a kernel that has it.

    A new runtime release is seeded from the live one with hardlinks (plugins/module_utils/vllm_runtime_seed.py):
    free on a disk, but on overlay without metacopy each link first copies the whole file up from
    the image (3.5 GB and about 45 s per host for the CPU runtime). With metacopy only the metadata
    is copied up. A global flag rather than a storage.conf: the command podman leaves for a
    container's restart (a reboot inside it) repeats the flags, not the environment, and every
    mount of a container must agree on metacopy. Whatever restarts a sandbox host uses this command.
    """
    if os.geteuid() == 0 and Path("/sys/module/overlay/parameters/metacopy").exists():
        return ["podman", "--storage-opt", "overlay.mountopt=nodev,metacopy=on"]
    return ["podman"]


def podman_env() -> dict:
    """The environment podman runs with: the project's containers.conf only."""
    return dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))


def podman(*args: str, check: bool = True, capture: bool = True, **kw) -> subprocess.CompletedProcess:
    env = podman_env()
    proc = subprocess.run([*podman_command(), *args], check=False, env=env, text=True, capture_output=capture, **kw)
    if check and proc.returncode != 0:
        raise FleetError(f"podman {' '.join(args)} failed ({proc.returncode}): {(proc.stderr or '').strip()}")
    return proc


# --------------------------------------------------------------------------- image


def image_recipe_hash() -> str:
    """Hash of everything that goes into the image: rebuild only when it changes."""
    h = hashlib.sha256(f"{SUITE}\n{DEBIAN_MIRROR}\n".encode())
    for path in sorted((SANDBOX / "image").iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def image_tag() -> str:
    return f"{IMAGE_REPO}:{image_recipe_hash()}"


def packages() -> list[str]:
    lines = (SANDBOX / "image" / "packages.txt").read_text().splitlines()
    return [ln.split("#")[0].strip() for ln in lines if ln.split("#")[0].strip()]


def build_image() -> str:
    with fleet_lock("image"):
        return _build_image()


def _build_image() -> str:
    tag = image_tag()
    if podman("image", "exists", tag, check=False).returncode == 0:
        log(f"image {tag}: cached")
        return tag
    for tool in ("debootstrap", "chroot"):
        if not shutil.which(tool):
            raise FleetError(f"{tool} not found: install it (apt-get install -y debootstrap) and retry")
    start = time.monotonic()
    log(f"image {tag}: building with debootstrap from {DEBIAN_MIRROR} (about a minute)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="image-build-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages())}",
                SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        shutil.copy(SANDBOX / "image" / "customize.sh", rootfs / "customize.sh")
        subprocess.run(["chroot", str(rootfs), "/bin/sh", "/customize.sh"], check=True)
        (rootfs / "customize.sh").unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        podman(
            "import",
            "--change",
            'CMD=["/sbin/init"]',
            "--change",
            "STOPSIGNAL=SIGRTMIN+3",
            "--change",
            f"LABEL {LABEL}.recipe={image_recipe_hash()}",
            "-",
            tag,
            stdin=tar.stdout,
        )
        if tar.wait() != 0:
            raise FleetError("tar of the image root failed")
    # Old images of this repo are unused once the recipe changed: drop them.
    for line in podman("images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO).stdout.split():
        if line != tag:
            podman("rmi", line, check=False)
    log(f"image {tag}: built in {time.monotonic() - start:.0f}s")
    return tag


# --------------------------------------------------------------------------- stage snapshots

STAGES_DIR = SANDBOX / "stages"
STAGE_REPO = "localhost/rigops-stage"
# SSH ports of the short-lived hosts that build snapshots (one per stage, never in a scenario).
STAGE_PORT_BASE = 2331


def stage_recipes() -> dict[str, dict]:
    return yaml_load(STAGES_DIR / "stages.yml")


def stage_recipe(name: str) -> dict:
    recipes = stage_recipes()
    if name not in recipes:
        raise FleetError(f"no stage snapshot {name!r} in {STAGES_DIR / 'stages.yml'} (known: {', '.join(recipes)})")
    return recipes[name]


def _tree_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FleetError(f"stage input {path} does not exist (fix lab/sandbox/stages/stages.yml)")
    return sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def stage_recipe_hash(name: str) -> str:
    """Hash of everything that produced the stage: the image (or the stage it starts from),
    the recipe, its playbook and every input file. A change to any of them rebuilds it."""
    recipe = stage_recipe(name)
    start = stage_image(recipe["after"]) if recipe.get("after") else image_tag()
    h = hashlib.sha256(json.dumps([start, name, recipe, HOST_RUN_OPTIONS], sort_keys=True).encode())
    for path in [STAGES_DIR / recipe["playbook"], SANDBOX / "profiles" / f"{recipe['profile']}.yaml"] + [
        f for rel in recipe.get("inputs", []) for f in _tree_files(ROOT / rel)
    ]:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def stage_image(name: str) -> str:
    return f"{STAGE_REPO}-{name}:{stage_recipe_hash(name)}"


def build_snapshot(name: str) -> str:
    """The stage's image, built when its recipe changed: a host made for it, the stage's
    playbook run on it over SSH as on any rig, the host stopped and committed."""
    with fleet_lock(f"stage-{name}"):
        return _build_snapshot(name)


def _build_snapshot(name: str) -> str:
    tag = stage_image(name)
    if podman("image", "exists", tag, check=False).returncode == 0:
        log(f"stage {name} {tag}: cached")
        return tag
    recipe = stage_recipe(name)
    port = STAGE_PORT_BASE + sorted(stage_recipes()).index(name)
    builder = Host(f"stage-{name}", recipe["profile"], port, recipe.get("after", ""))
    start = time.monotonic()
    log(f"stage {name} {tag}: building (host {builder.name}, playbook lab/sandbox/stages/{recipe['playbook']})")
    podman("rm", "-f", "-t", "0", builder.container, check=False)
    up([builder], as_json=False)
    inventory = STATE / f"{builder.name}.yml"
    groups = {g: {"hosts": {builder.name: None}} for g in recipe.get("groups", [])}
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {builder.name: connection_vars(builder)},
                    "children": groups,
                }
            }
        )
    )
    playbook = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(inventory),
        "-i",
        str(DEFAULT_INVENTORY / "groups.yml"),
        str(STAGES_DIR / recipe["playbook"]),
    ]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(playbook, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        podman("rm", "-f", "-t", "0", builder.container, check=False)
        raise FleetError(f"stage {name}: its playbook failed; last lines:\n{proc.stdout[-3000:]}{proc.stderr[-1000:]}")
    podman("stop", "-t", "30", builder.container)
    podman("commit", "--quiet", "--change", f"LABEL {LABEL}.stage={name}", builder.container, tag)
    podman("rm", "-f", builder.container)
    inventory.unlink()
    for line in podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"{STAGE_REPO}-{name}").stdout.split():
        if line != tag:
            podman("rmi", line, check=False)
    log(f"stage {name} {tag}: built in {time.monotonic() - start:.0f}s")
    return tag


# --------------------------------------------------------------------------- services


@dataclass
class Service:
    """A service container on the sandbox network, serving what a builder made in the cache.

    Only the cache folder is mounted, read-only at /cache (builders replace their output
    folders atomically, which a bind mount of the folder itself would not see; sources a
    service runs are staged there by content hash). ``build`` prints its output folder as
    its last stdout line; ``command`` turns that folder (as seen inside the container)
    into the argv.
    """

    name: str
    port: int
    host_port: int
    build: list[str]
    command: Callable[[str], list[str]]

    @property
    def container(self) -> str:
        return PREFIX + self.name


def _in_container(path: str) -> str:
    return "/cache/" + str(Path(path).resolve().relative_to(CACHE.resolve()))


def _staged(folder: Path) -> str:
    """Copy a source folder into the cache under its content hash; its in-container path.

    Services mount only the cache, so a service container does not depend on the
    checkout that created it (CI clones come and go).
    """
    h = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    dest = CACHE / "src" / f"{folder.name}-{h.hexdigest()[:12]}"
    if not dest.exists():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns("__pycache__"))
        tmp.rename(dest)
    return _in_container(str(dest))


def services() -> list[Service]:
    py = sys.executable

    def http_server(port: int) -> Callable[[str], list[str]]:
        return lambda folder: ["python3", "-m", "http.server", str(port), "--directory", _in_container(folder)]

    return [
        Service(
            name="repo",
            port=8080,
            host_port=18080,
            build=[py, str(SANDBOX / "driver_repo" / "build_repo.py"), "--out", str(CACHE / "nvidia-repo")],
            command=http_server(8080),
        ),
        Service(
            name="hub",
            port=8090,
            host_port=18090,
            build=[py, str(SANDBOX / "model" / "make_tiny_model.py")],
            command=lambda models: [
                "python3",
                _staged(SANDBOX / "hub") + "/hub.py",
                "--root",
                _in_container(models),
                "--host",
                "0.0.0.0",
                "--port",
                "8090",
            ],
        ),
        Service(
            name="wheels",
            port=8070,
            host_port=18070,
            build=[py, str(SANDBOX / "wheelhouse" / "build.py")],
            command=http_server(8070),
        ),
    ]


def ensure_network() -> None:
    if podman("network", "exists", NETWORK, check=False).returncode != 0:
        podman("network", "create", NETWORK)
        log(f"network {NETWORK}: created")


def ensure_service(svc: Service, image: str) -> None:
    built = subprocess.run(svc.build, check=True, stdout=subprocess.PIPE, text=True).stdout
    folder = built.strip().splitlines()[-1].split()[-1]  # builders print their output folder last
    command = svc.command(folder)
    spec_data = [image, svc.port, svc.host_port, command, str(CACHE)]
    spec = hashlib.sha256(json.dumps(spec_data).encode()).hexdigest()[:12]
    name = svc.container
    state = container_state(name)
    if state == "stale":
        remove_stale(name, f"service {svc.name}")
        state = None
    if state and container_label(name, f"{LABEL}.spec") != spec:
        log(f"service {svc.name}: definition changed, recreating")
        podman("rm", "-f", "-t", "1", name)
        state = None
    if state is None:
        podman(
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            NETWORK,
            "--network-alias",
            name,
            "-p",
            f"127.0.0.1:{svc.host_port}:{svc.port}",
            "-v",
            f"{CACHE}:/cache:ro",
            "--label",
            f"{LABEL}=service",
            "--label",
            f"{LABEL}.spec={spec}",
            "--restart",
            "always",
            image,
            *command,
        )
        log(f"service {svc.name}: started on http://{name}:{svc.port} (host: 127.0.0.1:{svc.host_port})")
    elif state != "running":
        podman("start", name)
        log(f"service {svc.name}: started")
    else:
        log(f"service {svc.name}: ok")
    wait_listening(svc)


def wait_listening(svc: Service, timeout: float = 30) -> None:
    """Fail here, naming the service, rather than later in a host's task."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", svc.host_port), timeout=2):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                logs = podman("logs", "--tail", "20", svc.container, check=False)
                raise FleetError(
                    f"service {svc.name} does not answer on 127.0.0.1:{svc.host_port} ({exc}); its last log lines:\n"
                    f"{logs.stdout}{logs.stderr}\nRemove it with `podman rm -f {svc.container}` and run `up` again."
                ) from exc
            time.sleep(0.5)


# --------------------------------------------------------------------------- hosts


@dataclass
class Host:
    name: str
    profile: str
    port: int
    stage: str = ""
    # ports of the container published on the controller's loopback: ((controller port, host port), ...)
    publish: tuple[tuple[int, int], ...] = ()

    @property
    def container(self) -> str:
        return PREFIX + self.name


def container_state(name: str) -> str | None:
    """Podman's status of the container, "stale" when podman's record outlived it, None if absent.

    When the processes of a session are killed wholesale (conmon and the container with
    them), podman still records "running" and refuses to start or stop the container:
    only its removal works. The container's monitor (conmon) being gone tells it apart.
    """
    proc = podman("container", "inspect", "--format", "{{.State.Status}} {{.State.ConmonPid}}", name, check=False)
    if proc.returncode != 0:
        return None
    status, _, conmon = proc.stdout.strip().partition(" ")
    if status in ("running", "paused", "stopping") and not _is_conmon(conmon):
        return "stale"
    return status


def _is_conmon(pid: str) -> bool:
    """A live (not zombie) process named conmon."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (ValueError, OSError):
        return False
    name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()[0]
    return name == "conmon" and state not in ("Z", "X")


def remove_stale(name: str, what: str) -> None:
    log(f"{what}: its processes are gone but podman still lists it (killed session?); recreating")
    for attempt in range(3):
        # The first removal can race podman's own late clean-up ("container state improper").
        if podman("rm", "-f", "-t", "0", name, check=attempt == 2).returncode == 0:
            return
        time.sleep(1)


def container_label(name: str, label: str) -> str:
    proc = podman("container", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', name, check=False)
    return proc.stdout.strip()


def inventory_hosts(inventory: Path) -> list[Host]:
    exe = shutil.which("ansible-inventory") or str(Path(sys.executable).parent / "ansible-inventory")
    proc = subprocess.run(
        [exe, "-i", str(inventory), "--list"],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise FleetError(f"cannot read inventory {inventory}: {proc.stderr.strip()}")
    hostvars = json.loads(proc.stdout).get("_meta", {}).get("hostvars", {})
    hosts = []
    for name, hv in sorted(hostvars.items()):
        if "sandbox_profile" not in hv:
            continue
        if "ansible_port" not in hv:
            raise FleetError(f"host {name} in {inventory} has sandbox_profile but no ansible_port")
        hosts.append(Host(name, hv["sandbox_profile"], int(hv["ansible_port"]), publish=_publish(name, hv)))
    return hosts


def _publish(name: str, hostvars: dict) -> tuple[tuple[int, int], ...]:
    """sandbox_publish: {port on the host: port on the controller's 127.0.0.1} (a gateway's HTTPS, say)."""
    value = hostvars.get("sandbox_publish") or {}
    try:
        pairs = tuple(sorted((int(outside), int(inside)) for inside, outside in dict(value).items()))
    except (TypeError, ValueError) as exc:
        why = f"host {name}: sandbox_publish must map ports to ports, e.g. {{8443: 2443}}: {value!r}"
        raise FleetError(why) from exc
    if any(not 0 < p < 65536 for pair in pairs for p in pair):
        raise FleetError(f"host {name}: sandbox_publish has a port outside 1-65535: {value!r}")
    return pairs


def parse_host_spec(spec: str) -> Host:
    try:
        name, profile, port, *stage = spec.split(":")
        if len(stage) > 1:
            raise ValueError(spec)
        return Host(name, profile, int(port), stage[0] if stage else "")
    except ValueError as exc:
        raise FleetError(
            f"--host {spec!r}: expected NAME:PROFILE:PORT[:STAGE], for example rig1:rtx5090x8:2301 "
            "or mw-rig1:nogpu:2351:runtime"
        ) from exc


def ensure_keypair() -> Path:
    STATE.mkdir(parents=True, exist_ok=True)
    key = STATE / "id_ed25519"
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigops-sandbox", "-f", str(key)],
            check=True,
        )
        log(f"ssh key: created {key}")
    return key


def ensure_demo_client_key() -> Path:
    """The key of the demo fleet's gateway client `demo` (inventories/sandbox/host_vars/gateway-01): made
    once per machine, 0600, never in the repository."""
    STATE.mkdir(parents=True, exist_ok=True)
    path = STATE / "demo-client-key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32) + "\n")
        log(f"gateway client key: created {path}")
    return path


def exec_in(host: Host, *cmd: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    return podman("exec", "-i", host.container, *cmd, check=check, input=stdin)


# How every sandbox host container runs (besides its name, port and labels). Part of the
# label `rigops.sandbox.spec`, so a change here recreates the hosts on the next `up`.
HOST_RUN_OPTIONS = [
    # A reboot (systemctl reboot inside) ends the container; podman starts it again.
    "--restart=always",
    # systemd needs it to set up the namespaces of hardened units (PrivateTmp,
    # ProtectSystem, ...) as it does on a real host; without it they fail with
    # 226/NAMESPACE. No devices, no --privileged.
    "--cap-add=SYS_ADMIN",
    # A server's /dev/shm is half its memory; podman's default 64 MiB is too small for
    # vLLM's shared-memory broadcast.
    "--shm-size=2g",
]


def host_spec(host: Host, image: str) -> str:
    spec = [host.profile, image, HOST_RUN_OPTIONS] + ([list(host.publish)] if host.publish else [])
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:12]


def create_host(host: Host, image: str) -> None:
    profile = SANDBOX / "profiles" / f"{host.profile}.yaml"
    if not profile.exists():
        known = ", ".join(sorted(p.stem for p in (SANDBOX / "profiles").glob("*.yaml")))
        raise FleetError(f"host {host.name}: no hardware profile {host.profile!r} (known: {known})")
    podman(
        "run",
        "-d",
        "--name",
        host.container,
        "--hostname",
        host.name,
        "--network",
        NETWORK,
        "--network-alias",
        host.name,
        "-p",
        f"127.0.0.1:{host.port}:22",
        *(arg for outside, inside in host.publish for arg in ("-p", f"127.0.0.1:{outside}:{inside}")),
        "--label",
        f"{LABEL}=host",
        "--label",
        f"{LABEL}.profile={host.profile}",
        "--label",
        f"{LABEL}.spec={host_spec(host, image)}",
        *HOST_RUN_OPTIONS,
        image,
    )


def wait_booted(host: Host, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = exec_in(host, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            if state == "degraded":
                failed = exec_in(host, "systemctl", "--failed", "--plain", "--no-legend", check=False).stdout
                log(f"host {host.name}: systemd degraded; failed units:\n{failed.strip()}")
            return
        time.sleep(0.5)
    raise FleetError(f"host {host.name}: systemd did not finish booting in {timeout:.0f}s (state {state!r})")


def install_hardware(host: Host) -> bool:
    """Lay down the simulated hardware of the host's profile (idempotent)."""
    profile = (SANDBOX / "profiles" / f"{host.profile}.yaml").read_text()
    exec_in(host, "mkdir", "-p", "/etc/nvidia-sim", "/opt/nvidia-sim")
    exec_in(host, "sh", "-c", "cat > /etc/nvidia-sim/profile.yaml", stdin=profile)
    tar = subprocess.run(
        ["tar", "-C", str(SANDBOX), "-c", "hardware"],
        check=True,
        capture_output=True,
    )
    env = podman_env()
    subprocess.run(
        [
            "podman",
            "exec",
            "-i",
            host.container,
            "sh",
            "-c",
            "rm -rf /opt/nvidia-sim/hardware && tar -C /opt/nvidia-sim -x",
        ],
        input=tar.stdout,
        check=True,
        env=env,
    )
    out = exec_in(host, "/opt/nvidia-sim/hardware/install-hardware").stdout
    return "unchanged" not in out


def authorize(host: Host, pubkey: str) -> bool:
    """The sandbox key for the SSH user (what Ansible logs in as, then sudo) and for root: the
    verify steps' own access (molecule/resources/python/rigops_testinfra.py), as `podman exec`
    gave it, without a sudo line per command in the host's journal."""
    changed = False
    for user, home in ((SSH_USER, f"/home/{SSH_USER}"), ("root", "/root")):
        keys = f"{home}/.ssh/authorized_keys"
        if exec_in(host, "cat", keys, check=False).stdout.strip() == pubkey.strip():
            continue
        exec_in(
            host,
            "sh",
            "-c",
            f"umask 077 && mkdir -p {home}/.ssh && cat > {keys} && chown -R {user}: {home}/.ssh",
            stdin=pubkey,
        )
        changed = True
    return changed


def host_key(host: Host, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = exec_in(host, "cat", "/etc/ssh/ssh_host_ed25519_key.pub", check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return " ".join(proc.stdout.split()[:2])
        time.sleep(0.5)
    raise FleetError(f"host {host.name}: no SSH host key after {timeout:.0f}s (is ssh-hostkeys.service failing?)")


def record_known_hosts(entries: dict[str, str]) -> None:
    """Replace the lines of these hosts in the sandbox known_hosts file, keep the others."""
    with fleet_lock("known_hosts"):
        _record_known_hosts(entries)


def _record_known_hosts(entries: dict[str, str]) -> None:
    path = STATE / "known_hosts"
    lines = path.read_text().splitlines() if path.exists() else []
    keep = [ln for ln in lines if ln.split(" ", 1)[0] not in entries]
    new = keep + [f"{addr} {key}" for addr, key in sorted(entries.items())]
    if new != lines:
        path.write_text("\n".join(new) + "\n")


def wait_ssh(host: Host, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", host.port), timeout=2) as sock:
                if sock.recv(4).startswith(b"SSH"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise FleetError(f"host {host.name}: sshd does not answer on 127.0.0.1:{host.port}")


def connection_vars(host: Host) -> dict:
    """How Ansible reaches a sandbox host: SSH as a real rig, host keys checked."""
    return {
        "ansible_host": "127.0.0.1",
        "ansible_port": host.port,
        "ansible_user": SSH_USER,
        "ansible_become": True,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_ssh_private_key_file": str(STATE / "id_ed25519"),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={STATE / 'known_hosts'} -o StrictHostKeyChecking=yes",
    }


def up(hosts: list[Host], as_json: bool) -> None:
    start = time.monotonic()
    base = build_image()
    # stage snapshots first: building one brings up (and removes) a host of its own
    stages = {stage: build_snapshot(stage) for stage in sorted({h.stage for h in hosts if h.stage})}
    images = {h.name: stages[h.stage] if h.stage else base for h in hosts}
    with fleet_lock("shared"):
        ensure_network()
        for svc in services():
            ensure_service(svc, base)
        key = ensure_keypair()
        ensure_demo_client_key()
    pubkey = Path(f"{key}.pub").read_text()
    ports = {}
    for host in hosts:
        for port in (host.port, *(outside for outside, _ in host.publish)):
            if port in ports:
                raise FleetError(f"hosts {ports[port]} and {host.name} both use port {port}")
            ports[port] = host.name
    created = []
    for host in hosts:
        state = container_state(host.container)
        if state == "stale":
            remove_stale(host.container, f"host {host.name}")
            state = None
        image = images[host.name]
        if state is not None and container_label(host.container, f"{LABEL}.spec") != host_spec(host, image):
            log(f"host {host.name}: profile, image or run options changed, recreating")
            podman("rm", "-f", host.container)
            state = None
        if state is None:
            create_host(host, image)
            created.append(host.name)
            if host.stage:
                log(f"host {host.name}: from stage snapshot {image}")
        elif state != "running":
            podman("start", host.container)
            log(f"host {host.name}: started")
    known = {}
    for host in hosts:
        wait_booted(host)
        # Every time, not only at creation: it is idempotent, and it completes a host
        # whose creation was interrupted.
        hw_changed = install_hardware(host)
        if host.name in created:
            log(f"host {host.name}: created ({host.profile}, ssh 127.0.0.1:{host.port})")
        changed = authorize(host, pubkey) or hw_changed
        known[f"[127.0.0.1]:{host.port}"] = host_key(host)
        wait_ssh(host)
        if host.name not in created:
            log(f"host {host.name}: {'updated' if changed else 'ok'}")
    record_known_hosts(known)
    log(f"up: {len(hosts)} host(s), {len(created)} created, in {time.monotonic() - start:.1f}s")
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "instance": h.name,
                        "address": "127.0.0.1",
                        "port": h.port,
                        "user": SSH_USER,
                        "identity_file": str(key),
                        "known_hosts": str(STATE / "known_hosts"),
                        "container": h.container,
                        "profile": h.profile,
                        "stage": h.stage,
                    }
                    for h in hosts
                ]
            )
        )


def set_aside(name: str) -> Path | None:
    """Move what the stopped container wrote (its overlay upper layer) out of podman's storage.

    A host that installed vLLM releases wrote 100k+ files; `podman rm` deletes them while it holds
    podman's storage lock (podman 4.3), 15-60 s in which every other lane's podman command waits
    too. Renamed within the same filesystem the files leave at once; delete_in_background deletes
    them after. None (podman deletes them itself) where that cannot be done: a user without the
    rights (rootless podman), a container without an upper layer. When a rename fails halfway, what
    moved is returned all the same (to be deleted now) and podman deletes the rest.
    """
    proc = podman("container", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", name, check=False)
    upper = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    if upper is None or not upper.is_dir() or len(upper.parents) < 2:
        return None
    # beside the layers: podman bind-mounts its overlay folder onto itself, a rename across mounts fails
    trash = upper.parents[1] / "rigops-trash"
    target = None
    try:
        trash.mkdir(mode=0o700, exist_ok=True)
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=trash))
        for entry in upper.iterdir():
            entry.rename(target / entry.name)
    except OSError:
        pass
    return target


def delete_in_background(paths: list[Path]) -> None:
    """Delete set-aside host files, and any an earlier deletion left (it was interrupted), in a
    process of their own that outlives this command: the runner's lane goes on meanwhile."""
    trashes = {p.parent for p in paths}
    leftovers = [p for t in trashes for p in t.iterdir() if p not in paths]
    if paths or leftovers:
        subprocess.Popen(  # noqa: S603 (fixed argv: rm on folders this module made)
            ["nice", "-n", "10", "rm", "-rf", "--one-file-system", *map(str, paths + leftovers)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def down(names: list[str], everything: bool) -> None:
    targets = [PREFIX + n for n in names]
    if everything:
        out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").stdout
        targets = out.split()
    present = [name for name in targets if container_state(name) is not None]
    # no grace period, the hosts are thrown away; what they wrote is deleted in the background
    if present:
        podman("stop", "-t", "0", *present, check=False)
        aside = [set_aside(name) for name in present]
        podman("rm", "-f", "-t", "0", *present)
        aside = [path for path in aside if path]
        delete_in_background(aside)
        if aside:
            log(f"files of {len(aside)} host(s) set aside, deleted in the background: {aside[0].parent}")
    for name in targets:
        log(f"{name}: {'removed' if name in present else 'absent'}")
    if everything and podman("network", "exists", NETWORK, check=False).returncode == 0:
        podman("network", "rm", NETWORK)
        log(f"network {NETWORK}: removed")


def list_fleet() -> None:
    labels = '{{index .Labels "rigops.sandbox"}}\t{{index .Labels "rigops.sandbox.profile"}}'
    fmt = "{{.Names}}\t{{.State}}\t" + labels + "\t{{.Ports}}"
    out = podman("ps", "-a", "--filter", f"label={LABEL}", "--format", fmt).stdout
    current = image_tag()
    built = podman("image", "exists", current, check=False).returncode == 0
    print(f"image: {current} ({'present' if built else 'not built'})")
    for stage in stage_recipes():
        tag = stage_image(stage)
        cached = podman("image", "exists", tag, check=False).returncode == 0
        print(f"stage {stage}: {tag} ({'present' if cached else 'not built'})")
    print(out.strip() or "no sandbox containers")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("image", help="build the host image if its recipe changed")
    p_snap = sub.add_parser("snapshot", help="build a converged stage's image if its recipe changed")
    p_snap.add_argument("stage", nargs="+")
    p_up = sub.add_parser("up", help="create or start the sandbox hosts (idempotent)")
    p_up.add_argument("--inventory", type=Path)
    p_up.add_argument("--host", action="append", default=[], metavar="NAME:PROFILE:PORT")
    p_up.add_argument("--json", action="store_true", help="print the hosts' connection details as JSON")
    sub.add_parser("list", help="list sandbox containers")
    p_down = sub.add_parser("down", help="remove sandbox hosts")
    p_down.add_argument("--inventory", type=Path)
    p_down.add_argument("--host", action="append", default=[], metavar="NAME")
    p_down.add_argument("--all", action="store_true", help="also the services and the network")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "image":
            build_image()
        elif args.cmd == "snapshot":
            for stage in args.stage:
                print(build_snapshot(stage))
        elif args.cmd == "up":
            hosts = [parse_host_spec(s) for s in args.host]
            if args.inventory or not hosts:
                hosts += inventory_hosts(args.inventory or DEFAULT_INVENTORY)
            up(hosts, args.json)
        elif args.cmd == "list":
            list_fleet()
        elif args.cmd == "down":
            names = list(args.host)
            if args.inventory or not (names or args.all):
                names += [h.name for h in inventory_hosts(args.inventory or DEFAULT_INVENTORY)]
            down(names, args.all)
    except FleetError as exc:
        print(f"[fleet] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
