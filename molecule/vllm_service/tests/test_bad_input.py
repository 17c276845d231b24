"""Mistaken and hostile inventories against the serving rig, through the main job as a user runs it.

Each case is an alias of vs-rig with the case's vllm_instances, all judged by one run of site.yml.
Each must be refused with a message that names the field, without a traceback, and must change
nothing on the rig: the configs, the keys, the units and the running instances (same PIDs) stay
as they were, and the instance still answers with its key. The table-driven unit test
(tests/unit/test_vllm_instances.py) holds many more cases; these are a representative dozen end to end.
"""

import copy
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from rigops_testinfra import alias_inventory, ansible_playbook, per_host

pytestmark = pytest.mark.changes_state

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
INSTANCES = yaml.safe_load((SCENARIO / "molecule.yml").read_text())["provisioner"]["inventory"]["host_vars"]["vs-rig"][
    "vllm_instances"
]
KEY = "Hostile-K3y-that-must-never-be-printed-0123456789"


def edited(**edits):
    """The scenario's instances with edits: `alpha__engine__x=1` sets alpha's engine.x; DROP removes."""
    inst = copy.deepcopy(INSTANCES)
    for path, value in edits.items():
        name, *keys = path.split("__")
        target = next(i for i in inst if i["name"] == name)
        for k in keys[:-1]:
            target = target.setdefault(k, {})
        if value is DROP:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return inst


DROP = object()

# (case, instances, the field the message must name, words of the message)
CASES = {
    "typo gpu for gpus": (edited(alpha__gpu=[0]), "vllm_instances[0].gpu", "did you mean gpus"),
    "unknown model key": (edited(alpha__model__max_len=4096), "vllm_instances[0].model.max_len", "did you mean"),
    "port as a string": (edited(beta__port="8002"), "vllm_instances[1].port", "quoted string"),
    "privileged port": (edited(beta__port=80), "vllm_instances[1].port", "privileged port"),
    "two instances on one port": (edited(beta__port=8001), "vllm_instances[1].port", "claimed by 2 instances"),
    "empty host": (edited(alpha__host=""), "vllm_instances[0].host", "literal"),
    "name too long": (edited(alpha__name="a" * 250), "vllm_instances[0].name", "characters"),
    "name with a path": (edited(alpha__name="../etc"), "vllm_instances[0].name", "[a-z0-9]"),
    "short key": (edited(beta__security={"api_key": "short"}), "vllm_instances[1].security.api_key", "<redacted>"),
    "key with a newline": (
        edited(beta__security={"api_key": KEY[:20] + "\n" + KEY[20:]}),
        "vllm_instances[1].security.api_key",
        "<redacted>",
    ),
    "key in extra_args": (
        edited(alpha__engine={"extra_args": [f"--api_key={KEY}"]}),
        "vllm_instances[0].engine.extra_args",
        "--api-key",
    ),
    "remote code by underscores": (
        edited(alpha__engine={"extra_args": ["--trust_remote_code"]}),
        "vllm_instances[0].engine.extra_args",
        "--trust-remote-code",
    ),
    "utilization as text": (
        edited(alpha__engine={"gpu_memory_utilization": "high"}),
        "vllm_instances[0].engine.gpu_memory_utilization",
        "number",
    ),
}


def state(host):
    """What a refused run must leave untouched: files, units, keys, and the running processes."""
    files = host.check_output(
        "find /etc/vllm /etc/systemd/system -path '*vllm*' -type f -print0 | sort -z | xargs -0 sha256sum"
    )
    pids = {n: host.check_output(f"systemctl show -p MainPID --value vllm@{n}") for n in ("alpha", "beta")}
    return files, pids


def flat(output):
    """The output without colour and with the callback's line wrapping undone."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", output).split())


@pytest.fixture(scope="module")
def refused(host, tmp_path_factory):
    """site.yml once for every case: each case is an alias of vs-rig with the case's vllm_instances
    (rigops_testinfra.alias_inventory), so one run judges them all (each stops in the preflight);
    the rig's state before and after."""
    folder = tmp_path_factory.mktemp("bad-input")
    names = {case: f"case-{n}" for n, case in enumerate(sorted(CASES))}
    inventory = alias_inventory(
        folder / "cases.yml", "vs-rig", {names[case]: {"vllm_instances": CASES[case][0]} for case in CASES}
    )
    before = state(host)
    extra = json.dumps({"rigops_report_dir": str(folder / "reports")})
    rc, out = ansible_playbook(ROOT / "site.yml", "-i", str(inventory), "-l", ",".join(names.values()), "-e", extra)
    return rc, out, names, before, state(host)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_by_name_and_changes_nothing(host, refused, case):
    rc, out, names, before, after = refused
    _, field, words = CASES[case]
    text = flat(per_host(out, names[case]))
    assert rc != 0, out[-3000:]
    assert field in text and words in text, text[-4000:]
    assert "Traceback" not in out
    assert KEY not in out and KEY[:20] not in out
    assert "failed in preflight" in text  # the report ran and names the stage
    assert after == before
    code = "curl -s -o /dev/null -w '%{http_code}' -H \"Authorization: Bearer $(cat /etc/vllm/alpha/api_key)\" "
    assert host.check_output(code + "http://127.0.0.1:8001/v1/models") == "200"
