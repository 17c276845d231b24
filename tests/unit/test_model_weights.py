"""plugins/module_utils/model_weights.py on real files in tmp_path, with captured hub answers.

The hub's API answers are the ones captured from the sandbox hub stand-in
(tests/unit/fixtures/model_weights/). The client run is replaced by StandInClient, which
writes the requested files into the folder it is given, as the real client does, and can
drop, corrupt or truncate files. Only config.json, model.safetensors.index.json and the
header of the second shard exist as real bytes in the fixtures; the other files are
stand-in bytes of the listed size (whole safetensors shards for *.safetensors), and their
sha256 (ModelScope) or LFS sha256 / git blob id (Hugging Face) in the captured listing are
replaced by those of the stand-in bytes. Paths, sizes, commits and the answers' structure
are the hub's.
"""

from __future__ import annotations

import copy
import grp
import hashlib
import json
import os
import pwd
import stat
import struct
from pathlib import Path
from unittest import mock

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils import model_weights as ms
from ansible_collections.rigops.fleet.plugins.module_utils import model_weights_plan as mw

FIX = Path(__file__).parent / "fixtures" / "model_weights"
COMMIT = "046faecc3573390176703f4b4dece37da6d49a82"
ENDPOINT = "https://hub.test"
MODELS = {"modelscope": "Qwen/Qwen3.5-9B", "huggingface": "Qwen/Qwen3.5-9B-Instruct"}
REVISION = {"modelscope": "master", "huggingface": "main"}
REAL = ("config.json", "model.safetensors.index.json")


def load(name):
    return json.loads((FIX / name).read_text())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def safetensors(size: int) -> bytes:
    """A whole safetensors file of exactly `size` bytes (one U8 tensor, header padded with spaces)."""
    n = 128
    length = size - 8 - n
    header = json.dumps({"w": {"dtype": "U8", "shape": [length], "data_offsets": [0, length]}}).encode()
    return struct.pack("<Q", n) + header.ljust(n, b" ") + b"\1" * length


def stand_in(path: str, size: int) -> bytes:
    if path in REAL:
        data = (FIX / path).read_bytes()
    elif path == "model-00002-of-00003.safetensors":
        header = (FIX / "shard2_header.bin").read_bytes()
        data = header + b"\0" * (size - len(header))
    elif path.endswith(".safetensors"):
        data = safetensors(size)
    else:
        data = (f"{path} of the stand-in repository\n".encode() * (size // 20 + 1))[:size]
    assert len(data) == size
    return data


@pytest.fixture(scope="module")
def repo() -> dict[str, bytes]:
    files = mw.ms_files(load("ms_files_sharded.json"))
    data = {f["path"]: stand_in(f["path"], f["size"]) for f in files}
    for f in files:
        if f["path"] in REAL:  # the capture and the real bytes agree
            assert f["sha256"] == sha256(data[f["path"]])
    return data


def ms_answers(repo, files_answer=None, revisions_answer=None):
    """URL -> (status, body) of the captured ModelScope answers, sha256 of the stand-in bytes."""
    listing = files_answer or load("ms_files_sharded.json")
    for e in listing["Data"]["Files"]:
        if e["Type"] == "blob" and e["Path"] in repo:
            e["Sha256"] = sha256(repo[e["Path"]])
    urls = mw.api_urls("modelscope", ENDPOINT, MODELS["modelscope"], "master")
    return {
        urls["files"]: (200, listing),
        urls["revisions"]: (200, revisions_answer or load("ms_revisions.json")),
    }


def hf_answers(repo, revision_answer=None, commit=COMMIT):
    """URL -> (status, body) of the captured Hugging Face answers, ids of the stand-in bytes."""
    tree = load("hf_tree_sharded.json")
    for e in tree:
        data = repo[e["path"]]
        if e.get("lfs"):
            e["lfs"]["oid"] = sha256(data)
        elif e["path"] in REAL:
            assert e["oid"] == git_oid(data)
        else:
            e["oid"] = git_oid(data)
    urls = mw.api_urls("huggingface", ENDPOINT, MODELS["huggingface"], "main")
    return {
        urls["revision"]: (200, revision_answer or load("hf_revision_main.json")),
        urls["tree"].format(commit=commit): (200, tree),
    }


class CapturedHub:
    """The opener seam: answers the hub's API calls from captured answers, records them."""

    def __init__(self, answers, redirect=None):
        self.answers = answers
        self.redirect = redirect or {}
        self.calls = []

    def __call__(self, url, headers, timeout):
        self.calls.append((url, dict(headers)))
        if url not in self.answers:
            return {"status": 404, "body": b'{"error": "not captured"}', "headers": {}, "url": url}
        status, body = self.answers[url]
        return {"status": status, "body": json.dumps(body).encode(), "headers": {}, "url": self.redirect.get(url, url)}


class StandInClient:
    """The fetch seam: one client run writes the wanted files into the folder, like the real client.

    never: paths it cannot get (the hub answers 404); corrupt_once / truncate_once: paths
    whose first download is wrong (same size / cut short, the run then fails); junk: what
    it leaves besides (its own cache files).
    """

    def __init__(self, repo, jail, never=(), corrupt_once=(), truncate_once=(), junk=()):
        self.repo, self.jail = repo, jail
        self.never, self.corrupt, self.truncate, self.junk = set(never), set(corrupt_once), set(truncate_once), junk
        self.calls = []

    def __call__(self, partial, commit, wanted):
        assert os.path.isdir(partial) and partial.endswith(f"{commit}.partial")
        assert not os.path.exists(os.path.join(partial, mw.MARKER))
        self.calls.append(list(wanted))
        ok, why = True, ""
        for rel in wanted:
            target = os.path.realpath(os.path.join(partial, rel))
            if not target.startswith(str(self.jail) + os.sep):
                raise AssertionError(f"the client was asked to write {rel!r} outside the jail: {target}")
            if rel in self.never or rel not in self.repo:
                ok, why = False, f"requests.exceptions.HTTPError: 404 Client Error for {rel}"
                continue
            data = self.repo[rel]
            if rel in self.corrupt:
                self.corrupt.discard(rel)
                data = data[:-1] + bytes([data[-1] ^ 1])
            elif rel in self.truncate:
                self.truncate.discard(rel)
                data = data[: len(data) // 2]
                ok, why = False, "requests.exceptions.ConnectionError: Connection broken: IncompleteRead"
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
        for rel in self.junk:
            os.makedirs(os.path.dirname(os.path.join(partial, rel)), exist_ok=True)
            Path(partial, rel).write_text("client cache")
        return ok, why


@pytest.fixture(scope="module")
def defaults() -> dict:
    """The module's option defaults, read from its argument_spec (what AnsibleModule hands stage_model)."""
    from ansible_collections.rigops.fleet.plugins.modules import model_weights as module

    captured = {}

    class Captured(Exception):
        pass

    def capture(argument_spec, **_kwargs):
        captured.update(argument_spec)
        raise Captured

    with mock.patch.object(module, "AnsibleModule", capture), pytest.raises(Captured):
        module.main()
    return {name: spec.get("default") for name, spec in captured.items()}


@pytest.fixture
def params(defaults, tmp_path):
    def make(hub="modelscope", **over):
        p = dict(defaults)
        p.update(
            hub=hub,
            id=MODELS[hub],
            revision=REVISION[hub],
            endpoint=ENDPOINT,
            root=str(tmp_path / "root"),
            owner=pwd.getpwuid(os.getuid()).pw_name,
            group=grp.getgrgid(os.getgid()).gr_name,
            disk_margin_bytes=0,
            attempts=2,
        )
        p.update(over)
        return p

    return make


def answers_for(hub, repo):
    return ms_answers(repo) if hub == "modelscope" else hf_answers(repo)


def final_dir(p) -> Path:
    return Path(mw.model_dir(p["root"], p["hub"], p["id"], COMMIT))


def tree(path: Path) -> dict:
    """Every entry under path with its type, size and mode (a snapshot to compare)."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (stat.S_IFMT(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode))
    return out


# --- the whole run: resolve, list, stage into .partial, verify, marker, rename -------------


@pytest.mark.parametrize("hub", ["modelscope", "huggingface"])
def test_stage_resolves_lists_stages_verifies_marks_and_renames(hub, params, repo, tmp_path):
    p = params(hub, label="controller" if hub == "huggingface" else "")
    api = CapturedHub(answers_for(hub, repo))
    client = StandInClient(repo, tmp_path, junk=[".cache/huggingface/download/config.json.metadata"])
    result = ms.stage_model(p, fetch=client, opener=api)

    # the hub's API in the clients' order, then one client run for every listed file
    urls = mw.api_urls(hub, ENDPOINT, p["id"], p["revision"])
    want_calls = [urls["files"], urls["revisions"]] if hub == "modelscope" else [urls["revision"]]
    assert [c[0] for c in api.calls][: len(want_calls)] == want_calls
    assert all("Authorization" not in headers for _url, headers in api.calls)
    assert client.calls == [sorted(repo)]

    final = final_dir(p)
    assert result["changed"] and result["staged"] and result["commit"] == COMMIT and result["path"] == str(final)
    assert result["downloaded"] == sorted(repo) and result["trust_remote_code"] is False
    assert not Path(str(final) + ".partial").exists()
    # the folder holds the listed files and the marker, nothing the client left besides
    assert sorted(str(x.relative_to(final)) for x in final.rglob("*")) == sorted([*repo, mw.MARKER])
    marker = json.loads((final / mw.MARKER).read_text())
    assert (marker["hub"], marker["id"], marker["commit"], marker["revision"]) == (hub, p["id"], COMMIT, p["revision"])
    assert marker["source"] == (p["label"] or hub)
    assert {f["path"]: f["sha256"] for f in marker["files"]} == {rel: sha256(data) for rel, data in repo.items()}
    assert stat.S_IMODE(final.stat().st_mode) == 0o750
    assert {stat.S_IMODE(x.stat().st_mode) for x in final.iterdir()} == {0o640}
    assert {x.stat().st_uid for x in final.iterdir()} == {os.getuid()}
    # the parents are made with the folder mode too
    assert stat.S_IMODE(final.parent.stat().st_mode) == 0o750

    # a rerun reads the marker, checks sizes, downloads nothing, changes nothing
    again = ms.stage_model(p, fetch=client, opener=CapturedHub(answers_for(hub, repo)))
    assert not again["changed"] and again["staged"] and again["bytes_needed"] == 0
    assert client.calls == [sorted(repo)]


def test_http_endpoint_with_the_opt_in_stages(params, repo, tmp_path):
    answers = {url.replace(ENDPOINT, "http://rigops-hub:8090"): a for url, a in ms_answers(repo).items()}
    p = params(endpoint="http://rigops-hub:8090", allow_http=True)
    result = ms.stage_model(p, fetch=StandInClient(repo, tmp_path), opener=CapturedHub(answers))
    assert result["staged"] and (final_dir(p) / mw.MARKER).is_file()


# --- a file that fails its check: fetched again, or refused -------------------------------


def test_corrupted_download_is_fetched_again(params, repo, tmp_path):
    """Same size, one byte off: only the sha256 catches it (huggingface_hub does not over plain http)."""
    p = params()
    client = StandInClient(repo, tmp_path, corrupt_once=["model-00002-of-00003.safetensors"])
    result = ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert client.calls == [sorted(repo), ["model-00002-of-00003.safetensors"]]
    assert result["staged"]
    shard = final_dir(p) / "model-00002-of-00003.safetensors"
    assert shard.read_bytes() == repo["model-00002-of-00003.safetensors"]


def test_wrong_size_after_every_attempt_is_refused_without_marker(params, repo, tmp_path):
    p = params(attempts=2)
    bad = dict(repo, **{"model-00001-of-00003.safetensors": repo["model-00001-of-00003.safetensors"][:-10]})
    client = StandInClient(bad, tmp_path)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    size = len(repo["model-00001-of-00003.safetensors"])
    assert f"is incomplete after 2 attempts: model-00001-of-00003.safetensors: size {size - 10}, expected {size}" in (
        info.value.msg
    )
    assert "no marker was written" in info.value.msg
    assert client.calls == [sorted(repo), ["model-00001-of-00003.safetensors"]]
    final = final_dir(p)
    assert not final.exists() and Path(str(final) + ".partial").is_dir()
    assert not list(Path(p["root"]).rglob(mw.MARKER))
    assert info.value.result["downloaded"] == sorted(repo) and not info.value.result["staged"]


def test_staged_copy_that_fails_its_check_keeps_its_good_files(params, repo, tmp_path):
    p = params()
    client = StandInClient(repo, tmp_path)
    ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    shard = final_dir(p) / "model-00003-of-00003.safetensors"
    kept = final_dir(p) / "tokenizer.json"
    inode = kept.stat().st_ino
    shard.write_bytes(shard.read_bytes()[:100])
    result = ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert client.calls[1:] == [["model-00003-of-00003.safetensors"]]
    assert result["changed"] and result["staged"] and kept.stat().st_ino == inode


def test_shard_named_in_the_index_but_not_listed_is_refused(params, repo, tmp_path):
    listing = load("ms_files_sharded.json")
    listing["Data"]["Files"] = [e for e in listing["Data"]["Files"] if "00002" not in e["Path"]]
    p = params()
    client = StandInClient(repo, tmp_path)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo, files_answer=listing)))
    assert info.value.msg == (
        f"{p['id']}@{COMMIT}: incomplete sharded model: model-00002-of-00003.safetensors: named in "
        "model.safetensors.index.json but not in the repository's file list"
    )
    final = final_dir(p)
    assert not final.exists() and not list(Path(p["root"]).rglob(mw.MARKER))
    assert Path(str(final) + ".partial").is_dir()


# --- resume ------------------------------------------------------------------------------


def test_interrupted_run_leaves_partial_and_the_next_run_resumes_it(params, repo, tmp_path):
    p = params(attempts=1)
    shard = "model-00001-of-00003.safetensors"
    first = StandInClient(repo, tmp_path, truncate_once=[shard], never=["tokenizer.json"])
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=first, opener=CapturedHub(ms_answers(repo)))
    assert "Last client error: requests.exceptions.HTTPError: 404" in info.value.msg
    assert "stays in" in info.value.msg and "a rerun resumes it" in info.value.msg
    partial = Path(str(final_dir(p)) + ".partial")
    assert partial.is_dir() and (partial / "config.json").is_file()
    kept = {rel: (partial / rel).stat().st_ino for rel in repo if rel not in (shard, "tokenizer.json")}

    # state=checked counts only what the partial folder still lacks
    checked = ms.stage_model(dict(p, state="checked"), opener=CapturedHub(ms_answers(repo)))
    assert checked["bytes_needed"] == len(repo[shard]) + len(repo["tokenizer.json"])

    second = StandInClient(repo, tmp_path)
    result = ms.stage_model(p, fetch=second, opener=CapturedHub(ms_answers(repo)))
    assert second.calls == [[shard, "tokenizer.json"]]  # the cut shard again, the missing file; nothing else
    final = final_dir(p)
    assert result["staged"] and not partial.exists()
    assert {rel: (final / rel).stat().st_ino for rel in kept} == kept  # the same files, renamed with the folder


# --- check mode and state=checked write nothing -------------------------------------------


@pytest.mark.parametrize(("state", "check_mode"), [("checked", False), ("present", True)])
def test_checked_and_check_mode_write_nothing(state, check_mode, params, repo, tmp_path):
    p = params(state=state)
    client = StandInClient(repo, tmp_path)
    result = ms.stage_model(p, check_mode=check_mode, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert client.calls == [] and not Path(p["root"]).exists()
    assert not result["staged"] and result["reason"] == "no marker" and result["commit"] == COMMIT
    assert result["bytes_needed"] == sum(len(d) for d in repo.values()) and result["free_bytes"] > 0
    assert result["changed"] is (state == "present")  # check mode reports what a real run would do

    # with a partial download and a stale staged copy around, nothing moves either
    partial = Path(str(final_dir(p)) + ".partial")
    partial.mkdir(parents=True)
    (partial / "config.json").write_bytes(repo["config.json"])
    before = tree(tmp_path)
    result = ms.stage_model(p, check_mode=check_mode, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert tree(tmp_path) == before and client.calls == []
    assert result["bytes_needed"] == sum(len(d) for d in repo.values()) - len(repo["config.json"])


def test_not_enough_disk_is_refused_before_any_write(params, repo, tmp_path):
    p = params(disk_margin_bytes=1 << 62)
    client = StandInClient(repo, tmp_path)
    with pytest.raises(ms.StageError, match="not enough free disk under"):
        ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert client.calls == [] and not Path(p["root"]).exists()


# --- hub answers checked ----------------------------------------------------------------


def listing_with(path):
    listing = load("ms_files_sharded.json")
    entry = copy.deepcopy(listing["Data"]["Files"][0])
    entry.update(Name=os.path.basename(path) or path, Path=path, Size=5)
    listing["Data"]["Files"].append(entry)
    return listing


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../../etc/passwd", "leaves the model folder"),
        ("/etc/shadow", "is absolute"),
        ("a/../../b", "leaves the model folder"),
        ("../../../../../../outside.txt", "leaves the model folder"),
        ("a/../b", "has a '.' or '..' segment"),
        ("./config.json", "has a '.' or '..' segment"),
        ("a//b", "has an empty segment"),
        ("weights/", "has an empty segment"),
        ("a\\..\\..\\b", "contains a backslash"),
        ("a\0b", "contains a NUL byte"),
        ("a\nb", "contains a control character"),
        ("", "is empty"),
        (mw.MARKER, "is the name of rigops' marker"),
    ],
)
def test_unsafe_path_in_a_listing_stops_the_stage_before_any_write(path, why, params, repo, tmp_path):
    p = params()
    client = StandInClient(repo, tmp_path)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo, files_answer=listing_with(path))))
    msg = info.value.msg
    assert msg.startswith(f"modelscope ({ENDPOINT}): {p['id']}: file path {path!r} {why}"), msg
    assert "Refused before anything was written" in msg
    assert client.calls == [] and list(tmp_path.iterdir()) == []  # not even the root


@pytest.mark.parametrize(
    "commit",
    [
        COMMIT.upper(),
        COMMIT[:12],
        "g" * 40,
        COMMIT + "\n",
        COMMIT[:-2] + "/x",
        "../../../../tmp/x",
    ],
)
@pytest.mark.parametrize("hub", ["modelscope", "huggingface"])
def test_bad_commit_from_the_hub_stops_the_stage_before_any_write(hub, commit, params, repo, tmp_path):
    p = params(hub)
    if hub == "modelscope":
        revisions = load("ms_revisions.json")
        revisions["Data"]["RevisionMap"]["Branches"][0]["CommitId"] = commit
        answers = ms_answers(repo, revisions_answer=revisions)
    else:
        answers = hf_answers(repo, revision_answer=dict(load("hf_revision_main.json"), sha=commit))
    api, client = CapturedHub(answers), StandInClient(repo, tmp_path)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=client, opener=api)
    assert info.value.msg.startswith(
        f"{hub} ({ENDPOINT}): {p['id']}: commit id {commit!r} for revision {p['revision']!r} is not a commit id "
        "(exactly 40 lowercase hex digits)"
    ), info.value.msg
    assert client.calls == [] and list(tmp_path.iterdir()) == []
    assert not any("/tree/" in url for url, _h in api.calls)  # never put into a URL either


def test_plain_http_without_the_opt_in_is_refused_before_any_call(params, repo, tmp_path):
    p = params(endpoint="http://rigops-hub:8090")
    api, client = CapturedHub({}), StandInClient(repo, tmp_path)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, fetch=client, opener=api)
    msg = info.value.msg
    assert msg.startswith(f"modelscope (http://rigops-hub:8090): {p['id']}: endpoint 'http://rigops-hub:8090' is plain")
    assert "model_weights_allow_http: true" in msg
    assert api.calls == [] and client.calls == [] and list(tmp_path.iterdir()) == []


def test_https_hub_redirecting_to_http_is_refused(params, repo, tmp_path):
    p = params()
    answers = ms_answers(repo)
    files_url = mw.api_urls("modelscope", ENDPOINT, p["id"], "master")["files"]
    api = CapturedHub(answers, redirect={files_url: files_url.replace("https://", "http://")})
    with pytest.raises(ms.StageError, match=r"was redirected to 'http://hub.test/.*', which is plain http"):
        ms.stage_model(p, fetch=StandInClient(repo, tmp_path), opener=api)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("expected", "needle"),
    [
        ({"commit": "HEAD", "files": []}, "commit id 'HEAD' is not a commit id"),
        ({"commit": COMMIT, "files": [{"path": "../../../../escape", "size": 1}]}, "'../../../../escape' leaves"),
        ({"commit": COMMIT, "files": [{"path": "/etc/shadow", "size": 1}]}, "'/etc/shadow' is absolute"),
    ],
)
def test_adopt_checks_the_cache_hosts_list_like_a_hub_answer(expected, needle, params, tmp_path):
    p = params("huggingface", source="adopt", expected=expected)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert info.value.msg.startswith(f"huggingface (the cache host's verified list): {p['id']}: ")
    assert needle in info.value.msg
    assert list(tmp_path.iterdir()) == []


def test_model_id_that_would_leave_the_root_is_refused(params, tmp_path):
    with pytest.raises(ms.StageError, match=r"model id '\.\./x' must be a hub repository id"):
        ms.stage_model(params(id="../x"), opener=CapturedHub({}))
    assert list(tmp_path.iterdir()) == []


# --- symbolic links are never followed -----------------------------------------------------


def outside(tmp_path) -> Path:
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "passwd").write_text("root:x:0:0\n")
    (victim / "passwd").chmod(0o600)
    return victim


def test_links_planted_in_partial_are_removed_not_followed(params, repo, tmp_path):
    """A folder link would send the unlink of a bad file, a file link the chmod, outside the root."""
    victim = outside(tmp_path)
    listing = listing_with("evil/passwd")
    repo = dict(repo, **{"evil/passwd": b"hello"})
    p = params()
    partial = Path(str(final_dir(p)) + ".partial")
    partial.mkdir(parents=True)
    (partial / "evil").symlink_to(victim, target_is_directory=True)  # evil/passwd: wrong size, "bad"
    (partial / "config.json").symlink_to(victim / "passwd")  # would be chmod 0640'd, chowned
    before = tree(victim)
    result = ms.stage_model(p, fetch=StandInClient(repo, tmp_path), opener=CapturedHub(ms_answers(repo, listing)))
    assert result["staged"]
    assert tree(victim) == before and (victim / "passwd").read_text() == "root:x:0:0\n"
    final = final_dir(p)
    assert not (final / "evil").is_symlink() and (final / "evil" / "passwd").read_bytes() == b"hello"
    assert not (final / "config.json").is_symlink()


def test_link_in_a_staged_model_is_refetched_not_followed(params, repo, tmp_path):
    victim = outside(tmp_path)
    p = params(verify_sha256=True)
    client = StandInClient(repo, tmp_path)
    ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    final = final_dir(p)
    (victim / "config.json").write_bytes(repo["config.json"])  # the right bytes, elsewhere
    (final / "config.json").unlink()
    (final / "config.json").symlink_to(victim / "config.json")
    before = tree(victim)
    checked = ms.stage_model(dict(p, state="checked"), opener=CapturedHub(ms_answers(repo)))
    assert not checked["staged"] and checked["reason"] == "config.json: config.json is a symbolic link"
    result = ms.stage_model(p, fetch=client, opener=CapturedHub(ms_answers(repo)))
    assert client.calls[1:] == [["config.json"]] and result["staged"]
    assert not (final / "config.json").is_symlink() and tree(victim) == before


# --- the real client's run -------------------------------------------------------------------


def test_client_fetch_runs_the_real_client_with_the_token_in_the_environment(params):
    p = params("huggingface", token="hf_secret", endpoint="", workers=2)
    seen = {}

    def run_command(argv, environ_update, check_rc):
        seen.update(argv=argv, env=environ_update, check_rc=check_rc)
        return 1, "", "Traceback...\nhuggingface_hub.errors.RepositoryNotFoundError: 404 Client Error\n"

    ok, why = ms.client_fetch(run_command, p)("/m/x.partial", COMMIT, ["config.json"])
    assert not ok and why == "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error"
    assert seen["argv"][:3] == [p["python"], "-c", mw.FETCH_SCRIPT] and seen["check_rc"] is False
    args = json.loads(seen["argv"][3])
    assert args == {
        "hub": "huggingface",
        "id": p["id"],
        "commit": COMMIT,
        "dir": "/m/x.partial",
        "files": ["config.json"],
        "endpoint": "https://huggingface.co",
        "workers": 2,
    }
    assert "hf_secret" not in " ".join(seen["argv"]) and seen["env"]["HF_TOKEN"] == "hf_secret"
    assert seen["env"]["HF_HOME"] == os.path.join(p["root"], ".client-cache", "huggingface")


# --- source fleet_cache: a real HTTP server with ranges stands for the site's cache -------


class CacheServer:
    """The fleet cache's data path over real HTTP: index.json and the store's files, with Range.

    files: {url path: bytes}; requests: (path, Range header, status) of every GET; stop_after:
    bytes of a body to send before the connection is cut (once, for the first file asked).
    """

    def __init__(self, files, token="", tls=None):
        import http.server
        import ssl
        import threading

        self.files, self.token, self.requests, self.cut = files, token, [], None
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802 (http.server's name)
                rng = self.headers.get("Range")
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self.answer(401, b"no", rng)
                data = server.files.get(self.path)
                if data is None:
                    return self.answer(404, b"not here", rng)
                start = int(rng.split("=")[1].rstrip("-")) if rng else 0
                body = data[start:]
                if server.cut and self.path.endswith(server.cut[0]):
                    _, keep = server.cut
                    server.cut = None
                    self.answer(206 if rng else 200, body, rng, length=len(body), send=body[:keep])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return None
                return self.answer(206 if rng else 200, body, rng)

            def answer(self, status, body, rng, length=None, send=None):
                server.requests.append((self.path, rng, status))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                self.wfile.write(body if send is None else send)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        if tls:  # (certificate, key): HTTPS under the certificate's name
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.url = f"https://localhost:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def cache_files(repo, hub="huggingface", revision="v1.0.0", corrupt=()):
    """The cache's index.json and store for one model (sha256 of the stand-in bytes), a file corrupted on request."""
    model_id = MODELS[hub]
    files = [{"path": rel, "size": len(data), "sha256": sha256(data)} for rel, data in sorted(repo.items())]
    index = {"models": [{"hub": hub, "id": model_id, "revision": revision, "commit": COMMIT, "files": files}]}
    base = "/models/" + mw.model_dir("", hub, model_id, COMMIT).lstrip("/")
    out = {"/index.json": json.dumps(index).encode()}
    for rel, data in repo.items():
        out[f"{base}/{rel}"] = data if rel not in corrupt else data[:-1] + bytes([data[-1] ^ 1])
    return out


@pytest.fixture
def cache(repo):
    servers = []

    def make(**kw):
        token, tls = kw.pop("token", ""), kw.pop("tls", None)
        server = CacheServer(cache_files(repo, **kw), token=token, tls=tls)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def cache_params(params, server, **over):
    over = {"allow_http": True, **over}
    return params("huggingface", source="fleet_cache", revision="v1.0.0", cache_url=server.url, **over)


def test_fleet_cache_pulls_every_file_verifies_marks_and_renames(params, repo, cache):
    server = cache(token="s3cret")
    p = cache_params(params, server, cache_token="s3cret", workers=3)
    result = ms.stage_model(p)
    final = final_dir(p)
    assert result["staged"] and result["changed"] and result["commit"] == COMMIT
    assert {rel: (final / rel).read_bytes() for rel in repo} == repo
    marker = json.loads((final / mw.MARKER).read_text())
    assert marker["source"] == "fleet_cache" and marker["revision"] == "v1.0.0"
    assert not Path(str(final) + ".partial").exists() and not list(final.rglob("*.part"))
    assert sorted(r[0].rsplit("/", 1)[-1] for r in server.requests[1:]) == sorted(repo)  # each file once
    # a second run reads only the listing
    before = len(server.requests)
    again = ms.stage_model(p)
    assert again["staged"] and not again["changed"] and server.requests[before:] == [("/index.json", None, 200)]


def test_fleet_cache_file_corrupted_on_the_cache_is_refused_and_named(params, repo, cache):
    shard = "model-00001-of-00003.safetensors"
    server = cache(corrupt=[shard])
    p = cache_params(params, server)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert f"{shard}: sha256" in info.value.msg and f"from the fleet cache {server.url}" in info.value.msg
    assert not final_dir(p).exists()  # nothing moved into place
    partial = Path(str(final_dir(p)) + ".partial")
    assert not (partial / mw.MARKER).exists()
    assert (partial / "config.json").read_bytes() == repo["config.json"]  # the good files stay for a rerun


def test_fleet_cache_cut_mid_file_resumes_with_a_range(params, repo, cache):
    shard = "model-00001-of-00003.safetensors"
    server = cache()
    server.cut = (shard, 1000)
    p = cache_params(params, server, attempts=1, workers=1)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert shard in info.value.msg and "a rerun resumes it" in info.value.msg
    part = Path(str(final_dir(p)) + ".partial") / (shard + ".part")
    assert part.stat().st_size == 1000
    result = ms.stage_model(p)
    assert result["staged"] and (final_dir(p) / shard).read_bytes() == repo[shard]
    assert [r for r in server.requests if r[0].endswith(shard)][-1] == (server.requests[-1][0], "bytes=1000-", 206)


def test_fleet_cache_down_changes_nothing_or_falls_back_to_the_hub(params, repo, cache, tmp_path):
    server = cache()
    url = server.url
    server.close()
    p = cache_params(params, server)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert f"fleet cache ({url}): cannot reach {url}/index.json" in info.value.msg
    assert "model_weights_fleet_cache_fallback_to_hub" in info.value.msg
    assert not Path(p["root"]).exists()
    hub = CapturedHub(hf_answers(repo))
    client = StandInClient(repo, tmp_path)
    p = dict(p, fallback_to_hub=True, revision="main")
    result = ms.stage_model(p, fetch=client, opener=hub)
    assert result["staged"] and "cannot reach" in result["fallback"] and client.calls
    assert json.loads((final_dir(p) / mw.MARKER).read_text())["source"] == "huggingface"


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        (
            {"revision": "v2.0.0"},
            "does not hold huggingface:Qwen/Qwen3.5-9B-Instruct@v2.0.0 (it holds revisions v1.0.0",
        ),
        ({"cache_token": "wrong", "token_on_server": "right"}, "answered 401: check model_weights_fleet_cache_token"),
        ({"allow_http": False}, "is plain http"),
    ],
)
def test_fleet_cache_refusals_name_what_to_fix(params, cache, over, needle):
    server = cache(token=over.pop("token_on_server", ""))
    p = cache_params(params, server)
    p.update(over)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert needle in info.value.msg
    assert not Path(p["root"]).exists()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """(certificate, key) of a self-signed certificate for localhost, made by openssl."""
    import subprocess

    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-days", "2",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


def test_fleet_cache_over_https_pulls_when_the_host_trusts_the_certificate(params, cache, certificate, monkeypatch):
    server = cache(tls=certificate)
    monkeypatch.setenv("SSL_CERT_FILE", certificate[0])  # the host's store holds the site's CA
    p = cache_params(params, server, allow_http=False)
    result = ms.stage_model(p)
    assert result["staged"] and result["changed"] and server.url.startswith("https://")
    assert json.loads((final_dir(p) / mw.MARKER).read_text())["source"] == "fleet_cache"


def test_fleet_cache_certificate_not_trusted_is_refused_named_and_never_falls_back(params, cache, certificate):
    server = cache(tls=certificate)
    hub_asked = []
    p = cache_params(params, server, allow_http=False, fallback_to_hub=True)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p, opener=lambda *a: hub_asked.append(a))
    msg = info.value.msg
    assert f"fleet cache ({server.url}): {server.url}/index.json: the cache's certificate is refused" in msg
    assert "CERTIFICATE_VERIFY_FAILED" in msg and "update-ca-certificates" in msg
    assert not hub_asked and not Path(p["root"]).exists() and not server.requests, msg


def test_fleet_cache_certificate_for_another_name_is_refused(params, cache, certificate, monkeypatch):
    server = cache(tls=certificate)
    monkeypatch.setenv("SSL_CERT_FILE", certificate[0])  # trusted, but made for localhost
    url = server.url.replace("//localhost:", "//127.0.0.1:")
    p = dict(cache_params(params, server, allow_http=False), cache_url=url)
    with pytest.raises(ms.StageError) as info:
        ms.stage_model(p)
    assert f"{url}/index.json: the cache's certificate is refused" in info.value.msg
    assert "mismatch" in info.value.msg and not Path(p["root"]).exists(), info.value.msg


def test_tls_failure_tells_a_certificate_from_a_dead_cache():
    import ssl
    from urllib.error import URLError

    refused = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert "CERTIFICATE_VERIFY_FAILED" in ms.tls_failure(URLError(refused))
    assert ms.tls_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"))
    assert ms.tls_failure(URLError(ConnectionRefusedError(111, "Connection refused"))) == ""
    assert ms.tls_failure(OSError("timed out")) == ""


# --- peers: the real rigops-model-peer server (module_utils model_weights_peer) over a staged copy ---------


@pytest.fixture
def peer(params, cache, tmp_path):
    """make(**config) -> (server, url, staged result): a host that pulled the model from the cache, serving it."""
    import threading

    from ansible_collections.rigops.fleet.plugins.module_utils import model_weights_peer as mp

    servers = []

    def make(token="", tls=None, files=None):
        source = cache()
        p = cache_params(params, source, root=str(tmp_path / f"peer{len(servers)}"))
        staged = ms.stage_model(p)
        config = {
            "listen": "127.0.0.1",
            "port": 1,
            "models": [{"hub": "huggingface", "id": p["id"], "commit": COMMIT, "path": staged["path"],
                        "files": files or staged["files"]}],
        }  # fmt: skip
        if tls:
            config.update(tls_certificate=tls[0], tls_key=tls[1])
        assert mp.check_config(config) == []
        config["port"] = 0
        server = mp.make_server(config, token)
        server.peer.log = open(os.devnull, "w")  # noqa: SIM115 (closed with the server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        scheme = "https://localhost" if tls else "http://127.0.0.1"
        return server, f"{scheme}:{server.server_address[1]}", staged

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()
        server.peer.log.close()


def peer_get(url, token="", rng=""):
    """(status, body) of one GET, the way a puller asks (open_url)."""
    from urllib.error import HTTPError

    from ansible.module_utils.urls import open_url

    headers = dict({"Authorization": f"Bearer {token}"} if token else {}, **({"Range": rng} if rng else {}))
    try:
        resp = open_url(url, headers=headers, timeout=10)
        return resp.getcode(), resp.read()
    except HTTPError as exc:
        return exc.code, exc.read()


def test_peer_serves_only_listed_verified_files_with_the_token_and_ranges(peer, repo):
    server, url, staged = peer(token="s3cret")
    shard = "model-00001-of-00003.safetensors"
    file_url = mw.cache_model_url(url, "huggingface", MODELS["huggingface"], COMMIT, shard)
    assert peer_get(file_url)[0] == 401 and peer_get(file_url, "wrong")[0] == 401
    assert peer_get(file_url, "s3cret") == (200, repo[shard])
    assert peer_get(file_url, "s3cret", "bytes=10-") == (206, repo[shard][10:])
    assert peer_get(file_url, "s3cret", "bytes=10-19") == (206, repo[shard][10:20])
    assert peer_get(file_url, "s3cret", f"bytes={len(repo[shard])}-")[0] == 416
    # the marker, a file beside the model, another commit, a path out of the folder: not listed, not served
    Path(staged["path"], "extra.bin").write_bytes(b"x")
    for rel in (mw.MARKER, "extra.bin", "../" + COMMIT + "/config.json"):
        assert peer_get(mw.cache_model_url(url, "huggingface", MODELS["huggingface"], COMMIT, rel), "s3cret")[0] == 404
    other = mw.cache_model_url(url, "huggingface", MODELS["huggingface"], "f" * 40, shard)
    assert peer_get(other, "s3cret")[0] == 404


def test_peer_refuses_a_file_changed_after_it_was_proven_and_one_that_never_matched(peer, repo):
    server, url, staged = peer()
    shard = "model-00001-of-00003.safetensors"
    file_url = mw.cache_model_url(url, "huggingface", MODELS["huggingface"], COMMIT, shard)
    assert peer_get(file_url)[0] == 200
    path = Path(staged["path"], shard)
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only the ctime moved
    status, body = peer_get(file_url)
    assert status == 409 and b"not verified, refused: sha256" in body
    # a symbolic link where a listed file was is never followed
    path.unlink()
    path.symlink_to(Path(staged["path"], "config.json"))
    assert peer_get(file_url)[0] == 404


def test_peer_config_problems_name_the_field():
    from ansible_collections.rigops.fleet.plugins.module_utils import model_weights_peer as mp

    good = {"hub": "huggingface", "id": "Org/Name", "commit": COMMIT, "path": "/srv/m",
            "files": [{"path": "config.json", "size": 1, "sha256": "a" * 64}]}  # fmt: skip
    assert mp.check_config({"port": 8082, "models": [good]}) == []
    problems = mp.check_config(
        {"port": 0, "tls_certificate": "/c.pem", "token_file": "rel",
         "models": [dict(good, commit="HEAD"), dict(good, files=[{"path": "../x", "size": 1, "sha256": "a" * 64}])]}
    )  # fmt: skip
    text = "; ".join(problems)
    assert "port must be a number 1-65535, got 0" in text and "tls_certificate and tls_key" in text
    assert "token_file must be an absolute path" in text and "models[0].commit" in text
    assert "models[1].files" in text and "../x" in text


def test_fleet_cache_with_peers_spreads_files_and_checks_every_peer_file(params, repo, cache, peer, tmp_path):
    _, url_a, _ = peer(token="s3cret")
    _, url_b, _ = peer(token="s3cret")
    source = cache(token="s3cret")
    ref = ms.peer_model_ref("huggingface", MODELS["huggingface"], COMMIT)
    peers = [{"url": url_a, "models": [ref]}, {"url": url_b, "models": [ref]}, {"url": "http://x", "models": []}]
    p = cache_params(params, source, cache_token="s3cret", peers=peers, workers=2, root=str(tmp_path / "late"))
    result = ms.stage_model(p)
    assert result["staged"] and {rel: (final_dir(p) / rel).read_bytes() for rel in repo} == repo
    report = result["peers"]
    assert report["peers"] == [url_a, url_b] and report["refused"] == []
    from_peers = sorted(rel for rels in report["from_peers"].values() for rel in rels)
    from_cache = sorted(r[0].rsplit("/", 1)[-1] for r in source.requests[1:])
    assert sorted(from_peers + from_cache) == sorted(repo) and len(from_peers) == len(repo) - len(from_cache) > 0
    assert set(report["from_peers"]) == {url_a, url_b}  # three sources, every one used
    assert report["peer_bytes"] == sum(len(repo[rel]) for rel in from_peers)


def test_a_corrupted_peer_copy_is_detected_and_fetched_again_from_the_cache(params, repo, cache, peer, tmp_path):
    shard = "model-00001-of-00003.safetensors"
    # a peer whose copy and list both went wrong: it proves the file against its own (wrong) sha256 and serves it
    server, url, staged = peer()
    path = Path(staged["path"], shard)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    server.peer.routes = {k: (disk, dict(e, sha256=hashlib.sha256(data).hexdigest()) if disk == str(path) else e)
                          for k, (disk, e) in server.peer.routes.items()}  # fmt: skip
    source = cache()
    ref = ms.peer_model_ref("huggingface", MODELS["huggingface"], COMMIT)
    # peer_seed 1: the largest file (the shard) goes to the peer, the next to the cache
    p = cache_params(params, source, peers=[{"url": url, "models": [ref]}], peer_seed=1, root=str(tmp_path / "late"))
    result = ms.stage_model(p)
    assert result["staged"] and (final_dir(p) / shard).read_bytes() == repo[shard]
    refused = result["peers"]["refused"]
    assert [(r["peer"], r["path"]) for r in refused] == [(url, shard)] and "sha256" in refused[0]["why"]
    assert any(r[0].endswith(shard) and r[2] == 200 for r in source.requests)  # the cache sent it again
    assert shard not in result["peers"]["from_peers"].get(url, [])


def test_staged_record_names_each_instance_of_each_placed_model():
    """model_weights_staged (the role's publish.yml): every instance of a placed model, by where it lies; a
    result without a path (a model skipped in a check run) names none."""
    from ansible_collections.rigops.fleet.plugins.filter.model_weights import staged_record  # noqa: PLC0415

    hub = {"source": "modelscope", "id": "Qwen/Qwen3-0.6B", "revision": "master", "instances": ["chat", "batch"]}
    local = {"source": "local", "id": "", "revision": "", "instances": ["own"]}
    placed = [
        {"item": hub, "path": "/var/lib/rigops/models/modelscope/Qwen/Qwen3-0.6B/abc", "commit": "abc", "staged": True},
        {"item": local, "path": "/srv/own", "trust_remote_code": True},
        {"item": {**hub, "instances": ["later"]}, "skipped": True},
    ]
    record = staged_record(placed)
    assert sorted(record) == ["batch", "chat", "own"]
    assert record["chat"] == record["batch"] == {
        "path": "/var/lib/rigops/models/modelscope/Qwen/Qwen3-0.6B/abc", "source": "modelscope",
        "id": "Qwen/Qwen3-0.6B", "revision": "master", "commit": "abc", "trust_remote_code": False,
    }  # fmt: skip
    assert record["own"]["commit"] == "" and record["own"]["trust_remote_code"] is True
