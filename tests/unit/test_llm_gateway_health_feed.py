"""The LLM gateway's health feed (module_utils llm_gateway_health_feed): what it drains from the sentinels'
states, and where it fails open. The feed against a real sentinel's GET /state, and the script as the role
installs it: tests/unit/test_gpu_health_sentinel.py; the drained file read by the real gateway:
tests/unit/test_llm_gateway.py."""

from __future__ import annotations

import pytest
from ansible_collections.rigops.fleet.plugins.filter import llm_gateway as gw
from ansible_collections.rigops.fleet.plugins.module_utils import llm_gateway_health_feed as feed

SICK = {
    "routable": False,
    "healthy": False,
    "healthy_streak": 0,
    "unhealthy_gpus": ["0000:01:00.0"],
    "findings": [{"detail": "Xid 79: GPU has fallen off the bus", "severity": "critical"}],
}
WELL = {"routable": True, "healthy": True, "healthy_streak": 9, "unhealthy_gpus": [], "findings": []}


def state(age=1.0, interval=5, **instances):
    return {"version": 1, "age_seconds": age, "interval": interval, "healthy": True, "instances": instances}


def fetcher(answers):
    def fetch(url, timeout):
        answer = answers[url]
        return (None, answer) if isinstance(answer, str) else (answer, None)

    return fetch


SOURCES = [
    {"host": "rig-a", "url": "http://a:9402/state", "instances": ["chat", "code"]},
    {"host": "rig-b", "url": "http://b:9402/state", "instances": ["chat"]},
]


def test_only_instances_their_sentinel_calls_unroutable_are_drained():
    doc = feed.poll(
        SOURCES,
        fetcher({"http://a:9402/state": state(chat=SICK, code=WELL), "http://b:9402/state": state(chat=WELL)}),
    )
    assert doc["drained"] == ["rig-a/chat"]
    assert doc["why"]["rig-a/chat"]["unhealthy_gpus"] == ["0000:01:00.0"]
    assert doc["why"]["rig-a/chat"]["findings"] == ["Xid 79: GPU has fallen off the bus"]
    assert {h: s["status"] for h, s in doc["hosts"].items()} == {"rig-a": "ok", "rig-b": "ok"}


def test_healthy_but_not_yet_recovered_stays_drained_and_unknown_instances_are_not():
    recovering = dict(SICK, healthy=True, healthy_streak=1, unhealthy_gpus=[], findings=[])
    doc = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": state(chat=recovering)}))
    # code has no GPU the sentinel watches: it is not in the state, and is not drained
    assert doc["drained"] == ["rig-a/chat"] and doc["why"]["rig-a/chat"]["healthy_streak"] == 1


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        ("connection refused", "unreachable"),
        ({"instances": {"chat": SICK}}, "bad"),  # no age, no interval
        (["not", "a", "state"], "bad"),
        (state(age=16, interval=5, chat=SICK), "stale"),  # more than 3 rounds old: the sentinel stopped
    ],
)
def test_a_sentinel_that_cannot_be_believed_drains_nothing(answer, status):
    doc = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": answer}))
    assert doc["drained"] == [] and doc["hosts"]["rig-a"]["status"] == status
    assert doc["hosts"]["rig-a"]["detail"]


def test_state_three_rounds_old_is_still_believed():
    doc = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": state(age=15, interval=5, chat=SICK)}))
    assert doc["drained"] == ["rig-a/chat"]


def test_changes_name_what_was_drained_put_back_or_lost():
    first = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": state(chat=SICK)}))
    assert feed.changes(None, first) == [
        "drained rig-a/chat: GPU(s) 0000:01:00.0 unhealthy: Xid 79: GPU has fallen off the bus"
    ]
    assert feed.changes(first, first) == []
    lost = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": "timed out"}))
    assert feed.changes(first, lost) == [
        "back in service rig-a/chat: healthy again",
        "rig-a: unreachable (http://a:9402/state: timed out)",
    ]
    back = feed.poll(SOURCES[:1], fetcher({"http://a:9402/state": state(chat=WELL)}))
    assert feed.changes(lost, back) == ["rig-a: ok"]


def test_config_check_names_each_bad_key():
    assert feed.check_config({"interval": 5, "timeout": 3, "drained_file": "/x", "sources": SOURCES}) == []
    problems = feed.check_config({"interval": 0, "timeout": True, "sources": [{"host": "a", "url": "ftp://x"}]})
    assert problems == [
        "config: drained_file missing",
        "config: interval must be a number of seconds above 0, got 0",
        "config: timeout must be a number of seconds above 0, got True",
        "config: sources[0] must be {host, url (http:// or https://), instances: [names]}",
    ]
    assert feed.check_config([]) == ["config: not a JSON object"]


def backend(host, *names, same_host=False, address=None):
    return {
        "host": host,
        "address": address or f"10.0.0.{len(host)}",
        "same_host": same_host,
        "instances": [{"name": n, "ref": f"{host}/{n}"} for n in names],
    }


def test_sources_from_the_routing_tables_rigs():
    entries = [
        backend("gw", "alpha", same_host=True),
        backend("rig-b", "beta", address="fd00::2"),
        backend("rig-c", "gamma"),  # its sentinel serves nothing (gpu_health_port 0)
        backend("orin-1", "edge"),  # not in the sentinels' groups
        backend("rig-d"),  # every instance drained by hand: nothing to read
    ]
    hostvars = {"rig-c": {"gpu_health_port": 0}, "rig-b": {"gpu_health_port": 9500}}
    sources = gw.health_sources(entries, ["gw", "rig-b", "rig-c", "rig-d"], hostvars, 9402)
    assert sources == [
        {"host": "gw", "url": "http://127.0.0.1:9402/state", "instances": ["alpha"]},
        {"host": "rig-b", "url": "http://[fd00::2]:9500/state", "instances": ["beta"]},
    ]


def test_the_gate_does_not_send_a_chat_where_every_hop_is_drained():
    tbl = {
        "routes": [
            {"name": "tiny-a", "hops": [{"refs": ["gw/alpha"]}]},
            {"name": "chat", "hops": [{"refs": ["gw/alpha"]}, {"refs": ["rig-b/beta"]}]},
            {"name": "far", "hops": [{"refs": ["gw/alpha"]}, {"refs": ["remote:big"]}]},
        ]
    }
    plan = gw.gate_plan(tbl, down=["remote:big"], drained=["gw/alpha"])
    assert plan == [
        {"name": "tiny-a", "gate": False, "why": "drained by GPU health: gw/alpha"},
        {"name": "chat", "gate": True, "why": ""},
        {"name": "far", "gate": False, "why": "unreachable: gw/alpha, remote:big"},
    ]
