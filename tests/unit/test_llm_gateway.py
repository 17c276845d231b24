"""The LLM gateway: roles/llm_gateway and plugins/filter/llm_gateway.py.

- The routing table and the preflight's refusals, from plain data.
- With a real nginx + njs on 127.0.0.1 (skipped when nginx or its njs module is not installed:
  apt-get install nginx libnginx-mod-http-js): the role's preflight and configure parts, run by
  ansible-playbook on this machine (connection local), render a config set for stand-in upstreams
  (three "rig" instances over HTTP, one of them read from its key file on the "rig", and a hosted
  provider over HTTPS, each of which checks its own key and records what it receives); `nginx -t`
  accepts the set, and nginx serves it: routing by `model`, aliases with fallback and benching,
  401/403/404, rate limits, streaming, the key swap, the paths never exposed, the JSON access log,
  the gate module, and the config sets' tool putting the last good set back after a failed gate.
- The whole role on a systemd host (install, the unit, run, gate, rerun, check mode, a change that
  fails its gate rolled back) is Molecule's: molecule/vllm_service/tests/test_llm_gateway.py.
"""

from __future__ import annotations

import copy
import http.client as http_client
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.filter import llm_gateway as gw
from ansible_collections.rigops.fleet.plugins.module_utils import llm_gateway as http
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "llm_gateway"
TOOL = ROLE / "files" / "rigops-llm-gateway-config"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
NJS = Path("/usr/lib/nginx/modules/ngx_http_js_module.so")


NO_NGINX = "nginx with njs not installed (apt-get install nginx libnginx-mod-http-js)"
needs_nginx = pytest.mark.needs("nginx with njs")

KEYS = {
    "alpha": "alpha-upstream-key-0123456789abcdef0123456789",
    "beta": "beta-upstream-key-0123456789abcdef01234567890",
    "gamma": "gamma-upstream-key-0123456789abcdef012345678",
    "remote": "remote-provider-key-0123456789abcdef",
}
CLIENTS = {
    "dev": "dev-client-key-0123456789abcdef0123456789abcdef",
    "limited": "limited-client-key-0123456789abcdef0123456789",
    "slow": "slow-client-key-0123456789abcdef0123456789abcd",
    "capped": "capped-client-key-0123456789abcdef0123456789ab",
}
PROMPT = "a prompt the access log must never hold"


# --------------------------------------------------------------------------- the routing table, plain data


def instance(ref, served, port, bind="127.0.0.1", require_key=True):
    host, name = ref.split("/")
    return {"name": name, "ref": ref, "port": port, "bind": bind, "served_name": served,
            "require_key": require_key, "connect": f"127.0.0.1:{port}", "problem": None}  # fmt: skip


def backend(host, *instances, same_host=False):
    return {"host": host, "address": "10.0.0.1", "address_given": False, "same_host": same_host,
            "instances": list(instances), "problem": None}  # fmt: skip


def spec(**over):
    base = {
        "backends": [
            backend("rig-a", instance("rig-a/alpha", "tiny-a", 8001), instance("rig-a/beta", "tiny-b", 8002)),
            backend("rig-b", instance("rig-b/alpha", "tiny-a", 8001)),
        ],
        "excluded_backends": [],
        "remotes": [
            {"name": "hosted", "base_url": "https://api.example.com/v1", "key": KEYS["remote"], "models": ["big-r"]}
        ],
        "aliases": {"chat": ["tiny-a", "tiny-b", "remote:big-r"]},
        "clients": [
            {"name": "dev", "key": CLIENTS["dev"], "models": "*"},
            {"name": "limited", "key": CLIENTS["limited"], "models": ["tiny-a"], "rate": "2r/s", "burst": 2},
        ],
        "settings": {"default_rate": "10r/s", "default_burst": 20},
        "health_hash": "",
        "keys_present": ["rig-a/alpha", "rig-a/beta", "rig-b/alpha"],
        "gateway_port": 8443,
    }
    base.update(over)
    return base


def test_table_names_hops_and_rewrites():
    table = gw.table(spec(settings={"default_policy": "failover"}))
    assert table["names"] == ["tiny-a", "tiny-b", "big-r", "chat"]
    routes = {r["name"]: r for r in table["routes"]}
    # the same served name on two rigs, policy failover: tried in inventory order, the first one benchable
    assert [h["label"] for h in routes["tiny-a"]["hops"]] == ["rig-a/alpha", "rig-b/alpha"]
    assert [h["upstream"] for h in routes["tiny-a"]["hops"]] == ["u0b", "u1"]
    # the alias: every target of each entry, in order, with the model rewritten where it differs
    chat = routes["chat"]["hops"]
    assert [(h["label"], h["model"], h["rewrite"]) for h in chat] == [
        ("rig-a/alpha", "tiny-a", True),
        ("rig-b/alpha", "tiny-a", True),
        ("rig-a/beta", "tiny-b", True),
        ("remote:hosted", "big-r", True),
    ]
    assert [h["next"] for h in chat] == ["r3_1", "r3_2", "r3_3", None]
    assert table["rewrite_positions"] == [0, 1, 2, 3] and table["pools"] == []
    remote = next(u for u in table["upstreams"] if u["kind"] == "remote")
    assert remote["server"] == "api.example.com:443" and remote["tls_name"] == "api.example.com"
    assert remote["host_header"] == "api.example.com" and remote["base_path"] == "/v1"
    # direct names are never rewritten
    assert not any(h["rewrite"] for n in ("tiny-a", "tiny-b", "big-r") for h in routes[n]["hops"])


def test_a_name_served_twice_is_a_pool_with_its_replicas_behind_it():
    """The default policy (session) pools the instances of one name; each policy its own nginx balancer; behind a
    pool, its replicas one by one (the route when the health feed drains one of them), then what follows it."""
    table = gw.table(spec(settings={"policies": {"chat": "least_busy"}}))
    routes = {r["name"]: r for r in table["routes"]}
    tiny = routes["tiny-a"]["hops"]
    assert [(h["id"], h["kind"], h["upstream"], h["next"], h["last"], h["solo"], h["solo_of"]) for h in tiny] == [
        ("r0_0", "pool", "p0", None, True, "r0_1", None),
        ("r0_1", "local", "u0b", "r0_2", False, None, "r0_0"),
        ("r0_2", "local", "u1", None, True, None, "r0_0"),
    ]
    assert tiny[0]["refs"] == ["rig-a/alpha", "rig-b/alpha"]
    assert routes["tiny-a"]["policy"] == "session" and routes["chat"]["policy"] == "least_busy"
    chat = routes["chat"]["hops"]
    assert [(h["label"], h["model"], h["next"]) for h in chat] == [
        ("least_busy:rig-a/alpha+rig-b/alpha", "tiny-a", "r3_1"),
        ("rig-a/beta", "tiny-b", "r3_2"),
        ("remote:hosted", "big-r", None),
        ("rig-a/alpha", "tiny-a", "r3_4"),
        ("rig-b/alpha", "tiny-a", "r3_1"),  # the pool's replicas, then on to the pool's next hop
    ]
    assert all(h["rewrite"] for h in chat) and chat[0]["solo"] == "r3_3"
    pools = {p["id"]: p for p in table["pools"]}
    assert {p: (v["policy"], v["balancer"], v["upstreams"]) for p, v in pools.items()} == {
        "p0": ("session", "hash $llm_session consistent", ["u0", "u1"]),
        "p1": ("least_busy", "least_conn", ["u0", "u1"]),
    }
    # a pooled replica is reached through its own socket, which passes the request on to its group of one
    ups = {u["ref"]: u for u in table["upstreams"]}
    assert ups["rig-a/alpha"]["pooled"] and ups["rig-a/alpha"]["single"] and not ups["rig-a/beta"]["pooled"]
    js = json.loads(gw.js_table(table))
    assert js["hops"]["r0_0"] == {"model": "tiny-a", "label": "session:rig-a/alpha+rig-b/alpha", "next": "",
                                  "replicas": ["rig-a/alpha", "rig-b/alpha"], "solo": "r0_1"}  # fmt: skip
    assert "replicas" not in js["hops"]["r0_1"]
    assert js["sockets"] == {"u0": "rig-a/alpha", "u1": "rig-b/alpha"}
    summary = gw.summary(table, "https://gw:8443/v1")
    assert summary["routes"]["tiny-a"] == ["session:rig-a/alpha+rig-b/alpha"]
    assert summary["policies"] == {"tiny-a": "session", "chat": "least_busy"}
    # the gate knows every replica of a pool: a name is skipped only when all are out
    plan = {p["name"]: p for p in gw.gate_plan(table, down=["rig-a/alpha"])}
    assert plan["tiny-a"]["gate"]
    plan = {p["name"]: p for p in gw.gate_plan(table, down=["rig-a/alpha", "rig-b/alpha"])}
    assert plan["tiny-a"] == {"name": "tiny-a", "gate": False, "why": "unreachable: rig-a/alpha, rig-b/alpha"}


def test_clients_hashed_and_zoned_by_rate_and_burst():
    table = gw.table(spec(health_hash="ab" * 32))
    clients = {c["name"]: c for c in table["clients"]}
    assert clients["dev"]["hash"] == gw.sha256_hex(CLIENTS["dev"]) and clients["dev"]["all"]
    assert clients["limited"]["models"] == ["tiny-a"] and not clients["limited"]["all"]
    assert clients[gw.HEALTH_CLIENT]["hash"] == "ab" * 32 and clients[gw.HEALTH_CLIENT]["all"]
    zones = {z["id"]: (z["rate"], z["burst"]) for z in table["zones"]}
    assert zones[clients["dev"]["zone"]] == ("10r/s", 20)
    assert zones[clients["limited"]["zone"]] == ("2r/s", 2)
    text = json.dumps(table)
    assert all(key not in text for key in CLIENTS.values()) and KEYS["remote"] not in text


def test_js_table_is_ascii_json_even_for_odd_names():
    odd = 'tiny 😀 "quoted" back\\slash\nnew line </script>'
    s = spec(aliases={}, clients=[{"name": "dev", "key": CLIENTS["dev"], "models": "*"}])
    s["backends"][0]["instances"][0]["served_name"] = odd
    text = gw.js_table(gw.table(s))
    assert text.isascii() and "\n" not in text
    data = json.loads(text)
    assert odd in data["routes"] and data["who"]["dev"] == gw.sha256_hex(CLIENTS["dev"])
    assert data["clients"][gw.sha256_hex(CLIENTS["dev"])]["models"][odd] == 1


def test_remote_model_served_by_a_rig_is_reached_only_as_remote_prefix():
    s = spec(remotes=[{"name": "hosted", "base_url": "https://api.example.com/v1", "key": KEYS["remote"],
                       "models": ["tiny-b", "big-r"]}], aliases={"far": ["remote:tiny-b"]})  # fmt: skip
    routes = {r["name"]: r for r in gw.table(s)["routes"]}
    assert [h["label"] for h in routes["tiny-b"]["hops"]] == ["rig-a/beta"]
    assert [(h["label"], h["rewrite"]) for h in routes["far"]["hops"]] == [("remote:hosted", True)]


def test_a_rig_left_out_keeps_its_names_known_with_no_upstream():
    s = spec(
        backends=[backend("rig-a", instance("rig-a/alpha", "tiny-a", 8001))],
        excluded_backends=[backend("rig-c", instance("rig-c/beta", "tiny-b", 8002))],
        keys_present=["rig-a/alpha"],
    )
    assert gw.problems(s) == []
    routes = {r["name"]: r for r in gw.table(s)["routes"]}
    assert routes["tiny-b"]["kind"] == "unavailable" and routes["tiny-b"]["hops"] == []
    assert [h["label"] for h in routes["chat"]["hops"]] == ["rig-a/alpha", "remote:hosted"]
    plan = {p["name"]: p for p in gw.gate_plan(gw.table(s), down=["remote:hosted"], skip=["big-r"])}
    assert plan["tiny-b"] == {"name": "tiny-b", "gate": False, "why": "no upstream is in the routing table"}
    assert plan["big-r"]["why"] == "llm_gateway_gate_skip" and plan["chat"]["gate"] is True


def test_drains_take_rigs_and_instances_out_and_keep_their_names_known():
    b = [
        backend("rig-a", instance("rig-a/alpha", "tiny-a", 8001), instance("rig-a/beta", "tiny-b", 8002)),
        backend("rig-c", instance("rig-c/gamma", "tiny-c", 8003)),
    ]
    kept = gw.drain(b, ["rig-a/alpha", "rig-c"], "kept")
    drained = gw.drain(b, ["rig-a/alpha", "rig-c"], "drained")
    assert [(e["host"], [i["name"] for i in e["instances"]]) for e in kept] == [("rig-a", ["beta"])]
    assert [(e["host"], [i["name"] for i in e["instances"]]) for e in drained] == [
        ("rig-a", ["alpha"]),
        ("rig-c", ["gamma"]),
    ]
    assert gw.drain(b, [], "kept") == b and gw.drain(b, [], "drained") == []
    routes = {r["name"]: r for r in gw.table(spec(backends=kept, excluded_backends=drained,
                                                 keys_present=["rig-a/beta"]))["routes"]}  # fmt: skip
    assert routes["tiny-a"]["hops"] == [] and [h["label"] for h in routes["chat"]["hops"]][0] == "rig-a/beta"
    with pytest.raises(ValueError, match="kept or drained"):
        gw.drain(b, [], "half")


def test_a_rig_drained_whole_is_out_with_its_problems():
    """llm_gateway_exclude_hosts is a drain the inventory holds: a rig left out whole (down for repair, an
    address the gateway cannot reach) adds no problem to the run; drained by instance, it still does."""
    broken = dict(backend("rig-x", instance("rig-x/alpha", "tiny-x", 8001)), problem="rig-x: no address")
    b = [broken, backend("rig-c", instance("rig-c/gamma", "tiny-c", 8003))]
    assert [e["host"] for e in gw.drain(b, ["rig-x"], "kept")] == ["rig-c"]
    assert [e["host"] for e in gw.drain(b, ["rig-x/alpha"], "kept")] == ["rig-x", "rig-c"]
    assert [e["host"] for e in gw.drain(b, ["rig-x"], "drained")] == ["rig-x"]


def test_drain_targets_name_what_exists_and_updates_are_stable():
    b = [backend("rig-a", instance("rig-a/alpha", "tiny-a", 8001)), backend("rig-c")]
    assert gw.drain_targets(["rig-a:alpha", "rig-c", "rig-a:alpha"], b) == {
        "refs": ["rig-a/alpha", "rig-c"],
        "problems": [],
    }
    assert gw.drain_targets(["rig-z", "rig-a:omega"], b)["problems"] == [
        "'rig-z': no rig 'rig-z' behind this gateway; rigs: rig-a, rig-c",
        "'rig-a:omega': rig-a has no instance 'omega'; its instances: alpha",
    ]
    assert gw.drain_targets([], b)["problems"] == ["no target given: HOST or HOST:INSTANCE (rigops_drain_targets)"]
    assert gw.drains_update([], "drain", ["rig-a:alpha", "rig-c"]) == ["rig-a/alpha", "rig-c"]
    assert gw.drains_update(["rig-a/alpha", "rig-c"], "drain", ["rig-c"]) == ["rig-a/alpha", "rig-c"]
    # undraining a rig puts back its drained instances too
    assert gw.drains_update(["rig-a/alpha", "rig-a", "rig-c"], "undrain", ["rig-a"]) == ["rig-c"]
    assert gw.drains_update(["rig-c"], "drain", []) == ["rig-c"]
    with pytest.raises(ValueError, match="drain or undrain"):
        gw.drains_update([], "pause", ["rig-c"])


def _edit(path, value):
    s = spec()
    target = s
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if key.isdigit() else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return s


REFUSALS = {
    "short client key": (_edit("clients.0.key", "short"), "llm_gateway_clients[0] (dev): key is shorter than 32"),
    "key with a quote": (
        _edit("clients.0.key", "x" * 40 + '"$'),
        "holds characters a Bearer token cannot carry",
    ),
    "two clients, one key": (_edit("clients.1.key", CLIENTS["dev"]), "its key is the key of llm_gateway_clients[0]"),
    "unknown model of a client": (_edit("clients.1.models", ["tiny-z"]), "model 'tiny-z' is unknown to the gateway"),
    "bad rate": (_edit("clients.1.rate", "fast"), "rate 'fast' must read like 10r/s"),
    "unknown client key": (_edit("clients.0", {"name": "dev", "key": CLIENTS["dev"], "modles": "*"}), "modles"),
    "bad client name": (_edit("clients.0.name", "Dev Team"), "name must match"),
    "alias target unknown": (_edit("aliases", {"chat": ["tiny-z"]}), "'tiny-z' is neither a served name"),
    "alias of an alias": (_edit("aliases", {"a": ["tiny-a"], "b": ["a"]}), "'a' is itself an alias"),
    "alias hides a name": (_edit("aliases", {"tiny-b": ["tiny-a"]}), "'tiny-b' is already the name of a model"),
    "remote model unknown": (_edit("aliases", {"chat": ["remote:nope"]}), "no remote lists the model 'nope'"),
    "http remote": (_edit("remotes.0.base_url", "http://api.example.com/v1"), "base_url is plain http"),
    "remote url without /v1": (_edit("remotes.0.base_url", "https://api.example.com/api"), "does not end in /v1"),
    "remote key missing": (_edit("remotes.0.key", ""), "llm_gateway_remotes[0] (hosted): key is missing"),
    "missing rig key": (_edit("keys_present", ["rig-a/alpha", "rig-b/alpha"]), "rig-a/beta (tiny-b): no API key"),
    "gateway port taken": (_edit("gateway_port", 8001), None),
    "unknown policy": (
        _edit("settings", {"policies": {"chat": "sticky"}}),
        "llm_gateway_policies['chat']: 'sticky' is not a policy; allowed: session, least_busy, round_robin, failover",
    ),
    "policy of an unknown name": (
        _edit("settings", {"policies": {"tiny-z": "session"}}),
        "llm_gateway_policies['tiny-z']: no model or alias of that name",
    ),
    "unknown default policy": (
        _edit("settings", {"default_policy": "random"}),
        "llm_gateway_default_policy 'random' is not a policy",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_say_what_and_how(case):
    given, words = REFUSALS[case]
    problems = gw.problems(given)
    if case == "gateway port taken":
        # only a rig instance on the gateway's own host can clash with its port
        assert problems == []
        given["backends"][0]["same_host"] = True
        problems = gw.problems(given)
        words = "port 8001 is also the gateway's llm_gateway_port"
    assert any(words in p for p in problems), problems
    text = "\n".join(problems)
    assert all(key not in text for key in list(CLIENTS.values()) + list(KEYS.values()))


def test_the_shipped_spec_is_accepted():
    assert gw.problems(spec()) == []


class HostVars(dict):
    """hostvars as a filter sees it: {host: {var: value}}."""


def test_backends_addresses_and_unreachable_loopback():
    hv = HostVars(
        {
            "gw": {"vllm_instances": [{"name": "alpha", "port": 8001, "model": {"source": "local", "path": "/m"}}]},
            "rig-b": {
                "ansible_host": "10.0.0.2",
                "vllm_instances": [
                    {"name": "beta", "port": 8002, "host": "0.0.0.0", "model": {"source": "local", "path": "/m"}},
                    {"name": "local", "port": 8003, "model": {"source": "local", "path": "/m"}},
                    {"name": "fixed", "port": 8004, "host": "10.0.0.7", "model": {"source": "local", "path": "/m"}},
                ],
            },
            "rig-c": {
                "ansible_host": "127.0.0.1",
                "vllm_instances": [
                    {"name": "x", "port": 8001, "host": "::", "model": {"source": "local", "path": "/m"}}
                ],
            },
        }
    )
    out = {b["host"]: b for b in gw.backends(["gw", "rig-b", "rig-c"], hv, "gw")}
    assert out["gw"]["instances"][0]["connect"] == "127.0.0.1:8001"
    assert out["gw"]["instances"][0]["served_name"] == "alpha"
    beta, local, fixed = out["rig-b"]["instances"]
    assert beta["connect"] == "10.0.0.2:8002" and beta["problem"] is None
    assert local["connect"] is None
    assert "binds 127.0.0.1: the gateway on gw cannot reach it on another host" in local["problem"]
    assert "vllm_service_allow_remote_bind: true on rig-b" in local["problem"]
    assert "put the gateway on rig-b" in local["problem"]
    assert fixed["connect"] == "10.0.0.7:8004"
    # a rig reached over an SSH forward (ansible_host 127.0.0.1, as in the sandbox): refused with the fix
    assert "set llm_gateway_upstream_address on rig-c" in out["rig-c"]["instances"][0]["problem"]
    given = gw.backends(["rig-c"], hv, "gw", {"rig-c": "fd00::7"})
    assert given[0]["instances"][0]["connect"] == "[fd00::7]:8001"
    # rigs that failed a stage of the main job (or were stopped) are left out by the role
    hv["rig-b"]["rigops_failed_stage"] = "services"
    hv["rig-c"]["rigops_stopped_by"] = "rig-b failed in services"
    assert gw.failed_hosts(["gw", "rig-b", "rig-c", "absent"], hv) == ["rig-b", "rig-c"]


def test_keys_come_from_the_fact_the_inventory_or_the_key_file():
    hv = HostVars(
        {
            "rig": {
                "vllm_instances": [
                    {"name": "a", "port": 8001, "model": {"source": "local", "path": "/m"}},
                    {
                        "name": "b",
                        "port": 8002,
                        "model": {"source": "local", "path": "/m"},
                        "security": {"api_key": KEYS["beta"]},
                    },
                    {"name": "c", "port": 8003, "model": {"source": "local", "path": "/m"}},
                    {
                        "name": "d",
                        "port": 8004,
                        "model": {"source": "local", "path": "/m"},
                        "security": {"require_key": False},
                    },
                ],  # fmt: skip
                "vllm_service_keys": {"a": KEYS["alpha"]},
                "vllm_service_config_root": "/srv/vllm",
                "llm_gateway_upstream_address": "10.0.0.9",
            }
        }
    )
    backends = gw.backends(["rig"], hv, "rig")
    reads = gw.key_reads(backends, hv)
    assert reads == [{"host": "rig", "instance": "c", "path": "/srv/vllm/c/api_key"}]
    import base64

    slurped = [{"item": reads[0], "content": base64.b64encode(f"{KEYS['gamma']}\n".encode()).decode()}]
    keys = gw.upstream_keys(backends, hv, slurped, [{"name": "hosted", "key": KEYS["remote"]}])
    assert keys == {"rig/a": KEYS["alpha"], "rig/b": KEYS["beta"], "rig/c": KEYS["gamma"], "rig/d": "",
                    "remote:hosted": KEYS["remote"]}  # fmt: skip
    assert gw.problems(spec(backends=backends, keys_present=list(keys), aliases={}, clients=[])) == []
    assert "rig/c (c): no API key" in "\n".join(gw.problems(spec(backends=backends, keys_present=["rig/a", "rig/b"],
                                                                 aliases={}, clients=[])))  # fmt: skip


def test_summary_has_no_key_nor_hash_and_san():
    table = gw.table(spec(health_hash="cd" * 32))
    summary = gw.summary(table, "https://gw:8443/v1", True, "0123", ["rig-b/alpha"])
    assert summary["clients"] == {"dev": ["tiny-a", "tiny-b", "big-r", "chat"], "limited": ["tiny-a"]}
    assert summary["routes"]["chat"][-1] == "remote:hosted" and summary["unreachable"] == ["rig-b/alpha"]
    text = json.dumps(summary)
    assert "cd" * 32 not in text and gw.sha256_hex(CLIENTS["dev"]) not in text
    assert gw.san(["gw.example.com", "10.0.0.1", "127.0.0.1", "::1", "gw.example.com"]) == (
        "DNS:gw.example.com,IP:10.0.0.1,IP:127.0.0.1,IP:::1"
    )
    with pytest.raises(ValueError, match="neither an IP address nor a DNS name"):
        gw.san(["bad name"])
    with pytest.raises(AnsibleFilterError):
        gw.FilterModule().filters()["gateway_san"](["bad name"])


# --------------------------------------------------------------------------- stand-in upstreams


class Upstream:
    """An OpenAI-compatible stand-in serving one model behind its own key; records every request."""

    def __init__(self, key, model, tls=None, delay=0.3):
        self.key, self.model, self.tls, self.delay = key, model, tls, delay
        self.fail_with = None  # a status every POST answers, as a sick vLLM's 500
        self.seen = []
        self.usage = []  # (prompt, completion) tokens of each answer, as vLLM reports them
        self.end_delay = 0.0
        self.server = None
        self.port = 0
        self._conns = set()

    def start(self, port=0):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                outer._conns.add(self.connection)

            def finish(self):
                outer._conns.discard(self.connection)
                super().finish()

            def _json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self, body):
                outer.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                   "body": body})  # fmt: skip
                if self.headers.get("Authorization") != f"Bearer {outer.key}":
                    self._json(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self):
                if not self._authorized(None):
                    return
                if self.path == "/v1/models":
                    return self._json(200, {"object": "list", "data": [{"id": outer.model, "object": "model"}]})
                self._json(404, {"detail": "Not Found"})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                if not self._authorized(body):
                    return
                if outer.fail_with:
                    return self._json(outer.fail_with, {"error": {"message": "EngineCore encountered an issue."}})
                if not isinstance(body, dict) or body.get("model") != outer.model:
                    name = body.get("model") if isinstance(body, dict) else None
                    return self._json(404, {"error": {"message": f"The model `{name}` does not exist.", "code": 404}})
                path = self.path.split("?")[0]
                # tokens as a tokenizer would count them: one per word of the body, one per streamed piece
                prompt = len(raw.split()) + 3
                if path == "/v1/messages":
                    outer.usage.append((prompt, 1))
                    return self._json(200, {"type": "message", "model": outer.model, "role": "assistant",
                                            "content": [{"type": "text", "text": "hi"}],
                                            "usage": {"input_tokens": prompt, "output_tokens": 1}})  # fmt: skip
                if path == "/v1/embeddings":
                    outer.usage.append((prompt, 0))
                    return self._json(200, {"object": "list", "model": outer.model, "data": [{"embedding": [0.1]}],
                                            "usage": {"prompt_tokens": prompt, "total_tokens": prompt}})  # fmt: skip
                if not body.get("stream"):
                    outer.usage.append((prompt, 1))
                    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
                    usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
                    return self._json(200, {"object": "chat.completion", "model": outer.model, "choices": [choice],
                                            "usage": usage})  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def send(data):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()

                events = [{"model": outer.model, "choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in
                          range(3)]  # fmt: skip
                for event in events:
                    send(f"data: {json.dumps(event)}\n\n".encode())
                    time.sleep(outer.delay)
                if (body.get("stream_options") or {}).get("include_usage"):
                    # vLLM's last chunk: no choices, the usage; sent in two pieces, as a network may cut it
                    outer.usage.append((prompt, len(events)))
                    usage = {"prompt_tokens": prompt, "completion_tokens": len(events),
                             "total_tokens": prompt + len(events)}  # fmt: skip
                    chunk = f"data: {json.dumps({'model': outer.model, 'choices': [], 'usage': usage})}\n\n".encode()
                    send(chunk[:20])
                    time.sleep(0.05)
                    send(chunk[20:])
                send(b"data: [DONE]\n\n")
                time.sleep(outer.end_delay)  # the stream's end after [DONE]: a client may have closed by then
                self.wfile.write(b"0\r\n\r\n")

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server, self.port = server, server.server_address[1]
        return self

    def stop(self):
        """Down like a stopped vLLM: no listener, and every open connection closed."""
        self.server.shutdown()
        self.server.server_close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the role, rendered and served


def inventory(tmp, ports, up, certs):
    etc = tmp / "etc"
    gateway = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "llm_gateway_config_root": str(etc),
        "llm_gateway_log_dir": str(tmp / "log"),
        "llm_gateway_state_dir": str(tmp / "state"),
        # pytest's folders are root's alone: the workers read the health feed's drained file there
        "llm_gateway_worker_user": "root",
        "llm_gateway_pid_file": str(tmp / "nginx.pid"),
        "llm_gateway_tool_dir": str(ROLE / "files"),
        "llm_gateway_nginx": NGINX,
        "llm_gateway_port": ports["gateway"],
        "llm_gateway_listen": ["127.0.0.1"],
        "llm_gateway_worker_processes": 1,
        "llm_gateway_connect_timeout": 1,
        "llm_gateway_bench_seconds": 2,
        "llm_gateway_max_body_size": "64k",
        "llm_gateway_remotes": [
            {
                "name": "hosted",
                "base_url": f"https://127.0.0.1:{up['remote'].port}/v1",
                "key": KEYS["remote"],
                "models": ["big-r"],
                "ca_file": str(certs / "remote.pem"),
            }
        ],  # fmt: skip
        "llm_gateway_aliases": {
            "chat": ["tiny-a", "tiny-b", "remote:big-r"],
            "far": ["tiny-a", "remote:big-r"],
            # the pool of tiny-p (policy session, the default) under the other policies
            "pool-rr": ["tiny-p"],
            "pool-least": ["tiny-p"],
            "pool-fail": ["tiny-p", "remote:big-r"],
        },
        "llm_gateway_policies": {"pool-rr": "round_robin", "pool-least": "least_busy", "pool-fail": "failover"},
        "llm_gateway_clients": [
            # the tests send many requests in a short time: only `slow` meets its limit
            {"name": "dev", "key": CLIENTS["dev"], "models": "*", "rate": "1000r/s", "burst": 1000},
            {"name": "limited", "key": CLIENTS["limited"], "models": ["tiny-a", "chat"], "rate": "1000r/s"},
            {"name": "slow", "key": CLIENTS["slow"], "models": "*", "rate": "1r/s", "burst": 1},
            # a budget the usage test spends
            {"name": "capped", "key": CLIENTS["capped"], "models": "*", "rate": "1000r/s", "tokens_per_day": 60},
        ],
        # the gateway is also a "rig": its instance is reached on loopback
        "vllm_instances": [
            {
                "name": "alpha",
                "port": up["alpha"].port,
                "model": {"source": "local", "path": "/m", "served_name": "tiny-a"},
            }
        ],
        "vllm_service_keys": {"alpha": KEYS["alpha"]},
    }
    rigs = {
        "gw": {},
        # published its key as the vllm_service role does (the fact vllm_service_keys)
        "rig-b": {
            "ansible_host": "10.255.0.2",
            "llm_gateway_upstream_address": "127.0.0.1",
            "vllm_instances": [
                {
                    "name": "beta",
                    "port": up["beta"].port,
                    "host": "0.0.0.0",
                    "model": {"source": "local", "path": "/m", "served_name": "tiny-b"},
                }
            ]  # fmt: skip
            # three replicas of tiny-p: a pool
            + [
                {
                    "name": n,
                    "port": up[n].port,
                    "host": "0.0.0.0",
                    "model": {"source": "local", "path": "/m", "served_name": "tiny-p"},
                }
                for n in REPLICAS
            ],  # fmt: skip
            "vllm_service_keys": {"beta": KEYS["beta"], **{n: up[n].key for n in REPLICAS}},
        },
        # only its key file on the "rig": read there by slurp (delegated, connection local)
        "rig-c": {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "llm_gateway_upstream_address": "127.0.0.1",
            "vllm_service_config_root": str(tmp / "rig-c-vllm"),
            "vllm_instances": [
                {
                    "name": "gamma",
                    "port": up["gamma"].port,
                    "host": "0.0.0.0",
                    "model": {"source": "local", "path": "/m", "served_name": "tiny-c"},
                }
            ],  # fmt: skip
        },
    }
    return {"all": {"children": {"gateways": {"hosts": {"gw": gateway}}, "gpu-rigs": {"hosts": rigs}}}}


PLAY = [
    {
        "name": "llm_gateway preflight and configure on this machine",
        "hosts": "gateways",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Folders install.yml makes",
                "ansible.builtin.file": {"path": "{{ item }}", "state": "directory", "mode": "0700"},
                "loop": [
                    "{{ llm_gateway_config_root }}/staging",
                    "{{ llm_gateway_config_root }}/tls",
                    "{{ llm_gateway_log_dir }}",
                    "{{ llm_gateway_state_dir }}",
                    "{{ llm_gateway_state_dir }}/replicas",
                    "{{ llm_gateway_state_dir }}/usage",
                ],  # fmt: skip
            },
            {
                "name": "Preflight",
                "ansible.builtin.import_role": {"name": "rigops.fleet.llm_gateway", "tasks_from": "preflight"},
            },
            {
                "name": "Configure",
                "ansible.builtin.import_role": {"name": "rigops.fleet.llm_gateway", "tasks_from": "configure"},
            },
        ],
    }
]


def playbook(tmp, inv, *extra):
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inv))
    (tmp / "play.yml").write_text(yaml.safe_dump(PLAY))
    proc = ansible_playbook("-i", tmp / "inventory.yml", tmp / "play.yml", *extra)
    return proc.returncode, proc.stdout + proc.stderr


def tool(*args):
    return subprocess.run([str(TOOL), *args], capture_output=True, text=True, check=False,
                          env=dict(os.environ, RIGOPS_NGINX=NGINX or "nginx"))  # fmt: skip


class Gateway:
    def __init__(self, tmp, ports, up, inv):
        self.tmp, self.ports, self.up, self.inv = tmp, ports, up, inv
        self.etc = tmp / "etc"
        self.client = http.Client("127.0.0.1", ports["gateway"], server_name="127.0.0.1",
                                  ca_file=str(self.etc / "tls" / "ca.pem"), timeout=30)  # fmt: skip

    def nginx(self, *args):
        return subprocess.run([NGINX, "-c", str(self.etc / "live" / "nginx.conf"), *args], capture_output=True,
                              text=True, check=False)  # fmt: skip

    def call(self, path, key=None, body=None, method=None, headers=None, stream=False):
        hdrs = dict(headers or {})
        if key:
            hdrs["Authorization"] = f"Bearer {key}"
        status, resp_headers, payload = self.client(
            method or ("POST" if body is not None else "GET"), path, headers=hdrs, body=body, stream=stream
        )
        if stream:
            return status, payload
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    def chat(self, model, key=CLIENTS["dev"], **extra):
        return self.call("/v1/chat/completions", key, {"model": model, "messages": [{"role": "user",
                         "content": PROMPT}], "max_tokens": 4, **extra})  # fmt: skip

    def log(self, wait=1.3):
        time.sleep(wait)  # access_log buffer flushes every second
        path = self.tmp / "log" / "access.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_config(self, config_id, timeout=10):
        return http.wait_config(self.client, config_id, timeout, interval=0.1)

    def live_id(self):
        return (self.etc / "live" / "config_id").read_text().strip()


REPLICAS = ("p1", "p2", "p3")
# every name of the gateway the tests serve, in its order
NAMES = ["tiny-a", "tiny-b", "tiny-p", "tiny-c", "big-r", "chat", "far", "pool-fail", "pool-least", "pool-rr"]


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    """The stand-in upstreams: three rig instances over HTTP, a hosted provider over HTTPS, and three replicas
    of one name (a pool)."""
    if NGINX is None or not NJS.exists():
        pytest.fail(NO_NGINX)  # only tests marked needs("nginx with njs") use it: they were skipped or failed first
    certs = tmp_path_factory.mktemp("llm-gateway-upstreams")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(certs / "remote-key.pem"), "-out", str(certs / "remote.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    up = {
        "alpha": Upstream(KEYS["alpha"], "tiny-a").start(),
        "beta": Upstream(KEYS["beta"], "tiny-b").start(),
        "gamma": Upstream(KEYS["gamma"], "tiny-c").start(),
        "remote": Upstream(KEYS["remote"], "big-r", tls=(str(certs / "remote.pem"), str(certs / "remote-key.pem"))),
    }
    up["remote"].start()
    for name in REPLICAS:
        up[name] = Upstream(f"{name}-replica-key-0123456789abcdef012345678", "tiny-p", delay=0.2).start()
    try:
        yield certs, up
    finally:
        for u in up.values():
            u.stop()


def prepared(tmp, upstreams):
    """A gateway's folder with rig-c's key file, and its inventory."""
    certs, up = upstreams
    (tmp / "rig-c-vllm" / "gamma").mkdir(parents=True)
    (tmp / "rig-c-vllm" / "gamma" / "api_key").write_text(KEYS["gamma"] + "\n")
    return inventory(tmp, {"gateway": free_port()}, up, certs)


def stop_nginx(conf, pid_file):
    subprocess.run([NGINX, "-c", str(conf), "-s", "quit"], capture_output=True, check=False)
    deadline = time.time() + 10
    while pid_file.exists() and time.time() < deadline:
        time.sleep(0.1)
    if pid_file.exists():  # pragma: no cover - nginx did not quit: end it
        os.kill(int(pid_file.read_text()), signal.SIGTERM)


def served(tmp, inv, up):
    """The role's preflight and configure on this machine, the set put live by the tool, nginx started by hand."""
    rc, out = playbook(tmp, inv)
    assert rc == 0, out[-4000:]
    assert tool("promote", str(tmp / "etc")).returncode == 0
    g = Gateway(tmp, {"gateway": inv["all"]["children"]["gateways"]["hosts"]["gw"]["llm_gateway_port"]}, up, inv)
    g.render_output = out
    started = g.nginx()
    assert started.returncode == 0, started.stderr
    try:
        g.wait_config(g.live_id())
        yield g
    finally:
        stop_nginx(tmp / "etc" / "live" / "nginx.conf", tmp / "nginx.pid")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, upstreams):
    tmp = tmp_path_factory.mktemp("llm-gateway")
    yield from served(tmp, prepared(tmp, upstreams), upstreams[1])


@needs_nginx
def test_the_set_is_checked_sealed_and_root_only(gateway):
    staging = gateway.etc / "staging"
    for name in ("nginx.conf", "gateway.js", "cert.pem", "key.pem", "config_id", "config_id.conf"):
        assert (staging / name).stat().st_mode & 0o777 == 0o600, name
    assert (staging.stat().st_mode & 0o777) == 0o700
    assert tool("check", str(staging)).returncode == 0
    assert tool("seal", str(staging)).stdout.strip() == f"{gateway.live_id()} kept"
    conf, js = (staging / "nginx.conf").read_text(), (staging / "gateway.js").read_text()
    # upstream keys only in nginx.conf (root only), client keys nowhere: only their sha256 in gateway.js
    assert f"Bearer {KEYS['gamma']}" in conf and KEYS["gamma"] not in js
    for key in CLIENTS.values():
        assert key not in conf and key not in js and gw.sha256_hex(key) in js
    for key in list(KEYS.values()) + list(CLIENTS.values()):
        assert key not in gateway.render_output
    assert (gateway.etc / "health_key").stat().st_mode & 0o777 == 0o600
    # nginx refuses a broken set: nothing would go live
    broken = gateway.tmp / "broken"
    shutil.copytree(staging, broken)
    (broken / "nginx.conf").write_text((broken / "nginx.conf").read_text().replace("proxy_pass", "proxy_passs", 1))
    check = tool("check", str(broken))
    assert check.returncode != 0 and "proxy_passs" in check.stderr


@needs_nginx
@pytest.mark.parametrize(
    ("name", "answered_by"),
    [("tiny-a", "tiny-a"), ("tiny-b", "tiny-b"), ("tiny-c", "tiny-c"), ("big-r", "big-r"), ("chat", "tiny-a"),
     ("far", "tiny-a")],
)  # fmt: skip
def test_every_name_answers_through_its_upstream(gateway, name, answered_by):
    status, body = gateway.chat(name)
    assert status == 200, body
    assert body["model"] == answered_by and body["choices"][0]["message"]["content"] == "hi"


@needs_nginx
def test_other_api_paths_are_routed_by_model(gateway):
    status, body = gateway.call("/v1/messages?beta=true", CLIENTS["dev"], {"model": "far", "max_tokens": 4,
                                "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert status == 200 and body["type"] == "message" and body["model"] == "tiny-a"
    assert gateway.up["alpha"].seen[-1]["path"] == "/v1/messages?beta=true"
    status, body = gateway.call("/v1/embeddings", CLIENTS["dev"], {"model": "big-r", "input": "x"})
    assert status == 200 and body["model"] == "big-r"
    # the remote's base path is kept, the query string passed on
    assert gateway.up["remote"].seen[-1]["path"] == "/v1/embeddings"


@needs_nginx
def test_streaming_is_passed_on_unbuffered(gateway):
    t0 = time.monotonic()
    status, lines = gateway.call("/v1/chat/completions", CLIENTS["dev"], {"model": "chat", "stream": True,
                                 "messages": [{"role": "user", "content": "hi"}]}, stream=True)  # fmt: skip
    assert status == 200
    arrivals = []
    for raw in lines:
        line = raw.decode().strip()
        if line.startswith("data:"):
            arrivals.append((time.monotonic() - t0, line[5:].strip()))
    assert arrivals[-1][1] == "[DONE]" and len(arrivals) == 4
    assert json.loads(arrivals[0][1])["model"] == "tiny-a"
    # the stand-in waits 0.3 s between events: the first one must not wait for the last
    assert arrivals[0][0] < 0.25 and arrivals[-1][0] > 0.8, arrivals


@needs_nginx
def test_upstreams_see_their_own_key_never_the_clients(gateway):
    for u in gateway.up.values():
        u.seen.clear()
    # (pool-rr: round robin, so each replica of the pool sees one)
    for name in ("tiny-a", "tiny-b", "tiny-c", "big-r", "chat", "pool-rr", "pool-rr", "pool-rr"):
        status, _ = gateway.call("/v1/chat/completions", CLIENTS["dev"], {"model": name, "messages": []},
                                 headers={"X-Api-Key": CLIENTS["dev"], "Api-Key": CLIENTS["dev"],
                                          "Cookie": f"session={CLIENTS['dev']}"})  # fmt: skip
        assert status == 200
    for label, u in gateway.up.items():
        assert u.seen, label
        for request in u.seen:
            headers = {k.lower(): v for k, v in request["headers"].items()}
            assert headers["authorization"] == f"Bearer {u.key}"
            assert not any(CLIENTS["dev"] in v for v in headers.values()), headers
            assert not {"x-api-key", "api-key", "cookie"} & set(headers)
    # the alias reached alpha with its own name in the body, and a pooled replica's Host is its own
    assert gateway.up["alpha"].seen[-1]["body"]["model"] == "tiny-a"
    assert gateway.up["p2"].seen[-1]["headers"]["Host"] == "127.0.0.1:" + str(gateway.up["p2"].port)
    assert gateway.up["remote"].seen[-1]["headers"]["Host"] == "127.0.0.1:" + str(gateway.up["remote"].port)


@needs_nginx
@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v1/models/tiny-a"])
@pytest.mark.parametrize(
    "auth",
    [None, "Bearer not-a-key", f"Bearer {CLIENTS['dev']}x", f"Bearer {CLIENTS['dev'][:-1]}", "Basic Zm9vOmJhcg==",
     f"Token {CLIENTS['dev']}", f"Bearer {gw.sha256_hex(CLIENTS['dev'])}"],
)  # fmt: skip
def test_a_missing_or_wrong_key_is_401(gateway, path, auth):
    body = {"model": "tiny-a", "messages": []} if path == "/v1/chat/completions" else None
    status, resp_headers, payload = gateway.client(
        "POST" if body else "GET", path, body=body, headers={"Authorization": auth} if auth else {}
    )
    assert status == 401, payload
    assert json.loads(payload)["error"]["type"] == "authentication_error"
    assert resp_headers.get("WWW-Authenticate", "").startswith("Bearer")


ANTHROPIC_ERROR = {"type", "error"}  # {type: "error", error: {type, message}}: what Anthropic's SDKs read
OPENAI_ERROR = {"error"}  # {error: {message, type, param, code}}: OpenAI's SDKs and vLLM's own errors
MESSAGE = {"model": "tiny-a", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@needs_nginx
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"])
def test_the_key_in_x_api_key_is_a_key_too(gateway, path):
    """Anthropic's SDKs send `x-api-key` by default (api_key=), Claude Code with ANTHROPIC_API_KEY too; the
    gateway takes the key from it when there is no Authorization header, and passes it on to no upstream."""
    gateway.up["alpha"].seen.clear()
    status, body = gateway.call(path, body=MESSAGE, headers={"x-api-key": CLIENTS["dev"]})
    assert status == 200, body
    headers = {k.lower(): v for k, v in gateway.up["alpha"].seen[-1]["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEYS['alpha']}" and "x-api-key" not in headers
    # a wrong key in it, or a right one beside a wrong Bearer (Authorization decides): 401
    for headers in ({"x-api-key": "not-a-key"}, {"x-api-key": CLIENTS["dev"], "Authorization": "Bearer nope"},
                    {"x-api-key": f"{CLIENTS['dev']} {CLIENTS['dev']}"}):  # fmt: skip
        assert gateway.call(path, body=MESSAGE, headers=headers)[0] == 401, headers
    # the limited client's key in x-api-key is that client's: its names only
    status, body = gateway.call(path, body=dict(MESSAGE, model="far"), headers={"x-api-key": CLIENTS["limited"]})
    assert status == 403 and body["error"]["type"] == "permission_error"


@needs_nginx
@pytest.mark.parametrize("family, path", [("anthropic", "/v1/messages"), ("anthropic", "/v1/messages/count_tokens"),
                                          ("openai", "/v1/chat/completions"), ("openai", "/v1/responses")])  # fmt: skip
def test_refusals_come_in_the_shape_of_the_api_family(gateway, family, path):
    """Each family's SDK reads its own error shape: the gateway's refusals (gateway.js and nginx.conf's own)
    answer /v1/messages in Anthropic's and every other path in OpenAI's, which vLLM's own errors also have."""
    expected = ANTHROPIC_ERROR if family == "anthropic" else OPENAI_ERROR
    cases = [
        (401, "authentication_error", gateway.call(path, "wrong-key", MESSAGE)),
        (403, "permission_error", gateway.call(path, CLIENTS["limited"], dict(MESSAGE, model="far"))),
        (404, "not_found_error", gateway.call(path, CLIENTS["dev"], dict(MESSAGE, model="no-such-model"))),
        (400, "invalid_request_error", gateway.call(path, CLIENTS["dev"], {"max_tokens": 4})),
        (413, "invalid_request_error", gateway.call(path, CLIENTS["dev"], dict(MESSAGE, padding="x" * 70000))),
    ]
    for status, kind, (got, body) in cases:
        assert got == status and set(body) == expected, (status, body)
        assert body["error"]["type"] == kind and body["error"]["message"], body
        if family == "anthropic":
            assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        else:
            assert body["error"]["code"] == status and body["error"]["param"] is None, body


@needs_nginx
def test_models_403_404_and_what_each_key_may_use(gateway):
    status, body = gateway.call("/v1/models", CLIENTS["limited"])
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["tiny-a", "chat"]
    assert all(m["object"] == "model" and m["owned_by"] == "rigops" for m in body["data"])
    status, body = gateway.call("/v1/models", CLIENTS["dev"])
    assert [m["id"] for m in body["data"]] == NAMES
    assert gateway.call("/v1/models/chat", CLIENTS["limited"])[0] == 200
    assert gateway.call("/v1/models/tiny-b", CLIENTS["limited"])[0] == 404
    status, body = gateway.chat("tiny-b", key=CLIENTS["limited"])
    assert status == 403 and body["error"]["type"] == "permission_error"
    status, body = gateway.chat("gpt-4o", key=CLIENTS["limited"])
    assert status == 404 and "Models of this key: tiny-a, chat" in body["error"]["message"]
    assert gateway.chat("chat", key=CLIENTS["limited"])[0] == 200


@needs_nginx
@pytest.mark.parametrize(
    "path",
    ["/metrics", "/tokenize", "/detokenize", "/health", "/version", "/docs", "/openapi.json", "/ping", "/load",
     "/pause", "/resume", "/v1/load_lora_adapter", "/v1/responses/resp_1", "/v1/chat/completions/render",
     "/server_info", "/v1/models/../../metrics"],
)  # fmt: skip
def test_paths_vllm_leaves_open_are_never_passed_on(gateway, path):
    for u in gateway.up.values():
        u.seen.clear()
    for method in ("GET", "POST"):
        status, _ = gateway.call(path, CLIENTS["dev"], {"model": "tiny-a"} if method == "POST" else None, method=method)
        assert status == 404, (method, path, status)
    assert not any(u.seen for u in gateway.up.values())


@needs_nginx
def test_bad_bodies_are_400_and_too_large_413(gateway):
    status, _, payload = gateway.client("POST", "/v1/chat/completions", body=b"not json",
                                        headers={"Authorization": f"Bearer {CLIENTS['dev']}"})  # fmt: skip
    assert status == 400 and b"not JSON" in payload
    for body in ({"messages": []}, {"model": 7}, ["tiny-a"]):
        assert gateway.call("/v1/chat/completions", CLIENTS["dev"], body)[0] == 400
    status, body = gateway.chat("tiny-a", padding="x" * 70000)
    assert status == 413 and body["error"]["code"] == 413
    status, body = gateway.call("/v1/chat/completions", CLIENTS["dev"], method="GET")
    assert status == 405


@needs_nginx
def test_rate_limit_per_client(gateway):
    time.sleep(1.1)
    codes = [gateway.chat("tiny-a", key=CLIENTS["slow"])[0] for _ in range(6)]
    assert codes[:2] == [200, 200] and codes.count(429) >= 3, codes
    status, body = gateway.chat("tiny-a", key=CLIENTS["slow"])
    assert status == 429 and body["error"]["type"] == "rate_limit_error"
    # another client is not slowed by it
    assert [gateway.chat("tiny-a")[0] for _ in range(5)] == [200] * 5


@needs_nginx
def test_access_log_is_json_without_keys_or_bodies(gateway):
    gateway.chat("chat", key=CLIENTS["limited"])
    gateway.chat("tiny-b", key=CLIENTS["limited"])
    gateway.chat("tiny-a", key="wrong-key-0123456789abcdef0123456789")
    text = (gateway.tmp / "log" / "access.log").read_text() if gateway.log() else ""
    lines = [json.loads(line) for line in text.splitlines()]
    ok = [e for e in lines if e["client"] == "limited" and e["model"] == "chat" and e["status"] == 200][-1]
    assert ok["target"] == "gw/alpha"
    assert ok["upstream"] == f"127.0.0.1:{gateway.up['alpha'].port}"
    assert isinstance(ok["request_time"], float) and ok["path"] == "/v1/chat/completions"
    assert any(e["client"] == "limited" and e["model"] == "tiny-b" and e["status"] == 403 for e in lines)
    assert any(e["client"] == "" and e["status"] == 401 for e in lines)
    for secret in [PROMPT, *CLIENTS.values(), *KEYS.values(), "wrong-key-0123456789abcdef0123456789"]:
        assert secret not in text
    assert PROMPT not in (gateway.tmp / "log" / "error.log").read_text()


@needs_nginx
def test_gate_passes_and_names_what_answered(gateway):
    key = (gateway.etc / "health_key").read_text().strip()
    names = [{"name": n, "gate": True, "why": ""} for n in NAMES]
    out = http.gate(gateway.client, key, names, config_id=gateway.live_id(), stream_name="chat", timeout=5)
    assert out["failures"] == [], out["failures"]
    assert out["answered"]["far"]["answered_by"] == "tiny-a" and out["answered"]["chat"]["ttft_s"] < 0.3
    assert set(out["listed"]) == {n["name"] for n in names}
    stale = http.gate(gateway.client, key, names, config_id="0" * 16, timeout=1)
    assert [f["kind"] for f in stale["failures"]] == ["not_reloaded"]
    wrong = http.gate(gateway.client, CLIENTS["limited"], names, config_id=gateway.live_id(), timeout=5)
    assert {f["kind"] for f in wrong["failures"]} == {"models", "chat"}


@needs_nginx
def test_probe_tells_reachable_from_refused(gateway):
    targets = [{"ref": "a", "server": f"127.0.0.1:{gateway.up['alpha'].port}"}, {"ref": "z", "server": "127.0.0.1:9"}]
    out = http.probe(targets, timeout=1)
    assert [(r["ref"], r["ok"]) for r in out] == [("a", True), ("z", False)] and out[1]["error"]


@needs_nginx
def test_preflight_refuses_with_the_fix_and_never_the_key(gateway, tmp_path):
    inv = copy.deepcopy(gateway.inv)
    host = inv["all"]["children"]["gateways"]["hosts"]["gw"]
    host["llm_gateway_config_root"] = str(tmp_path / "etc")
    host["llm_gateway_clients"].append(
        {"name": "eve", "key": "short-secret-value", "models": ["tiny-z"], "tokens_per_day": 0}
    )
    host["llm_gateway_aliases"]["broken"] = ["tiny-a", "remote:gone"]
    inv["all"]["children"]["gpu-rigs"]["hosts"]["rig-b"]["vllm_instances"][0]["host"] = "127.0.0.1"
    rc, out = playbook(tmp_path, inv)
    assert rc != 0
    flat = " ".join(out.split())
    assert "llm_gateway preflight refused (5 problem(s))" in flat, out[-3000:]
    for words in (
        "rig-b/beta (tiny-b) binds 127.0.0.1: the gateway on gw cannot reach it on another host",
        "llm_gateway_clients[4] (eve): key is shorter than 32 characters",
        "llm_gateway_clients[4] (eve): model 'tiny-z' is unknown to the gateway",
        "llm_gateway_clients[4] (eve): tokens_per_day 0 must be a whole number >= 1",
        "llm_gateway_aliases['broken']: 'remote:gone': no remote lists the model 'gone'",
    ):
        assert words in flat, words
    assert "short-secret-value" not in out
    assert not (tmp_path / "etc" / "staging" / "nginx.conf").exists()


@needs_nginx
def test_fallback_on_a_refused_upstream_benches_it_and_returns(gateway):
    alpha = gateway.up["alpha"]
    port = alpha.port
    alpha.stop()
    try:
        t0 = time.monotonic()
        status, body = gateway.chat("chat")
        first = time.monotonic() - t0
        assert status == 200 and body["model"] == "tiny-b"
        status, body = gateway.chat("chat")
        assert status == 200 and body["model"] == "tiny-b"
        status, body = gateway.chat("far")
        assert status == 200 and body["model"] == "big-r"
        # a name without a fallback answers a JSON 502
        status, body = gateway.chat("tiny-a")
        assert status == 502 and body["error"]["type"] == "upstream_unavailable"
        log = [e for e in gateway.log() if e["model"] in ("chat", "far")][-3:]
        # the first: alpha refused, then beta; the second: alpha benched (not tried), beta at once
        # alpha refused, the placeholder beside it too (it exists to be tried next), then beta answered
        assert log[0]["upstream"].startswith(f"127.0.0.1:{port}, unix:") and log[0]["target"] == "rig-b/beta"
        assert log[0]["upstream_status"] == "502, 502 : 200"
        assert log[1]["upstream"].startswith("u0b : ") and log[1]["target"] == "rig-b/beta"
        assert log[2]["target"] == "remote:hosted"
        assert float(log[0]["request_time"]) < 0.1 and first < 1.0, (log[0], first)
    finally:
        alpha.start(port)
    time.sleep(2.2)  # llm_gateway_bench_seconds
    deadline = time.time() + 10
    while time.time() < deadline and gateway.chat("chat")[1].get("model") != "tiny-a":
        time.sleep(0.5)
    assert gateway.chat("chat")[1]["model"] == "tiny-a"
    assert gateway.chat("tiny-a")[0] == 200


@needs_nginx
def test_an_upstream_answering_500_is_benched_like_a_refused_one(gateway):
    alpha = gateway.up["alpha"]
    alpha.fail_with = 500
    alpha_posts = len([s for s in alpha.seen if s["method"] == "POST"])
    try:
        status, body = gateway.chat("chat")
        assert status == 200 and body["model"] == "tiny-b"
        status, body = gateway.chat("chat")
        assert status == 200 and body["model"] == "tiny-b"
        log = [e for e in gateway.log() if e["model"] == "chat"][-2:]
        # alpha's 500, the placeholder (never a real upstream) refused, then beta answered
        assert log[0]["upstream_status"] == "500, 502 : 200" and log[0]["target"] == "rig-b/beta"
        assert log[0]["upstream"].startswith(f"127.0.0.1:{alpha.port}, unix:")
        assert len([s for s in alpha.seen if s["method"] == "POST"]) == alpha_posts + 1
        # benched: alpha is not tried
        assert f":{alpha.port}" not in log[1]["upstream"] and log[1]["target"] == "rig-b/beta"
    finally:
        alpha.fail_with = None
    time.sleep(2.2)  # llm_gateway_bench_seconds
    deadline = time.time() + 10
    while time.time() < deadline and gateway.chat("chat")[1].get("model") != "tiny-a":
        time.sleep(0.5)
    assert gateway.chat("chat")[1]["model"] == "tiny-a"


def reconfigure(gateway, *extra):
    """The role's preflight and configure again, the staging set put live and nginx reloaded onto it."""
    rc, out = playbook(gateway.tmp, gateway.inv, *extra)
    if rc != 0:
        return rc, out
    assert tool("promote", str(gateway.etc)).returncode == 0
    assert gateway.nginx("-s", "reload").returncode == 0
    # every new connection on the new config: an old worker may still accept one just after the first answer
    for _ in range(5):
        gateway.wait_config(gateway.live_id())
        time.sleep(0.2)
    return rc, out


@needs_nginx
def test_a_drained_instance_leaves_the_routing_until_undrained(gateway):
    undrained = gateway.live_id()
    drains = gateway.etc / "drains.json"
    drains.write_text(json.dumps({"drained": ["gw/alpha"]}))  # as a run of playbooks/drain.yml keeps it
    try:
        rc, out = reconfigure(gateway)
        assert rc == 0, out[-3000:]
        status, body = gateway.chat("chat")
        assert status == 200 and body["model"] == "tiny-b"
        status, body = gateway.chat("tiny-a")
        assert status == 503 and body["error"]["type"] == "overloaded_error"
        # a bad target changes nothing and names the rigs there are
        rc, out = playbook(gateway.tmp, gateway.inv, "-e", json.dumps({"llm_gateway_drain_targets": ["rig-z:x"]}))
        assert rc != 0 and "no rig 'rig-z' behind this gateway; rigs: gw, rig-b, rig-c" in out, out[-3000:]
        # undrained by name in this run: back in the routing table
        undrain = {"llm_gateway_drain_targets": ["gw"], "llm_gateway_drain_action": "undrain"}
        rc, out = reconfigure(gateway, "-e", json.dumps(undrain))
        assert rc == 0, out[-3000:]
        assert gateway.chat("chat")[1]["model"] == "tiny-a"
        # undrained, the set is the one before the drain, byte for byte
        assert gateway.live_id() == undrained
    finally:
        drains.unlink()
        if gateway.live_id() != undrained:  # the test failed half way: the set without the drain again
            assert reconfigure(gateway)[0] == 0
    assert gateway.chat("tiny-a")[0] == 200


@needs_nginx
def test_instances_the_health_feed_drained_are_routed_around_at_the_next_request(gateway):
    """The drained file of rigops-llm-gateway-health, read by gateway.js on every request (no reload)."""
    drained = gateway.tmp / "state" / "health" / "drained.json"
    drained.parent.mkdir(exist_ok=True)
    alpha_posts = len([s for s in gateway.up["alpha"].seen if s["method"] == "POST"])
    try:
        drained.write_text(json.dumps({"version": 1, "drained": ["gw/alpha"], "why": {}, "hosts": {}}))
        status, body = gateway.chat("chat")
        assert status == 200 and body["model"] == "tiny-b"
        status, body = gateway.chat("far")
        assert status == 200 and body["model"] == "big-r"
        # a name with no other hop: 503, in the shape clients read
        status, body = gateway.chat("tiny-a")
        assert (
            status == 503 and body["error"]["type"] == "overloaded_error" and "GPU health" in body["error"]["message"]
        )
        # alpha never saw one of them
        assert len([s for s in gateway.up["alpha"].seen if s["method"] == "POST"]) == alpha_posts
        log = [e for e in gateway.log() if e["model"] in ("chat", "far")][-2:]
        assert [e["target"] for e in log] == ["rig-b/beta", "remote:hosted"]
        # a file that cannot be read drains nothing (the feed fails open)
        drained.write_text("{not json")
        assert gateway.chat("chat")[1]["model"] == "tiny-a"
        drained.write_text(json.dumps({"drained": ["gw/alpha", "rig-b/beta"]}))
        assert gateway.chat("chat")[1]["model"] == "big-r"
    finally:
        drained.unlink()
    assert gateway.chat("chat")[1]["model"] == "tiny-a"
    assert gateway.chat("tiny-a")[0] == 200


def posts(up):
    return [s for s in up.seen if s["method"] == "POST"]


def replica_of(gateway, send):
    """Which replica of the pool answered the request ``send`` makes (one at a time): its status and name."""
    before = {n: len(posts(gateway.up[n])) for n in REPLICAS}
    status, body = send()
    grew = [n for n in REPLICAS if len(posts(gateway.up[n])) > before[n]]
    assert len(grew) <= 1, grew  # no request reaches two replicas
    return status, (grew[0] if grew else None)


def turn(gateway, session, turns, model="tiny-p", headers=None):
    """Turn ``turns`` of a conversation: the shared system prompt, its own first message, then growing."""
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"task {session}"}]
    for t in range(1, turns):
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"more {t}"}]
    body = {"model": model, "messages": messages, "max_tokens": 4}
    return replica_of(gateway, lambda: gateway.call("/v1/chat/completions", CLIENTS["dev"], body, headers=headers))


@needs_nginx
def test_a_pool_keeps_each_conversation_on_one_replica_and_spreads_them(gateway):
    """Policy session (the default): every turn of a conversation on the replica of its first turn, the
    conversations spread over the replicas; a client's x-session-id outweighs the messages; the replica's own
    key on each request, the client's never."""
    where = {}
    for session in range(24):
        for t in range(1, 4):
            status, replica = turn(gateway, session, t)
            assert status == 200 and replica is not None
            assert where.setdefault(session, replica) == replica, (session, t, where[session], replica)
    spread = {n: list(where.values()).count(n) for n in REPLICAS}
    assert all(spread.values()), spread
    for ident in ("alpha", "beta", "gamma"):
        seen = {turn(gateway, f"{ident}-{i}", 1, headers={"X-Session-Id": ident})[1] for i in range(6)}
        assert len(seen) == 1, (ident, seen)
    (answered,) = seen
    for n in REPLICAS:
        last = posts(gateway.up[n])[-1]["headers"]
        assert last["Authorization"] == f"Bearer {gateway.up[n].key}" and "X-Api-Key" not in last
    # the access log names the replica that answered (its socket is nginx's $upstream_addr)
    entry = [e for e in gateway.log() if e["model"] == "tiny-p"][-1]
    assert entry["target"] == f"rig-b/{answered}" and "/replicas/u" in entry["upstream"], entry
    # one socket per replica, in the folder the role's install makes for them (its mode: molecule/vllm_service)
    assert len(list((gateway.tmp / "state" / "replicas").glob("u*.sock"))) == len(REPLICAS)


@needs_nginx
def test_a_replica_leaving_moves_only_its_own_conversations(gateway):
    """Consistent hashing: the replica stopped, its conversations go to the others and no request fails; every
    other conversation stays where it was; once it is back (after llm_gateway_bench_seconds), so are its own."""
    where = {session: turn(gateway, session, 1)[1] for session in range(24)}
    leaving = max(REPLICAS, key=lambda n: list(where.values()).count(n))
    port = gateway.up[leaving].port
    gateway.up[leaving].stop()
    try:
        moved = {}
        for session, replica in where.items():
            status, now = turn(gateway, session, 2)
            assert status == 200 and now is not None and now != leaving, (session, status, now)
            if replica != leaving:
                assert now == replica, (session, replica, now)
            else:
                moved[session] = now
        assert moved and all(n != leaving for n in moved.values())
    finally:
        gateway.up[leaving].start(port)
    time.sleep(2.5)  # the bench (llm_gateway_bench_seconds: 2) is over: nginx tries the replica again
    assert {session: turn(gateway, session, 3)[1] for session in where} == where


@needs_nginx
def test_round_robin_least_busy_and_failover_pools(gateway):
    """round_robin takes the replicas in turn; least_busy sends streams in flight to the idle replicas; failover
    sends everything to the first replica in inventory order. Each alias asks the pool for its own model."""
    rr = [turn(gateway, i, 1, model="pool-rr") for i in range(6)]
    assert all(status == 200 for status, _n in rr) and sorted(n for _s, n in rr) == ["p1", "p1", "p2", "p2", "p3", "p3"]
    assert posts(gateway.up["p1"])[-1]["body"]["model"] == "tiny-p"
    before = {n: len(posts(gateway.up[n])) for n in REPLICAS}
    results = []

    def stream():
        body = {"model": "pool-least", "stream": True, "messages": [{"role": "user", "content": "the same prompt"}]}
        status, chunks = gateway.call("/v1/chat/completions", CLIENTS["dev"], body, stream=True)
        results.append((status, b"".join(chunks) if not isinstance(chunks, bytes) else chunks))

    threads = [threading.Thread(target=stream) for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)  # each in flight (0.6 s of chunks) when the next comes
    for thread in threads:
        thread.join(30)
    assert [status for status, _body in results] == [200, 200, 200] and all(b"[DONE]" in b for _s, b in results)
    assert {n: len(posts(gateway.up[n])) - before[n] for n in REPLICAS} == {"p1": 1, "p2": 1, "p3": 1}
    assert {turn(gateway, i, 1, model="pool-fail")[1] for i in range(5)} == {"p1"}


@needs_nginx
def test_a_replica_the_health_feed_drained_leaves_its_pool(gateway):
    """The health feed drains one replica: the pool gives way to its replicas' own hops, the drained one skipped;
    every replica drained, the alias goes on to its next target."""
    drained = gateway.tmp / "state" / "health" / "drained.json"
    drained.parent.mkdir(exist_ok=True)
    try:
        drained.write_text(json.dumps({"drained": ["rig-b/p1"]}))
        assert {turn(gateway, session, 1)[1] for session in range(8)} == {"p2"}
        drained.write_text(json.dumps({"drained": ["rig-b/p1", "rig-b/p2", "rig-b/p3"]}))
        status, replica = turn(gateway, 0, 1, model="pool-fail")
        assert status == 200 and replica is None
        assert gateway.log()[-1]["target"] == "remote:hosted"
    finally:
        drained.unlink()
    assert len({turn(gateway, session, 1)[1] for session in range(12)}) > 1


# --------------------------------------------------------------------------- usage per client and budgets

USAGE_SCRIPT = ROLE / "files" / "rigops-llm-gateway-usage"


def usage_service(gateway, tmp):
    """rigops-llm-gateway-usage laid out as the role installs it, with its config for this gateway (the usage
    folder nginx writes, the budgets of the inventory as the table gives them)."""
    home = tmp / "usage-service"
    package = home / "ansible_collections/rigops/fleet/plugins/module_utils"
    package.mkdir(parents=True)
    shutil.copy(USAGE_SCRIPT, home / USAGE_SCRIPT.name)
    for name in ("llm_gateway_usage", "state_file"):
        shutil.copy(ROOT / f"plugins/module_utils/{name}.py", package / f"{name}.py")
    folder = gateway.tmp / "state" / "usage"
    budgets = {c["name"]: c["tokens_per_day"] for c in
               gateway.inv["all"]["children"]["gateways"]["hosts"]["gw"]["llm_gateway_clients"]
               if c.get("tokens_per_day")}  # fmt: skip
    config = {"interval": 1, "keep_days": 30, "usage_dir": str(folder), "spent_file": str(folder / "spent.json"),
              "textfile": str(home / "usage.prom"), "budgets": budgets}  # fmt: skip
    (home / "usage.json").write_text(json.dumps(config))

    def run(*args):
        res = subprocess.run([sys.executable, str(home / USAGE_SCRIPT.name), *args, "--config",
                              str(home / "usage.json")], capture_output=True, text=True, check=False,
                             env={"PATH": os.environ["PATH"]})  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res.stdout

    return home, folder, run


def usage_today(run):
    rows = json.loads(run("report", "--json"))["rows"]
    return {(r["client"], r["model"]): r for r in rows}


@needs_nginx
def test_usage_of_plain_and_streamed_answers_is_counted_exactly(gateway, tmp_path):
    home, folder, run = usage_service(gateway, tmp_path)
    run("once")
    before = usage_today(run)
    alpha = gateway.up["alpha"]
    alpha.usage.clear()
    key = CLIENTS["limited"]
    assert gateway.chat("tiny-a", key=key)[1]["usage"]["completion_tokens"] == 1
    message = {"model": "tiny-a", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}
    assert gateway.call("/v1/messages", key, message)[1]["usage"]["output_tokens"] == 1
    chat = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "a b c"}]}
    # a stream whose client did not ask for usage: the gateway asked, counted it, and took the chunk out
    status, lines = gateway.call("/v1/chat/completions", key, chat, stream=True)
    events = [raw.decode().strip()[5:].strip() for raw in lines if raw.decode().startswith("data:")]
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 4
    assert not any('"usage"' in e for e in events), events
    assert alpha.seen[-1]["body"]["stream_options"] == {"include_usage": True}
    # a stream whose client asked: its usage chunk reaches it whole (sent in two pieces by the upstream)
    asked = dict(chat, stream_options={"include_usage": True})
    status, lines = gateway.call("/v1/chat/completions", key, asked, stream=True)
    events = [raw.decode().strip()[5:].strip() for raw in lines if raw.decode().startswith("data:")]
    assert status == 200 and len(events) == 5 and json.loads(events[-2])["usage"]["completion_tokens"] == 3
    # a client that closes on [DONE], before the upstream's stream ends (the OpenAI SDK does): counted too
    alpha.end_delay = 0.5
    try:
        tls = ssl.create_default_context(cafile=str(gateway.etc / "tls" / "ca.pem"))
        conn = http_client.HTTPSConnection("127.0.0.1", gateway.ports["gateway"], timeout=30, context=tls)
        conn.request("POST", "/v1/chat/completions", json.dumps(asked),
                     {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        while b"[DONE]" not in resp.readline():
            pass
        conn.close()
        time.sleep(1)
    finally:
        alpha.end_delay = 0.0
    # nginx writes each line as the request ends; the service sums them
    run("once")
    after = usage_today(run)
    sent = {"tiny-a": alpha.usage[:2], "chat": alpha.usage[2:]}
    assert len(alpha.usage) == 5
    for model, answers in sent.items():
        old = before.get(("limited", model), {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0})
        new = after[("limited", model)]
        assert new["requests"] - old["requests"] == len(answers), (model, new, old)
        assert new["prompt_tokens"] - old["prompt_tokens"] == sum(p for p, _ in answers), (model, new, old)
        assert new["completion_tokens"] - old["completion_tokens"] == sum(c for _, c in answers), (model, new)
    # the day's log holds no key, no prompt; the counters and the table name the client
    day = next(folder.glob("*.jsonl")).read_text()
    for secret in [PROMPT, "hello there", *CLIENTS.values(), *KEYS.values()]:
        assert secret not in day
    prom = (home / "usage.prom").read_text()
    total = after[("limited", "chat")]["completion_tokens"]
    assert f'rigops_llm_gateway_completion_tokens_total{{client="limited",model="chat"}} {total}' in prom
    assert 'rigops_llm_gateway_budget_tokens{client="capped"} 60' in prom
    table = run("report", "--since", "1")
    assert re.search(r"^limited\s+chat\s+\d+", table, re.M), table
    # a second round reads nothing twice
    run("once")
    assert usage_today(run) == after


@needs_nginx
def test_a_spent_budget_is_429_until_the_day_ends_and_through_a_reload(gateway, tmp_path):
    home, folder, run = usage_service(gateway, tmp_path)
    key = CLIENTS["capped"]
    for _ in range(4):  # each asks for more than 15 prompt tokens: 60 a day are spent
        assert gateway.chat("tiny-a", key=key)[0] == 200
    run("once")
    spent = json.loads((folder / "spent.json").read_text())
    assert spent["spent"]["capped"]["budget"] == 60 and spent["spent"]["capped"]["used"] >= 60
    status, headers, payload = gateway.client("POST", "/v1/chat/completions", body={"model": "tiny-a", "messages": []},
                                              headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    body = json.loads(payload)
    assert status == 429 and body["error"]["type"] == "insufficient_quota", body
    assert "60 tokens a day, is spent" in body["error"]["message"] and spent["resets_at"] in body["error"]["message"]
    retry = int({k.lower(): v for k, v in headers.items()}["retry-after"])
    assert 0 < retry <= 86400
    status, body = gateway.call("/v1/messages", body=MESSAGE, headers={"x-api-key": key})
    assert status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    assert gateway.chat("tiny-a")[0] == 200  # another key is not touched
    # nginx reloaded: the budget still holds (it is a file)
    assert gateway.nginx("-s", "reload").returncode == 0
    time.sleep(1)
    assert gateway.chat("tiny-a", key=key)[0] == 429
    # a spent file of a day that ended refuses nobody (the service stopped before it wrote the new day's)
    (folder / "spent.json").write_text(json.dumps(dict(spent, until=int(time.time()) - 1)))
    assert gateway.chat("tiny-a", key=key)[0] == 200
    (folder / "spent.json").write_text(json.dumps(dict(spent, spent={})))


def test_the_config_sets_tool(tmp_path):
    """seal, same, promote, mark-good, restore: what tasks/run.yml does with the sets (no nginx needed)."""
    etc = tmp_path / "etc"
    (etc / "staging").mkdir(parents=True)

    def stage(text):
        for name in ("nginx.conf", "gateway.js", "cert.pem", "key.pem"):
            (etc / "staging" / name).write_text(f"{name} {text}\n")
        return tool("seal", str(etc / "staging")).stdout.split()

    ident, state = stage("one")
    assert state == "changed" and len(ident) == 16
    assert (etc / "staging" / "config_id.conf").read_text() == f'js_var $llm_config_id "{ident}";\n'
    assert stage("one") == [ident, "kept"]
    assert tool("same", str(etc / "staging"), str(etc / "live")).returncode == 1
    assert tool("restore", str(etc)).returncode == 3  # nothing good yet
    assert tool("promote", str(etc)).returncode == 0 and tool("mark-good", str(etc)).returncode == 0
    assert tool("same", str(etc / "staging"), str(etc / "live")).returncode == 0
    two = stage("two")[0]
    assert two != ident and tool("promote", str(etc)).returncode == 0
    assert (etc / "live" / "config_id").read_text().strip() == two
    assert tool("restore", str(etc)).returncode == 0
    assert (etc / "live" / "config_id").read_text().strip() == ident
    assert (etc / "rejected" / "config_id").read_text().strip() == two
    for folder in ("live", "last-good", "rejected"):
        assert (etc / folder).stat().st_mode & 0o777 == 0o700
        assert all(f.stat().st_mode & 0o777 == 0o600 for f in (etc / folder).iterdir())
    assert sorted(p.name for p in etc.iterdir()) == ["last-good", "live", "rejected", "staging"]
    assert tool("bogus").returncode == 2


# --------------------------------------------------------------------------- lab/measure/gateway.py (no host)


def _bench():
    """lab/measure/gateway.py and its helper, registered like tests/unit/test_benchmarks.py does."""
    for name, module in (("_sandbox", "_sandbox"), ("gateway", "bench_gateway")):
        if module not in sys.modules:
            spec = importlib.util.spec_from_file_location(module, ROOT / "lab" / "measure" / f"{name}.py")
            sys.modules[module] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[module])
    return sys.modules["bench_gateway"]


def test_benchmark_ratios_table_and_arguments():
    bench = _bench()
    results = {
        "direct": {"1": {"requests": 100, "errors": 0, "rps": 20.0, "median_ms": 50.2, "p90_ms": 51.0},
                   "8": {"requests": 0, "errors": 9, "rps": 0.0, "median_ms": None, "p90_ms": None}},
        "gateway": {"1": {"requests": 99, "errors": 0, "rps": 19.5, "median_ms": 50.9, "p90_ms": 52.0},
                    "8": {"requests": 10, "errors": 0, "rps": 1.0, "median_ms": 60.0, "p90_ms": 61.0}},
    }  # fmt: skip
    assert bench.ratios(results) == {"1": {"added_median_ms": 0.7, "throughput_ratio": 0.975}}
    text = bench.format_results(results, "local", False, 50)
    assert "answering after 50 ms" in text
    assert "concurrency 1: +0.700 ms median (goal <= 1.0 ms), throughput 0.975x direct (goal >= 0.95x): met" in text
    assert re.search(r"^ +8  direct +- +- +0.0 +9$", text, re.M)
    args = bench.parse_args(["--where", "local", "--concurrency", "32,1", "--upstream-ms", "50"])
    assert args.concurrency == [1, 32] and args.where == "local" and args.upstream_ms == 50
    for bad in (["--concurrency", "0"], ["--seconds", "0"], ["--where", "moon"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    # its sandbox host's SSH port is its own
    used = set()
    for path in [*ROOT.glob("molecule/*/molecule.yml"), ROOT / "inventories" / "sandbox" / "hosts.yml"]:
        used |= {int(p) for p in re.findall(r"(?:port|ansible_port):\s*(\d+)", path.read_text())}
    assert bench.HOST[2] not in used | set(range(2381, 2389)) | set(range(2391, 2395)) | {2355, 2356, 2357, 2358}
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "measure" / "gateway.py"), "--help"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.startswith("usage:")


def test_the_example_gateway_names_only_what_the_example_inventory_serves():
    """inventories/example/group_vars/gateways: every alias target and client model is served by the example's
    rigs and Jetson (their instances bound to their own address, as that file's comment asks) or its remote."""
    settings = yaml.safe_load((ROOT / "inventories/example/group_vars/gateways/llm_gateway.yml").read_text())
    vault = iter(f"vault-placeholder-{i:02d}-0123456789abcdef0123456789" for i in range(100))

    def unvault(value):
        if isinstance(value, str) and "{{" in value:
            return next(vault)
        if isinstance(value, dict):
            return {k: unvault(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unvault(v) for v in value]
        return value

    settings = unvault(settings)
    hosts = {}
    for group, host, address in (("rtx5090", "rig-5090-01", "10.0.10.11"), ("h100", "h100-01", "10.0.10.21"),
                                 ("jetson", "thor-01", "10.0.20.31")):  # fmt: skip
        instances = yaml.safe_load((ROOT / f"inventories/example/group_vars/{group}/vllm_instances.yml").read_text())
        hosts[host] = {
            "ansible_host": address,
            "vllm_instances": [dict(i, host=address) for i in instances["vllm_instances"]],
        }
    backends = gw.backends(list(hosts), hosts, "gw-01")
    spec_ = {"backends": backends, "remotes": settings["llm_gateway_remotes"],
             "aliases": settings["llm_gateway_aliases"], "clients": settings["llm_gateway_clients"],
             "gateway_port": settings["llm_gateway_port"],
             "keys_present": [i["ref"] for b in backends for i in b["instances"]]}  # fmt: skip
    assert gw.problems(spec_) == []
    routes = {r["name"]: [h["label"] for h in r["hops"] if not h["solo_of"]] for r in gw.table(spec_)["routes"]}
    assert routes["chat"] == ["session:rig-5090-01/main+h100-01/chat", "thor-01/text", "remote:hosted"]
    assert set(settings["llm_gateway_gate_skip"]) <= set(routes)
    # bound to loopback (the example's default today), the rigs are refused with the fix
    loopback = {h: dict(v, vllm_instances=yaml.safe_load(
        (ROOT / f"inventories/example/group_vars/{g}/vllm_instances.yml").read_text())["vllm_instances"])
        for (h, v), g in zip(hosts.items(), ("rtx5090", "h100", "jetson"), strict=True)}  # fmt: skip
    refused = gw.problems(dict(spec_, backends=gw.backends(list(loopback), loopback, "gw-01")))
    assert len(refused) == 5 and all("vllm_service_allow_remote_bind" in p for p in refused)


def x509(path):
    """basicConstraints CA, extended key usages and subject alternative names of a PEM certificate."""
    from cryptography import x509 as cx
    from cryptography.x509.oid import ExtensionOID

    cert = cx.load_pem_x509_certificate(Path(path).read_bytes())
    ext = {e.oid: e.value for e in cert.extensions}
    san = ext.get(ExtensionOID.SUBJECT_ALTERNATIVE_NAME)
    usage = ext.get(ExtensionOID.EXTENDED_KEY_USAGE)
    return {
        "ca": ext[ExtensionOID.BASIC_CONSTRAINTS].ca,
        "san": sorted(str(v.value) for v in san) if san else [],
        "usage": [u._name for u in usage] if usage else [],
        "issuer": cert.issuer.rfc4514_string(),
        "subject": cert.subject.rfc4514_string(),
    }


@needs_nginx
def test_the_gateway_serves_a_leaf_its_own_ca_signed(gateway):
    """Given no certificate, the role makes a CA and a server certificate it signs: rustls clients (Codex)
    refuse a server certificate that is its own CA. The served chain verifies against ca.pem; the keys are
    root only; a rerun keeps both; a gateway from before the CA (a lone self-signed cert.pem) gets both. (Last in
    the file: the pair it leaves is not the one the gateway serves.)"""
    tls = gateway.etc / "tls"
    ca, leaf = x509(tls / "ca.pem"), x509(tls / "cert.pem")
    assert ca["ca"] is True and leaf["ca"] is False and leaf["usage"] == ["serverAuth"]
    assert leaf["issuer"] == ca["subject"] != leaf["subject"] and "127.0.0.1" in leaf["san"]
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(tls / "ca.pem"), str(tls / "cert.pem")],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for name, mode in (("ca-key.pem", 0o600), ("key.pem", 0o600), ("ca.pem", 0o644), ("cert.pem", 0o644)):
        assert (tls / name).stat().st_mode & 0o777 == mode, name
    # what a client sees on the wire: the leaf, checked against the CA alone
    assert gateway.chat("tiny-a")[0] == 200
    before = {name: (tls / name).read_bytes() for name in ("ca.pem", "cert.pem")}
    rc, out = playbook(gateway.tmp, gateway.inv)
    assert rc == 0, out[-3000:]
    assert {name: (tls / name).read_bytes() for name in before} == before
    # the upgrade: tls/ as the role left it before the CA
    for name in ("ca.pem", "ca-key.pem"):
        (tls / name).unlink()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(tls / "key.pem"), "-out", str(tls / "cert.pem")],
                   check=True, capture_output=True)  # fmt: skip
    rc, out = playbook(gateway.tmp, gateway.inv)
    assert rc == 0, out[-3000:]
    again = x509(tls / "cert.pem")
    assert again["ca"] is False and again["issuer"] == x509(tls / "ca.pem")["subject"]
    assert (tls / "ca.pem").read_bytes() != before["ca.pem"] and (tls / "ca-key.pem").stat().st_mode & 0o777 == 0o600
