"""Staging of one model on the host: the I/O behind plugins/modules/model_weights.py.

The hub's API (revision and listing), the client runs that download, the checks of a
folder, the marker, the rename into place, owners and modes, free disk. The decisions are
plain functions in model_weights.py; this file carries them out on the host's files.

Two seams keep it testable without a host or a network (tests/unit/test_model_weights.py):
`opener` answers the hub's API calls (default: Ansible's open_url) and `fetch` stands for
one run of the hub client (default: client_fetch, the real client run by the runtime's
python). Every failure is a StageError with the message for the user and the result so far.

Hub answers are checked before anything is written (model_weights.commit_problem,
listing_problems, endpoint_problem), and nothing here follows a symbolic link inside a
model folder: a link is removed (the link, not its target) or refused.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import ssl
import stat
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.six.moves.http_client import HTTPException
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.rigops.fleet.plugins.module_utils.model_weights_plan import (
    CACHE_INDEX,
    CHUNK,
    COMMIT_RE,
    DEFAULT_ENDPOINT,
    DEFAULT_REVISION,
    FETCH_SCRIPT,
    ID_RE,
    MARKER,
    HubError,
    api_urls,
    bytes_needed,
    cache_entry,
    cache_model_url,
    commit_problem,
    disk_problem,
    endpoint_problem,
    fetch_env,
    hf_commit,
    hf_files,
    hub_error,
    index_problems,
    last_error,
    linked_part,
    listing_problems,
    make_marker,
    marker_files,
    marker_problem,
    model_dir,
    ms_commit,
    ms_files,
    problems_text,
    refusal,
    remote_code,
    safetensors_problem,
    sha256_file,
    verify_files,
)


class StageError(Exception):
    """Stops the weights stage for this model: msg for the user, result with what is known so far."""

    def __init__(self, msg: str, **result):
        super().__init__(msg)
        self.msg = msg
        self.result = result


# ---------------------------------------------------------------------------------------
# The hub's API: the calls the clients make, each answer checked before it is used.


def urls_opener(url: str, headers: dict, timeout: int) -> dict:
    """One GET with Ansible's open_url: {status, body, headers, url}; an HTTP error is an answer too.

    `url` is where the answer came from after redirects (an https hub that redirects to
    plain http is caught by the caller).
    """
    try:
        resp = open_url(url, headers=headers, timeout=timeout, http_agent="rigops-model-weights")
        return {
            "status": resp.getcode(),
            "body": resp.read(),
            "headers": dict(resp.headers or {}),
            "url": resp.geturl(),
        }
    except HTTPError as exc:
        try:
            body = exc.read() or b""
        except (AttributeError, OSError):
            body = b""
        return {"status": exc.code, "body": body, "headers": dict(exc.headers or {}), "url": url}


class HubApi:
    """The listing API of one hub for one model and revision."""

    def __init__(self, hub, model_id, revision, endpoint="", token="", timeout=30, allow_http=False, opener=None):
        self.hub = hub
        self.model_id = model_id
        self.revision = revision or DEFAULT_REVISION[hub]
        self.endpoint = endpoint or DEFAULT_ENDPOINT[hub]
        self.token = token
        self.timeout = timeout
        self.allow_http = allow_http
        self.opener = opener or urls_opener

    @property
    def where(self) -> str:
        return f"{self.hub} ({self.endpoint})"

    def refuse(self, problems: list[str], answered: bool = True, **result) -> StageError:
        return StageError(refusal(self.where, self.model_id, problems, answered), **result)

    def check_endpoint(self) -> None:
        why = endpoint_problem(self.endpoint, self.allow_http)
        if why:
            raise self.refuse([f"endpoint {self.endpoint!r} {why}"], answered=False)

    def get_json(self, url: str):
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            answer = self.opener(url, headers, self.timeout)
        except (URLError, OSError, ValueError) as exc:
            raise StageError(
                f"{self.hub}: cannot reach {url} ({exc}); check model_weights_{self.hub}_endpoint", url=url
            ) from None
        landed = answer.get("url") or url
        why = endpoint_problem(landed, self.allow_http)
        if why:
            raise self.refuse([f"{url} was redirected to {landed!r}, which {why}"], url=url)
        body = answer.get("body") or b""
        if isinstance(body, bytes):
            body = body.decode("utf-8", "replace")
        if answer["status"] >= 400:
            raise StageError(
                hub_error(self.hub, self.model_id, self.revision, answer["status"], body, answer.get("headers")),
                url=url,
            )
        try:
            return json.loads(body)
        except ValueError as exc:
            raise StageError(f"{self.where}: {url} answered with something that is not JSON ({exc})", url=url) from None

    def listing(self) -> tuple[str, list[dict]]:
        """(commit, files) of the revision: the commit and every path checked before any use."""
        self.check_endpoint()
        urls = api_urls(self.hub, self.endpoint, self.model_id, self.revision)
        try:
            if self.hub == "modelscope":
                commit = self.revision if COMMIT_RE.match(self.revision) else ""
                files = ms_files(self.get_json(urls["files"]))
                if not commit:
                    commit = ms_commit(self.get_json(urls["revisions"]), self.revision)
                if not commit:
                    raise StageError(
                        f"modelscope: revision {self.revision!r} of {self.model_id} is neither a branch, a tag "
                        f"nor a commit"
                    )
                self.check_commit(commit)
            else:
                commit = hf_commit(self.get_json(urls["revision"]))
                self.check_commit(commit)  # before it goes into the tree's URL
                files = hf_files(self.get_json(urls["tree"].format(commit=commit)))
        except (HubError, AttributeError, KeyError, TypeError, ValueError) as exc:
            raise StageError(f"{self.hub}: unexpected listing for {self.model_id}@{self.revision}: {exc!r}") from None
        problems = listing_problems(files)
        if problems:
            raise self.refuse(problems)
        if not files:
            raise StageError(f"{self.hub}: {self.model_id}@{self.revision} lists no files")
        return commit, files

    def check_commit(self, commit) -> None:
        why = commit_problem(commit)
        if why:
            raise self.refuse([f"commit id {commit!r} for revision {self.revision!r} {why}"])


# ---------------------------------------------------------------------------------------
# The hub client: one run downloads the wanted files into the .partial folder.


def client_fetch(run_command, params: dict):
    """fetch(partial, commit, wanted) -> (ok, why): one run of the real client (FETCH_SCRIPT).

    run_command is AnsibleModule.run_command; params the module's. The token goes by
    environment only, never on the command line.
    """

    def fetch(partial: str, commit: str, wanted: list[str]):
        args = {
            "hub": params["hub"],
            "id": params["id"],
            "commit": commit,
            "dir": partial,
            "files": wanted,
            "endpoint": params["endpoint"] or DEFAULT_ENDPOINT[params["hub"]],
            "workers": params["workers"],
        }
        env = fetch_env(params["hub"], params["token"], os.path.join(params["root"], ".client-cache"))
        rc, out, err = run_command(
            [params["python"], "-c", FETCH_SCRIPT, json.dumps(args)], environ_update=env, check_rc=False
        )
        return rc == 0, last_error(err or out)

    return fetch


# ---------------------------------------------------------------------------------------
# The site's fleet cache (roles/fleet_cache): its listing, and files pulled over HTTP(S)
# in parallel, each resumed from what an earlier attempt left (Range), checked afterwards
# like a hub's download (stage_from_hub). Plain HTTP GETs with Ansible's open_url: no
# hub client is needed on the host, and the controller is not on the data path.


class CacheUnreachable(StageError):
    """The cache did not answer at all (a fallback to the hub may apply)."""


def tls_failure(exc: Exception) -> str:
    """Why TLS failed behind an open_url error (a certificate the host does not trust, another
    name), or '' when exc is not a TLS failure."""
    reason = exc.reason if isinstance(exc, URLError) else exc
    return str(reason) if isinstance(reason, ssl.SSLError) else ""


def cache_headers(params: dict) -> dict:
    token = params.get("cache_token") or ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def cache_listing(params: dict, opener=None) -> tuple[str, list[dict]]:
    """(commit, files) of the model in the cache's listing, checked like a hub's answer."""
    base = params["cache_url"]
    where = f"fleet cache ({base})"
    why = endpoint_problem(base, params["allow_http"]) if base else "is empty: set model_weights_fleet_cache_url"
    if why:
        raise StageError(refusal(where, params["id"], [f"cache_url {base!r} {why}"], answered=False))
    url = base.rstrip("/") + "/" + CACHE_INDEX
    headers = dict(cache_headers(params), Accept="application/json")
    try:
        answer = (opener or urls_opener)(url, headers, params["timeout"])
    except (URLError, OSError, ValueError) as exc:
        tls = tls_failure(exc)
        if tls:
            # not a dead cache: no fallback to the hub past a certificate that does not check out
            raise StageError(
                f"{where}: {url}: the cache's certificate is refused ({tls}). Nothing was changed. It must "
                "name the host of model_weights_fleet_cache_url and be signed by a CA this host trusts "
                "(a site's own CA: /usr/local/share/ca-certificates/, then update-ca-certificates)",
                url=url,
            ) from None
        raise CacheUnreachable(f"{where}: cannot reach {url} ({exc}); is the cache up?", url=url) from None
    landed = answer.get("url") or url
    why = endpoint_problem(landed, params["allow_http"])
    if why:
        raise StageError(refusal(where, params["id"], [f"{url} was redirected to {landed!r}, which {why}"]))
    if answer["status"] in (401, 403):
        raise StageError(f"{where}: {url} answered {answer['status']}: check model_weights_fleet_cache_token", url=url)
    if answer["status"] >= 400:
        raise CacheUnreachable(f"{where}: {url} answered {answer['status']}", url=url)
    body = answer.get("body") or b""
    try:
        index = json.loads(body.decode("utf-8", "replace") if isinstance(body, bytes) else body)
        commit, files = cache_entry(
            index, params["hub"], params["id"], params["revision"] or DEFAULT_REVISION[params["hub"]]
        )
    except (HubError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise StageError(f"{where}: {exc}", url=url) from None
    problems = (
        [f"commit id {commit!r} {commit_problem(commit)}"] if commit_problem(commit) else []
    ) + listing_problems(files)
    if problems:
        raise StageError(refusal(where, params["id"], problems))
    return commit, files


def cache_pull(url: str, dest: str, size: int, headers: dict, timeout: int) -> str:
    """Download url into dest, resuming from dest + '.part' (Range); dest appears only when whole.

    '' when done, else why not (what arrived stays in the .part file for the next attempt).
    """
    part = dest + ".part"
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    if os.path.islink(part):
        os.unlink(part)
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    if have > size:
        os.unlink(part)
        have = 0
    try:
        resp = open_url(
            url, headers=dict(headers, Range=f"bytes={have}-") if have else headers, timeout=timeout,
            http_agent="rigops-model-weights",
        )  # fmt: skip
        # what arrives is on disk at once (read1: no waiting for a whole chunk), so a cut keeps it
        read = getattr(resp, "read1", resp.read)
        with open(part, "ab" if resp.getcode() == 206 else "wb", buffering=0) as out:
            for block in iter(lambda: read(CHUNK), b""):
                out.write(block)
    except HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except (URLError, OSError, ValueError, HTTPException) as exc:
        return f"{url}: {exc!r}"
    got = os.path.getsize(part)
    if got != size:
        return f"{url}: {got} of {size} bytes arrived (the connection ended early)"
    os.rename(part, dest)
    return ""


def peer_urls(params: dict, commit: str) -> list[str]:
    """The base URLs of the peers (hosts of earlier batches) that serve this model at this commit."""
    ref = peer_model_ref(params["hub"], params["id"], commit)
    return [p["url"] for p in params.get("peers") or [] if ref in (p.get("models") or [])]


def peer_model_ref(hub: str, model_id: str, commit: str) -> str:
    return f"{hub}/{model_id}@{commit}"


def cache_fetch(params: dict, files: list[dict]):
    """fetch(partial, commit, wanted) -> (ok, why): each wanted file pulled, `workers` at a time.

    With peers that serve the model, the files are spread over the cache and the peers (largest first, from
    an offset of peer_seed, so that hosts of one batch start on different sources); a file from a peer is
    checked against the cache's sha256 at once, and one that is refused, cut or wrong is taken from the cache.
    fetch.report says what the peers sent and what was taken from the cache instead.
    """
    headers = cache_headers(params)
    entries = {f["path"]: f for f in files}
    report = {"peers": [], "from_peers": {}, "peer_bytes": 0, "refused": []}
    lock = threading.Lock()

    def from_cache(partial: str, commit: str, rel: str) -> str:
        url = cache_model_url(params["cache_url"], params["hub"], params["id"], commit, rel)
        return cache_pull(url, os.path.join(partial, rel), entries[rel]["size"], headers, params["timeout"])

    def from_peer(partial: str, commit: str, rel: str, peer: str) -> str:
        dest, entry = os.path.join(partial, rel), entries[rel]
        why = cache_pull(cache_model_url(peer, params["hub"], params["id"], commit, rel), dest, entry["size"], headers,
                         params["timeout"])  # fmt: skip
        if not why:
            got = sha256_file(dest)
            why = "" if got == entry["sha256"] else f"sha256 {got}, expected {entry['sha256']}"
        with lock:
            if why:
                report["refused"].append({"peer": peer, "path": rel, "why": why})
            else:
                report["from_peers"].setdefault(peer, []).append(rel)
                report["peer_bytes"] += entry["size"]
        if why:  # nothing of it is kept: the cache's copy starts from zero
            for path in (dest, dest + ".part"):
                if os.path.isfile(path) and not os.path.islink(path):
                    os.unlink(path)
            return from_cache(partial, commit, rel)
        return ""

    def fetch(partial: str, commit: str, wanted: list[str]):
        peers = peer_urls(params, commit)
        report["peers"] = peers
        sources = [""] + peers  # "" is the cache
        order = sorted(wanted, key=lambda rel: (-entries[rel]["size"], rel))
        seed = params.get("peer_seed") or 0
        plan = {
            rel: sources[(seed + n) % len(sources)] if entries[rel].get("sha256") else "" for n, rel in enumerate(order)
        }

        def one(rel: str) -> str:
            if plan[rel]:
                return from_peer(partial, commit, rel, plan[rel])
            return from_cache(partial, commit, rel)

        with ThreadPoolExecutor(max_workers=max(1, params["workers"])) as pool:
            errors = [e for e in pool.map(one, order) if e]
        return not errors, "; ".join(errors[:3])

    fetch.report = report
    return fetch


# ---------------------------------------------------------------------------------------
# Files and folders of the model, never through a symbolic link.


def read_marker(directory: str) -> dict | None:
    """The marker of a staged model (None when there is none, or it is not a plain file)."""
    path = os.path.join(directory, MARKER)
    if os.path.islink(path):
        return None
    try:
        with open(path) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def read_json_in(directory: str, follow_links: bool = False):
    """read(rel) -> the JSON of a file of the model (ValueError for a path through a link, unless follow_links)."""

    def read(rel):
        if not follow_links and linked_part(directory, rel):
            raise ValueError(f"{rel} goes through a symbolic link")
        with open(os.path.join(directory, rel)) as f:
            return json.load(f)

    return read


def read_config(directory: str, files: list[dict]) -> dict:
    """The model's config.json ({} when it is not listed or not readable)."""
    if "config.json" not in {f["path"] for f in files}:
        return {}
    try:
        config = read_json_in(directory)("config.json")
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def free_bytes(path: str) -> int:
    """Free bytes for an unprivileged writer on the filesystem that holds (or will hold) path."""
    while not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def owner_ids(owner: str, group: str) -> tuple[int, int]:
    """(uid, gid) of the names (or numbers) given for the staged files."""
    try:
        uid = int(owner) if str(owner).isdigit() else pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise StageError(
            f"owner {owner!r} of the staged files is not a user on this host (model_weights_owner)"
        ) from None
    try:
        gid = int(group) if str(group).isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise StageError(
            f"group {group!r} of the staged files is not a group on this host (model_weights_group)"
        ) from None
    return uid, gid


def set_ids_and_mode(path: str, ids: tuple[int, int], mode: int) -> None:
    """Owner, group and mode of one file or folder; a symbolic link is left alone (never followed)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return
    if (st.st_uid, st.st_gid) != ids:
        os.lchown(path, *ids)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def ensure_parents(path: str, ids: tuple[int, int], dir_mode: int) -> None:
    """Create <root>/<hub>/<org>/<name> with the folder mode and owner (never the model's final folder)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        os.mkdir(d)
        set_ids_and_mode(d, ids, dir_mode)


def drop_links(directory: str) -> list[str]:
    """Remove every symbolic link inside directory (the links, never their targets); their relative paths.

    Model files are plain files: a link left by a client or planted in a .partial folder
    would make a later check, chmod or unlink act outside the model root.
    """
    dropped = []
    for base, dirs, names in os.walk(directory):
        for name in dirs + names:
            full = os.path.join(base, name)
            if os.path.islink(full):
                os.unlink(full)
                dropped.append(os.path.relpath(full, directory))
    return sorted(dropped)


def remove_file(directory: str, rel: str) -> None:
    """Delete a listed file that failed its check; a link on its way is removed instead of followed."""
    link = linked_part(directory, rel)
    path = os.path.join(directory, link or rel)
    if link or os.path.isfile(path):
        os.unlink(path)


def tidy(directory: str, files: list[dict]) -> list[str]:
    """Remove what is not part of the model (a client's .cache/, temp files, links); what was removed."""
    keep = {f["path"] for f in files} | {MARKER}
    removed = []
    for base, dirs, names in os.walk(directory, topdown=False):
        for name in names:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, directory)
            if rel not in keep or os.path.islink(full):
                os.unlink(full)
                removed.append(rel)
        for name in dirs:
            full = os.path.join(base, name)
            if os.path.islink(full):
                os.unlink(full)
                removed.append(os.path.relpath(full, directory))
            elif not os.listdir(full):
                os.rmdir(full)
    return sorted(removed)


def apply_modes(directory: str, ids: tuple[int, int], dir_mode: int, file_mode: int) -> None:
    for base, _dirs, names in os.walk(directory):
        set_ids_and_mode(base, ids, dir_mode)
        for name in names:
            set_ids_and_mode(os.path.join(base, name), ids, file_mode)


def write_marker(directory: str, marker: dict, ids: tuple[int, int], file_mode: int) -> None:
    path = os.path.join(directory, MARKER)
    if os.path.islink(path):
        os.unlink(path)
    with open(path, "w") as f:
        json.dump(marker, f, indent=1, sort_keys=True)
    set_ids_and_mode(path, ids, file_mode)


# ---------------------------------------------------------------------------------------
# One model: check, stage into .partial, prove, marker, rename.


def check_local_model(path: str) -> dict:
    """A model folder already on the host (source local): config.json and every shard of the index whole."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise StageError(f"local model {path}: no config.json there; set model.path to a model folder")
    files = []
    for base, _dirs, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), path)
            if not rel.startswith("."):
                files.append({"path": rel, "size": os.path.getsize(os.path.join(base, name))})
    # a local folder is the operator's: links are followed there (a Hugging Face cache snapshot is made of them)
    read = read_json_in(path, follow_links=True)
    problems = index_problems(files, read)
    for f in files:
        if f["path"].endswith(".safetensors"):
            why = safetensors_problem(os.path.join(path, f["path"]))
            if why:
                problems.append(f"{f['path']}: {why}")
    if problems:
        raise StageError(f"local model {path} is incomplete: " + "; ".join(problems))
    trust = remote_code(files, read("config.json"))
    return {
        "path": path,
        "commit": "",
        "staged": True,
        "files": sorted(files, key=lambda f: f["path"]),
        "trust_remote_code": trust["trust_remote_code"],
        "remote_code": {"python_files": trust["python_files"], "auto_map": trust["auto_map"]},
    }


def stage_from_hub(params: dict, final: str, commit: str, files: list[dict], fetch, ids, result: dict):
    """Download into <final>.partial until every file is proven: (partial, sha256 digests).

    A staged copy that failed its check is moved back to .partial (its good files stay);
    each attempt deletes what is wrong and asks the client for what is missing. A failure
    leaves the .partial folder for the next run to resume, and no marker.
    """
    partial = final + ".partial"
    dir_mode = int(params["dir_mode"], 8)
    if os.path.isdir(final) and not os.path.isdir(partial):
        os.rename(final, partial)
    elif os.path.isdir(final):
        shutil.rmtree(final)
    ensure_parents(os.path.dirname(final), ids, dir_mode)
    if not os.path.isdir(partial):
        os.mkdir(partial, 0o700)
    drop_links(partial)
    stale = os.path.join(partial, MARKER)
    if os.path.isfile(stale):  # the marker of a staged copy moved back: a .partial folder never has one
        os.unlink(stale)
    downloaded, errors = set(), []
    check = verify_files(partial, files, full=True)
    attempts = max(1, params["attempts"])
    for _attempt in range(attempts):
        for rel in check["bad"]:
            remove_file(partial, rel)
        wanted = sorted(set(check["missing"]) | set(check["bad"]))
        if not wanted:
            break
        downloaded.update(wanted)
        ok, why = fetch(partial, commit, wanted)
        if not ok:
            errors.append(why)
        drop_links(partial)
        check = verify_files(partial, files, full=True)
    result["downloaded"] = sorted(downloaded)
    if not check["ok"]:
        raise StageError(
            f"{params['hub']}: {params['id']}@{commit} is incomplete after {attempts} attempts"
            + (f" from the fleet cache {params['cache_url']}: " if params["source"] == "fleet_cache" else ": ")
            + problems_text(check)
            + (f". Last client error: {errors[-1]}" if errors else "")
            + f". The partial download stays in {partial} and a rerun resumes it; no marker was written."
        )
    return partial, check["digests"]


def finish(params: dict, partial: str, final: str, model: dict, commit: str, files, digests, ids, result) -> None:
    """Every shard of the index present, then tidy, owners and modes, the marker, and the rename into place."""
    problems = index_problems(files, read_json_in(partial))
    if problems:
        raise StageError(f"{model['id']}@{commit}: incomplete sharded model: " + "; ".join(problems))
    trust = remote_code(files, read_config(partial, files))
    marker = make_marker(model, commit, files, digests, trust)
    tidy(partial, files)
    apply_modes(partial, ids, int(params["dir_mode"], 8), int(params["file_mode"], 8))
    write_marker(partial, marker, ids, int(params["file_mode"], 8))
    os.rename(partial, final)
    result.update(changed=True, staged=True, files=marker["files"], trust_remote_code=trust["trust_remote_code"])
    result["remote_code"] = {"python_files": trust["python_files"], "auto_map": trust["auto_map"]}


def adopted_listing(params: dict) -> tuple[str, list[dict]]:
    """(commit, files) another host verified (source adopt), checked like a hub's answer."""
    expected = params["expected"] or {}
    where = f"{params['hub']} (the cache host's verified list)"
    if not expected.get("commit"):
        raise StageError(f"{params['id']}: source adopt needs expected (the cache host's result with commit/files)")
    why = commit_problem(expected["commit"])
    if why:
        raise StageError(refusal(where, params["id"], [f"commit id {expected['commit']!r} {why}"]))
    try:
        files = marker_files(expected)
    except (AttributeError, KeyError, TypeError) as exc:
        raise StageError(
            f"{params['id']}: expected.files is not a list of files with path and size ({exc!r})"
        ) from None
    problems = listing_problems(files)
    if problems:
        raise StageError(refusal(where, params["id"], problems))
    return expected["commit"], files


def stage_model(params: dict, check_mode: bool = False, fetch=None, opener=None) -> dict:
    """The model_weights module's run for one model; its result, or StageError.

    params: the module's options (plain data). fetch(partial, commit, wanted) -> (ok, why)
    runs the hub client once (client_fetch in the module); opener answers the hub's API
    (urls_opener when None). state=checked and check mode list and verify, write nothing.
    """
    result = {"changed": False, "staged": False, "downloaded": [], "bytes_needed": 0}
    try:
        if params["source"] == "local":
            result.update(check_local_model(params["path"]))
            return result
        return _stage_model(params, check_mode, fetch, opener, result)
    except StageError as exc:
        exc.result = dict(result, **exc.result)
        raise


def _stage_model(params, check_mode, fetch, opener, result):
    hub, model_id = params["hub"], params["id"]
    revision = params["revision"] or DEFAULT_REVISION[hub]
    if not isinstance(model_id, str) or not ID_RE.match(model_id):
        raise StageError(f"{hub}: model id {model_id!r} must be a hub repository id like Org/Name")
    if params["source"] == "adopt":
        commit, files = adopted_listing(params)
    elif params["source"] == "fleet_cache":
        try:
            commit, files = cache_listing(params)
            fetch = cache_fetch(params, files)
        except CacheUnreachable as exc:
            if not params["fallback_to_hub"]:
                raise StageError(
                    exc.msg + ". Nothing was changed; start the cache, or allow the hub "
                    "(model_weights_fleet_cache_fallback_to_hub: true)",
                    **exc.result,
                ) from None
            result["fallback"] = exc.msg
            params = dict(params, source="hub", label=params["hub"])
            return _stage_model(params, check_mode, fetch, opener, result)
    else:
        api = HubApi(
            hub,
            model_id,
            revision,
            endpoint=params["endpoint"],
            token=params["token"],
            timeout=params["timeout"],
            allow_http=params["allow_http"],
            opener=opener,
        )
        commit, files = api.listing()
    final = model_dir(params["root"], hub, model_id, commit)
    partial = final + ".partial"
    result.update(path=final, commit=commit)
    for folder in (final, partial):
        if os.path.islink(folder):
            raise StageError(f"{folder} is a symbolic link; a model folder must be a plain folder under the root")

    marker = read_marker(final)
    problem = marker_problem(marker, hub, model_id, commit, files)
    if not problem:
        check = verify_files(final, files, full=params["verify_sha256"])
        if not check["ok"]:
            problem = problems_text(check)
    where = partial if os.path.isdir(partial) else final
    result["bytes_needed"] = 0 if not problem else bytes_needed(where, files)
    result["free_bytes"] = free_bytes(params["root"])
    result["files"] = marker["files"] if marker and not problem else files
    if not problem:
        result.update(staged=True, trust_remote_code=bool(marker.get("trust_remote_code")))
        result["remote_code"] = remote_code(files, read_config(final, files))
        return result
    result["reason"] = problem
    pre = remote_code(files, None)
    result.update(trust_remote_code=pre["trust_remote_code"], remote_code=pre)
    if params["state"] == "checked" or check_mode:
        result["changed"] = params["state"] == "present"
        return result

    ids = owner_ids(params["owner"], params["group"])
    label = params["label"] or ("fleet_cache" if params["source"] == "fleet_cache" else hub)
    model = {"id": model_id, "hub": hub, "source": label, "revision": revision}
    if params["source"] == "adopt":
        model["source"] = "controller"
        model["revision"] = params["expected"].get("revision", revision)
        if not os.path.isdir(partial):
            raise StageError(f"{partial}: nothing copied from the cache host to adopt")
        drop_links(partial)
        check = verify_files(partial, files, full=True)
        if not check["ok"]:
            raise StageError(
                f"{model_id}@{commit}: files copied from the cache host do not match its verified list: "
                + problems_text(check)
            )
        if os.path.isdir(final):
            shutil.rmtree(final)
        finish(params, partial, final, model, commit, files, check["digests"], ids, result)
        return result

    why = disk_problem(
        result["bytes_needed"],
        result["free_bytes"],
        params["disk_margin_ratio"],
        params["disk_margin_bytes"],
        params["root"],
    )
    if why:
        raise StageError(why)
    if fetch is None:
        raise StageError(f"{hub}: {model_id}@{commit} needs a download and no hub client was given")
    partial, digests = stage_from_hub(params, final, commit, files, fetch, ids, result)
    if getattr(fetch, "report", {}).get("peers"):
        result["peers"] = fetch.report
    finish(params, partial, final, model, commit, files, digests, ids, result)
    return result
