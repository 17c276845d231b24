"""Pure logic of the model_weights role: plan, hub listings, checks of hub answers,
verification, marker.

Everything here takes plain data (or a directory) and returns plain data, so it is tested
without a host (tests/unit/test_model_weights_plan.py, on listings captured from the sandbox
hub stand-in). plugins/modules/model_weights_plan.py calls it; plugins/modules/model_weights.py goes
through plugins/module_utils/model_weights.py, which does the staging I/O these functions decide.
Downloads themselves go through the real hub clients (FETCH_SCRIPT, run by the runtime
venv's python).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
from urllib.parse import urlsplit

# The instance contract's words: its sources (HUB_SOURCES name the hub in model.hub: the fan-out
# through the controller, and the pull from the site's fleet cache), hubs, ids, names and paths.
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_instances import (
    HUB_ID_RE as ID_RE,
)
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_instances import (
    HUB_SOURCES,
    HUBS,
    SOURCES,
    name_problem,
)
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_instances import (
    path_problem as model_path_problem,
)

# The fleet cache's listing of its verified models (roles/fleet_cache writes it).
CACHE_INDEX = "index.json"
MARKER = ".rigops-model.json"
MARKER_VERSION = 1
# \A...\Z, not ^...$: `$` also matches before a trailing newline.
COMMIT_RE = re.compile(r"\A[0-9a-f]{40}\Z")
DEFAULT_REVISION = {"modelscope": "master", "huggingface": "main"}
DEFAULT_ENDPOINT = {"modelscope": "https://www.modelscope.cn", "huggingface": "https://huggingface.co"}
OTHER_HUB = {"modelscope": "huggingface", "huggingface": "modelscope"}
CHUNK = 1 << 20


class HubError(Exception):
    """A hub answered, but not with the model: unknown id, unknown revision, ..."""


# ---------------------------------------------------------------------------------------
# Plan: which models a host stages, deduplicated, and who downloads for the fleet.


def model_key(hub: str, model_id: str, revision: str) -> str:
    return f"{hub}:{model_id}@{revision}"


def normalize_model(instance: dict) -> dict:
    """One instance's model, with defaults, or ValueError saying what is wrong."""
    name = instance.get("name") if isinstance(instance, dict) else None
    if name_problem(name):
        raise ValueError(f"instance name {name!r} {name_problem(name)} (see docs/instances.md)")
    model = instance.get("model")
    if not isinstance(model, dict):
        raise ValueError(f"instance {name}: model must be a mapping with source and id (see docs/instances.md)")
    source = model.get("source", "")
    if source not in SOURCES:
        raise ValueError(f"instance {name}: model.source must be one of {', '.join(SOURCES)} (got {source!r})")
    if source == "local":
        path = model.get("path") or ""
        if model_path_problem(path):
            raise ValueError(f"instance {name}: source local needs model.path, an absolute directory (got {path!r})")
        return {
            "key": f"local:{path.rstrip('/') or '/'}",
            "source": "local",
            "hub": "",
            "id": model.get("id") or path,
            "revision": "",
            "path": path.rstrip("/") or "/",
            "trust_remote_code": bool(model.get("trust_remote_code", False)),
        }
    hub = source if source not in HUB_SOURCES else model.get("hub", "")
    if hub not in HUBS:
        raise ValueError(
            f"instance {name}: source {source} needs model.hub, the hub the model is downloaded from: "
            f"modelscope or huggingface (got {hub!r})"
        )
    model_id = model.get("id", "")
    if not isinstance(model_id, str) or not ID_RE.match(model_id):
        raise ValueError(f"instance {name}: model.id must be a hub repository id like Org/Name (got {model_id!r})")
    revision = str(model.get("revision") or DEFAULT_REVISION[hub])
    return {
        "key": model_key(hub, model_id, revision),
        "source": source,
        "hub": hub,
        "id": model_id,
        "revision": revision,
        "path": "",
        "trust_remote_code": bool(model.get("trust_remote_code", False)),
    }


# What the plan reads of an instance: its name and these model fields (the rigops.fleet.model_refs
# filter gives exactly that). Nothing else (security, its key) may reach the plan.
PLAN_FIELDS = ("name", "model")
MODEL_FIELDS = ("source", "id", "revision", "hub", "path", "trust_remote_code")


def _model_ref_problem(inst) -> str:
    """Why an entry of the fleet is more than a model reference ('' when it is one)."""
    if not isinstance(inst, dict):
        return ""  # normalize_model says what is wrong with it
    extra = sorted(str(k) for k in inst if k not in PLAN_FIELDS)
    model = inst.get("model")
    if isinstance(model, dict):
        extra += sorted(f"model.{k}" for k in model if k not in MODEL_FIELDS)
    if not extra:
        return ""
    return (
        f"the plan takes each instance's name and model fields only ({', '.join(MODEL_FIELDS)}), got also "
        f"{', '.join(extra)}: pass vllm_instances through rigops.fleet.model_refs (a key must never reach the plan)"
    )


def plan(host: str, fleet: dict, cache_host: str = "") -> dict:
    """The models `host` stages, each once, with the instances that use it.

    fleet: {host: [model references]} for every host of the play, in play order; a model
    reference is an instance's name and model fields, {name, model: {source, id, revision,
    hub, path, trust_remote_code}} (PLAN_FIELDS, MODEL_FIELDS), never more: ValueError for
    anything else (security above all). A `controller` model is downloaded from the hub by one
    cache host (cache_host if set, else the first host of the play that needs it) and copied
    from there to the others; the cache host stages it even when none of its own instances uses it.
    """
    for name, instances in fleet.items():
        for inst in instances or []:
            problem = _model_ref_problem(inst)
            if problem:
                raise ValueError(f"{name}: {problem}")
    per_host: dict[str, dict[str, dict]] = {}
    for name, instances in fleet.items():
        models: dict[str, dict] = {}
        seen_names = set()
        for inst in instances or []:
            model = normalize_model(inst)
            if inst["name"] in seen_names:
                raise ValueError(f"{name}: instance name {inst['name']} is used twice; names must be unique on a host")
            seen_names.add(inst["name"])
            entry = models.setdefault(model["key"], dict(model, instances=[]))
            if model["source"] == "controller":
                entry["source"] = "controller"
            entry["instances"].append(inst["name"])
            entry["trust_remote_code"] = entry["trust_remote_code"] or model["trust_remote_code"]
        per_host[name] = models
    if cache_host and cache_host not in fleet:
        raise ValueError(f"model_weights_cache_host {cache_host} is not a host of this play; add it to the play")
    mine = per_host.get(host, {})
    out = []
    for key, model in mine.items():
        model = dict(model)
        if model["source"] == "controller":
            model["cache_host"] = cache_host or next(h for h, ms in per_host.items() if key in ms)
            model["role"] = "download" if model["cache_host"] == host else "copy"
        else:
            model["cache_host"] = ""
            model["role"] = "local" if model["source"] == "local" else "download"
        out.append(model)
    if cache_host == host:
        for models in per_host.values():
            for key, model in models.items():
                if model["source"] == "controller" and key not in mine and key not in {m["key"] for m in out}:
                    out.append(dict(model, instances=[], cache_host=host, role="download"))
    return {"models": sorted(out, key=lambda m: m["key"])}


def model_dir(root: str, hub: str, model_id: str, commit: str) -> str:
    """<root>/<hub>/<org>/<name>/<commit>: several revisions side by side."""
    org, name = model_id.split("/", 1)
    return os.path.join(root, hub, org, name, commit)


# ---------------------------------------------------------------------------------------
# Hub listings: the same API calls the clients make, parsed into one file list.


def cache_model_url(base: str, hub: str, model_id: str, commit: str, rel: str = "") -> str:
    """URL of a staged model's folder (or of one of its files) on a fleet cache: the store's layout."""
    url = base.rstrip("/") + "/models/" + model_dir("", hub, model_id, commit).lstrip("/")
    return url + "/" + rel if rel else url + "/"


def cache_entry(index, hub: str, model_id: str, revision: str) -> tuple[str, list[dict]]:
    """(commit, files) of one model in a fleet cache's listing; HubError saying what is missing.

    The listing is {"models": [{hub, id, revision, commit, files: [{path, size, sha256}]}]};
    revision matches the entry's revision or its commit.
    """
    if not isinstance(index, dict) or not isinstance(index.get("models"), list):
        raise HubError(f"the listing is not a mapping with a list of models (got {type(index).__name__})")
    held = []
    for entry in index["models"]:
        if not isinstance(entry, dict):
            continue
        if entry.get("hub") == hub and entry.get("id") == model_id:
            if revision in (entry.get("revision"), entry.get("commit")):
                return entry.get("commit"), marker_files(entry)
            held.append(str(entry.get("revision")))
    where = f"revisions {', '.join(sorted(held))} only" if held else "nothing of this model"
    raise HubError(
        f"the cache does not hold {hub}:{model_id}@{revision} (it holds {where}); add the model to the cache "
        f"(fleet_cache_models, or an instance with source fleet_cache among fleet_cache_clients) and run the "
        f"caches play first"
    )


def api_urls(hub: str, endpoint: str, model_id: str, revision: str) -> dict:
    base = endpoint.rstrip("/")
    if hub == "modelscope":
        return {
            "revisions": f"{base}/api/v1/models/{model_id}/revisions",
            "files": f"{base}/api/v1/models/{model_id}/repo/files?Revision={revision}&Recursive=True",
        }
    return {
        "revision": f"{base}/api/models/{model_id}/revision/{revision}",
        "tree": f"{base}/api/models/{model_id}/tree/{{commit}}?recursive=true",
    }


def hub_error(hub: str, model_id: str, revision: str, status: int, body: str, headers: dict | None = None) -> str:
    """A clear error for a failed listing: which hub, which id, what to do."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    detail = ""
    try:
        data = json.loads(body or "{}")
        detail = data.get("Message") or data.get("error") or ""
    except (ValueError, AttributeError):
        detail = (body or "")[:200]
    code = headers.get("x-error-code", "")
    is_rev = code == "RevisionNotFound" or ("rev" in detail.lower() and "repository" not in detail.lower())
    if status == 404 and is_rev:
        return (
            f"{hub}: model {model_id} has no revision {revision!r} ({detail or code}). Use a branch, tag or commit "
            f"that exists on {hub} for this id."
        )
    if status == 404:
        return (
            f"{hub}: model id {model_id} not found ({detail or code or 'HTTP 404'}). Check the id and the hub: "
            f"ids differ between ModelScope and Hugging Face (the same model may be named differently on "
            f"{OTHER_HUB[hub]})."
        )
    if status in (401, 403):
        return f"{hub}: access to {model_id} refused (HTTP {status}): set model_weights_{hub}_token to a valid token."
    return f"{hub}: listing {model_id}@{revision} failed with HTTP {status}: {detail or body[:200]}"


def ms_commit(revisions: dict, revision: str) -> str:
    """The commit a ModelScope branch or tag names (a 40-hex revision is its own commit)."""
    data = revisions.get("Data") or {}
    rmap = data.get("RevisionMap") or {}
    for kind in ("Branches", "Tags"):
        for entry in rmap.get(kind) or []:
            if entry.get("Revision") == revision and entry.get("CommitId"):
                return entry["CommitId"]
    if COMMIT_RE.match(revision):
        return revision
    return ""


def ms_files(listing: dict) -> list[dict]:
    """ModelScope `repo/files` reply -> [{path, size, sha256}] (blobs only)."""
    if not listing.get("Success", True) or "Data" not in listing:
        raise HubError(listing.get("Message") or "modelscope listing without Data")
    files = []
    for entry in listing["Data"].get("Files") or []:
        if entry.get("Type") != "blob":
            continue
        files.append({"path": entry["Path"], "size": int(entry["Size"]), "sha256": entry.get("Sha256") or None})
    return sorted(files, key=lambda f: f["path"])


def ms_listing_commit(listing: dict) -> str:
    for entry in (listing.get("Data") or {}).get("Files") or []:
        commit = entry.get("CommitId") or entry.get("Revision") or ""
        if COMMIT_RE.match(commit):
            return commit
    return ""


def hf_commit(info: dict) -> str:
    return info.get("sha") or ""


def hf_files(tree: list) -> list[dict]:
    """Hugging Face `tree` reply -> [{path, size, sha256, git_oid}] (files only).

    LFS files carry their sha256; small files only their git blob id, which is checked
    instead (sha1 over "blob <size>\\0" + content).
    """
    files = []
    for entry in tree:
        if entry.get("type") != "file":
            continue
        lfs = entry.get("lfs") or {}
        files.append(
            {
                "path": entry["path"],
                "size": int(lfs.get("size", entry.get("size", 0))),
                "sha256": lfs.get("oid") or None,
                "git_oid": None if lfs else entry.get("oid"),
            }
        )
    return sorted(files, key=lambda f: f["path"])


# ---------------------------------------------------------------------------------------
# Hub answers checked: commit ids and file paths from a hub (or a mirror) end up in
# renames, unlinks and chmods run as root, so each is proven harmless before any write.


def endpoint_problem(endpoint: str, allow_http: bool) -> str:
    """'' when the hub may be asked at endpoint: https, or plain http with the opt-in."""
    try:
        url = urlsplit(endpoint)
        host = url.hostname
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if url.scheme not in ("http", "https") or not host:
        return "is not an http(s) URL with a host"
    if url.scheme == "http" and not allow_http:
        return (
            "is plain http: file lists and weights could be altered on the way. Use https, or opt in for a "
            "trusted mirror with allow_http (role variable model_weights_allow_http: true)"
        )
    return ""


def commit_problem(commit) -> str:
    """'' when commit is a commit id: exactly 40 lowercase hex digits (it names a folder)."""
    if not isinstance(commit, str):
        return f"is not a string ({type(commit).__name__})"
    if not COMMIT_RE.match(commit):
        return "is not a commit id (exactly 40 lowercase hex digits)"
    return ""


def path_problem(rel) -> str:
    """'' when rel is a relative file path that stays inside the model's folder.

    Paths are taken as they are listed, never normalised: a path that only stays inside
    after normalisation (`a/../b`) is refused as well, so what is checked is what is used.
    """
    if not isinstance(rel, str):
        return f"is not a string ({type(rel).__name__})"
    if not rel:
        return "is empty"
    if "\0" in rel:
        return "contains a NUL byte"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        return "contains a control character"
    if "\\" in rel:
        return "contains a backslash"
    if rel.startswith("/"):
        return "is absolute"
    parts = rel.split("/")
    depth = 0
    for part in parts:
        depth += -1 if part == ".." else 0 if part in (".", "") else 1
        if depth < 0:
            return "leaves the model folder"
    if "" in parts:
        return "has an empty segment (// or a trailing /)"
    if "." in parts or ".." in parts:
        return "has a '.' or '..' segment"
    if rel == MARKER:
        return f"is the name of rigops' marker ({MARKER})"
    return ""


def listing_problems(files: list[dict]) -> list[str]:
    """What is unsafe or impossible in a listing: each path, duplicates, a file that is also a folder, sizes."""
    problems, seen = [], set()
    for f in files:
        rel = f.get("path")
        why = path_problem(rel)
        if why:
            problems.append(f"file path {rel!r} {why}")
            continue
        if rel in seen:
            problems.append(f"file path {rel!r} is listed twice")
        seen.add(rel)
        size = f.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            problems.append(f"file {rel!r} has size {size!r}, not a byte count")
    for rel in sorted(seen):
        parts = rel.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in seen:
                problems.append(f"file path {folder!r} is also the folder of {rel!r}")
                break
    return problems


def refusal(where: str, model_id: str, problems: list[str], answered: bool = True) -> str:
    """The message that stops the weights stage: which hub, which model, which values, nothing written."""
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    hint = "; check the hub or mirror that answered" if answered else ""
    return f"{where}: {model_id}: {shown}. Refused before anything was written under the model root{hint}."


# ---------------------------------------------------------------------------------------
# Verification of a folder against the listing.


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def git_blob_sha1(path: str) -> str:
    h = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())  # noqa: S324 - git's object id, not security
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def safetensors_problem(path: str) -> str:
    """'' if the file is a whole safetensors file (header + every tensor's bytes), else why not."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "shorter than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size, 100 * 1024 * 1024):
                return f"header length {n} is beyond the file ({size} bytes)"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        return f"unreadable safetensors header: {exc}"
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)),
        default=0,
    )
    if size != 8 + n + end:
        return f"truncated or padded: {size} bytes, header says {8 + n + end}"
    return ""


def index_shards(index: dict) -> list[str]:
    return sorted(set((index.get("weight_map") or {}).values()))


def index_problems(files: list[dict], read_json) -> list[str]:
    """Every shard that a *.safetensors.index.json names must be among the files."""
    names = {f["path"] for f in files}
    problems = []
    for f in files:
        if not f["path"].endswith(".safetensors.index.json"):
            continue
        try:
            shards = index_shards(read_json(f["path"]))
        except (OSError, ValueError) as exc:
            problems.append(f"{f['path']}: unreadable index ({exc})")
            continue
        prefix = os.path.dirname(f["path"])
        for shard in shards:
            rel = os.path.join(prefix, shard) if prefix else shard
            if rel not in names:
                problems.append(f"{rel}: named in {f['path']} but not in the repository's file list")
    return problems


def linked_part(directory: str, rel: str) -> str:
    """The first part of rel under directory that is a symbolic link ('' if none is).

    A link inside a model folder would send a check, a chmod or an unlink outside it;
    model files are plain files in plain folders.
    """
    parts = rel.split("/")
    path = directory
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return ""
        if stat.S_ISLNK(mode):
            return "/".join(parts[: i + 1])
    return ""


def verify_files(directory: str, files: list[dict], full: bool) -> dict:
    """Compare a folder with the expected files.

    Sizes always; sha256 (or the git blob id) when `full`, or for a file whose size is
    right but that the caller wants proven. A symbolic link (the file or a folder on its way)
    is bad, never followed. Returns {ok, missing, bad: {path: why}, digests}.
    """
    missing, bad, digests = [], {}, {}
    for f in files:
        path = os.path.join(directory, f["path"])
        link = linked_part(directory, f["path"])
        if link:
            bad[f["path"]] = f"{link} is a symbolic link"
            continue
        if not os.path.isfile(path):
            missing.append(f["path"])
            continue
        size = os.path.getsize(path)
        if size != f["size"]:
            bad[f["path"]] = f"size {size}, expected {f['size']}"
            continue
        if not full:
            continue
        if f.get("sha256"):
            got = sha256_file(path)
            digests[f["path"]] = got
            if got != f["sha256"]:
                bad[f["path"]] = f"sha256 {got}, expected {f['sha256']}"
                continue
        elif f.get("git_oid"):
            got = git_blob_sha1(path)
            if got != f["git_oid"]:
                bad[f["path"]] = f"git blob id {got}, expected {f['git_oid']}"
                continue
            digests[f["path"]] = sha256_file(path)
        else:
            digests[f["path"]] = sha256_file(path)
        if f["path"].endswith(".safetensors"):
            why = safetensors_problem(path)
            if why:
                bad[f["path"]] = why
    return {"ok": not missing and not bad, "missing": missing, "bad": bad, "digests": digests}


def problems_text(check: dict) -> str:
    """One line for a verify_files result: what is missing or wrong."""
    return "; ".join([f"{m}: missing" for m in check["missing"]] + [f"{k}: {v}" for k, v in check["bad"].items()])


def remote_code(files: list[dict], config: dict | None) -> dict:
    """Does the repository ship custom code (auto_map in config.json, or *.py files)?"""
    py = sorted(f["path"] for f in files if f["path"].endswith(".py"))
    auto_map = sorted((config or {}).get("auto_map") or {})
    return {"trust_remote_code": bool(py or auto_map), "python_files": py, "auto_map": auto_map}


def bytes_needed(directory: str, files: list[dict]) -> int:
    """Bytes still to fetch into directory for the listing (whole files that are wrong count fully)."""
    need = 0
    for f in files:
        path = os.path.join(directory, f["path"])
        if linked_part(directory, f["path"]) or not (os.path.isfile(path) and os.path.getsize(path) == f["size"]):
            need += f["size"]
    return need


def disk_problem(needed: int, free: int, margin_ratio: float, margin_bytes: int, where: str) -> str:
    want = int(needed * (1 + margin_ratio)) + margin_bytes if needed else 0
    if want > free:
        return (
            f"not enough free disk under {where}: the models need {needed} bytes, {want} with the margin "
            f"(model_weights_disk_margin_ratio/_bytes), {free} free. Free space or move model_weights_root."
        )
    return ""


# ---------------------------------------------------------------------------------------
# Marker: what was verified, so a rerun checks cheaply and downloads nothing.


def make_marker(model: dict, commit: str, files: list[dict], digests: dict, trust: dict) -> dict:
    return {
        "version": MARKER_VERSION,
        "id": model["id"],
        "hub": model["hub"],
        "source": model["source"],
        "revision": model["revision"],
        "commit": commit,
        "trust_remote_code": trust["trust_remote_code"],
        "files": [
            {"path": f["path"], "size": f["size"], "sha256": digests.get(f["path"]) or f.get("sha256")} for f in files
        ],
    }


def marker_problem(marker: dict | None, hub: str, model_id: str, commit: str, files: list[dict] | None) -> str:
    """'' when the marker records this model at this commit (and, given a listing, these files)."""
    if not marker:
        return "no marker"
    if marker.get("version") != MARKER_VERSION:
        return f"marker version {marker.get('version')}"
    if (marker.get("hub"), marker.get("id"), marker.get("commit")) != (hub, model_id, commit):
        return f"marker is for {marker.get('hub')}:{marker.get('id')}@{marker.get('commit')}"
    if files is not None:
        want = {(f["path"], f["size"]) for f in files}
        have = {(f["path"], f["size"]) for f in marker.get("files") or []}
        if want != have:
            return "marker's file list differs from the hub's"
        for f in files:
            rec = next(m for m in marker["files"] if m["path"] == f["path"])
            if f.get("sha256") and rec.get("sha256") and rec["sha256"] != f["sha256"]:
                return f"marker's sha256 of {f['path']} differs from the hub's"
    return ""


def marker_files(marker: dict) -> list[dict]:
    return [{"path": f["path"], "size": f["size"], "sha256": f.get("sha256")} for f in marker.get("files") or []]


# ---------------------------------------------------------------------------------------
# The download itself: run by the runtime venv's python, through the real clients.

FETCH_SCRIPT = r"""
import json, os, sys
a = json.loads(sys.argv[1])
patterns = a["files"] or None
if a["hub"] == "huggingface":
    from huggingface_hub import snapshot_download
    snapshot_download(repo_id=a["id"], revision=a["commit"], local_dir=a["dir"], allow_patterns=patterns,
                      endpoint=a["endpoint"] or None, max_workers=a["workers"])
else:
    from modelscope import snapshot_download
    snapshot_download(a["id"], revision=a["commit"], local_dir=a["dir"], allow_patterns=patterns,
                      endpoint=a["endpoint"] or None, max_workers=a["workers"])
print(json.dumps({"dir": a["dir"]}))
"""


def fetch_env(hub: str, token: str, home: str) -> dict:
    """Environment of a client run: token by environment (never argv), caches kept off ~."""
    env = {
        "HF_HOME": os.path.join(home, "huggingface"),
        "MODELSCOPE_CACHE": os.path.join(home, "modelscope"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "DISABLE_TQDM": "1",
        "HF_HUB_OFFLINE": "0",
    }
    if token:
        env["HF_TOKEN" if hub == "huggingface" else "MODELSCOPE_API_TOKEN"] = token
    return env


def last_error(output: str) -> str:
    """The client's exception line (the last line that looks like one), for the failure message."""
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception)\b", ln) or ln.startswith("requests.exceptions"):
            return ln[:500]
    return lines[-1][:500] if lines else ""
