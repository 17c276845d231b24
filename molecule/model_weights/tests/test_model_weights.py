"""End state of model_weights on two sandbox rigs (real clients, hub stand-in)."""

import json
import os
import urllib.request
from collections import Counter
from pathlib import Path

from rigops_testinfra import get_host

HUB = "http://127.0.0.1:18090"
ROOT = "/srv/rigops/models"
COMMIT = "046faecc3573390176703f4b4dece37da6d49a82"  # v1.0.0 / master / main: the sharded tiny model
SINGLE = "a9e01e777e010be5cfed07fed091269f1ea8833a"  # rigops-sandbox/tiny-llama main: single file
FLEET = f"{ROOT}/huggingface/Qwen/Qwen3.5-9B-Instruct/{COMMIT}"
EXPECTED = {
    "mw-rig1": {
        "chat": ("modelscope", "Qwen/Qwen3.5-9B", "master", f"{ROOT}/modelscope/Qwen/Qwen3.5-9B/{COMMIT}"),
        "fleet": ("controller", "Qwen/Qwen3.5-9B-Instruct", "v1.0.0", FLEET),
    },
    "mw-rig2": {
        "small": (
            "huggingface",
            "rigops-sandbox/tiny-llama",
            "main",
            f"{ROOT}/huggingface/rigops-sandbox/tiny-llama/{SINGLE}",
        ),
        "fleet": ("controller", "Qwen/Qwen3.5-9B-Instruct", "v1.0.0", FLEET),
        "fleet-b": ("controller", "Qwen/Qwen3.5-9B-Instruct", "v1.0.0", FLEET),
    },
}


def get(path):
    with urllib.request.urlopen(HUB + path, timeout=10) as resp:
        return json.loads(resp.read())


def hub_files(hub, model_id, commit):
    """The hub's own listing: path -> (size, sha256)."""
    if hub == "modelscope":
        data = get(f"/api/v1/models/{model_id}/repo/files?Revision={commit}&Recursive=True")["Data"]["Files"]
        return {f["Path"]: (f["Size"], f["Sha256"]) for f in data if f["Type"] == "blob"}
    ms_twin = {"Qwen/Qwen3.5-9B-Instruct": "Qwen/Qwen3.5-9B", "rigops-sandbox/tiny-llama": "rigops/tiny-llama"}
    return hub_files("modelscope", ms_twin[model_id], commit)  # same snapshot, and ModelScope lists every sha256


def test_models_json_is_the_published_record(host, hostname):
    record = json.loads(host.file("/etc/rigops/models.json").content_string)
    assert set(record) == set(EXPECTED[hostname])
    for name, (source, model_id, revision, path) in EXPECTED[hostname].items():
        assert record[name] == {
            "path": path,
            "source": source,
            "id": model_id,
            "revision": revision,
            "commit": Path(path).name,
            "trust_remote_code": False,
        }
    f = host.file("/etc/rigops/models.json")
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)


def test_every_file_the_hub_lists_is_there_whole(host, hostname):
    for _name, (source, model_id, _rev, path) in EXPECTED[hostname].items():
        hub = "huggingface" if source == "controller" else source
        want = hub_files(hub, model_id, Path(path).name)
        out = host.check_output(f"cd {path} && find . -type f ! -name .rigops-model.json -printf '%P\\n' | sort")
        assert out.split() == sorted(want), path
        sums = dict(
            line.split()[::-1]
            for line in host.check_output(f"cd {path} && sha256sum {' '.join(sorted(want))}").splitlines()
        )
        assert {p: (host.file(f"{path}/{p}").size, sums[p]) for p in want} == want


def test_marker_records_model_revision_and_digests(host, hostname):
    for _name, (source, model_id, revision, path) in EXPECTED[hostname].items():
        marker = json.loads(host.file(f"{path}/.rigops-model.json").content_string)
        hub = "huggingface" if source == "controller" else source
        assert (marker["id"], marker["hub"], marker["source"], marker["revision"], marker["commit"]) == (
            model_id,
            hub,
            source,
            revision,
            Path(path).name,
        )
        want = hub_files(hub, model_id, Path(path).name)
        assert {f["path"]: (f["size"], f["sha256"]) for f in marker["files"]} == want


def test_root_owned_readable_by_the_service_group_only(host, hostname):
    paths = {p for *_x, p in EXPECTED[hostname].values()}
    for path in paths:
        for d in (path, str(Path(path).parent), str(Path(path).parent.parent)):
            f = host.file(d)
            assert (f.user, f.group, f.mode) == ("root", "vllm", 0o750), d
        assert host.check_output(f"find {path} -type f ! -perm 0640 -o -type f ! -group vllm -o ! -user root") == ""
        assert host.run(f"runuser -u vllm -- cat {path}/config.json").rc == 0
        assert host.run(f"runuser -u nobody -- cat {path}/config.json").rc != 0
    assert host.check_output(f"find {ROOT} -name '*.partial'") == ""


def test_fleet_copy_is_identical_to_the_cache_hosts():
    """mw-rig2 got the fleet model from mw-rig1 (the first host needing it), byte for byte."""
    rig1, rig2 = (get_host(name) for name in ("mw-rig1", "mw-rig2"))
    marker = f"{FLEET}/.rigops-model.json"
    assert json.loads(rig2.file(marker).content_string) == json.loads(rig1.file(marker).content_string)
    sums = [h.check_output(f"cd {FLEET} && sha256sum * | sort") for h in (rig1, rig2)]
    assert sums[0] == sums[1] and sums[0].count("\n") == 9


def hub_log_window():
    """Hub requests since prepare (converge + idempotence), until the fault tests began."""
    start = int(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "hub-log-start").read_text())
    entries = get("/_admin/log")[start:]
    end = next((i for i, e in enumerate(entries) if e["path"].startswith("/_admin/faults")), len(entries))
    return entries[:end]


def downloads(entries, repo):
    return Counter(
        e["file"]
        for e in entries
        if e["method"] == "GET"
        and e["repo"] == repo
        and e["file"]
        and e["status"] in (200, 206)
        and e["client"] in ("modelscope", "huggingface_hub")
    )


def test_hub_saw_one_download_per_file_for_the_fleet_and_none_on_rerun():
    entries = hub_log_window()
    for repo, hub, commit in (
        ("Qwen/Qwen3.5-9B-Instruct", "huggingface", COMMIT),  # fan-out to two rigs
        ("Qwen/Qwen3.5-9B", "modelscope", COMMIT),
        ("rigops-sandbox/tiny-llama", "huggingface", SINGLE),
    ):
        got = downloads(entries, repo)
        assert got == Counter({f: 1 for f in hub_files(hub, repo, commit)}), (repo, got)
