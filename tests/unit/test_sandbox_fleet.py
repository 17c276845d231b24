"""lab/sandbox/fleet.py's pieces that need no podman: what a removed host wrote, set aside for deletion."""

import errno
import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab" / "sandbox"))
import fleet  # noqa: E402


def upper_layer(tmp_path, monkeypatch, names):
    """A container's upper layer as podman lays it out (<storage>/overlay/<id>/diff), and podman's
    inspect answering with it."""
    upper = tmp_path / "overlay" / "0123abcd" / "diff"
    upper.mkdir(parents=True)
    for name in names:
        (upper / name).write_text(name)
    answer = SimpleNamespace(returncode=0, stdout=f"{upper}\n", stderr="")
    monkeypatch.setattr(fleet, "podman", lambda *args, **kwargs: answer)
    return upper


def test_the_files_move_beside_the_layers(tmp_path, monkeypatch):
    upper = upper_layer(tmp_path, monkeypatch, ["etc", "usr", "var"])
    target = fleet.set_aside("rigops-a")
    assert target.parent == tmp_path / "overlay" / "rigops-trash" and target.name.startswith("rigops-a-")
    assert sorted(p.name for p in target.iterdir()) == ["etc", "usr", "var"]
    assert list(upper.iterdir()) == []


def test_a_rename_failing_halfway_returns_what_moved(tmp_path, monkeypatch):
    """What moved is deleted with the set-aside files now (not left in the trash until a later run);
    what did not is podman's to delete."""
    upper = upper_layer(tmp_path, monkeypatch, ["etc", "usr", "var"])
    rename, calls = Path.rename, []

    def failing_second(self, target):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", failing_second)
    target = fleet.set_aside("rigops-b")
    assert target is not None
    moved, left = {p.name for p in target.iterdir()}, {p.name for p in upper.iterdir()}
    assert len(moved) == 1 and moved | left == {"etc", "usr", "var"} and not moved & left


def test_nothing_to_set_aside_without_an_upper_layer(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "podman", lambda *args, **kwargs: SimpleNamespace(returncode=125, stdout="", stderr=""))
    assert fleet.set_aside("rigops-c") is None
    upper_layer(tmp_path, monkeypatch, [])
    (tmp_path / "overlay" / "rigops-trash").write_text("not a folder")  # the trash cannot be made
    assert fleet.set_aside("rigops-d") is None


def test_the_runtime_stage_takes_every_filter_file_its_role_applies():
    """The runtime stage's inputs (lab/sandbox/stages/stages.yml) list filter files one by one: each filter
    the role vllm_runtime (or the stage's playbook) names must be in a listed file, or a change to it would
    leave a stale stage."""
    recipe = fleet.stage_recipe("runtime")
    inputs = set(recipe["inputs"])
    owners = {}
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"stage_filter_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name in module.FilterModule().filters():
            owners[name] = f"plugins/filter/{path.name}"
    texts = [p.read_text() for p in (ROOT / "roles" / "vllm_runtime").rglob("*") if p.is_file()]
    texts.append((fleet.STAGES_DIR / recipe["playbook"]).read_text())
    applied = {m for text in texts for m in re.findall(r"rigops\.fleet\.([a-z_]+)", text) if m in owners}
    assert applied, "the role applies no filter of the collection: the pattern above went wrong"
    missing = sorted(f"{name} ({owners[name]})" for name in applied if owners[name] not in inputs)
    assert missing == [], f"add to the runtime stage's inputs: {missing}"


def test_the_runtime_stage_takes_every_module_its_role_calls():
    """The runtime stage's inputs list modules one by one too: each module of the collection that the role
    vllm_runtime (or the stage's playbook) calls must be listed, or a change to it would leave a stale stage."""
    recipe = fleet.stage_recipe("runtime")
    modules = {p.stem for p in (ROOT / "plugins" / "modules").glob("*.py")}
    texts = [p.read_text() for p in (ROOT / "roles" / "vllm_runtime").rglob("*") if p.is_file()]
    texts.append((fleet.STAGES_DIR / recipe["playbook"]).read_text())
    called = {m for text in texts for m in re.findall(r"rigops\.fleet\.([a-z_]+):", text) if m in modules}
    assert {"vllm_runtime_check", "vllm_runtime_seed"} <= called, "the pattern above went wrong"
    missing = sorted(m for m in called if f"plugins/modules/{m}.py" not in recipe["inputs"])
    assert missing == [], f"add to the runtime stage's inputs: {missing}"


# --------------------------------------------------------------------------- the demo fleet's gateway


def test_the_demo_fleet_has_a_gateway_published_on_the_controller():
    """inventories/sandbox: a host of group gateways whose HTTPS port is published where the demo says."""
    hosts = {h.name: h for h in fleet.inventory_hosts(fleet.DEFAULT_INVENTORY)}
    assert hosts["gateway-01"].publish == ((2443, 8443),) and hosts["gateway-01"].profile == "nogpu"
    assert all(not h.publish for name, h in hosts.items() if name != "gateway-01")
    ports = [p for h in hosts.values() for p in (h.port, *(outside for outside, _ in h.publish))]
    assert len(ports) == len(set(ports))
    url = yaml.safe_load((fleet.DEFAULT_INVENTORY / "host_vars/gateway-01/llm_gateway.yml").read_text())
    assert url["llm_gateway_public_url"] == "https://127.0.0.1:2443"
    assert "https://127.0.0.1:2443/v1" in (ROOT / "rigops").read_text()
    # a gateway on a host of its own reaches only instances bound beyond the rig's loopback
    for rig in ("rig-5090", "rig-h100"):
        served = yaml.safe_load((fleet.DEFAULT_INVENTORY / f"host_vars/{rig}/vllm_instances.yml").read_text())
        assert {i.get("host") for i in served["vllm_instances"]} == {"0.0.0.0"}, rig
        assert served["vllm_service_allow_remote_bind"] is True, rig  # the schema refuses the bind without it


def test_a_published_port_changes_the_hosts_spec_and_bad_ones_are_refused():
    plain = fleet.Host("gw", "nogpu", 2225)
    published = fleet.Host("gw", "nogpu", 2225, publish=((2443, 8443),))
    assert fleet.host_spec(plain, "img") != fleet.host_spec(published, "img")
    assert fleet._publish("gw", {"sandbox_publish": {8443: 2443}}) == ((2443, 8443),)
    for bad in ({8443: "https"}, {8443: 70000}, ["8443:2443"]):
        with pytest.raises(fleet.FleetError, match="gw: sandbox_publish"):
            fleet._publish("gw", {"sandbox_publish": bad})


def test_the_demo_client_key_is_made_once_and_kept_private(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "STATE", tmp_path / "state")
    path = fleet.ensure_demo_client_key()
    key = path.read_text()
    assert len(key.strip()) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert fleet.ensure_demo_client_key().read_text() == key
