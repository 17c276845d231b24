# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the llm_gateway role checks over the network, as plain functions (unit-tested without a host).

- ``probe(targets, timeout)``: which upstreams the gateway host reaches (a TCP connect each);
- ``gate(client, ...)``: the gateway answers as it must after a change: the config just written
  is the one in service (``/healthz`` names its id), keys are required (401 without or with a wrong
  one), vLLM's unguarded paths are not exposed (404), ``/v1/models`` lists every name, and every
  name answers a real chat completion (one also streamed, its first token timed).

Used by the role's modules llm_gateway_probe and llm_gateway_gate (roles/llm_gateway/library).
Standard library only, Python 3.8+ (it runs on the gateway host).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time

# vLLM answers these without its key (or they are admin paths): the gateway must never pass them on.
UNEXPOSED = (
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/version",
    "/health",
    "/ping",
    "/load",
    "/pause",
    "/resume",
    "/docs",
    "/openapi.json",
    "/v1/load_lora_adapter",
    "/server_info",
)


class Failure(Exception):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind = kind
        self.msg = msg


def probe(targets, timeout=3.0, connect=socket.create_connection):
    """[{ref, server, ok, error}] for each {ref, server: 'host:port' or '[v6]:port'}."""
    out = []
    for target in targets:
        host, port = split_hostport(target["server"])
        try:
            sock = connect((host, port), timeout)
            sock.close()
            out.append({"ref": target["ref"], "server": target["server"], "ok": True, "error": ""})
        except OSError as exc:
            out.append({"ref": target["ref"], "server": target["server"], "ok": False, "error": str(exc) or repr(exc)})
    return out


def split_hostport(server):
    if server.startswith("["):
        host, _sep, port = server[1:].partition("]:")
        return host, int(port)
    host, _sep, port = server.rpartition(":")
    return host, int(port)


class _Connection(http.client.HTTPSConnection):
    """HTTPS to an address (127.0.0.1) with the certificate checked against another name (SNI too)."""

    def __init__(self, host, port, server_name, context, timeout):
        super().__init__(host, port, timeout=timeout, context=context)
        self._rigops_server_name = server_name
        self._rigops_context = context

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._rigops_context.wrap_socket(sock, server_hostname=self._rigops_server_name)


class Client:
    """Requests to the gateway: (method, path, headers, body, stream) -> (status, headers, body or lines)."""

    def __init__(self, host, port, server_name=None, ca_file=None, verify=True, timeout=120.0):
        self.host, self.port, self.timeout = host, int(port), timeout
        context = ssl.create_default_context(cafile=ca_file or None)
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self.context = context
        self.server_name = server_name or host

    def __call__(self, method, path, headers=None, body=None, stream=False, timeout=None):
        conn = _Connection(self.host, self.port, self.server_name, self.context, timeout or self.timeout)
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        hdrs = dict(headers or {})
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Failure("not_listening", f"{method} {path}: no answer from the gateway: {exc}") from exc
        if stream and resp.status == 200:
            return resp.status, dict(resp.getheaders()), _lines(resp, conn)
        try:
            payload = resp.read()
        finally:
            conn.close()
        return resp.status, dict(resp.getheaders()), payload


def _lines(resp, conn):
    try:
        while True:
            line = resp.readline()
            if not line:
                return
            yield line
    finally:
        conn.close()


def _json(body):
    try:
        return json.loads(body.decode("utf-8") if isinstance(body, bytes) else body)
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None


def error_text(body):
    data = _json(body)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or json.dumps(err))[:400]
        return str(err)[:400]
    return (body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")).strip()[:400]


def wait_config(client, config_id, timeout, interval=0.5, clock=time.monotonic, sleep=time.sleep):
    """Poll /healthz until it names config_id (the reloaded config is in service); seconds waited."""
    start = clock()
    last = "no answer"
    while True:
        try:
            status, _headers, body = client("GET", "/healthz", timeout=5)
            data = _json(body)
            seen = data.get("config") if isinstance(data, dict) else None
            if status == 200 and (not config_id or seen == config_id):
                return round(clock() - start, 3)
            last = f"HTTP {status}, config {seen!r}"
        except Failure as exc:
            last = exc.msg
        if clock() - start >= timeout:
            raise Failure(
                "not_reloaded",
                f"/healthz did not name the new config {config_id} within {timeout} s ({last}): the gateway still "
                "serves another config or does not answer; see journalctl -u the gateway's unit and its error.log",
            )
        sleep(interval)


def gate(
    client,
    key,
    names,
    config_id="",
    stream_name="",
    max_tokens=1,
    prompt="Say hello.",
    timeout=60,
    clock=time.monotonic,
    sleep=time.sleep,
):
    """Every check, all of them run; returns {answered, failures, skipped, listed, reload_s}.

    names: [{name, gate, why}] (rigops.fleet.gateway_gate_plan).
    """
    auth = {"Authorization": f"Bearer {key}"}
    out = {"failures": [], "answered": {}, "skipped": {}}

    def fail(kind, msg):
        out["failures"].append({"kind": kind, "msg": msg})

    try:
        out["reload_s"] = wait_config(client, config_id, timeout, clock=clock, sleep=sleep)
    except Failure as exc:
        fail(exc.kind, exc.msg)
        return out
    try:
        for label, headers in (("without a key", {}), ("with a wrong key", {"Authorization": "Bearer not-a-key"})):
            status, _headers, body = client("GET", "/v1/models", headers=headers)
            if status != 401:
                fail("key_not_required", f"GET /v1/models {label}: HTTP {status}, expected 401")
        for path in UNEXPOSED:
            status, _headers, _body = client("GET", path, headers=auth)
            if status != 404:
                fail("exposed", f"GET {path} with a client key: HTTP {status}, expected 404 (never passed on)")
        status, _headers, body = client("GET", "/v1/models", headers=auth)
        data = _json(body)
        listed = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []
        out["listed"] = listed
        if status != 200:
            fail("models", f"GET /v1/models with the health key: HTTP {status}: {error_text(body)}")
        else:
            missing = [n["name"] for n in names if n["name"] not in listed]
            if missing:
                fail("models", f"GET /v1/models does not list {missing}")
        for entry in names:
            name = entry["name"]
            if not entry.get("gate", True):
                out["skipped"][name] = entry.get("why") or "skipped"
                continue
            payload = {"model": name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
            t0 = clock()
            status, _headers, body = client("POST", "/v1/chat/completions", headers=auth, body=payload)
            data = _json(body)
            if status != 200 or not isinstance(data, dict) or not data.get("choices"):
                fail("chat", f"{name}: chat completion: HTTP {status}: {error_text(body)}")
                continue
            out["answered"][name] = {"chat_s": round(clock() - t0, 3), "answered_by": data.get("model")}
        if stream_name and stream_name in out["answered"]:
            payload = {
                "model": stream_name,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max(max_tokens, 2),
                "stream": True,
            }
            t0 = clock()
            status, _headers, lines = client("POST", "/v1/chat/completions", headers=auth, body=payload, stream=True)
            if status != 200:
                fail("stream", f"{stream_name}: streamed chat: HTTP {status}: {error_text(lines)}")
            else:
                first, done = None, False
                for raw in lines:
                    line = raw.decode("utf-8", "replace").strip()
                    if line.startswith("data:"):
                        if first is None:
                            first = round(clock() - t0, 3)
                        if line[5:].strip() == "[DONE]":
                            done = True
                if first is None or not done:
                    fail("stream", f"{stream_name}: the stream ended without data or without [DONE]")
                out["answered"][stream_name]["ttft_s"] = first
    except Failure as exc:
        fail(exc.kind, exc.msg)
    return out
