#!/usr/bin/env python3
"""A local stand-in for the ModelScope and Hugging Face model hubs (stdlib only).

Serves model repositories described by a JSON catalog, speaking the subset of both hubs'
HTTP APIs that the pinned ``modelscope`` (1.40.2, code in ``modelscope_hub`` 0.5.1) and
``huggingface_hub`` (2.4.0) clients call in ``snapshot_download``. See README.md for the
endpoints, the catalog format, the request log and the fault injection API.

    hub.py --root DIR [--catalog FILE] [--host 127.0.0.1] [--port 8090] [--log FILE]
           [--faults FILE]

``DIR`` holds the snapshot directories the catalog names (relative paths are taken
relative to ``DIR``); ``--catalog`` defaults to ``DIR/catalog.json`` and then to the
``catalog.json`` next to this file.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

HERE = Path(__file__).resolve().parent
CHUNK = 64 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".onnx", ".msgpack", ".h5")
MS_NOT_FOUND_CODE = 10010205001  # what ModelScope puts in "Code" for a missing model


# --------------------------------------------------------------------------- repository


@dataclass
class RepoFile:
    path: str
    abspath: Path
    size: int
    sha256: str
    git_oid: str  # sha1 of the git blob (the LFS pointer's blob for LFS files)
    lfs: bool


@dataclass
class Snapshot:
    directory: Path
    commit: str
    files: dict[str, RepoFile]
    created: float

    def dirs(self) -> set[str]:
        out: set[str] = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out


@dataclass
class Repo:
    hub: str  # "modelscope" | "huggingface"
    id: str
    default_branch: str
    branches: dict[str, Snapshot]
    tags: dict[str, Snapshot]
    extra: dict = field(default_factory=dict)

    def resolve(self, revision: str | None) -> tuple[str, Snapshot] | None:
        rev = revision or self.default_branch
        if rev in self.branches:
            return rev, self.branches[rev]
        if rev in self.tags:
            return rev, self.tags[rev]
        for snap in list(self.branches.values()) + list(self.tags.values()):
            if rev == snap.commit:
                return rev, snap
        return None


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def scan_snapshot(directory: Path) -> Snapshot:
    files: dict[str, RepoFile] = {}
    for p in sorted(directory.rglob("*")):
        if not p.is_file() or any(part.startswith(".") for part in p.relative_to(directory).parts):
            continue
        rel = p.relative_to(directory).as_posix()
        size = p.stat().st_size
        sha, blob = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
        with p.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
                blob.update(block)
        lfs = rel.endswith(LFS_SUFFIXES)
        if lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha.hexdigest()}\nsize {size}\n"
            oid = _git_blob_sha1(pointer.encode())
        else:
            oid = blob.hexdigest()
        files[rel] = RepoFile(rel, p, size, sha.hexdigest(), oid, lfs)
    listing = "".join(f"{f.path}\0{f.sha256}\n" for f in files.values())
    commit = hashlib.sha1(b"rigops-hub-snapshot\n" + listing.encode()).hexdigest()
    created = max((f.abspath.stat().st_mtime for f in files.values()), default=0.0)
    return Snapshot(directory, commit, files, created)


def load_catalog(root: Path, catalog_path: Path) -> dict[tuple[str, str], Repo]:
    catalog = json.loads(catalog_path.read_text())
    snapshots: dict[Path, Snapshot] = {}

    def snap(rel: str) -> Snapshot:
        d = Path(rel)
        d = d if d.is_absolute() else root / d
        d = d.resolve()
        if d not in snapshots:
            if not d.is_dir():
                raise SystemExit(f"catalog {catalog_path}: snapshot directory {d} missing")
            snapshots[d] = scan_snapshot(d)
        return snapshots[d]

    repos: dict[tuple[str, str], Repo] = {}
    for entry in catalog["repos"]:
        hub = entry["hub"]
        if hub not in ("modelscope", "huggingface"):
            raise SystemExit(f"catalog: unknown hub {hub!r}")
        default = entry.get("default_branch") or ("master" if hub == "modelscope" else "main")
        branches = {k: snap(v) for k, v in entry.get("branches", {}).items()}
        tags = {k: snap(v) for k, v in entry.get("tags", {}).items()}
        if default not in branches:
            raise SystemExit(f"catalog: {hub}:{entry['id']} lacks its default branch {default!r}")
        repos[(hub, entry["id"])] = Repo(hub, entry["id"], default, branches, tags, entry)
    return repos


# --------------------------------------------------------------------------- faults


class Faults:
    """Runtime-configurable faults, matched against each request in order."""

    KINDS = ("drop", "stall", "corrupt", "delay", "status")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[dict] = []
        self._next = 1

    def add(self, spec: dict) -> dict:
        if spec.get("kind") not in self.KINDS:
            raise ValueError(f"fault kind must be one of {self.KINDS}")
        f = {"times": 1, **spec, "hits": 0}
        with self._lock:
            f["id"] = self._next
            self._next += 1
            self._faults.append(f)
        return f

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def list(self) -> list[dict]:
        with self._lock:
            return [dict(f) for f in self._faults]

    def take(self, *, hub: str, repo: str | None, file: str | None, kinds, start: int = 0) -> dict | None:
        """Return (and count) the first matching fault, or None."""
        with self._lock:
            for f in self._faults:
                if f["kind"] not in kinds or f["times"] == 0:
                    continue
                if f.get("hub") and f["hub"] != hub:
                    continue
                if f.get("repo") and f["repo"] != repo:
                    continue
                if f.get("file"):
                    if file is None or not fnmatch.fnmatchcase(file, f["file"]):
                        continue
                if f["kind"] in ("drop", "stall") and start >= int(f.get("after_bytes", 0)):
                    continue  # a resumed request past the break point goes through
                f["hits"] += 1
                if f["times"] > 0:
                    f["times"] -= 1
                return dict(f)
        return None


# --------------------------------------------------------------------------- request log


class RequestLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.entries: list[dict] = []
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, entry: dict) -> None:
        line = json.dumps(entry, sort_keys=True)
        with self._lock:
            self.entries.append(entry)
            if self.path:
                with self.path.open("a") as f:
                    f.write(line + "\n")


def client_kind(user_agent: str) -> str:
    ua = user_agent.lower()
    for needle, kind in (
        ("huggingface_hub", "huggingface_hub"),
        ("hf_hub/", "huggingface_hub"),
        ("modelscope", "modelscope"),
        ("python-urllib", "urllib"),
        ("curl", "curl"),
        ("wget", "wget"),
        ("python-requests", "requests"),
        ("python-httpx", "httpx"),
    ):
        if needle in ua:
            return kind
    return "other"


# --------------------------------------------------------------------------- HTTP


class HubError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """Return (start, end inclusive), None for no/ignored Range, "unsatisfiable"."""
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None  # malformed or multi-range: serve the whole file (RFC 9110 allows it)
    if m.group(1) == "":
        n = int(m.group(2))
        if n == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return "unsatisfiable"
    return start, min(end, size - 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rigops-hub/1"
    server: HubServer

    # quiet default logging; the JSON log is the record
    def log_message(self, format: str, *args) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)

    # -- plumbing -------------------------------------------------------------------
    def _begin(self) -> None:
        self.t0 = time.monotonic()
        self.entry = {
            "ts": round(time.time(), 3),
            "method": self.command,
            "path": self.path,
            "client": client_kind(self.headers.get("User-Agent", "")),
            "ua": self.headers.get("User-Agent", ""),
            # who asked: a test counts one host's downloads while other scenarios run
            "address": self.client_address[0],
            "api": None,
            "repo": None,
            "revision": None,
            "file": None,
            "range": self.headers.get("Range"),
            "status": None,
            "bytes": 0,
            "size": None,
            "fault": None,
        }

    def _finish(self) -> None:
        if self.entry.get("ms") is not None:
            return  # already logged
        self.entry["ms"] = round((time.monotonic() - self.t0) * 1000, 1)
        self.server.log.write(self.entry)

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            self.entry["bytes"] = len(body)
        self.entry["status"] = status

    def _json(self, status: int, data, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(), "application/json", headers)

    def _ms_ok(self, data) -> None:
        self._json(200, {"Code": 200, "Success": True, "Message": "", "RequestId": uuid.uuid4().hex, "Data": data})

    def _error(self, err: HubError) -> None:
        api = self.entry.get("api")
        if api == "modelscope":
            body = {
                "Code": MS_NOT_FOUND_CODE if err.status == 404 else err.status,
                "Success": False,
                "Message": err.message,
                "RequestId": uuid.uuid4().hex,
            }
            self._json(err.status, body)
        else:
            headers = {"X-Error-Code": err.code, "X-Error-Message": err.message}
            self._json(err.status, {"error": err.message}, headers)

    def _abort(self) -> None:
        """Drop the connection without a proper end (the client sees a short body)."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- dispatch --------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    ROUTES = [
        # admin
        ("admin", re.compile(r"^/_admin/(?P<what>faults|log|health|reload)$")),
        # ModelScope (legacy /api/v1 surface)
        ("ms_accel", re.compile(r"^/api/v1/repos/internalAccelerationInfo$")),
        ("ms_revisions", re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)/revisions$")),
        ("ms_files", re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)/repo/files$")),
        ("ms_file", re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)/repo$")),
        ("ms_info", re.compile(r"^/api/v1/models/(?P<repo>[^/]+/[^/]+)$")),
        # Hugging Face
        ("hf_info", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")),
        ("hf_tree", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$")),
        ("hf_resolve", re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")),
        ("index", re.compile(r"^/$")),
    ]

    def _dispatch(self) -> None:
        self._begin()
        try:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            name, m = None, None
            for route, rx in self.ROUTES:
                m = rx.match(url.path)
                if m:
                    name = route
                    break
            if name and name.startswith("ms_"):
                self.entry["api"] = "modelscope"
            elif name and name.startswith("hf_"):
                self.entry["api"] = "huggingface"
            if name is None:
                raise HubError(404, "NotFound", f"no route for {url.path}")
            groups = {k: unquote(v) for k, v in m.groupdict().items() if v is not None}
            allowed = ("POST", "DELETE", "GET") if name == "admin" else ("GET", "HEAD")
            if self.command not in allowed:
                raise HubError(405, "MethodNotAllowed", f"{self.command} not allowed on {url.path}")
            if name != "admin":
                self._maybe_delay_or_status(groups.get("repo"), groups.get("file") or query.get("FilePath"))
                if self.entry["status"]:
                    return
            getattr(self, "_" + name)(groups, query)
        except HubError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            self.entry["status"] = self.entry["status"] or 499
        finally:
            self._finish()

    def _maybe_delay_or_status(self, repo: str | None, file: str | None) -> None:
        hub = self.entry["api"] or "any"
        f = self.server.faults.take(hub=hub, repo=repo, file=file, kinds=("delay",))
        if f:
            self.entry["fault"] = f"delay:{f['id']}"
            time.sleep(float(f.get("seconds", 1.0)))
        f = self.server.faults.take(hub=hub, repo=repo, file=file, kinds=("status",))
        if f:
            self.entry["fault"] = f"status:{f['id']}"
            status = int(f.get("status", 503))
            self._json(status, {"error": f"injected fault {f['id']}"})

    def _repo(self, hub: str, repo_id: str) -> Repo:
        self.entry["repo"] = repo_id
        repo = self.server.repos.get((hub, repo_id))
        if repo is None:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    def _snapshot(self, repo: Repo, revision: str | None) -> tuple[str, Snapshot]:
        self.entry["revision"] = revision or repo.default_branch
        hit = repo.resolve(revision)
        if hit is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return hit

    # -- admin -----------------------------------------------------------------------
    def _admin(self, groups: dict, query: dict) -> None:
        what = groups["what"]
        self.entry["api"] = "admin"
        if what == "health":
            return self._json(200, {"ok": True, "repos": len(self.server.repos)})
        if what == "log":
            return self._json(200, self.server.log.entries)
        if what == "reload" and self.command == "POST":
            self.server.reload()
            return self._json(200, {"repos": sorted(f"{h}:{i}" for h, i in self.server.repos)})
        if what == "faults":
            if self.command == "GET":
                return self._json(200, self.server.faults.list())
            if self.command == "DELETE":
                self.server.faults.clear()
                return self._json(200, [])
            length = int(self.headers.get("Content-Length") or 0)
            try:
                spec = json.loads(self.rfile.read(length) or b"null")
                specs = spec if isinstance(spec, list) else [spec]
                added = [self.server.faults.add(s) for s in specs]
            except (ValueError, TypeError, AttributeError) as exc:
                raise HubError(400, "BadRequest", str(exc)) from exc
            return self._json(200, added)
        raise HubError(405, "MethodNotAllowed", f"{self.command} /_admin/{what}")

    def _index(self, groups: dict, query: dict) -> None:
        self._json(
            200,
            [
                {"hub": r.hub, "id": r.id, "default_branch": r.default_branch,
                 "branches": {k: s.commit for k, s in r.branches.items()},
                 "tags": {k: s.commit for k, s in r.tags.items()}}
                for r in self.server.repos.values()
            ],
        )  # fmt: skip

    # -- ModelScope --------------------------------------------------------------------
    def _ms_accel(self, groups: dict, query: dict) -> None:
        # asked for by the client to detect an Alibaba Cloud region; "none" here
        self._ms_ok({})

    def _ms_info(self, groups: dict, query: dict) -> None:
        repo = self._repo("modelscope", groups["repo"])
        owner, name = repo.id.split("/", 1)
        snap = repo.branches[repo.default_branch]
        self._ms_ok(
            {
                "Id": int(hashlib.sha1(repo.id.encode()).hexdigest()[:8], 16),
                "Name": name,
                "Path": owner,
                "ChineseName": "",
                "Description": repo.extra.get("description", "rigops sandbox model"),
                "Tasks": [{"Name": "text-generation"}],
                "Visibility": 5,
                "IsPublished": 1,
                "IsAccessible": 1,
                "Downloads": 0,
                "Stars": 0,
                "CreatedTime": int(snap.created),
                "LastUpdatedTime": int(snap.created),
                "Revision": repo.default_branch,
            }
        )

    def _ms_revisions(self, groups: dict, query: dict) -> None:
        repo = self._repo("modelscope", groups["repo"])

        def item(name: str, snap: Snapshot) -> dict:
            return {"Revision": name, "CommitId": snap.commit, "CreatedAt": int(snap.created), "Description": ""}

        self._ms_ok(
            {
                "RevisionMap": {
                    "Branches": [item(k, s) for k, s in repo.branches.items()],
                    "Tags": [item(k, s) for k, s in repo.tags.items()],
                }
            }
        )

    def _ms_files(self, groups: dict, query: dict) -> None:
        repo = self._repo("modelscope", groups["repo"])
        _, snap = self._snapshot(repo, query.get("Revision"))
        recursive = query.get("Recursive", "False").lower() == "true"
        root = (query.get("Root") or "").strip("/")
        if root and root not in snap.dirs():
            raise HubError(404, "EntryNotFound", f"directory {root} not found")
        prefix = root + "/" if root else ""
        entries = []
        for d in sorted(snap.dirs()):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix) :]):
                entries.append(
                    {"Name": d.rsplit("/", 1)[-1], "Path": d, "Type": "tree", "Size": 0,
                     "Revision": snap.commit, "CommitId": snap.commit, "Mode": "040000"}
                )  # fmt: skip
        for f in snap.files.values():
            rest = f.path[len(prefix) :]
            if not f.path.startswith(prefix) or (not recursive and "/" in rest):
                continue
            entries.append(
                {
                    "Name": f.path.rsplit("/", 1)[-1],
                    "Path": f.path,
                    "Type": "blob",
                    "Size": f.size,
                    "Sha256": f.sha256,
                    "IsLFS": f.lfs,
                    "Mode": "100644",
                    "Revision": snap.commit,
                    "CommitId": snap.commit,
                    "CommitMessage": "rigops sandbox snapshot",
                    "CommitterName": "rigops",
                    "CommittedDate": int(snap.created),
                }
            )
        self._ms_ok({"Files": entries, "LatestCommitter": {"Id": snap.commit, "Message": "rigops sandbox snapshot"}})

    def _ms_file(self, groups: dict, query: dict) -> None:
        repo = self._repo("modelscope", groups["repo"])
        _, snap = self._snapshot(repo, query.get("Revision"))
        path = query.get("FilePath", "").lstrip("/")
        self._serve_file(snap, path, hub="modelscope", repo=repo)

    # -- Hugging Face ------------------------------------------------------------------
    def _hf_info(self, groups: dict, query: dict) -> None:
        repo = self._repo("huggingface", groups["repo"])
        _, snap = self._snapshot(repo, groups.get("rev"))
        blobs = query.get("blobs", "").lower() == "true"
        siblings = []
        for f in snap.files.values():
            s: dict = {"rfilename": f.path}
            if blobs:
                s.update(size=f.size, blobId=f.git_oid)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(s)
        created = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(snap.created))
        self._json(
            200,
            {
                "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24],
                "id": repo.id,
                "modelId": repo.id,
                "author": repo.id.split("/")[0],
                "sha": snap.commit,
                "lastModified": created,
                "createdAt": created,
                "private": False,
                "disabled": False,
                "gated": False,
                "downloads": 0,
                "likes": 0,
                "library_name": "transformers",
                "pipeline_tag": "text-generation",
                "tags": ["transformers", "safetensors", "llama", "text-generation"],
                "config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
                "siblings": siblings,
                "usedStorage": sum(f.size for f in snap.files.values()),
            },
        )

    def _hf_tree(self, groups: dict, query: dict) -> None:
        repo = self._repo("huggingface", groups["repo"])
        _, snap = self._snapshot(repo, groups["rev"])
        recursive = query.get("recursive", "false").lower() == "true"
        sub = groups.get("sub", "").strip("/")
        if sub and sub not in snap.dirs():
            raise HubError(404, "EntryNotFound", f"{sub} does not exist on {groups['rev']}")
        prefix = sub + "/" if sub else ""
        out = []
        for d in sorted(snap.dirs()):
            if d.startswith(prefix) and (recursive or "/" not in d[len(prefix) :]):
                oid = hashlib.sha1(f"tree {d} {snap.commit}".encode()).hexdigest()
                out.append({"type": "directory", "oid": oid, "size": 0, "path": d})
        for f in snap.files.values():
            rest = f.path[len(prefix) :]
            if not f.path.startswith(prefix) or (not recursive and "/" in rest):
                continue
            item: dict = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.path}
            if f.lfs:
                item["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(item)
        self._json(200, out)

    def _hf_resolve(self, groups: dict, query: dict) -> None:
        repo = self._repo("huggingface", groups["repo"])
        _, snap = self._snapshot(repo, groups["rev"])
        self._serve_file(snap, groups["file"], hub="huggingface", repo=repo)

    # -- file bodies -------------------------------------------------------------------
    def _serve_file(self, snap: Snapshot, path: str, *, hub: str, repo: Repo) -> None:
        self.entry["file"] = path
        f = snap.files.get(path)
        if f is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {self.entry['revision']}")
        self.entry["size"] = f.size
        etag = f'"{f.sha256}"' if f.lfs else f'"{f.git_oid}"'
        headers = {
            "Accept-Ranges": "bytes",
            "ETag": etag,
            "X-Repo-Commit": snap.commit,
            "Content-Disposition": f'inline; filename="{path.rsplit("/", 1)[-1]}"',
        }
        if f.lfs or hub == "modelscope":
            # huggingface_hub prefers it to ETag; modelscope checks the body against it
            headers["X-Linked-Etag"] = f'"{f.sha256}"'
            headers["X-Linked-Size"] = str(f.size)
        rng = parse_range(self.headers.get("Range"), f.size)
        if rng == "unsatisfiable":
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{f.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            self.entry["status"] = 416
            return
        start, end = rng if rng else (0, f.size - 1)
        length = max(0, end - start + 1)
        status = 206 if rng else 200
        fault = None
        if self.command == "GET":
            fault = self.server.faults.take(
                hub=hub, repo=repo.id, file=path, kinds=("drop", "stall", "corrupt"), start=start
            )
        if fault:
            self.entry["fault"] = f"{fault['kind']}:{fault['id']}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.entry["status"] = status
        if self.command == "HEAD":
            return
        stop_at = end + 1
        if fault and fault["kind"] in ("drop", "stall"):
            stop_at = min(stop_at, int(fault.get("after_bytes", 0)))
        corrupt_at = f.size // 2 if fault and fault["kind"] == "corrupt" else -1
        sent = 0
        with f.abspath.open("rb") as fh:
            fh.seek(start)
            pos = start
            while pos < stop_at:
                chunk = fh.read(min(CHUNK, stop_at - pos))
                if not chunk:
                    break
                if pos <= corrupt_at < pos + len(chunk):
                    b = bytearray(chunk)
                    b[corrupt_at - pos] ^= 0xFF
                    chunk = bytes(b)
                self.wfile.write(chunk)
                pos += len(chunk)
                sent += len(chunk)
                self.entry["bytes"] = sent
        if fault and fault["kind"] in ("drop", "stall") and pos <= end:
            self.wfile.flush()
            self._finish()  # log before the client can see the connection end
            if fault["kind"] == "stall":
                self.server.stop_event.wait(float(fault.get("seconds", 3600)))
            self._abort()


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, addr, root: Path, catalog: Path, log: RequestLog, verbose: bool = False) -> None:
        self.root, self.catalog, self.log, self.verbose = root, catalog, log, verbose
        self.faults = Faults()
        self.stop_event = threading.Event()
        self.repos = load_catalog(root, catalog)
        super().__init__(addr, Handler)

    def reload(self) -> None:
        self.repos = load_catalog(self.root, self.catalog)

    def server_close(self) -> None:
        self.stop_event.set()
        super().server_close()


def find_catalog(root: Path, catalog: Path | None) -> Path:
    for candidate in (catalog, root / "catalog.json", HERE / "catalog.json"):
        if candidate and candidate.is_file():
            return candidate
    raise SystemExit("no catalog: pass --catalog or put catalog.json in --root")


def make_server(
    root: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8090,
    catalog: Path | None = None,
    log: Path | None = None,
    faults: Path | None = None,
    verbose: bool = False,
) -> HubServer:
    root = root.resolve()
    server = HubServer((host, port), root, find_catalog(root, catalog), RequestLog(log), verbose)
    if faults:
        data = json.loads(faults.read_text())
        for spec in data if isinstance(data, list) else [data]:
            server.faults.add(spec)
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, required=True, help="directory holding the snapshots")
    ap.add_argument("--catalog", type=Path, help="catalog JSON (default: ROOT/catalog.json, then ./catalog.json)")
    ap.add_argument("--host", default=os.environ.get("RIGOPS_HUB_HOST", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("RIGOPS_HUB_PORT", "8090")))
    ap.add_argument("--log", type=Path, help="JSON-lines request log")
    ap.add_argument("--faults", type=Path, help="JSON file with faults to start with")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    server = make_server(
        args.root, host=args.host, port=args.port, catalog=args.catalog, log=args.log,
        faults=args.faults, verbose=args.verbose,
    )  # fmt: skip
    host, port = server.server_address[:2]
    print(f"rigops hub on http://{host}:{port} serving {len(server.repos)} repos", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
