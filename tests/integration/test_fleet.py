"""The sandbox fleet machinery: idempotent up, list, down (real podman containers)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOST = "it-fleet"
pytestmark = pytest.mark.integration


def fleet(*args):
    env = dict(os.environ, CONTAINERS_CONF=str(ROOT / "lab" / "sandbox" / "podman" / "containers.conf"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "lab" / "sandbox" / "fleet.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def clean():
    fleet("down", "--host", HOST)
    yield
    fleet("down", "--host", HOST)


def test_up_twice_then_down(clean):
    rc, out, err = fleet("up", "--host", f"{HOST}:nogpu:2398", "--json")
    assert rc == 0, err
    assert "1 created" in err
    rc, out, err = fleet("up", "--host", f"{HOST}:nogpu:2398", "--json")
    assert rc == 0, err
    assert "0 created" in err and f"host {HOST}: ok" in err
    assert "[127.0.0.1]:2398 ssh-ed25519 " in (ROOT / "lab" / "sandbox" / ".state" / "known_hosts").read_text()
    rc, out, _ = fleet("list")
    line = next(ln for ln in out.splitlines() if ln.startswith(f"rigops-{HOST}\t"))
    assert "\tUp " in line and "nogpu" in line and "127.0.0.1:2398->22/tcp" in line
    rc, _, err = fleet("down", "--host", HOST)
    assert rc == 0 and "removed" in err
    rc, _, err = fleet("down", "--host", HOST)
    assert rc == 0 and "absent" in err


def test_down_takes_what_the_host_wrote_out_of_podmans_way_and_deletes_it_after(clean):
    """podman rm would delete it under its storage lock; down sets it aside and deletes it in the background."""
    rc, _, err = fleet("up", "--host", f"{HOST}:nogpu:2398")
    assert rc == 0, err
    env = dict(os.environ, CONTAINERS_CONF=str(ROOT / "lab" / "sandbox" / "podman" / "containers.conf"))

    def podman(*args):
        return subprocess.run(["podman", *args], capture_output=True, text=True, env=env, check=True).stdout.strip()

    podman("exec", f"rigops-{HOST}", "sh", "-c", "mkdir -p /srv/junk && seq 2000 | xargs -I{} touch /srv/junk/{}")
    upper = Path(podman("container", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", f"rigops-{HOST}"))
    assert (upper / "srv" / "junk" / "2000").exists()
    rc, _, err = fleet("down", "--host", HOST)
    assert rc == 0 and "removed" in err and "files of 1 host(s) set aside, deleted in the background" in err
    assert not upper.exists()  # podman removed the layer at once
    trash = upper.parents[1] / "rigops-trash"
    deadline = time.monotonic() + 60
    while any(p.name.startswith(f"rigops-{HOST}-") for p in trash.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(p.name.startswith(f"rigops-{HOST}-") for p in trash.iterdir()), "set aside, never deleted"


def test_ssh_reaches_the_host_with_recorded_host_keys(clean):
    rc, _, err = fleet("up", "--host", f"{HOST}:nogpu:2398")
    assert rc == 0, err
    state = ROOT / "lab" / "sandbox" / ".state"
    ssh = subprocess.run(
        [
            "ssh",
            "-i",
            str(state / "id_ed25519"),
            "-o",
            f"UserKnownHostsFile={state / 'known_hosts'}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-p",
            "2398",
            "rigops@127.0.0.1",
            "sudo -n true && hostname",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ssh.returncode == 0, ssh.stderr
    assert ssh.stdout.strip() == HOST


def test_unknown_profile_is_refused_with_the_known_ones(clean):
    rc, _, err = fleet("up", "--host", f"{HOST}2:no-such-profile:2397")
    assert rc == 1
    assert "no hardware profile 'no-such-profile'" in err and "rtx5090x8" in err
    fleet("down", "--host", f"{HOST}2")


def test_port_clash_is_refused(clean):
    rc, _, err = fleet("up", "--host", "a1:nogpu:2396", "--host", "a2:nogpu:2396")
    assert rc == 1 and "both use port 2396" in err


def test_host_whose_processes_were_killed_is_recreated(clean):
    """A killed session takes conmon and the container with it; podman still says running."""
    rc, _, err = fleet("up", "--host", f"{HOST}:nogpu:2398")
    assert rc == 0, err

    def inspect(fmt):
        env = dict(os.environ, CONTAINERS_CONF=str(ROOT / "lab" / "sandbox" / "podman" / "containers.conf"))
        cmd = ["podman", "inspect", "--format", fmt, f"rigops-{HOST}"]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout.strip()

    for pid in inspect("{{.State.ConmonPid}} {{.State.Pid}}").split():  # conmon first: podman records no exit
        os.kill(int(pid), 9)
    status = inspect("{{.State.Status}}")
    assert status == "running"  # the stale record this test is about
    rc, _, err = fleet("up", "--host", f"{HOST}:nogpu:2398")
    assert rc == 0, err
    assert "its processes are gone" in err and "1 created" in err
