"""Keys set through the inventory (a vault file, the README's route) never leak.

First an instance leaves the inventory (what of it stays, and where). Then the main job's runtime,
weights, services and health stages run on vs-rig at -vvv with both instances' keys from an
ansible-vault file, with Ansible's default strategy (what a user's run prints), then the stages
that handle the keys (services, health) once more under mitogen's (RIGOPS_MITOGEN=1: mitogen logs
its own way at -vvv). Then the keys are searched for everywhere they must not be: both runs'
controller output, the run's report, the rig's journal (modules log "Invoked with" and their
arguments there), the rig's files outside the two key files, the process table and systemd's view
of the units. And the keys still work: each instance answers its own key.
"""

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import ansible_playbook

pytestmark = pytest.mark.changes_state

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
INSTANCES = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["vs-rig"][
    "vllm_instances"
]
KEYS = {
    "alpha": "Vault-alpha-K3y-0123456789-abcdefghijklmnopqrstuv",
    "beta": "Vault-beta-K3y-9876543210-zyxwvutsrqponmlkjihgfedc",
}
# Searched on the rig: everything a run can write to, but the key files themselves, the kernel's
# views and the runtime (root-owned wheels that no run writes after their install).
SEARCH = "/etc /var /run /tmp /root /home /srv /usr/local"


def test_an_instance_that_leaves_the_inventory_takes_its_user_along_and_its_key_aside(host):
    """beta leaves vllm_instances: stopped, disabled, its config and key moved aside root-only, its user
    and group deleted, alpha untouched. The vault run below brings beta back (a new user, the vault's key)."""
    alpha = host.check_output("systemctl show -p MainPID --value vllm@alpha")
    extra = json.dumps({"vllm_instances": [i for i in INSTANCES if i["name"] == "alpha"]})
    rc, out = ansible_playbook(ROOT / "site.yml", "-l", "vs-rig", "--tags", "services", "-e", extra)
    flat = " ".join(out.split())
    assert rc == 0, out[-4000:]
    assert "removed vllm@beta.service (stopped, disabled, user vllm-beta deleted, config and key moved to" in flat
    beta = host.service("vllm@beta")
    assert not beta.is_running and not beta.is_enabled and host.socket("tcp://127.0.0.1:8002").is_listening is False
    assert not host.user("vllm-beta").exists and not host.group("vllm-beta").exists
    assert not host.file("/etc/vllm/beta").exists
    removed = host.file("/etc/vllm/.removed")
    assert (removed.user, removed.mode) == ("root", 0o700)
    moved = host.check_output("ls -dt /etc/vllm/.removed/beta-*").split()[0]
    assert host.file(f"{moved}/api_key").exists and host.file(f"{moved}/config.toml").exists
    assert host.check_output("systemctl show -p MainPID --value vllm@alpha") == alpha


@pytest.fixture(scope="module")
def vault_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vault")
    password = folder / "password"
    password.write_text("rigops-sandbox-vault-password\n")
    secrets_file = folder / "vault.yml"
    secrets_file.write_text(yaml.safe_dump({f"vault_{name}_key": key for name, key in KEYS.items()}))
    encrypt = [str(Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "ansible-vault"), "encrypt"]
    if not Path(encrypt[0]).exists():
        encrypt[0] = "ansible-vault"
    subprocess.run([*encrypt, "--vault-password-file", str(password), str(secrets_file)], check=True)
    assert "$ANSIBLE_VAULT" in secrets_file.read_text()
    instances = [dict(i, security={"api_key": "{{ vault_" + i["name"] + "_key }}"}) for i in INSTANCES]
    extra = folder / "instances.json"
    extra.write_text(json.dumps({"vllm_instances": instances, "rigops_report_dir": str(folder / "reports")}))
    args = (
        "-l", "vs-rig", "-vvv",
        "-e", f"@{secrets_file}", "-e", f"@{extra}", "--vault-password-file", str(password),
    )  # fmt: skip
    rc, out = ansible_playbook(ROOT / "site.yml", *args, "--tags", "runtime,weights,services,health", strategy="linear")
    # mitogen's run: the stages that handle the keys (services writes them, health's gate uses them)
    again = (
        ansible_playbook(ROOT / "site.yml", *args, "--tags", "services,health", strategy="mitogen_linear")
        if rc == 0
        else (None, "")
    )
    return rc, out, folder / "reports", again


def leaks(text):
    return [name for name, key in KEYS.items() if key in text]


def test_the_run_passes_with_the_vault_keys_in_place(host, vault_run):
    rc, out, _, (again_rc, again) = vault_run
    assert rc == 0, out[-4000:]
    # the second run was mitogen's: Ansible warns of a strategy from outside ansible.builtin
    assert again_rc == 0 and "strategy plugins not included in ansible.builtin" in again, again[-4000:]
    for name, key in KEYS.items():
        assert host.check_output(f"cat /etc/vllm/{name}/api_key") == key
        code = f"curl -s -o /dev/null -w '%{{http_code}}' -H {shlex.quote('Authorization: Bearer ' + key)} "
        port = next(i["port"] for i in INSTANCES if i["name"] == name)
        assert host.check_output(code + f"http://127.0.0.1:{port}/v1/models") == "200"


def test_no_key_in_the_controller_output_or_the_report(vault_run):
    _, out, reports, (_, again) = vault_run
    assert "Invoked with" in out or "<127.0.0.1>" in out  # it really was -vvv
    assert leaks(out) == [] and leaks(again) == []
    texts = [p.read_text() for p in reports.glob("*.json")]
    assert texts and leaks("".join(texts)) == []


def test_no_key_in_the_rigs_journal_processes_or_units(host, vault_run):
    assert leaks(host.check_output("journalctl --no-pager -o cat")) == []
    assert leaks(host.check_output("ps -eo args")) == []
    for name in KEYS:
        assert leaks(host.check_output(f"systemctl show vllm@{name}")) == []
        assert leaks(host.check_output(f"systemctl cat vllm@{name}")) == []


def test_no_key_in_the_rigs_files_but_its_own_key_file(host, vault_run):
    found = set()
    for key in KEYS.values():
        res = host.run(f"grep -rlsF -- {shlex.quote(key)} {SEARCH}")
        found.update(res.stdout.split())
    assert found == {"/etc/vllm/alpha/api_key", "/etc/vllm/beta/api_key"}
