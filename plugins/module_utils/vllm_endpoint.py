# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health gate of one vLLM OpenAI-compatible endpoint, and the meaning of its failures.

`gate()` runs the checks through a transport (a callable), so that the unit tests replay
responses captured from a real vLLM and the module uses `UrllibTransport` (stdlib urllib,
explicitly without proxies: the endpoint is on loopback). Each failure carries a `kind`
and a message that says what to do:

- not_listening: connection refused until the deadline (wrong port, service not running)
- engine_dead: /health 503 (the engine process died; the API server is up)
- key_mismatch: 401 with the key (the key the client sends differs from the service's)
- key_not_required: /v1/models answers 200 without a key while one is required
- served_name_mismatch: the expected name is not served (404, or missing from /v1/models)
- proxy: an answer that came from a proxy (407, Via/Proxy headers, or a proxy error body)
- error_body: an error object instead of `choices`
- key_invalid: the key holds what an HTTP header cannot carry (non-ASCII, whitespace, control
  characters); judged before any request, never quoting the key
- timeout, http_error: anything else, with the status and body
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request


class Response:
    def __init__(self, status, headers=None, body=b"", lines=None):
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.body = body
        self.lines = lines  # streamed body: an iterator of bytes lines, or None


class TransportError(Exception):
    """No HTTP answer: kind is refused, timeout, reset, dns or other."""

    def __init__(self, kind, detail):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class GateFailure(Exception):
    def __init__(self, kind, msg, step, status=None, body=None, served=None):
        super().__init__(msg)
        self.kind = kind
        self.msg = msg
        self.step = step
        self.status = status
        self.body = body
        self.served = served


class UrllibTransport:
    """HTTP through urllib without any proxy (unless use_proxy_env), as (method, url, headers, data, timeout)."""

    def __init__(self, use_proxy_env=False):
        handlers = [] if use_proxy_env else [urllib.request.ProxyHandler({})]
        self.opener = urllib.request.build_opener(*handlers)

    def __call__(self, method, url, headers=None, data=None, timeout=30, stream=False):
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            resp = self.opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            return Response(exc.code, dict(exc.headers or {}), exc.read() or b"")
        except urllib.error.URLError as exc:
            raise _transport_error(exc.reason) from exc
        except (TimeoutError, OSError) as exc:
            raise _transport_error(exc) from exc
        if stream:
            return Response(resp.status, dict(resp.headers), b"", lines=iter(resp.readline, b""))
        with resp:
            return Response(resp.status, dict(resp.headers), resp.read())


def _transport_error(reason):
    if isinstance(reason, ConnectionRefusedError):
        return TransportError("refused", str(reason))
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return TransportError("timeout", str(reason))
    if isinstance(reason, ConnectionResetError):
        return TransportError("reset", str(reason))
    if isinstance(reason, socket.gaierror):
        return TransportError("dns", str(reason))
    return TransportError("other", str(reason))


def _json(body):
    try:
        return json.loads(body.decode("utf-8") if isinstance(body, bytes) else body)
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None


def error_text(body):
    """The message of an OpenAI-style error body ({"error": {"message": ...}} or {"message": ...})."""
    data = _json(body)
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or json.dumps(err))[:500]
        return str(err)[:500]
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    return text.strip()[:500]


def served_names(body):
    """Model ids listed by a /v1/models body."""
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    return [m.get("id") for m in data["data"] if isinstance(m, dict)]


def looks_like_proxy(resp):
    if resp.status == 407:
        return True
    if any(h in resp.headers for h in ("via", "proxy-agent", "x-squid-error")):
        return True
    return resp.status in (502, 504) and b"proxy" in (resp.body or b"").lower()


def classify(step, resp, url, served_name=None, served=None):
    """A GateFailure for an unexpected HTTP answer at `step` (health, models, models_nokey, chat, stream)."""
    body = resp.body.decode("utf-8", "replace")[:1000] if isinstance(resp.body, bytes) else str(resp.body)
    detail = error_text(resp.body)
    if looks_like_proxy(resp):
        return GateFailure(
            "proxy",
            f"{url}: answered by a proxy (HTTP {resp.status}, headers {sorted(resp.headers)}), not by vLLM; "
            "add 127.0.0.1,localhost to NO_PROXY (the service and clients on the host) or unset HTTP(S)_PROXY",
            step,
            resp.status,
            body,
        )
    if step == "health" and resp.status == 503:
        return GateFailure(
            "engine_dead",
            f"{url}: /health answers 503: the API server is up but its engine died; read the service's journal "
            "(journalctl -u vllm@<instance>), fix the cause (memory, model files, flags) and restart it",
            step,
            503,
            body,
        )
    if resp.status == 401:
        return GateFailure(
            "key_mismatch",
            f"{url}: 401 Unauthorized with the key: the key sent differs from the service's; use the key in "
            "/etc/vllm/<instance>/api_key (vllm_service_keys on the controller), sent as 'Authorization: Bearer "
            f"<key>' ({detail})",
            step,
            401,
            body,
        )
    if resp.status == 404 and step in ("chat", "stream"):
        names = served if served is not None else []
        return GateFailure(
            "served_name_mismatch",
            f"{url}: 404 for model {served_name!r}: this instance serves {names}; ask for one of those names or "
            f"set model.served_name ({detail})",
            step,
            404,
            body,
            names,
        )
    if resp.status == 503:
        return GateFailure(
            "engine_dead",
            f"{url}: 503 Service Unavailable: the engine is not serving; read the service's journal ({detail})",
            step,
            503,
            body,
        )
    return GateFailure(
        "http_error",
        f"{url}: HTTP {resp.status} at {step}: {detail or '(empty body)'}",
        step,
        resp.status,
        body,
    )


def proxy_warning(env, host):
    """A warning when a proxy in `env` would catch requests to `host` (clients that honour the env)."""
    proxy = next((env[k] for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY") if env.get(k)), "")
    if not proxy:
        return None
    no_proxy = ",".join(env.get(k, "") for k in ("no_proxy", "NO_PROXY"))
    entries = {x.strip() for x in no_proxy.split(",") if x.strip()}
    if "*" in entries or host in entries or (host in ("127.0.0.1", "localhost", "::1") and entries & {"localhost"}):
        return None
    return (
        f"HTTP_PROXY ({proxy}) is set and NO_PROXY does not list {host}: clients on this host that honour the "
        f"environment send their requests to the proxy; add {host},localhost to NO_PROXY"
    )


def key_problem(key):
    """Why a key cannot travel in an Authorization header (never quoting it), or None.

    http.client encodes header values as Latin-1 and refuses line breaks: a key with anything but
    printable ASCII would end the gate in a traceback, and no client could send it either.
    """
    if not isinstance(key, str):
        return "is not text"
    if any(ord(c) > 126 for c in key):
        return "holds non-ASCII characters"
    if any(ord(c) < 33 or ord(c) == 127 for c in key):
        return "holds whitespace or control characters"
    return None


def _auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_ready(transport, base, deadline, interval, clock, sleep, unit_state=None, max_restarts=0):
    """Poll /health until 200. Connection refused is the normal 'loading' state. Returns attempts.

    unit_state: a callable returning (ActiveState, NRestarts) of the service, or None; waiting stops
    when the service is failed/inactive or restarted more than max_restarts times meanwhile.
    """
    url = f"{base}/health"
    first_restarts = None
    attempts = 0
    last = "no attempt"
    while True:
        attempts += 1
        try:
            resp = transport("GET", url, timeout=10)
        except TransportError as exc:
            last = exc.kind
            resp = None
        if resp is not None:
            if resp.status == 200:
                return attempts
            if resp.status == 503 or looks_like_proxy(resp):
                raise classify("health", resp, url)
            last = f"HTTP {resp.status}"
        if unit_state is not None:
            state, restarts = unit_state()
            if state in ("failed", "inactive"):
                raise GateFailure(
                    "not_running",
                    f"{url}: the service is {state} (not running, not restarting); read its journal for the cause",
                    "health",
                )
            if first_restarts is None:
                first_restarts = restarts
            elif restarts - first_restarts > max_restarts:
                raise GateFailure(
                    "not_running",
                    f"{url}: the service crashed and was restarted {restarts - first_restarts} time(s) while "
                    "loading; read its journal for the cause",
                    "health",
                )
        if clock() >= deadline:
            if last == "refused":
                raise GateFailure(
                    "not_listening",
                    f"{url}: connection refused until the timeout: nothing listens on this port; check the "
                    "instance's port and host in vllm_instances, that the service runs, and its journal (a "
                    "model that loads longer than the timeout: raise vllm_service_ready_timeout)",
                    "health",
                )
            raise GateFailure(
                "timeout",
                f"{url}: not ready before the timeout (last: {last}); read the service's journal",
                "health",
            )
        sleep(interval)


def gate(
    transport,
    base,
    served_name,
    key=None,
    require_key=True,
    chat=True,
    stream=True,
    max_tokens=8,
    prompt="Say hello.",
    timeout=900,
    interval=2.0,
    request_timeout=60,
    clock=time.monotonic,
    sleep=time.sleep,
    unit_state=None,
    max_restarts=0,
):
    """Run the gate; returns the figures, raises GateFailure with the first problem."""
    if key:
        problem = key_problem(key)
        if problem:
            raise GateFailure(
                "key_invalid",
                f"{base}: the instance's key {problem}: no HTTP client can send it (an Authorization header carries "
                "printable ASCII only); rotate it (vllm_service_rotate_keys) or fix security.api_key",
                "key",
            )
    result = {"url": base}
    start = clock()
    result["attempts"] = wait_ready(transport, base, start + timeout, interval, clock, sleep, unit_state, max_restarts)
    result["ready_s"] = round(clock() - start, 3)
    result["health"] = 200

    url = f"{base}/v1/models"
    try:
        resp = transport("GET", url, headers=_auth(key), timeout=request_timeout)
    except TransportError as exc:
        raise GateFailure("not_listening", f"{url}: {exc.detail} right after /health answered", "models") from exc
    if resp.status != 200:
        raise classify("models", resp, url)
    names = served_names(resp.body)
    if names is None:
        raise GateFailure("error_body", f"{url}: 200 without a model list: {error_text(resp.body)}", "models")
    result["served"] = names
    if served_name not in names:
        raise GateFailure(
            "served_name_mismatch",
            f"{url}: {served_name!r} is not served; this instance serves {names}; fix model.served_name or the "
            "name clients ask for",
            "models",
            200,
            served=names,
        )
    resp = transport("GET", url, timeout=request_timeout)
    result["models_without_key"] = resp.status
    if require_key and resp.status != 401:
        raise GateFailure(
            "key_not_required",
            f"{url}: HTTP {resp.status} without a key, but a key is required: the service runs without "
            "VLLM_API_KEY; check the key file and the launcher's journal, then restart it",
            "models_nokey",
            resp.status,
        )

    if chat:
        url = f"{base}/v1/chat/completions"
        payload = {"model": served_name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        headers = {"Content-Type": "application/json", **_auth(key)}
        t0 = clock()
        resp = transport("POST", url, headers=headers, data=json.dumps(payload).encode(), timeout=request_timeout)
        if resp.status != 200:
            raise classify("chat", resp, url, served_name, names)
        data = _json(resp.body)
        if not isinstance(data, dict) or not data.get("choices"):
            raise GateFailure(
                "error_body",
                f"{url}: an answer without 'choices' (an error body): {error_text(resp.body)}",
                "chat",
                200,
                resp.body.decode("utf-8", "replace")[:1000],
            )
        result["chat_s"] = round(clock() - t0, 3)
        result["chat_usage"] = data.get("usage", {})

    if stream:
        url = f"{base}/v1/chat/completions"
        payload = {
            "model": served_name,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **_auth(key)}
        t0 = clock()
        resp = transport(
            "POST", url, headers=headers, data=json.dumps(payload).encode(), timeout=request_timeout, stream=True
        )
        if resp.status != 200:
            raise classify("stream", resp, url, served_name, names)
        ttft, chunks, done = None, 0, False
        for raw in resp.lines or []:
            line = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else raw.strip()
            if not line.startswith("data:"):
                continue
            item = line[5:].strip()
            if item == "[DONE]":
                done = True
                break
            data = _json(item)
            if isinstance(data, dict) and "error" in data:
                raise GateFailure(
                    "error_body", f"{url}: the stream sent an error: {error_text(item)}", "stream", 200, item
                )
            choices = data.get("choices") if isinstance(data, dict) else None
            if choices:
                chunks += 1
                delta = choices[0].get("delta", {}) or {}
                if ttft is None and (delta.get("content") or delta.get("reasoning_content")):
                    ttft = clock() - t0
        if not done or chunks == 0:
            raise GateFailure(
                "error_body", f"{url}: the stream ended without chunks or [DONE] ({chunks} chunks)", "stream", 200
            )
        result["stream_chunks"] = chunks
        result["ttft_s"] = round(ttft, 3) if ttft is not None else None
        result["stream_s"] = round(clock() - t0, 3)
    return result
