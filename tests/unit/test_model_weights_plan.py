"""plugins/module_utils/model_weights_plan.py on listings captured from the sandbox hub stand-in.

Fixtures (tests/unit/fixtures/model_weights/): the API replies the hub clients read
(ModelScope revisions and repo/files, Hugging Face revision info and tree, 404 bodies),
config.json and model.safetensors.index.json of the sharded tiny model, and the real
header of its second shard.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.rigops.fleet.plugins.module_utils import model_weights_plan as mw
from ansible_run import LOCALHOST, ansible_playbook

FIX = Path(__file__).parent / "fixtures" / "model_weights"
COMMIT = "046faecc3573390176703f4b4dece37da6d49a82"


def load(name):
    return json.loads((FIX / name).read_text())


def inst(name, **model):
    """A model reference, as rigops.fleet.model_refs publishes it for the plan: name and model fields only."""
    return {"name": name, "model": model}


# --- plan -------------------------------------------------------------------------------


def test_plan_dedups_models_and_keeps_instances():
    fleet = {
        "rig1": [
            inst("a", source="modelscope", id="Qwen/Qwen3.5-9B"),
            inst("b", source="modelscope", id="Qwen/Qwen3.5-9B", revision="master"),
            inst("c", source="huggingface", id="Qwen/Qwen3.5-9B-Instruct", revision="v0.9.0"),
        ]
    }
    models = mw.plan("rig1", fleet)["models"]
    assert [m["key"] for m in models] == [
        "huggingface:Qwen/Qwen3.5-9B-Instruct@v0.9.0",
        "modelscope:Qwen/Qwen3.5-9B@master",
    ]
    assert models[1]["instances"] == ["a", "b"]
    assert {m["role"] for m in models} == {"download"}


def test_plan_controller_first_host_needing_it_downloads():
    fleet_model = {"source": "controller", "hub": "huggingface", "id": "Org/M", "revision": "v1"}
    fleet = {
        "rig0": [inst("x", source="local", path="/m")],
        "rig1": [inst("f", **fleet_model)],
        "rig2": [inst("f", **fleet_model), inst("g", **fleet_model)],
    }
    one = mw.plan("rig1", fleet)["models"]
    two = mw.plan("rig2", fleet)["models"]
    assert one[0]["role"] == "download" and one[0]["cache_host"] == "rig1"
    assert two[0]["role"] == "copy" and two[0]["cache_host"] == "rig1" and two[0]["instances"] == ["f", "g"]
    assert mw.plan("rig0", fleet)["models"][0]["role"] == "local"


def test_plan_explicit_cache_host_stages_models_it_does_not_serve():
    fleet_model = {"source": "controller", "hub": "modelscope", "id": "Org/M"}
    fleet = {"cache": [], "rig1": [inst("f", **fleet_model)]}
    cache = mw.plan("cache", fleet, "cache")["models"]
    assert cache == [dict(cache[0], role="download", instances=[], cache_host="cache")]
    assert mw.plan("rig1", fleet, "cache")["models"][0]["role"] == "copy"
    with pytest.raises(ValueError, match="not a host of this play"):
        mw.plan("rig1", fleet, "elsewhere")


def test_plan_fleet_cache_models_are_pulled_by_every_host_itself():
    cached = {"source": "fleet_cache", "hub": "huggingface", "id": "Org/M", "revision": "v1"}
    fleet = {"rig1": [inst("f", **cached)], "rig2": [inst("f", **cached), inst("g", **cached)]}
    for host in fleet:
        (model,) = mw.plan(host, fleet)["models"]
        assert model["role"] == "download" and model["source"] == "fleet_cache" and model["cache_host"] == ""
        assert model["key"] == "huggingface:Org/M@v1"


def test_cache_entry_finds_the_revision_or_its_commit_and_names_what_the_cache_holds():
    files = [{"path": "config.json", "size": 3, "sha256": "a" * 64}]
    index = {"models": [{"hub": "huggingface", "id": "Org/M", "revision": "v1", "commit": COMMIT, "files": files}]}
    assert mw.cache_entry(index, "huggingface", "Org/M", "v1") == (COMMIT, files)
    assert mw.cache_entry(index, "huggingface", "Org/M", COMMIT)[0] == COMMIT
    with pytest.raises(mw.HubError, match="holds revisions v1 only"):
        mw.cache_entry(index, "huggingface", "Org/M", "v2")
    with pytest.raises(mw.HubError, match="holds nothing of this model"):
        mw.cache_entry(index, "modelscope", "Org/M", "v1")
    with pytest.raises(mw.HubError, match="not a mapping with a list of models"):
        mw.cache_entry([], "huggingface", "Org/M", "v1")
    url = mw.cache_model_url("https://cache/", "huggingface", "Org/M", COMMIT, "a/b.json")
    assert url == f"https://cache/models/huggingface/Org/M/{COMMIT}/a/b.json"


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        (inst("a", source="gitlab", id="a/b"), "model.source must be one of"),
        (inst("a", source="fleet_cache", id="a/b"), "source fleet_cache needs model.hub"),
        (inst("a", source="controller", id="a/b"), "needs model.hub"),
        (inst("a", source="modelscope", id="no-slash"), "Org/Name"),
        (inst("a", source="local", path="relative"), "absolute directory"),
        ({"name": "Bad_Name", "model": {}}, "holds characters other than a-z"),
        ({"name": "a"}, "model must be a mapping"),
    ],
)
def test_plan_refuses_bad_instances(instance, message):
    with pytest.raises(ValueError, match=message):
        mw.plan("h", {"h": [instance]})


def test_plan_refuses_duplicate_instance_names():
    with pytest.raises(ValueError, match="used twice"):
        mw.plan("h", {"h": [inst("a", source="local", path="/m"), inst("a", source="local", path="/n")]})


KEY = "k3y-of-the-vault-0123456789abcdefghijklmnop"


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"name": "a", "port": 8000, "model": {"source": "local", "path": "/m"}}, "port"),
        ({"name": "a", "model": {"source": "local", "path": "/m"}, "security": {"api_key": KEY}}, "security"),
        ({"name": "a", "model": {"source": "local", "path": "/m", "api_key": KEY}}, "model.api_key"),
    ],
)
def test_plan_takes_model_references_only_and_never_quotes_a_key(entry, named):
    """Another host's whole instance (its key included) is refused, by name of the key, not its value."""
    fleet = {"h": [inst("b", source="local", path="/n")], "other": [entry]}
    with pytest.raises(ValueError) as info:
        mw.plan("h", fleet)
    assert f"got also {named}" in str(info.value) and "rigops.fleet.model_refs" in str(info.value)
    assert KEY not in str(info.value)


def test_plan_module_refuses_a_key_before_it_logs_its_arguments(run_module, monkeypatch):
    """The argument spec refuses anything but model references: AnsibleModule fails before _log_invocation."""
    from ansible.module_utils import basic
    from ansible_collections.rigops.fleet.plugins.modules import model_weights_plan as module

    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "_log_invocation", lambda self: logged.append(self.params))
    refs = [{"host": "h", "instances": [inst("a", source="modelscope", id="Qwen/Qwen3.5-9B")]}]
    failed, result = run_module(module.main, {"host": "h", "fleet": refs})
    assert not failed and [m["key"] for m in result["models"]] == ["modelscope:Qwen/Qwen3.5-9B@master"]
    assert logged and KEY not in repr(logged)
    logged.clear()
    whole = [{"host": "h", "instances": [dict(inst("a", source="local", path="/m"), security={"api_key": KEY})]}]
    failed, result = run_module(module.main, {"host": "h", "fleet": whole})
    assert failed and "security" in result["msg"] and KEY not in repr(result)
    assert logged == []  # nothing reached the host's journal


def test_model_dir_layout():
    assert (
        mw.model_dir("/srv/m", "modelscope", "Qwen/Qwen3.5-9B", COMMIT) == f"/srv/m/modelscope/Qwen/Qwen3.5-9B/{COMMIT}"
    )


# --- listings -----------------------------------------------------------------------------


def test_modelscope_revisions_resolve_branch_tag_and_commit():
    revs = load("ms_revisions.json")
    assert mw.ms_commit(revs, "master") == COMMIT
    assert mw.ms_commit(revs, "v0.9.0") == "a9e01e777e010be5cfed07fed091269f1ea8833a"
    assert mw.ms_commit(revs, "a" * 40) == "a" * 40
    assert mw.ms_commit(revs, "nope") == ""


def test_modelscope_listing_of_the_sharded_model():
    listing = load("ms_files_sharded.json")
    files = mw.ms_files(listing)
    assert len(files) == 10
    shard = next(f for f in files if f["path"] == "model-00002-of-00003.safetensors")
    assert shard["size"] == 329472 and len(shard["sha256"]) == 64
    assert mw.ms_listing_commit(listing) == COMMIT
    assert mw.index_problems(files, lambda rel: load(rel)) == []


def test_huggingface_listing_lfs_sha256_and_git_oids():
    assert mw.hf_commit(load("hf_revision_main.json")) == COMMIT
    files = mw.hf_files(load("hf_tree_sharded.json"))
    by = {f["path"]: f for f in files}
    ms = {f["path"]: f for f in mw.ms_files(load("ms_files_sharded.json"))}
    assert set(by) == set(ms)
    # LFS files carry the same sha256 as ModelScope's listing; small files only a git blob id
    assert by["model-00001-of-00003.safetensors"]["sha256"] == ms["model-00001-of-00003.safetensors"]["sha256"]
    assert by["config.json"]["sha256"] is None and len(by["config.json"]["git_oid"]) == 40
    single = mw.hf_files(load("hf_tree_single.json"))
    assert [f["path"] for f in single if f["path"].endswith(".safetensors")] == ["model.safetensors"]


def test_real_files_match_both_listings(tmp_path):
    (tmp_path / "config.json").write_bytes((FIX / "config.json").read_bytes())
    ms = [f for f in mw.ms_files(load("ms_files_sharded.json")) if f["path"] == "config.json"]
    hf = [f for f in mw.hf_files(load("hf_tree_sharded.json")) if f["path"] == "config.json"]
    assert mw.verify_files(str(tmp_path), ms, full=True)["ok"]
    assert mw.verify_files(str(tmp_path), hf, full=True)["ok"]  # git blob id over the real bytes


@pytest.mark.parametrize(
    ("hub", "fixture", "status", "headers", "needle"),
    [
        ("modelscope", "ms_error_unknown_id.json", 404, {}, "ids differ between ModelScope and Hugging Face"),
        ("modelscope", "ms_error_revision.json", 404, {}, "has no revision 'nope'"),
        ("huggingface", "hf_error_repo.json", 404, {"X-Error-Code": "RepoNotFound"}, "model id Qwen/X not found"),
        ("huggingface", "hf_error_revision.json", 404, {"X-Error-Code": "RevisionNotFound"}, "has no revision"),
        ("huggingface", "hf_error_repo.json", 401, {}, "model_weights_huggingface_token"),
    ],
)
def test_hub_errors_name_the_hub_and_the_id(hub, fixture, status, headers, needle):
    msg = mw.hub_error(hub, "Qwen/X", "nope", status, (FIX / fixture).read_text(), headers)
    assert msg.startswith(f"{hub}:") and "Qwen/X" in msg
    assert needle in msg


def test_hub_error_modelscope_unknown_id_mentions_the_other_hub():
    msg = mw.hub_error("modelscope", "Qwen/Nope", "master", 404, (FIX / "ms_error_unknown_id.json").read_text())
    assert "Repository Qwen/Nope not found" in msg and "huggingface" in msg


# --- verification -----------------------------------------------------------------------


def shard_file(path: Path, size: int | None = None):
    header = (FIX / "shard2_header.bin").read_bytes()
    (n,) = struct.unpack("<Q", header[:8])
    meta = json.loads(header[8 : 8 + n])
    end = max(v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__")
    whole = 8 + n + end
    path.write_bytes(header + b"\0" * ((size if size is not None else whole) - len(header)))
    return whole


def test_safetensors_whole_and_truncated(tmp_path):
    whole = shard_file(tmp_path / "a.safetensors")
    assert whole == 329472  # the real shard's size
    assert mw.safetensors_problem(str(tmp_path / "a.safetensors")) == ""
    shard_file(tmp_path / "b.safetensors", whole - 100)
    assert "truncated" in mw.safetensors_problem(str(tmp_path / "b.safetensors"))
    (tmp_path / "c.safetensors").write_bytes(b"\x01")
    assert "shorter" in mw.safetensors_problem(str(tmp_path / "c.safetensors"))


def test_verify_files_missing_size_and_sha(tmp_path):
    (tmp_path / "a").write_bytes(b"hello")
    (tmp_path / "b").write_bytes(b"hellO")
    (tmp_path / "c").write_bytes(b"hi")
    sha = mw.sha256_file(str(tmp_path / "a"))
    files = [
        {"path": "a", "size": 5, "sha256": sha},
        {"path": "b", "size": 5, "sha256": sha},
        {"path": "c", "size": 5, "sha256": None},
        {"path": "d", "size": 1, "sha256": None},
    ]
    quick = mw.verify_files(str(tmp_path), files, full=False)
    assert quick["missing"] == ["d"] and list(quick["bad"]) == ["c"]  # sizes only: b passes
    full = mw.verify_files(str(tmp_path), files, full=True)
    assert sorted(full["bad"]) == ["b", "c"] and "sha256" in full["bad"]["b"]
    assert full["digests"]["a"] == sha
    assert mw.problems_text(full).startswith("d: missing; ")


def test_index_names_a_shard_the_listing_lacks():
    files = [f for f in mw.ms_files(load("ms_files_sharded.json")) if "00002" not in f["path"]]
    problems = mw.index_problems(files, lambda rel: load(rel))
    assert problems == [
        "model-00002-of-00003.safetensors: named in model.safetensors.index.json but not in the repository's file list"
    ]


def test_remote_code_detection():
    files = mw.ms_files(load("ms_files_sharded.json"))
    assert mw.remote_code(files, load("config.json"))["trust_remote_code"] is False
    custom = mw.remote_code(files + [{"path": "modeling_x.py", "size": 1}], {"auto_map": {"AutoModel": "m.X"}})
    assert custom == {"trust_remote_code": True, "python_files": ["modeling_x.py"], "auto_map": ["AutoModel"]}


def test_bytes_needed_and_disk(tmp_path):
    files = mw.ms_files(load("ms_files_sharded.json"))
    total = sum(f["size"] for f in files)
    assert mw.bytes_needed(str(tmp_path), files) == total
    (tmp_path / "config.json").write_bytes((FIX / "config.json").read_bytes())
    assert mw.bytes_needed(str(tmp_path), files) == total - 579
    assert mw.disk_problem(0, 0, 0.1, 10, "/x") == ""
    assert "not enough free disk under /x" in mw.disk_problem(1000, 1100, 0.1, 1, "/x")
    assert mw.disk_problem(1000, 1101, 0.1, 1, "/x") == ""


def test_marker_round_trip():
    files = mw.hf_files(load("hf_tree_sharded.json"))
    model = {"id": "Qwen/Qwen3.5-9B-Instruct", "hub": "huggingface", "source": "controller", "revision": "main"}
    digests = {f["path"]: f["sha256"] or "0" * 64 for f in files}
    marker = mw.make_marker(model, COMMIT, files, digests, {"trust_remote_code": False})
    assert marker["source"] == "controller" and all(len(f["sha256"]) == 64 for f in marker["files"])
    assert mw.marker_problem(marker, "huggingface", model["id"], COMMIT, files) == ""
    assert mw.marker_problem(marker, "huggingface", model["id"], COMMIT, None) == ""
    assert "marker is for" in mw.marker_problem(marker, "modelscope", model["id"], COMMIT, files)
    assert "marker is for" in mw.marker_problem(marker, "huggingface", model["id"], "f" * 40, files)
    assert "file list differs" in mw.marker_problem(marker, "huggingface", model["id"], COMMIT, files[1:])
    assert mw.marker_problem(None, "huggingface", model["id"], COMMIT, files) == "no marker"
    assert mw.marker_files(marker)[0].keys() == {"path", "size", "sha256"}


def test_fetch_env_keeps_the_token_out_of_argv():
    env = mw.fetch_env("huggingface", "secret", "/srv/m/.client-cache")
    assert env["HF_TOKEN"] == "secret" and "MODELSCOPE_API_TOKEN" not in env
    assert mw.fetch_env("modelscope", "t", "/c")["MODELSCOPE_API_TOKEN"] == "t"
    assert "HF_TOKEN" not in mw.fetch_env("huggingface", "", "/c")
    assert "secret" not in mw.FETCH_SCRIPT


def test_last_error_picks_the_exception_line():
    out = "Traceback (most recent call last):\n  File x\nrequests.exceptions.HTTPError: [E3020] [404] nope\n"
    assert mw.last_error(out) == "requests.exceptions.HTTPError: [E3020] [404] nope"
    assert mw.last_error("") == ""
    assert os.path.basename(mw.MARKER) == ".rigops-model.json"


# --- the module, on folders (no hub) ------------------------------------------------------


def local_model(path: Path, shards=(1, 2, 3)):
    path.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors.index.json"):
        (path / name).write_bytes((FIX / name).read_bytes())
    for i in shards:
        shard_file(path / f"model-0000{i}-of-00003.safetensors")


def test_module_local_source_whole_and_missing_shard(run_module, tmp_path):
    from ansible_collections.rigops.fleet.plugins.modules import model_weights as module

    local_model(tmp_path / "ok")
    failed, result = run_module(module.main, {"source": "local", "path": str(tmp_path / "ok")})
    assert not failed and result["path"] == str(tmp_path / "ok") and result["trust_remote_code"] is False
    local_model(tmp_path / "bad", shards=(1, 3))
    failed, result = run_module(module.main, {"source": "local", "path": str(tmp_path / "bad")})
    assert failed and "model-00002-of-00003.safetensors: named in model.safetensors.index.json" in result["msg"]


def test_module_adopt_proves_copies_then_marker_and_rename(run_module, tmp_path):
    from ansible_collections.rigops.fleet.plugins.modules import model_weights as module

    src = tmp_path / "src"
    local_model(src)
    files = [
        {"path": p.name, "size": p.stat().st_size, "sha256": mw.sha256_file(str(p))} for p in sorted(src.iterdir())
    ]
    expected = {"commit": COMMIT, "revision": "main", "files": files}
    root = tmp_path / "root"
    final = Path(mw.model_dir(str(root), "huggingface", "Org/M", COMMIT))
    args = {"source": "adopt", "hub": "huggingface", "id": "Org/M", "root": str(root), "expected": expected}
    # nothing copied yet: checked reports what is missing
    failed, result = run_module(module.main, dict(args, state="checked"))
    assert not failed and not result["staged"] and result["bytes_needed"] == sum(f["size"] for f in files)
    # a corrupted copy is refused, no marker
    partial = Path(str(final) + ".partial")
    local_model(partial)
    data = bytearray((partial / "model-00002-of-00003.safetensors").read_bytes())
    data[-1] ^= 1
    (partial / "model-00002-of-00003.safetensors").write_bytes(bytes(data))
    failed, result = run_module(module.main, args)
    assert failed and "model-00002-of-00003.safetensors: sha256" in result["msg"]
    assert not final.exists()
    # a good copy: marker, rename, and a rerun changes nothing
    local_model(partial)
    failed, result = run_module(module.main, args)
    assert not failed and result["changed"] and result["staged"]
    marker = json.loads((final / mw.MARKER).read_text())
    assert marker["source"] == "controller" and marker["commit"] == COMMIT
    assert not partial.exists() and oct(final.stat().st_mode & 0o777) == "0o750"
    assert oct((final / "config.json").stat().st_mode & 0o777) == "0o640"
    failed, result = run_module(module.main, args)
    assert not failed and not result["changed"] and result["staged"]


# --- hub answers checked ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("commit", "ok"),
    [
        (COMMIT, True),
        (COMMIT.upper(), False),
        (COMMIT[:39], False),
        (COMMIT + "0", False),
        ("z" * 40, False),
        (COMMIT + "\n", False),  # `$` would have let this one through
        (None, False),
        (int("1" * 40, 16), False),
    ],
)
def test_commit_problem(commit, ok):
    why = mw.commit_problem(commit)
    assert (why == "") is ok
    if not ok:
        assert why.startswith("is not a")
    assert bool(mw.COMMIT_RE.match(commit) if isinstance(commit, str) else False) is ok


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("config.json", ""),
        ("sub/dir/model.safetensors", ""),
        (".gitattributes", ""),
        ("a..b/c...json", ""),
        ("../../etc/passwd", "leaves the model folder"),
        ("/etc/shadow", "is absolute"),
        ("a/../../b", "leaves the model folder"),
        ("a//../../b", "leaves the model folder"),
        ("a/../b", "has a '.' or '..' segment"),
        ("a/./b", "has a '.' or '..' segment"),
        ("a//b", "has an empty segment (// or a trailing /)"),
        ("a/", "has an empty segment (// or a trailing /)"),
        ("..\\..\\etc\\passwd", "contains a backslash"),
        ("a\0b", "contains a NUL byte"),
        ("a\x1bb", "contains a control character"),
        ("", "is empty"),
        (None, "is not a string (NoneType)"),
        (mw.MARKER, "is the name of rigops' marker (.rigops-model.json)"),
    ],
)
def test_path_problem(path, why):
    assert mw.path_problem(path) == why


def test_listing_problems_name_each_offending_path():
    files = mw.ms_files(load("ms_files_sharded.json"))
    assert mw.listing_problems(files) == []
    assert mw.listing_problems(mw.hf_files(load("hf_tree_sharded.json"))) == []
    bad = files + [
        {"path": "../../etc/passwd", "size": 1},
        {"path": "config.json", "size": 579},
        {"path": "config.json/x", "size": 1},
        {"path": "big", "size": -1},
    ]
    assert mw.listing_problems(bad) == [
        "file path '../../etc/passwd' leaves the model folder",
        "file path 'config.json' is listed twice",
        "file 'big' has size -1, not a byte count",
        "file path 'config.json' is also the folder of 'config.json/x'",
    ]


def test_a_listing_path_from_the_hub_is_taken_as_listed():
    listing = load("ms_files_sharded.json")
    listing["Data"]["Files"][0]["Path"] = "../../../etc/cron.d/x"
    files = mw.ms_files(listing)
    assert "../../../etc/cron.d/x" in {f["path"] for f in files}  # parsing keeps it; the check names it
    assert mw.listing_problems(files) == ["file path '../../../etc/cron.d/x' leaves the model folder"]


@pytest.mark.parametrize(
    ("endpoint", "allow_http", "needle"),
    [
        ("https://www.modelscope.cn", False, ""),
        ("https://mirror.internal:8443/hf", False, ""),
        ("http://rigops-hub:8090", True, ""),
        ("http://rigops-hub:8090", False, "is plain http"),
        ("HTTP://rigops-hub:8090", False, "is plain http"),
        ("ftp://mirror/", True, "is not an http(s) URL"),
        ("https://", False, "is not an http(s) URL with a host"),
        ("rigops-hub:8090", True, "is not an http(s) URL"),
        ("", False, "is not an http(s) URL"),
    ],
)
def test_endpoint_problem(endpoint, allow_http, needle):
    why = mw.endpoint_problem(endpoint, allow_http)
    assert (why == "") is (needle == "") and needle in why
    if needle == "is plain http":
        assert "model_weights_allow_http: true" in why


def test_refusal_names_where_the_model_and_the_values():
    msg = mw.refusal("huggingface (http://m)", "Org/M", [f"p{i}" for i in range(7)])
    assert msg.startswith("huggingface (http://m): Org/M: p0; p1; p2; p3; p4; and 2 more. Refused before anything")
    assert msg.endswith("; check the hub or mirror that answered.")
    assert mw.refusal("modelscope (http://m)", "Org/M", ["p"], answered=False) == (
        "modelscope (http://m): Org/M: p. Refused before anything was written under the model root."
    )


def test_verify_files_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w").write_bytes(b"hello")
    model = tmp_path / "model"
    model.mkdir()
    (model / "sub").symlink_to(outside, target_is_directory=True)
    (model / "f").symlink_to(outside / "w")
    files = [{"path": "sub/w", "size": 5, "sha256": None}, {"path": "f", "size": 5, "sha256": None}]
    check = mw.verify_files(str(model), files, full=True)
    assert check["bad"] == {"sub/w": "sub is a symbolic link", "f": "f is a symbolic link"} and not check["ok"]
    assert mw.linked_part(str(model), "sub/w") == "sub" and mw.linked_part(str(model), "nope/x") == ""
    assert mw.bytes_needed(str(model), files) == 10


# --- the module, against captured hub answers (no network) -----------------------------------


class CapturedResponse:
    def __init__(self, url, body):
        self.url, self.body, self.headers = url, body, {}

    def getcode(self):
        return 200

    def read(self):
        return self.body

    def geturl(self):
        return self.url


def test_module_checked_lists_through_open_url(run_module, monkeypatch, tmp_path):
    from ansible_collections.rigops.fleet.plugins.module_utils import model_weights as model_staging
    from ansible_collections.rigops.fleet.plugins.modules import model_weights as module

    endpoint = "http://rigops-hub:8090"
    urls = mw.api_urls("modelscope", endpoint, "Qwen/Qwen3.5-9B", "master")
    answers = {urls["files"]: "ms_files_sharded.json", urls["revisions"]: "ms_revisions.json"}
    calls = []

    def fake_open_url(url, headers=None, **_kwargs):
        calls.append((url, headers))
        return CapturedResponse(url, (FIX / answers[url]).read_bytes())

    monkeypatch.setattr(model_staging, "open_url", fake_open_url)
    args = {"state": "checked", "hub": "modelscope", "id": "Qwen/Qwen3.5-9B", "endpoint": endpoint}
    args.update(root=str(tmp_path / "root"), token="ms-secret")
    failed, result = run_module(module.main, args)
    assert failed and "endpoint 'http://rigops-hub:8090' is plain http" in result["msg"]
    assert "Qwen/Qwen3.5-9B" in result["msg"] and "model_weights_allow_http" in result["msg"] and calls == []
    failed, result = run_module(module.main, dict(args, allow_http=True))
    assert not failed and result["commit"] == COMMIT and not result["staged"] and not result["changed"]
    assert result["bytes_needed"] == sum(f["size"] for f in mw.ms_files(load("ms_files_sharded.json")))
    assert [c[0] for c in calls] == [urls["files"], urls["revisions"]]
    assert calls[0][1]["Authorization"] == "Bearer ms-secret"
    assert not (tmp_path / "root").exists()


# --- the role's preflight ---------------------------------------------------------------


def test_preflight_refuses_a_python_without_the_hubs_client_by_name(tmp_path):
    """The role's preflight on the controller, with its own python as the runtime's: it has huggingface_hub
    (found, not imported) and no modelscope, which the refusal names alone, before anything is made on disk."""
    refs = [
        {"name": "a", "model": {"source": "huggingface", "id": "Qwen/Qwen3.5-9B-Instruct", "revision": "v1.0.0"}},
        {"name": "b", "model": {"source": "modelscope", "id": "Qwen/Qwen3.5-9B", "revision": "master"}},
    ]
    play = {
        "name": "model_weights preflight",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": {
            "model_weights_instances": refs,
            "model_weights_python": sys.executable,
            "model_weights_group": "root",
            "model_weights_root": str(tmp_path / "models"),
        },
        "tasks": [
            {
                "name": "Preflight",
                "ansible.builtin.import_role": {"name": "rigops.fleet.model_weights", "tasks_from": "preflight"},
            },
        ],
    }
    (tmp_path / "play.yml").write_text(yaml.safe_dump([play]))
    proc = ansible_playbook(*LOCALHOST, tmp_path / "play.yml")
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0, out[-3000:]
    assert f"localhost: {sys.executable} has no client for modelscope (" in out, out[-3000:]
    assert "PackageNotFoundError: No package metadata was found for modelscope" in out, out[-3000:]
    assert "the hub clients are installed, the group exists" in out
    assert not (tmp_path / "models").exists()
