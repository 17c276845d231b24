"""Failure paths on mw-rig1, after the end-state tests: faults injected into the shared hub
stand-in (scoped to one repo and file, cleared afterwards), each run into its own root."""

import json
import urllib.request
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook

pytestmark = pytest.mark.changes_state

testinfra_hosts = ["mw-rig1"]
HUB = "http://127.0.0.1:18090"
PLAYBOOK = Path(__file__).resolve().parents[1] / "faults.yml"
CONVERGE = Path(__file__).resolve().parents[1] / "converge.yml"
SHARDED = "046faecc3573390176703f4b4dece37da6d49a82"
SINGLE = "a9e01e777e010be5cfed07fed091269f1ea8833a"


def hub(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(HUB + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


@pytest.fixture
def fault():
    added = []

    def add(**spec):
        hub("POST", "/_admin/faults", spec)
        added.append(spec)

    yield add
    if added:
        hub("DELETE", "/_admin/faults")


@pytest.fixture
def root(host, request):
    path = f"/srv/rigops-faults/{request.node.name.replace('[', '-').rstrip(']')}"
    host.run(f"rm -rf {path}")
    yield path
    host.run(f"rm -rf {path}")


def run(root, instance, *args):
    """(rc, output with whitespace collapsed: the YAML callback wraps long messages)."""
    rc, out = ansible_playbook(PLAYBOOK, "-e", json.dumps({"mw_root": root, "mw_instance": instance}), *args)
    return rc, " ".join(out.split())


def model(source, model_id, revision, **extra):
    return {"name": "f", "port": 8000, "model": dict(source=source, id=model_id, revision=revision, **extra)}


def log_since(n):
    return hub("GET", "/_admin/log")[n:]


def test_dropped_connection_is_resumed(host, root, fault):
    start = len(hub("GET", "/_admin/log"))
    fault(kind="drop", hub="modelscope", repo="Qwen/Qwen3.5-9B", file="model-00001-*", after_bytes=400000)
    rc, out = run(root, model("modelscope", "Qwen/Qwen3.5-9B", "master"))
    assert rc == 0, out
    gets = [e for e in log_since(start) if e["file"] == "model-00001-of-00003.safetensors" and e["method"] == "GET"]
    assert gets[0]["fault"] and gets[0]["fault"].startswith("drop") and gets[0]["bytes"] <= 400000
    resumed = [e for e in gets[1:] if e["range"] and not e["range"].startswith("bytes=0-")]
    assert resumed and resumed[0]["status"] == 206, gets
    path = f"{root}/modelscope/Qwen/Qwen3.5-9B/{SHARDED}"
    assert host.file(f"{path}/.rigops-model.json").exists
    assert host.file(f"{path}/model-00001-of-00003.safetensors").size == 971512
    assert host.check_output(f"sha256sum {path}/model-00001-of-00003.safetensors").split()[0] == next(
        f["sha256"]
        for f in json.loads(host.file(f"{path}/.rigops-model.json").content_string)["files"]
        if f["path"] == "model-00001-of-00003.safetensors"
    )


def test_corrupted_download_is_fetched_again(host, root, fault):
    """huggingface_hub accepts a corrupted body of the right size; the role's sha256 check does not."""
    start = len(hub("GET", "/_admin/log"))
    fault(kind="corrupt", hub="huggingface", repo="Qwen/Qwen3.5-9B-Instruct", file="model.safetensors")
    rc, out = run(root, model("huggingface", "Qwen/Qwen3.5-9B-Instruct", "v0.9.0"))
    assert rc == 0, out
    gets = [e for e in log_since(start) if e["file"] == "model.safetensors" and e["method"] == "GET"]
    assert [bool(e["fault"]) for e in gets] == [True, False], gets
    path = f"{root}/huggingface/Qwen/Qwen3.5-9B-Instruct/{SINGLE}"
    assert host.file(f"{path}/.rigops-model.json").exists


def test_corrupted_file_on_disk_is_fetched_again(host, root):
    rc, out = run(root, model("huggingface", "Qwen/Qwen3.5-9B-Instruct", "v0.9.0"))
    assert rc == 0, out
    path = f"{root}/huggingface/Qwen/Qwen3.5-9B-Instruct/{SINGLE}/model.safetensors"
    good = host.check_output(f"sha256sum {path}").split()[0]
    host.check_output(f"printf 'X' | dd of={path} bs=1 seek=1000 conv=notrunc status=none")
    assert host.check_output(f"sha256sum {path}").split()[0] != good
    start = len(hub("GET", "/_admin/log"))
    rc, out = run(
        root, model("huggingface", "Qwen/Qwen3.5-9B-Instruct", "v0.9.0"), "-e", "model_weights_verify_sha256=true"
    )
    assert rc == 0, out
    assert host.check_output(f"sha256sum {path}").split()[0] == good
    assert [e["file"] for e in log_since(start) if e["method"] == "GET" and e["file"]] == ["model.safetensors"]


def test_shard_missing_from_the_hub_fails_clearly_without_marker(host, root, fault):
    fault(kind="status", status=404, hub="modelscope", repo="Qwen/Qwen3.5-9B", file="model-00002-*", times=-1)
    rc, out = run(root, model("modelscope", "Qwen/Qwen3.5-9B", "master"))
    assert rc != 0
    assert "model-00002-of-00003.safetensors: missing" in out, out
    assert "no marker was written" in out
    assert host.check_output(f"find {root} -name .rigops-model.json") == ""
    assert not host.file(f"{root}/modelscope/Qwen/Qwen3.5-9B/{SHARDED}").exists
    assert not host.file(f"{root}/models.json").exists


def test_unknown_id_names_the_hub_and_the_id(host, root):
    rc, out = run(root, model("huggingface", "Qwen/Qwen3.5-9B", "main"))  # a ModelScope id
    assert rc != 0
    assert "huggingface: model id Qwen/Qwen3.5-9B not found" in out, out
    assert "ids differ between ModelScope and Hugging Face" in out
    assert not host.file(root).exists


def test_unknown_revision_is_refused(host, root):
    rc, out = run(root, model("modelscope", "Qwen/Qwen3.5-9B", "v9.9.9"))
    assert rc != 0
    assert "modelscope: model Qwen/Qwen3.5-9B has no revision 'v9.9.9'" in out, out


def test_check_mode_changes_nothing(host, root):
    rc, out = run(root, model("modelscope", "Qwen/Qwen3.5-9B", "master"), "--check")
    assert rc == 0, out
    assert not host.file(root).exists
    rc, out = ansible_playbook(CONVERGE, "--check")
    assert rc == 0, out
    assert "changed=0" in out and "changed=1" not in out
