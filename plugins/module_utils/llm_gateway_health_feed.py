# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The LLM gateway's health feed: the rig instances the gateway routes around because the GPU health sentinel
of their rig (role gpu_health, ``GET /state``) says they may not take traffic (``routable`` false).

The llm_gateway role writes the feed's config: for each rig behind the gateway whose sentinel it reads, the
URL of its state and the instances the gateway routes to there. The service ``rigops-llm-gateway-health``
calls :func:`poll` every interval and writes the document it returns to the drained file, which the
gateway's request logic (gateway.js) reads on every request: a drained instance is skipped and the name goes
to its next hop (an alias's fallback); a name whose every hop is drained answers 503.

Fail open: a sentinel that does not answer, answers something else than a state, or whose state is older
than ``STALE_INTERVALS`` of its own rounds (it stopped) drains nothing of its rig. The gateway's passive
health still benches an upstream that refuses or fails requests; a rig that is down is no GPU verdict.

Host side: Python 3.8 and the standard library only.
"""

import http.client
import json
import urllib.parse

FEED_VERSION = 1
# A state older than this many of the sentinel's rounds is stale: the sentinel stopped renewing it.
STALE_INTERVALS = 3
CONFIG_KEYS = ("interval", "timeout", "drained_file", "sources")


def check_config(config):
    """Problems of a feed config (the role writes it; a hand edit may break it)."""
    if not isinstance(config, dict):
        return ["config: not a JSON object"]
    problems = [f"config: {key} missing" for key in CONFIG_KEYS if key not in config]
    for key in ("interval", "timeout"):
        value = config.get(key)
        if key in config and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
            problems.append(f"config: {key} must be a number of seconds above 0, got {value!r}")
    for i, source in enumerate(config.get("sources") or []):
        if not (
            isinstance(source, dict)
            and isinstance(source.get("host"), str)
            and isinstance(source.get("url"), str)
            and source["url"].startswith(("http://", "https://"))
            and isinstance(source.get("instances"), list)
        ):
            problems.append(f"config: sources[{i}] must be {{host, url (http:// or https://), instances: [names]}}")
    return problems


def fetch_state(url, timeout):
    """(the sentinel's state, None) or (None, why not).

    http.client rather than urllib.request, whose use ansible-test asks to replace with Ansible's open_url: this
    runs on the gateway host outside Ansible, with the standard library only."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = connection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return None, f"HTTP {resp.status}"
        return json.loads(body.decode("utf-8")), None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return None, str(exc) or type(exc).__name__
    finally:
        conn.close()


def _shape_ok(state):
    return (
        isinstance(state, dict)
        and isinstance(state.get("instances"), dict)
        and isinstance(state.get("age_seconds"), (int, float))
        and isinstance(state.get("interval"), (int, float))
    )


def poll(sources, fetch, timeout=3.0):
    """The feed's document from one round over ``sources``: drained refs (``host/instance``), why each is
    drained, and each rig's status (ok, unreachable, bad, stale)."""
    drained, why, hosts = [], {}, {}
    for source in sources:
        host = source["host"]
        state, error = fetch(source["url"], timeout)
        if error is not None:
            hosts[host] = {"status": "unreachable", "detail": f"{source['url']}: {error}"}
            continue
        if not _shape_ok(state):
            hosts[host] = {"status": "bad", "detail": f"{source['url']}: not a GPU health state"}
            continue
        if state["age_seconds"] > STALE_INTERVALS * state["interval"]:
            hosts[host] = {
                "status": "stale",
                "detail": "state {:.0f} s old, rounds every {} s: the sentinel stopped".format(
                    state["age_seconds"], state["interval"]
                ),
            }
            continue
        hosts[host] = {"status": "ok", "detail": ""}
        for name in source["instances"]:
            verdict = state["instances"].get(name)
            if isinstance(verdict, dict) and verdict.get("routable") is False:
                ref = f"{host}/{name}"
                drained.append(ref)
                why[ref] = {
                    "unhealthy_gpus": verdict.get("unhealthy_gpus") or [],
                    "findings": [f.get("detail", "") for f in verdict.get("findings") or [] if isinstance(f, dict)],
                    "healthy_streak": verdict.get("healthy_streak", 0),
                }
    return {"version": FEED_VERSION, "drained": sorted(drained), "why": why, "hosts": hosts}


def changes(before, after):
    """Lines for the journal: what this round drained, put back, or could not read, against the last round."""
    before = before or {"drained": [], "hosts": {}}
    lines = []
    for ref in after["drained"]:
        if ref not in before.get("drained", []):
            detail = after["why"][ref]
            lines.append(
                "drained {}: GPU(s) {} unhealthy: {}".format(
                    ref, ", ".join(detail["unhealthy_gpus"]) or "?", "; ".join(detail["findings"]) or "no detail"
                )
            )
    lines += [
        f"back in service {ref}: healthy again" for ref in before.get("drained", []) if ref not in after["drained"]
    ]
    for host, status in sorted(after["hosts"].items()):
        was = (before.get("hosts") or {}).get(host, {}).get("status")
        if status["status"] != was and (status["status"] != "ok" or was is not None):
            lines.append(f"{host}: {status['status']}" + (f" ({status['detail']})" if status["detail"] else ""))
    return lines
