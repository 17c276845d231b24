"""The vllm_service role's filters (plugins/filter/vllm_service.py).

config.toml is written by a TOML library: every config of the sandbox and example
inventories reads back equal with tomllib, and so do strings that a hand-written
TOML template gets wrong (emoji, quotes, backslashes, newlines, control characters).
The role's own wiring (vars/main.yml, the filter plugin, the template) is run once through
ansible-playbook on the controller and reproduces the file rendered on a sandbox rig.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.filter import vllm_instances as contract
from ansible_collections.rigops.fleet.plugins.filter import vllm_service as plugin
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_config import build_configs, load, placement, validate
from ansible_run import LOCALHOST, ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "vllm_service"
FIX = Path(__file__).resolve().parent / "fixtures" / "vllm_service"
LAUNCHER_ON_HOST = "/usr/local/lib/rigops-vllm/rigops-vllm-launch"
# `ansible_managed | comment` with Ansible's default ansible_managed
HEADER = "#\n# Ansible managed\n#"
# served names a TOML template with to_json gets wrong (surrogate escapes, raw DEL); a NUL is refused
# (no command line can carry it: exec would fail), see test_a_nul_in_a_served_name_is_refused
NASTY = 'tiny 😀 "quoted" back\\slash\nnew line\ttab \x1f\x7f é'


def inventory_configs(inventory):
    """{host: configs} for every host of an inventory with instances, as the role builds them."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(ROOT / "inventories" / inventory), "--list"],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    out = {}
    for host, hostvars in json.loads(proc.stdout)["_meta"]["hostvars"].items():
        instances = hostvars.get("vllm_instances", [])
        if not instances:
            continue
        staged = {
            i["name"]: {
                "path": f"/srv/rigops/models/{i['model']['source']}/{i['model']['id']}/0123abcd",
                "commit": "0123abcd",
            }
            for i in instances
        }
        site = hostvars.get("vllm_service_instance_defaults", defaults["vllm_service_instance_defaults"])
        settings = {
            "python": "/opt/rigops/vllm/releases/r1/venv/bin/python",
            "config_root": defaults["vllm_service_config_root"],
            "cache_root": "/var/cache/vllm",
            "allow_remote_bind": hostvars.get(
                "vllm_service_allow_remote_bind", defaults["vllm_service_allow_remote_bind"]
            ),
            "allowed_models": defaults["vllm_service_allowed_models"],
            "remote_code_allowed": defaults["vllm_service_remote_code_allowed"],
            "metrics_enabled": defaults["vllm_service_metrics_enabled"],
        }
        out[host] = build_configs(schema.merge(instances, site), staged, settings)
    return out


@pytest.fixture(scope="module")
def all_configs():
    found = {}
    for inventory in ("sandbox", "example"):
        for host, configs in inventory_configs(inventory).items():
            found[f"{inventory}/{host}"] = configs
    # every host of both inventories that serves something (the sandbox's Jetsons too, on the CPU build)
    assert sorted(found) == [
        "example/h100-01",
        "example/rig-5090-01",
        "example/thor-01",
        "sandbox/orin-01",
        "sandbox/rig-5090",
        "sandbox/rig-h100",
        "sandbox/thor-01",
    ]
    return found


def test_every_inventory_config_round_trips_and_passes_the_launcher_rules(all_configs):
    for host, configs in all_configs.items():
        assert placement(configs) == [], host
        for cfg in configs:
            text = plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)
            assert tomllib.loads(text) == cfg, (host, text)
            assert validate(tomllib.loads(text), host, check_files=False)[1] == []


def test_sandbox_gpus_are_written_and_read_back(all_configs):
    (cfg,) = all_configs["sandbox/rig-5090"]
    text = plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)
    assert tomllib.loads(text)["server"]["gpus"] == [0, 1]
    assert tomllib.loads(text)["model"]["max_model_len"] == 65536  # its own (coding clients), over the default
    assert tomllib.loads(text)["engine"]["kv_cache_memory_bytes"] == 67108864  # the sandbox's defaults were merged


def test_file_text_header_comments_and_layout():
    cfg = load(FIX / "alpha.config.toml")
    # built in another order: the file's order is the filter's (sections fixed, keys sorted)
    cfg = {s: dict(reversed(cfg[s].items())) for s in reversed(cfg)}
    text = plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)
    # the file the old template rendered on a sandbox rig, to the byte: no restart on upgrade
    assert text == (FIX / "alpha.config.toml").read_text()
    assert text.startswith(
        "#\n# Ansible managed\n#\n# vLLM instance `alpha`: read by\n"
        f"# {LAUNCHER_ON_HOST} (vllm@alpha.service).\n# Check it with: {LAUNCHER_ON_HOST} --check <this file>\n"
    )
    sections = re.findall(r"^\[(\w+)\]$", text, re.M)
    assert sections == ["server", "model", "engine", "security", "metrics"]


def test_a_nasty_served_name_round_trips_exactly():
    cfg = load(FIX / "alpha.config.toml")
    cfg["model"]["served_name"] = NASTY
    cfg["engine"]["extra_args"] = ["--chat-template-content-format=string", 'a "b" \\c\n']
    text = plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)
    back = tomllib.loads(text)
    assert back["model"]["served_name"] == NASTY
    assert back == cfg
    # the old to_json way does not give TOML for it (a surrogate pair escape)
    with pytest.raises(tomllib.TOMLDecodeError):
        tomllib.loads(f"served_name = {json.dumps(NASTY)}\n")


def test_a_nul_in_a_served_name_is_refused():
    cfg = load(FIX / "alpha.config.toml")
    cfg["model"]["served_name"] = "tiny\x00"
    text = plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)
    assert tomllib.loads(text) == cfg  # TOML holds it ...
    assert any("served_name: holds a NUL character" in p for p in validate(cfg, "x", check_files=False)[1])


def test_the_launcher_accepts_the_rendered_file_with_a_nasty_name(tmp_path):
    """The task's validate step, on a host-like tree: model, key, a runtime with vllm."""
    model = tmp_path / "model"
    model.mkdir()
    for name in (FIX / "model_files.txt").read_text().split():
        src = FIX / name
        (model / name).write_text(src.read_text() if src.exists() else "x")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "lib" / "python3.11" / "site-packages" / "vllm-0.32.0.dist-info").mkdir(parents=True)
    (tmp_path / "api_key").write_text("K" * 43 + "\n")
    cfg = load(FIX / "alpha.config.toml")
    cfg["model"].update(served_name=NASTY, path=str(model))
    cfg["server"].update(key_file=str(tmp_path / "api_key"), python=str(venv / "bin" / "python"))
    (tmp_path / "config.toml").write_text(plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(ROLE / "files" / "rigops-vllm-launch"), "--dry-run", str(tmp_path / "config.toml")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / ".collections")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"--served-model-name={NASTY}" in json.loads(proc.stdout)["argv"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda c: c["model"].update(id=None), r"\[model\] id: null cannot be written to TOML"),
        (lambda c: c["engine"].update(extra_args=["a", None]), r"\[engine\] extra_args\[1\]: null"),
        (lambda c: c["server"].update(instance="a\nb = 1"), "holds a control character"),
        (lambda c: c["server"].update(port=object()), r"\[server\] port: <object .*> \(object\) is not plain"),
    ],
)
def test_what_toml_cannot_hold_is_refused_by_name(change, expected):
    cfg = load(FIX / "alpha.config.toml")
    change(cfg)
    with pytest.raises(AnsibleFilterError, match=expected):
        plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST)


@pytest.mark.parametrize("header", ["Ansible managed", "#\nnot = 'a comment'", "# bell \x07"])
def test_the_header_must_be_comment_lines(header):
    with pytest.raises(AnsibleFilterError, match="is not a TOML comment"):
        plugin.render_toml(load(FIX / "alpha.config.toml"), header, LAUNCHER_ON_HOST)


def test_filters_turn_value_errors_into_filter_errors():
    assert set(plugin.FilterModule().filters()) == {
        "vllm_configs",
        "vllm_preflight",
        "vllm_toml",
        "vllm_config_files",
        "vllm_changed_instances",
        "vllm_devices",
        "vllm_config_changes",
    }
    with pytest.raises(AnsibleFilterError, match=r"vllm_instances\[0\]\.model: 'x' is not a mapping"):
        contract.vllm_instances([{"name": "a", "model": "x"}], {})
    with pytest.raises(AnsibleFilterError, match="settings lack"):
        plugin.vllm_configs([], {}, {})


def test_the_role_renders_the_sandbox_rig_file_through_ansible(tmp_path):
    """vars/main.yml + the role's filter plugin + its template, run by ansible-playbook on the controller.

    The role's preflight (read-only; the launcher judges the configs on the controller) sets
    what the configs need; the template then renders them as the configure task does.
    """
    play = [
        {
            "name": "vllm_service wiring",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "vllm_instances": [
                    {
                        "name": "alpha",
                        "port": 8001,
                        "model": {
                            "source": "modelscope",
                            "id": "Qwen/Qwen3.5-9B",
                            "revision": "master",
                            "served_name": "tiny-a",
                        },
                    },
                    {
                        "name": "beta",
                        "port": 8002,
                        "model": {"source": "local", "path": "/srv/m/beta", "served_name": NASTY},
                    },
                ],
                "model_weights_staged": {
                    "alpha": {
                        "path": load(FIX / "alpha.config.toml")["model"]["path"],
                        "commit": load(FIX / "alpha.config.toml")["model"]["commit"],
                    }
                },
                "vllm_service_python": load(FIX / "alpha.config.toml")["server"]["python"],
            },
            "tasks": [
                {
                    "name": "Preflight",
                    "ansible.builtin.import_role": {"name": "rigops.fleet.vllm_service", "tasks_from": "preflight"},
                },
                {
                    "name": "Render",
                    "ansible.builtin.copy": {
                        "content": "{{ item.content }}",
                        "dest": str(tmp_path) + "/{{ item.path | dirname | basename }}.toml",
                        "mode": "0640",
                    },
                    # the entries the role's configure.yml hands to rigops.fleet.host_files
                    "loop": (
                        "{{ vllm_service__configs | rigops.fleet.vllm_config_files(vllm_service__managed_header,"
                        " vllm_service__launcher, vllm_service_config_root, vllm_service_group) }}"
                    ),
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, allow_unicode=True))
    sandbox_vars = ROOT / "inventories" / "sandbox" / "group_vars" / "all" / "vllm_service.yml"
    # its vllm_service_environment reads rollout.yml's planted fault (empty here): the entry point's argument
    # spec validation renders every variable of the role
    planted = sandbox_vars.parent / "rollout.yml"
    proc = ansible_playbook(*LOCALHOST, "-e", f"@{sandbox_vars}", "-e", f"@{planted}", tmp_path / "play.yml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert (tmp_path / "alpha.toml").read_text() == (FIX / "alpha.config.toml").read_text()
    beta = load(tmp_path / "beta.toml")
    assert beta["model"]["served_name"] == NASTY and beta["model"]["path"] == "/srv/m/beta"
    assert beta["model"]["commit"] == "" and beta["server"]["gpus"] == []


def test_config_changes_name_each_value_a_new_file_changed():
    old = '[server]\nport = 8001\n\n[model]\nquantization = ""\nmax_model_len = 1024\n'
    new = '[server]\nport = 8001\n\n[model]\nquantization = "awq"\n\n[engine]\nenforce_eager = true\n'
    assert plugin.vllm_config_changes(old, new) == [
        "engine.enforce_eager: - -> True",
        "model.max_model_len: 1024 -> -",
        "model.quantization: '' -> 'awq'",
    ]
    assert plugin.vllm_config_changes(old, old) == ["nothing (the same config.toml)"]
    assert plugin.vllm_config_changes(old, "[model") == [
        "(a config.toml is not TOML: Expected ']' at the end of a table declaration (at end of document))"
    ]


def test_config_files_are_host_files_entries_checked_by_the_launcher():
    cfg = load(FIX / "alpha.config.toml")
    [entry] = plugin.vllm_config_files([cfg], HEADER, LAUNCHER_ON_HOST, "/etc/vllm", "vllm")
    assert entry == {
        "path": "/etc/vllm/alpha/config.toml",
        "content": plugin.render_toml(cfg, HEADER, LAUNCHER_ON_HOST),
        "group": "vllm",
        "mode": "0640",
        "validate": f"{LAUNCHER_ON_HOST} --check %s",
    }


def test_changed_instances_are_read_off_the_changed_paths():
    changed = {
        "/etc/vllm/alpha/config.toml": ["content"],
        "/etc/systemd/system/vllm@beta.service.d": ["mode"],
        "/etc/systemd/system/vllm@beta.service.d/devices.conf": ["absent"],
        "/etc/vllm/alphabet/api_key": ["present"],
    }
    names = ["alpha", "alphabet", "beta", "gamma"]
    assert plugin.vllm_changed_instances(changed, names, "/etc/vllm", "/etc/systemd/system") == [
        "alpha", "alphabet", "beta",
    ]  # fmt: skip
    assert plugin.vllm_changed_instances({}, names, "/etc/vllm", "/etc/systemd/system") == []
