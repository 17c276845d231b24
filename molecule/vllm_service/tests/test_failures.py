"""Refusals and recovery, after the end-state tests: bad configurations are refused before any
restart (the running services keep their MainPID and their config), a configuration vLLM refuses
only at start puts back the one that served, and a killed vLLM is restarted by systemd and passes
the gate again."""

import copy
import json
import os
import re
import time
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import alias_inventory, ansible_playbook, per_host, recap

pytestmark = pytest.mark.changes_state

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
INSTANCES = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["vs-rig"][
    "vllm_instances"
]
LAUNCHER = "/usr/local/lib/rigops-vllm/rigops-vllm-launch"


def has(output, text):
    """`text` is in `output`, ignoring whitespace and colour (the callback wraps long messages)."""
    clean = re.sub(r"\x1b\[[0-9;]*m", "", output)
    return "".join(text.split()) in "".join(clean.split())


def state(host):
    return {
        n: (
            host.check_output(f"systemctl show -p MainPID --value vllm@{n}"),
            host.check_output(f"sha256sum /etc/vllm/{n}/config.toml"),
        )
        for n in ("alpha", "beta")
    }


def changed(**edits):
    inst = copy.deepcopy(INSTANCES)
    for path, value in edits.items():
        name, *keys = path.split("__")
        target = next(i for i in inst if i["name"] == name)
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        target[keys[-1]] = value
    return inst


CASES = {
    "utilization 1.5": (
        changed(alpha__engine__gpu_memory_utilization=1.5),
        "vllm_instances[0].engine.gpu_memory_utilization: 1.5 is above 1",
    ),
    "tp larger than the GPU group": (
        changed(alpha__engine__tensor_parallel_size=2),
        "tensor_parallel_size: 2 is larger than the instance's GPU group",
    ),
    "unknown [engine] key": (
        changed(beta__engine__max_batch=4),
        "vllm_instances[1].engine.max_batch: 4 is an unknown key",
    ),
    "port clash": (changed(beta__port=8001), "vllm_instances[1].port: 8001 is claimed by 2 instances"),
    "remote code not allowed": (
        changed(alpha__model__trust_remote_code=True),
        "which is not in vllm_service_remote_code_allowed",
    ),
    "key too short": (changed(beta__security={"api_key": "short-secret"}), "security.api_key: <redacted> is shorter"),
    "extra_args sets the key": (changed(beta__engine={"extra_args": ["--api_key=x"]}), "sets --api-key"),
    "extra_args unknown to vLLM": (changed(beta__engine={"extra_args": ["--no-such-flag"]}), "unrecognized arguments"),
    "max_model_len above the model": (changed(alpha__model__max_model_len=1000000), "is more than the model allows"),
}


@pytest.fixture(scope="module")
def refusals(host, tmp_path_factory):
    """The converge once for every case: each case is an alias of vs-rig with the case's
    vllm_instances (rigops_testinfra.alias_inventory), each stops in the preflight; the state around."""
    names = {case: f"case-{n}" for n, case in enumerate(sorted(CASES))}
    inventory = alias_inventory(
        tmp_path_factory.mktemp("refusals") / "cases.yml",
        "vs-rig",
        # (without the long context the scenario allows beta: a max_model_len above the model is refused)
        {names[case]: {"vllm_instances": CASES[case][0], "sandbox_long_context": False} for case in CASES},
    )
    before = state(host)
    rc, out = ansible_playbook(SCENARIO / "converge.yml", "-i", str(inventory), "-l", ",".join(names.values()))
    return rc, out, names, before, state(host)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_is_refused_before_any_restart(refusals, case):
    rc, out, names, before, after = refusals
    mine = per_host(out, names[case])
    assert rc != 0
    assert has(mine, CASES[case][1]), mine[-3000:]
    assert has(mine, "vllm_service preflight refused")
    assert recap(out, names[case])["changed"] == 0
    assert after == before


def test_launcher_check_refuses_a_bad_file_on_the_host(host):
    edit = "s/^gpu_memory_utilization = .*/gpu_memory_utilization = 1.5/; s/^\\[engine\\]/[engine]\\nbogus = 1/"
    host.check_output(f"sed '{edit}' /etc/vllm/alpha/config.toml > /tmp/bad.toml")
    res = host.run(f"{LAUNCHER} --check /tmp/bad.toml")
    assert res.rc == 1
    assert "/tmp/bad.toml: [engine] bogus: unknown key" in res.stderr
    assert "remove it or pass a vLLM flag through extra_args" in res.stderr
    assert host.run(f"{LAUNCHER} --check /etc/vllm/alpha/config.toml").rc == 0


def test_check_mode_changes_nothing_and_still_gates(host):
    before = state(host)
    rc, out = ansible_playbook(SCENARIO / "converge.yml", "--check")
    assert rc == 0, out[-3000:]
    assert {k: recap(out, "vs-rig")[k] for k in ("changed", "failed")} == {"changed": 0, "failed": 0}
    assert has(out, "Gate | vllm_endpoint on alpha")
    assert state(host) == before


def test_rotation_replaces_one_key_and_restarts_only_that_instance(host):
    before = state(host)
    old = host.check_output("cat /etc/vllm/beta/api_key")
    host.check_output("install -m 600 /etc/vllm/beta/api_key /tmp/old_key")
    rc, out = ansible_playbook(SCENARIO / "converge.yml", "-e", '{"vllm_service_rotate_keys": ["beta"]}')
    assert rc == 0, out[-3000:]
    new = host.check_output("cat /etc/vllm/beta/api_key")
    assert new != old and re.fullmatch(r"[A-Za-z0-9_-]{43,}", new)
    assert new not in out and old not in out
    f = host.file("/etc/vllm/beta/api_key")
    assert (f.user, f.group, f.mode) == ("root", "vllm-beta", 0o640)
    after = state(host)
    assert after["alpha"] == before["alpha"]
    assert after["beta"][0] != before["beta"][0]  # restarted by the handler, then gated
    code = "curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $(cat {})\" http://127.0.0.1:8002/v1/models"
    assert host.check_output(code.format("/tmp/old_key")) == "401"
    assert host.check_output(code.format("/etc/vllm/beta/api_key")) == "200"
    host.check_output("rm -f /tmp/old_key")


def test_a_config_vllm_refuses_at_start_puts_back_the_one_that_served(host, tmp_path):
    """awq on a model that is not AWQ: vLLM's parser takes the value, the engine refuses it when it loads.
    The run fails naming the value; alpha serves its previous config.toml again; beta is not touched."""
    before = state(host)
    play = tmp_path / "services.yml"
    play.write_text(yaml.safe_dump([{"name": "Services", "hosts": "gpu-rigs", "roles": ["rigops.fleet.vllm_service"]}]))
    bad = changed(alpha__model__quantization="awq")
    rc, out = ansible_playbook(play, "-e", json.dumps({"vllm_instances": bad}))
    assert rc != 0
    assert has(out, "vllm@alpha.service failed its gate"), out[-3000:]
    assert has(out, "The new configuration changed model.quantization: '' -> 'awq'"), out[-3000:]
    assert has(out, "The configuration that last passed serves again (it answers)"), out[-3000:]
    after = state(host)
    assert after["alpha"][1] == before["alpha"][1]  # the config.toml that served, back
    assert after["alpha"][0] not in ("0", before["alpha"][0])  # restarted onto it
    assert after["beta"] == before["beta"]
    rejected = host.file("/etc/vllm/alpha/config.toml.rejected")
    assert 'quantization = "awq"' in rejected.content_string and (rejected.user, rejected.mode) == ("root", 0o640)
    code = "curl -s -o /dev/null -w '%{http_code}' -H \"Authorization: Bearer $(cat /etc/vllm/alpha/api_key)\" "
    assert host.check_output(code + "http://127.0.0.1:8001/v1/models") == "200"


def test_killed_vllm_is_restarted_and_passes_the_gate(host):
    before = host.check_output("systemctl show -p MainPID --value vllm@alpha")
    restarts = int(host.check_output("systemctl show -p NRestarts --value vllm@alpha"))
    host.check_output(f"kill -9 {before}")
    deadline = time.time() + 120
    while time.time() < deadline:
        now = host.check_output("systemctl show -p MainPID --value vllm@alpha")
        if (
            now not in ("0", before)
            and int(host.check_output("systemctl show -p NRestarts --value vllm@alpha")) > restarts
        ):
            break
        time.sleep(2)
    else:
        pytest.fail("systemd did not restart vllm@alpha after SIGKILL")
    rc, out = ansible_playbook(SCENARIO / "gate.yml")
    assert rc == 0, out[-3000:]
