# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A host's model peer: the files of its staged fleet_cache models, read-only, to the hosts of later batches.

The peer serves the fleet cache's URL layout (``/models/<hub>/<org>/<name>/<commit>/<path>``, HTTP ranges
for resumes) and only the files its config lists, each with the sha256 of the cache's listing. A file is
hashed before it is first served, from the open file it is then served from; the proof is kept per file
by (device, inode, size, mtime, ctime), so any write to the file (which moves its ctime) makes it prove
itself again, and a file whose hash differs is refused (409), never served. The cache's access rules
hold: its bearer token when it has one, TLS when it speaks TLS. The server runs as a service of the
model_weights role for the length of a rollout (roles/model_weights/files/rigops-model-peer).

The pulling side is model_weights.peer_fetch: it checks every file it got from a peer against the cache's
listing before using it, and takes a refused or wrong file from the cache.

Hand-written on the standard library (http.server, ssl): a host runs it with its system Python 3.8+, which
has no other HTTP server, and the peer's rules (listed files only, hash before serving) are the point of it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import ssl
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from ansible_collections.rigops.fleet.plugins.module_utils.model_weights_plan import (
    CHUNK,
    COMMIT_RE,
    cache_model_url,
    path_problem,
)

RANGE_RE = re.compile(r"\Abytes=(\d+)-(\d*)\Z")


def check_config(config) -> list[str]:
    """What is wrong with a peer's config, field by field ([] when it can serve)."""
    if not isinstance(config, dict):
        return [f"the config must be a mapping, got {type(config).__name__}"]
    problems = []
    port = config.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        problems.append(f"port must be a number 1-65535, got {port!r}")
    if not isinstance(config.get("listen", ""), str):
        problems.append(f"listen must be an address, got {config.get('listen')!r}")
    tls = [config.get("tls_certificate"), config.get("tls_key")]
    if any(tls) and not all(isinstance(p, str) and p.startswith("/") for p in tls):
        problems.append("tls_certificate and tls_key must both be absolute paths, or neither set")
    for key in ("user", "group"):
        if not isinstance(config.get(key, ""), str):
            problems.append(f"{key} must be a name, got {config.get(key)!r}")
    token_file = config.get("token_file")
    if token_file and not (isinstance(token_file, str) and token_file.startswith("/")):
        problems.append(f"token_file must be an absolute path, got {token_file!r}")
    models = config.get("models")
    if not isinstance(models, list):
        return problems + [f"models must be a list, got {type(models).__name__}"]
    for n, m in enumerate(models):
        where = f"models[{n}]"
        if not isinstance(m, dict):
            problems.append(f"{where} must be a mapping")
            continue
        if not (isinstance(m.get("path"), str) and m["path"].startswith("/")):
            problems.append(f"{where}.path must be the staged model's absolute folder, got {m.get('path')!r}")
        if not isinstance(m.get("commit"), str) or not COMMIT_RE.match(m["commit"]):
            problems.append(f"{where}.commit must be 40 lowercase hex digits, got {m.get('commit')!r}")
        for key in ("hub", "id"):
            if not isinstance(m.get(key), str) or not m[key]:
                problems.append(f"{where}.{key} must be a non-empty string")
        files = m.get("files")
        if not isinstance(files, list) or not files:
            problems.append(f"{where}.files must be the model's files with path, size and sha256")
            continue
        for f in files:
            ok = isinstance(f, dict) and not path_problem(f.get("path"))
            ok = ok and isinstance(f.get("size"), int) and re.match(r"\A[0-9a-f]{64}\Z", str(f.get("sha256")))
            if not ok:
                problems.append(f"{where}.files: {f!r} needs a relative path, a size and a sha256")
                break
    return problems


def routes(config: dict) -> dict:
    """URL path -> (the file on disk, its entry of the listing), for every file the config lists."""
    table = {}
    for m in config["models"]:
        base = cache_model_url("", m["hub"], m["id"], m["commit"])  # the URL's path: no base
        for f in m["files"]:
            table[base + f["path"]] = (os.path.join(m["path"], f["path"]), f)
    return table


def stat_key(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def open_listed(path: str):
    """The file opened for reading, never through a symbolic link at its last component (OSError otherwise)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise OSError(f"{path} is not a plain file")
    return handle


def parse_range(header: str, size: int):
    """(start, end inclusive) of a one-range `Range` header, None for no header, ValueError when unsatisfiable."""
    if not header:
        return None
    match = RANGE_RE.match(header.strip())
    if not match:
        raise ValueError(header)
    start = int(match.group(1))
    end = int(match.group(2)) if match.group(2) else size - 1
    if start >= size or end < start:
        raise ValueError(header)
    return start, min(end, size - 1)


class Peer:
    """What the server knows: the routes, the token, and which files it has proven (by stat key)."""

    def __init__(self, config: dict, token: str = ""):
        self.routes = routes(config)
        self.token = token
        self.proven = {}
        self.lock = threading.Lock()
        self.log = sys.stderr

    def authorized(self, header: str) -> bool:
        if not self.token:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    def prove(self, url_path: str, handle) -> str:
        """'' when the open file matches its listed sha256 (hashed once per stat key), else why not."""
        disk, entry = self.routes[url_path]
        key = stat_key(os.fstat(handle.fileno()))
        if key[2] != entry["size"]:
            return f"size {key[2]}, the listing's {entry['size']}"
        with self.lock:
            if self.proven.get(disk) == key:
                return ""
        digest = hashlib.sha256()
        handle.seek(0)
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
        got = digest.hexdigest()
        if got != entry["sha256"]:
            with self.lock:
                self.proven.pop(disk, None)
            return f"sha256 {got}, the listing's {entry['sha256']}"
        with self.lock:
            self.proven[disk] = key
        return ""


class Handler(BaseHTTPRequestHandler):
    server_version = "rigops-model-peer"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 60

    def do_HEAD(self):  # noqa: N802 (http.server's naming)
        self.answer(send_body=False)

    def do_GET(self):  # noqa: N802
        self.answer(send_body=True)

    def refuse(self, status: int, why: str):
        body = (why + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.note(status, why)

    def note(self, status: int, what: str):
        self.peer.log.write(f"{self.client_address[0]} {self.command} {self.url_path} {status} {what}\n")
        self.peer.log.flush()

    def answer(self, send_body: bool):
        peer = self.server.peer
        self.peer = peer
        self.url_path = unquote(urlsplit(self.path).path)
        if not peer.authorized(self.headers.get("Authorization")):
            return self.refuse(401, "the fleet cache's token is required")
        if self.url_path not in peer.routes:
            return self.refuse(404, "not a file this peer serves")
        disk, entry = peer.routes[self.url_path]
        try:
            handle = open_listed(disk)
        except OSError as exc:
            return self.refuse(404, f"cannot open the staged file ({exc.strerror or exc})")
        with handle:
            why = peer.prove(self.url_path, handle)
            if why:
                return self.refuse(409, f"not verified, refused: {why}")
            size = entry["size"]
            try:
                span = parse_range(self.headers.get("Range", ""), size)
            except ValueError:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return self.note(416, self.headers.get("Range", ""))
            start, end = span or (0, size - 1)
            self.send_response(206 if span else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            if span:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            sent = 0
            if send_body:
                handle.seek(start)
                left = end - start + 1
                while left:
                    block = handle.read(min(CHUNK, left))
                    if not block:
                        break
                    self.wfile.write(block)
                    left -= len(block)
                    sent += len(block)
            self.note(206 if span else 200, f"{sent} bytes")

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        return  # one line per request is written by note(), never the headers


def read_token(path: str) -> str:
    if not path:
        return ""
    with open(path) as f:
        return f.read().strip()


def make_server(config: dict, token: str = "") -> ThreadingHTTPServer:
    """The server, bound and (with a certificate) speaking TLS; serve_forever() serves it."""
    family_host = config.get("listen") or "0.0.0.0"  # noqa: S104 (the site's hosts pull from it)
    server_class = type("PeerServer", (ThreadingHTTPServer,), {"daemon_threads": True})
    if ":" in family_host:
        server_class.address_family = socket.AF_INET6
    server = server_class((family_host, config["port"]), Handler)
    server.peer = Peer(config, token)
    if config.get("tls_certificate"):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(config["tls_certificate"], config["tls_key"])
        # the handshake in the request's thread (its first read), not in the accepting loop
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    return server


def drop_privileges(user: str, group: str) -> None:
    """From root (that read the token and the key) to user:group (that reads the staged files), for good."""
    import grp
    import pwd

    if os.getuid() != 0 or not user:
        return
    uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def load_config(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
