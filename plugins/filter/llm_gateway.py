# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The LLM gateway's routing table, built on the controller from the inventory (roles/llm_gateway).

Plain functions with plain data in and out (unit-tested in tests/unit/test_llm_gateway.py),
exposed as filters:

- ``hosts | rigops.fleet.gateway_backends(hostvars, gateway, addresses)``: every rig instance the
  gateway routes to, key-free: ``[{host, address, address_given, same_host, instances: [{name,
  port, bind, served_name, require_key, ref, connect, problem}]}]``;
- ``hosts | rigops.fleet.gateway_failed_hosts(hostvars)``: the rigs that failed a stage of this run or
  were stopped (left out of the routing table);
- ``backends | rigops.fleet.gateway_drain(drained, part)``: the backends without the drained rigs and
  instances (``part`` kept), or only those (``part`` drained); ``drained`` lists ``host`` and
  ``host/instance`` refs, as the gateway's drains file records them (playbooks/drain.yml);
- ``targets | rigops.fleet.gateway_drain_targets(backends)``: ``{refs, problems}`` of operator targets
  ``HOST`` or ``HOST:INSTANCE`` against the rigs' instances;
- ``recorded | rigops.fleet.gateway_drains_update(action, targets)``: the drained refs after this run;
- ``backends | rigops.fleet.gateway_key_reads(hostvars)``: the key files the play still has to read
  on the rigs (instances whose key neither the ``vllm_service_keys`` fact nor the inventory gives);
- ``backends | rigops.fleet.gateway_upstream_keys(hostvars, slurped, remotes)``: ``{ref: key}`` of
  every upstream (rig instances and remotes), for the task that renders the config (no_log);
- ``spec | rigops.fleet.gateway_problems``: every reason to refuse the gateway's settings, each a line
  that says what is wrong and how to fix it (never a key's value);
- ``spec | rigops.fleet.gateway_table``: the routing table the templates render (no key in it; client
  keys only as sha256 hex digests);
- ``table | rigops.fleet.gateway_js``: the table as the JSON literal the njs module embeds (ASCII only);
- ``table | rigops.fleet.gateway_gate_plan(down)``: which names the gate sends a chat to, and which it
  skips because every upstream of the name is unreachable from the gateway;
- ``table | rigops.fleet.gateway_summary(url, ...)``: what the report and the client settings need;
- ``names | rigops.fleet.gateway_san``: the subjectAltName of the certificate the gateway's own CA signs;

``spec`` is ``{backends, excluded_backends, remotes, aliases, clients, settings, health_hash,
keys_present, gateway_port}``. A name served only by rigs left out of the run (excluded, or
failed in an earlier stage) stays known and answers 503 until they are back.

Names clients ask for:

- every served name of a rig instance: several instances serving one name form a pool, spread by the
  name's policy (``POLICIES``; ``settings.policies``, else ``settings.default_policy``);
- every model of a remote (``llm_gateway_remotes[].models``) that no rig serves;
- every alias (``llm_gateway_aliases``): an ordered fallback list of those names and of
  ``remote:<model>`` (that remote model, even when a rig serves the same name); a name of the list
  served by several instances is their pool, spread by the alias's policy.

A pool is an nginx upstream group of its replicas, balanced by nginx itself (``hash ... consistent``,
``least_conn``, round robin). Each replica's key goes in on the way out of the pool: the group's servers are
the gateway's own unix sockets, one per replica, each a server of nginx.conf that sets the replica's key and
passes the request on (nginx builds a request's headers before it picks the server, so a group cannot
give each server a key of its own). A pool hop keeps, behind it, its replicas as plain hops in inventory
order: the route of the requests the health feed finds a replica of the pool drained for.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import re
from urllib.parse import urlsplit

from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import filter_errors as _filter
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain

HEALTH_CLIENT = "rigops-health"
CLIENT_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9_.-]{0,62}\Z")
REMOTE_NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9-]{0,62}\Z")
# RFC 6750 b64token: what an `Authorization: Bearer` header carries. Nothing else can be written
# into an nginx string literal safely either (no quote, backslash, `$`, `;`, brace or space).
TOKEN_RE = re.compile(r"\A[A-Za-z0-9._~+/-]+=*\Z")
RATE_RE = re.compile(r"\A([1-9][0-9]{0,6})r/([sm])\Z")
CLIENT_KEY_MIN = 32
REMOTE_KEY_MIN = 16
KEY_MAX = 512
CLIENT_KEYS = ("name", "key", "models", "rate", "burst", "tokens_per_day")
REMOTE_KEYS = ("name", "base_url", "key", "models", "allow_http", "ca_file")
REMOTE_PREFIX = "remote:"
# How a pool (several instances serving one name) spreads requests, and the nginx directive that does it:
# session: the same conversation on the same replica (vLLM's prefix cache stays warm), by consistent hashing
# of $llm_session (gateway.js: the client's x-session-id, else the system prompt and first user message);
# least_busy: the replica with the fewest requests in flight; round_robin: in turn; failover: the first
# replica in inventory order, the next only when it fails (no pool).
POLICIES = {"session": "hash $llm_session consistent", "least_busy": "least_conn", "round_robin": "", "failover": None}
WILDCARDS = ("0.0.0.0", "::")


def _hostvar(hostvars, host, name, default=None):
    try:
        value = hostvars[host].get(name, default)
    except (KeyError, AttributeError):
        return default
    return _plain(value) if value is not None else default


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def token_problem(key, minimum):
    """What is wrong with a Bearer key (never quoting it), or None."""
    if not isinstance(key, str) or key == "":
        return "is missing"
    if len(key) < minimum:
        return f"is shorter than {minimum} characters (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
    if len(key) > KEY_MAX:
        return f"is longer than {KEY_MAX} characters"
    if not TOKEN_RE.match(key):
        return (
            "holds characters a Bearer token cannot carry (RFC 6750 b64token: letters, digits and - . _ ~ + / "
            "with = only at the end)"
        )
    return None


def _is_loopback(address):
    return schema.is_loopback(address)


def _hostport(address, port):
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _address_ok(address):
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return bool(re.match(r"\A[A-Za-z0-9.-]+\Z", address or ""))


# --------------------------------------------------------------------------- rig instances


def backends(hosts, hostvars, gateway, addresses=None):
    """The rig instances of ``hosts``, as the gateway on host ``gateway`` reaches them (key-free).

    The address of a rig: ``addresses[host]`` (the gateway's llm_gateway_upstream_addresses),
    else the rig's ``llm_gateway_upstream_address``, else its ``ansible_host``, else its name.
    An instance of the gateway's own host is reached on loopback. ``problem`` says why an
    instance cannot be reached (bound to loopback on another host, ...).
    """
    addresses = _plain(addresses or {})
    out = []
    for host in [str(h) for h in _plain(hosts or [])]:
        given = addresses.get(host) or _hostvar(hostvars, host, "llm_gateway_upstream_address")
        address = str(given or _hostvar(hostvars, host, "ansible_host") or host)
        same = host == str(gateway)
        entry = {
            "host": host,
            "address": address,
            "address_given": bool(given),
            "same_host": same,
            "instances": [],
            "problem": None,
        }
        try:
            instances = _instances_of(hostvars, host)
        except ValueError as exc:
            entry["problem"] = f"{host}: {exc}"
            out.append(entry)
            continue
        for inst in instances:
            if not isinstance(inst.get("name"), str):
                entry["problem"] = f"{host}: an instance of vllm_instances has no name (docs/instances.md)"
                continue
            model, security = inst["model"], inst["security"]
            bind = str(inst.get("host") or "127.0.0.1")
            item = {
                "name": inst["name"],
                "ref": f"{host}/{inst['name']}",
                "port": inst.get("port"),
                "bind": bind,
                "served_name": model.get("served_name") or inst["name"],
                "require_key": security.get("require_key", True) is not False,
                "connect": None,
                "problem": None,
            }
            item["connect"], item["problem"] = _connect(host, address, bool(given), same, bind, item, str(gateway))
            entry["instances"].append(item)
        out.append(entry)
    return out


def drain(entries, drained, part="kept"):
    """The backends without what ``drained`` names (``part`` kept), or with only that (``part`` drained).

    ``drained``: refs ``host`` (every instance of the rig: a drain by hand, or a rig of
    llm_gateway_exclude_hosts) and ``host/instance``. A drained instance is left out of the routing
    table: its names stay known, an alias goes on to its next target. A rig drained whole is out with
    its problems (an address the gateway cannot reach is no reason to refuse the run that leaves it out).
    """
    if part not in ("kept", "drained"):
        raise ValueError(f"part must be kept or drained, not {part!r}")
    drained = {str(d) for d in _plain(drained or [])}
    out = []
    for entry in _plain(entries or []):
        whole = entry["host"] in drained
        chosen = [i for i in entry["instances"] if (whole or i["ref"] in drained) == (part == "drained")]
        if chosen or (part == "kept" and entry.get("problem") and not whole):
            out.append(dict(entry, instances=chosen))
    return out


def drains_update(recorded, action, targets):
    """The drained refs after ``action`` (drain or undrain) on operator ``targets`` (HOST or HOST:INSTANCE).

    Undraining a rig puts back its drained instances too. Sorted, each once: the file stays the same
    when nothing changes.
    """
    drained = {str(r) for r in _plain(recorded or [])}
    refs = {str(t).replace(":", "/", 1) for t in _plain(targets or [])}
    if action == "drain":
        drained |= refs
    elif action == "undrain":
        drained = {r for r in drained if r not in refs and r.split("/", 1)[0] not in refs}
    else:
        raise ValueError(f"llm_gateway_drain_action must be drain or undrain, not {action!r}")
    return sorted(drained)


def drain_targets(targets, entries):
    """``{refs, problems}``: operator targets ``HOST`` or ``HOST:INSTANCE`` as drains-file refs."""
    instances = {e["host"]: [i["name"] for i in e["instances"]] for e in _plain(entries or [])}
    refs, problems = [], []
    for target in _plain(targets or []):
        host, name = (str(target).split(":", 1) + [""])[:2]
        if host not in instances:
            problems.append(
                f"{target!r}: no rig {host!r} behind this gateway; rigs: {', '.join(sorted(instances)) or 'none'}"
            )
        elif name and name not in instances[host]:
            problems.append(
                f"{target!r}: {host} has no instance {name!r}; its instances: {', '.join(instances[host]) or 'none'}"
            )
        else:
            ref = f"{host}/{name}" if name else host
            if ref not in refs:
                refs.append(ref)
    if not refs and not problems:
        problems.append("no target given: HOST or HOST:INSTANCE (rigops_drain_targets)")
    return {"refs": refs, "problems": problems}


def health_sources(entries, hosts, hostvars, port=9402):
    """The health feed's sources: for each rig of ``entries`` (backends in the routing table) that is one of
    ``hosts`` (the rigs running the GPU health sentinel), the URL of its sentinel's state and the instances
    routed to there. The port: the rig's gpu_health_port, else ``port``; a rig whose port is 0 serves none.
    The gateway's own host is read on loopback, another at the address its instances are reached at."""
    hosts = {str(h) for h in _plain(hosts or [])}
    out = []
    for entry in _plain(entries or []):
        names = [i["name"] for i in entry["instances"]]
        rig_port = int(_hostvar(hostvars, entry["host"], "gpu_health_port", port) or 0)
        if entry["host"] not in hosts or not names or rig_port == 0:
            continue
        address = "127.0.0.1" if entry["same_host"] else entry["address"]
        out.append({"host": entry["host"], "url": f"http://{_hostport(address, rig_port)}/state", "instances": names})
    return out


def _connect(host, address, given, same, bind, item, gateway):
    port = item["port"]
    if not isinstance(port, int) or isinstance(port, bool):
        return None, f"{item['ref']}: port {port!r} is not a number (docs/instances.md)"
    if same:
        if bind == "localhost" or bind == "0.0.0.0":
            return _hostport("127.0.0.1", port), None
        if bind == "::":
            return _hostport("::1", port), None
        return _hostport(bind, port), None
    if _is_loopback(bind):
        return None, (
            f"{item['ref']} ({item['served_name']}) binds {bind}: the gateway on {gateway} cannot reach it on "
            f"another host. Fix: bind the rig's address (host: <the rig's IP> or 0.0.0.0 on the instance, with "
            f"vllm_service_allow_remote_bind: true on {host}), or put the gateway on {host} (add it to the group "
            f"gateways)"
        )
    target = address if (given or bind in WILDCARDS) else bind
    if not _address_ok(target):
        return None, (
            f"{item['ref']}: {target!r} is not an IP address or a DNS name; set llm_gateway_upstream_address on {host}"
        )
    if _is_loopback(target) and not given:
        return None, (
            f"{item['ref']}: the gateway on {gateway} would reach {host} at {target} (its ansible_host), which is the "
            f"gateway's own loopback. Fix: set llm_gateway_upstream_address on {host} (or "
            f"llm_gateway_upstream_addresses['{host}'] on the gateway) to an address the gateway reaches it at"
        )
    return _hostport(target, port), None


def failed_hosts(hosts, hostvars):
    """The hosts that failed a stage of this run or were stopped (rigops_failed_stage, rigops_stopped_by)."""
    return [
        str(h)
        for h in _plain(hosts or [])
        if _hostvar(hostvars, h, "rigops_failed_stage") is not None or _hostvar(hostvars, h, "rigops_stopped_by")
    ]


def key_reads(backend_list, hostvars):
    """[{host, instance, path}] of the keyed instances whose key the play does not have yet."""
    out = []
    for entry in _plain(backend_list or []):
        published = _hostvar(hostvars, entry["host"], "vllm_service_keys", {}) or {}
        given = _given_keys(hostvars, entry["host"])
        root = _hostvar(hostvars, entry["host"], "vllm_service_config_root", "/etc/vllm") or "/etc/vllm"
        for inst in entry["instances"]:
            if inst["require_key"] and inst["name"] not in published and inst["name"] not in given:
                out.append({"host": entry["host"], "instance": inst["name"], "path": f"{root}/{inst['name']}/api_key"})
    return out


def _instances_of(hostvars, host):
    """A rig's instances merged by the contract (plugins/module_utils/vllm_instances.py); ValueError
    with the contract's refusal when they cannot be merged (the main job's preflight refuses them first)."""
    return schema.merge(
        _hostvar(hostvars, host, "vllm_instances", []), _hostvar(hostvars, host, "vllm_service_instance_defaults", None)
    )


def _given_keys(hostvars, host):
    try:
        return schema.given_keys(_instances_of(hostvars, host))
    except ValueError:
        return {}


def upstream_keys(backend_list, hostvars, slurped=None, remotes=None):
    """{ref: key} of every upstream: rig instances (the vllm_service_keys fact, the inventory's
    security.api_key, or the key file read on the rig) and remotes (their `key`).

    ``slurped``: the results of the slurp loop over key_reads (``item`` and ``content``). Only for
    the task that renders the config, under no_log.
    """
    keys = {}
    read = {}
    for result in _plain(slurped or []):
        if isinstance(result, dict) and result.get("content") and isinstance(result.get("item"), dict):
            item = result["item"]
            read[f"{item['host']}/{item['instance']}"] = base64.b64decode(result["content"]).decode().strip()
    for entry in _plain(backend_list or []):
        published = _hostvar(hostvars, entry["host"], "vllm_service_keys", {}) or {}
        given = _given_keys(hostvars, entry["host"])
        for inst in entry["instances"]:
            if not inst["require_key"]:
                keys[inst["ref"]] = ""
                continue
            key = published.get(inst["name"]) or given.get(inst["name"]) or read.get(inst["ref"])
            if key:
                keys[inst["ref"]] = str(key).strip()
    for remote in _plain(remotes or []):
        if isinstance(remote, dict) and isinstance(remote.get("name"), str):
            keys[REMOTE_PREFIX + remote["name"]] = str(remote.get("key") or "")
    return keys


# --------------------------------------------------------------------------- names and routes


def _remote_parts(remote):
    """(scheme, host, port, base path) of a remote's base_url, or a problem text."""
    url = remote.get("base_url")
    if not isinstance(url, str):
        return None, "base_url is missing"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"base_url {url!r} is not an http(s) URL, e.g. https://api.example.com/v1"
    if parts.query or parts.fragment or parts.username:
        return None, f"base_url {url!r} carries a query, a fragment or credentials: give the key as `key`"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None, f"base_url {url!r} has a bad port"
    if not _address_ok(parts.hostname):
        return None, f"base_url {url!r}: its host is neither an IP address nor a DNS name"
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        return None, (
            f"base_url {url!r} does not end in /v1: give the provider's OpenAI-compatible base URL (what an OpenAI "
            "SDK takes as base_url), e.g. https://api.example.com/v1"
        )
    if re.search(r"[^A-Za-z0-9._~/-]", path):
        return None, f"base_url {url!r}: its path holds characters outside letters, digits and - . _ ~ /"
    return (parts.scheme, parts.hostname, port, path), None


def _names(backend_list, remotes):
    """(served {name: [refs]}, remote_models {model: [remote names]}, direct names in order)."""
    served = {}
    for entry in backend_list:
        for inst in entry["instances"]:
            served.setdefault(inst["served_name"], []).append(inst["ref"])
    remote_models = {}
    for remote in remotes:
        if isinstance(remote, dict) and isinstance(remote.get("models"), list):
            for model in remote["models"]:
                if isinstance(model, str):
                    remote_models.setdefault(model, []).append(remote.get("name"))
    direct = list(served) + [m for m in remote_models if m not in served]
    return served, remote_models, direct


def _parked(spec, served, remote_models):
    """Names served only by rigs and instances left out of this run (drained, failed rigs)."""
    out = []
    for entry in spec.get("excluded_backends") or []:
        for inst in entry.get("instances") or []:
            name = inst.get("served_name")
            if name not in served and name not in remote_models and name not in out:
                out.append(name)
    return out


def _client_problems(clients, known, health):
    out = []
    if not isinstance(clients, list):
        return ["llm_gateway_clients is not a list; write [{name, key, models, rate}] (roles/llm_gateway/README.md)"]
    seen, hashes = {}, {}
    for index, client in enumerate(clients):
        where = f"llm_gateway_clients[{index}]"
        if not isinstance(client, dict):
            out.append(f"{where} is not a mapping; write {{name: alice, key: <from the vault>, models: '*'}}")
            continue
        name = client.get("name")
        if isinstance(name, str):
            where = f"{where} ({name})"
        unknown = sorted(set(client) - set(CLIENT_KEYS))
        if unknown:
            out.append(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CLIENT_KEYS)}")
        if not isinstance(name, str) or not CLIENT_NAME_RE.match(name):
            out.append(
                f"{where}: name must match [a-z0-9][a-z0-9_.-]* (at most 63 characters): it names the client in "
                "the access log and in the rate limits"
            )
        elif name == HEALTH_CLIENT and health:
            out.append(f"{where}: the name {HEALTH_CLIENT} is the gate's own client; choose another")
        elif name in seen:
            out.append(f"{where}: the name {name} is also llm_gateway_clients[{seen[name]}]; names are unique")
        else:
            seen[name] = index
        problem = token_problem(client.get("key"), CLIENT_KEY_MIN)
        if problem:
            out.append(f"{where}: key {problem}; keep it in the vault (key: '{{{{ vault_{name or 'client'}_key }}}}')")
        else:
            digest = sha256_hex(client["key"])
            if digest in hashes:
                out.append(f"{where}: its key is the key of llm_gateway_clients[{hashes[digest]}]: one key per client")
            hashes.setdefault(digest, index)
        models = client.get("models", "*")
        if models != "*":
            if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
                out.append(f"{where}: models must be '*' (every name) or a non-empty list of names")
            else:
                for model in models:
                    if model not in known:
                        out.append(
                            f"{where}: model {model!r} is unknown to the gateway; known: {', '.join(sorted(known))}"
                        )
        rate = client.get("rate")
        if rate is not None and (not isinstance(rate, str) or not RATE_RE.match(rate)):
            out.append(f"{where}: rate {rate!r} must read like 10r/s or 600r/m")
        burst = client.get("burst")
        if burst is not None and (not isinstance(burst, int) or isinstance(burst, bool) or burst < 0):
            out.append(f"{where}: burst {burst!r} must be a whole number >= 0")
        budget = client.get("tokens_per_day")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            out.append(
                f"{where}: tokens_per_day {budget!r} must be a whole number >= 1 (the key's budget of prompt and "
                "completion tokens a day), or left out for none"
            )
    return out


def _remote_problems(remotes, settings):
    out = []
    if not isinstance(remotes, list):
        return ["llm_gateway_remotes is not a list; write [{name, base_url, key, models}]"]
    seen = {}
    for index, remote in enumerate(remotes):
        where = f"llm_gateway_remotes[{index}]"
        if not isinstance(remote, dict):
            out.append(f"{where} is not a mapping")
            continue
        name = remote.get("name")
        if isinstance(name, str):
            where = f"{where} ({name})"
        unknown = sorted(set(remote) - set(REMOTE_KEYS))
        if unknown:
            out.append(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(REMOTE_KEYS)}")
        if not isinstance(name, str) or not REMOTE_NAME_RE.match(name):
            out.append(f"{where}: name must match [a-z0-9][a-z0-9-]* (at most 63 characters)")
        elif name in seen:
            out.append(f"{where}: the name {name} is also llm_gateway_remotes[{seen[name]}]")
        else:
            seen[name] = index
        parts, problem = _remote_parts(remote)
        if problem:
            out.append(f"{where}: {problem}")
        elif parts[0] == "http" and remote.get("allow_http") is not True:
            out.append(
                f"{where}: base_url is plain http: the key would cross the network in clear text; use https, or set "
                "allow_http: true on this remote (a provider on a trusted network)"
            )
        if remote.get("allow_http") not in (None, True, False):
            out.append(f"{where}: allow_http must be true or false")
        ca_file = remote.get("ca_file")
        if ca_file not in (None, "") and (not isinstance(ca_file, str) or not ca_file.startswith("/")):
            out.append(f"{where}: ca_file must be an absolute path on the gateway (a PEM bundle of the CAs to trust)")
        problem = token_problem(remote.get("key"), REMOTE_KEY_MIN)
        if problem:
            out.append(f"{where}: key {problem}; keep it in the vault (key: '{{{{ vault_{name or 'remote'}_key }}}}')")
        models = remote.get("models")
        if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
            out.append(f"{where}: models must be a non-empty list of the model names the provider serves")
        elif len(set(models)) != len(models):
            out.append(f"{where}: models lists a name twice")
    return out


def _resolve(ref, served, remote_models, aliases, parked=()):
    """The targets of one alias entry, [(kind, ref, model)], or a problem text.

    ``parked``: names served only by rigs left out of this run (excluded or failed): no target now.
    """
    if ref.startswith(REMOTE_PREFIX):
        model = ref[len(REMOTE_PREFIX) :]
        owners = remote_models.get(model, [])
        if not owners:
            return None, f"{ref!r}: no remote lists the model {model!r} (llm_gateway_remotes[].models)"
        if len(owners) > 1:
            return None, f"{ref!r}: remotes {', '.join(owners)} all list {model!r}; keep it on one remote"
        return [("remote", owners[0], model)], None
    if ref in aliases:
        return None, f"{ref!r} is itself an alias; list its targets instead"
    if ref in served:
        return [("local", r, ref) for r in served[ref]], None
    if ref in remote_models:
        return _resolve(REMOTE_PREFIX + ref, served, remote_models, aliases)
    if ref in parked:
        return [], None
    return None, f"{ref!r} is neither a served name of a rig instance nor a remote model (remote:<model>)"


def problems(spec):
    """Every reason to refuse the gateway's settings (lines that say what is wrong and the fix)."""
    spec = _plain(spec or {})
    backend_list = spec.get("backends") or []
    remotes = spec.get("remotes") or []
    aliases = spec.get("aliases") or {}
    clients = spec.get("clients") or []
    keys_present = set(spec.get("keys_present") or [])
    out = []
    for entry in backend_list:
        if entry.get("problem"):
            out.append(entry["problem"])
        for inst in entry["instances"]:
            if inst.get("problem"):
                out.append(inst["problem"])
            elif inst["require_key"] and inst["ref"] not in keys_present:
                out.append(
                    f"{inst['ref']} ({inst['served_name']}): no API key: neither the vllm_service_keys fact of "
                    f"{entry['host']}, nor security.api_key in the inventory, nor a readable key file on the rig. "
                    f"Fix: deploy the instance first (site.yml --tags services -l {entry['host']}), or leave the rig "
                    "out (./rigops drain, or llm_gateway_exclude_hosts)"
                )
            if entry["same_host"] and inst["port"] == spec.get("gateway_port"):
                out.append(f"{inst['ref']}: port {inst['port']} is also the gateway's llm_gateway_port on this host")
    out += _remote_problems(remotes, spec.get("settings") or {})
    served, remote_models, direct = _names(backend_list, remotes)
    parked = _parked(spec, served, remote_models)
    direct = direct + parked
    if not isinstance(aliases, dict):
        out.append("llm_gateway_aliases is not a mapping; write {name: [served name, remote:model, ...]}")
        aliases = {}
    for name, targets in aliases.items():
        where = f"llm_gateway_aliases[{name!r}]"
        if not isinstance(name, str) or not name:
            out.append(f"{where}: an alias name must be a non-empty string")
            continue
        if name in direct:
            out.append(f"{where}: {name!r} is already the name of a model; give the alias another name")
        if name.startswith(REMOTE_PREFIX):
            out.append(f"{where}: an alias name cannot start with {REMOTE_PREFIX}")
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            out.append(f"{where}: write an ordered, non-empty list of names (served names, remote:<model>)")
            continue
        if len(set(targets)) != len(targets):
            out.append(f"{where}: lists a target twice")
        for ref in targets:
            _resolved, problem = _resolve(ref, served, remote_models, aliases, parked)
            if problem:
                out.append(f"{where}: {problem}")
    known = set(direct) | {n for n in aliases if isinstance(n, str)}
    out += _client_problems(clients, known, bool(spec.get("health_hash")))
    out += _policy_problems(spec.get("settings") or {}, known)
    return out


def _policy_problems(settings, known):
    allowed = ", ".join(POLICIES)
    out = []
    default = settings.get("default_policy", "session")
    if default not in POLICIES:
        out.append(f"llm_gateway_default_policy {default!r} is not a policy; allowed: {allowed}")
    policies = settings.get("policies") or {}
    if not isinstance(policies, dict):
        return out + [f"llm_gateway_policies is not a mapping; write {{name: policy}} with a policy of {allowed}"]
    for name, policy in policies.items():
        if name not in known:
            out.append(
                f"llm_gateway_policies[{name!r}]: no model or alias of that name; known: {', '.join(sorted(known))}"
            )
        if policy not in POLICIES:
            out.append(f"llm_gateway_policies[{name!r}]: {policy!r} is not a policy; allowed: {allowed}")
    return out


def _rate_parts(rate):
    match = RATE_RE.match(rate)
    return int(match.group(1)), match.group(2)


def table(spec):
    """The routing table (call after problems() found none). No key in it."""
    spec = _plain(spec or {})
    settings = spec.get("settings") or {}
    backend_list = spec.get("backends") or []
    remotes = [r for r in spec.get("remotes") or [] if isinstance(r, dict)]
    aliases = spec.get("aliases") or {}
    served, remote_models, direct = _names(backend_list, remotes)
    instances = {inst["ref"]: (entry, inst) for entry in backend_list for inst in entry["instances"]}

    upstreams, upstream_ids = [], {}

    def upstream(kind, ref):
        key = (kind, ref)
        if key not in upstream_ids:
            uid = f"u{len(upstreams)}"
            upstream_ids[key] = uid
            if kind == "local":
                entry, inst = instances[ref]
                upstreams.append(
                    {
                        "id": uid,
                        "kind": "local",
                        "ref": ref,
                        "label": ref,
                        "server": inst["connect"],
                        "scheme": "http",
                        "tls_name": "",
                        "host_header": inst["connect"],
                        "base_path": "",
                        "ca_file": "",
                        "single": False,
                        "benchable": False,
                        "pooled": False,
                    }
                )
            else:
                remote = next(r for r in remotes if r.get("name") == ref)
                (scheme, host, port, path), _problem = _remote_parts(remote)
                default_port = 443 if scheme == "https" else 80
                upstreams.append(
                    {
                        "id": uid,
                        "kind": "remote",
                        "ref": REMOTE_PREFIX + ref,
                        "label": REMOTE_PREFIX + ref,
                        "server": _hostport(host, port),
                        "scheme": scheme,
                        "tls_name": host if scheme == "https" else "",
                        "host_header": host if port == default_port else _hostport(host, port),
                        "base_path": path,
                        "ca_file": remote.get("ca_file") or "",
                        "single": False,
                        "benchable": False,
                        "pooled": False,
                    }
                )
        return next(u for u in upstreams if u["id"] == upstream_ids[key])

    routes, pools, pool_ids = [], [], {}
    parked = _parked(spec, served, remote_models)
    default_policy = settings.get("default_policy", "session")
    policies = settings.get("policies") or {}

    def pool(policy, refs):
        key = (policy, tuple(refs))
        if key not in pool_ids:
            members = [upstream("local", ref) for ref in refs]
            for member in members:
                # the replica's socket passes requests on to its group of one (uN)
                member["pooled"] = member["single"] = True
            pool_ids[key] = f"p{len(pools)}"
            pools.append(
                {
                    "id": pool_ids[key],
                    "policy": policy,
                    "balancer": POLICIES[policy],
                    "upstreams": [m["id"] for m in members],
                    "refs": list(refs),
                    "label": f"{policy}:" + "+".join(refs),
                }
            )
        return next(p for p in pools if p["id"] == pool_ids[key])

    def add_route(name, kind, groups):
        """``groups``: the targets of each entry in order, [[(kind, ref, model)]]; an entry of several
        instances is a pool unless the route's policy is failover."""
        rid = f"r{len(routes)}"
        policy = policies.get(name, default_policy)
        steps = []
        for group in groups:
            if len(group) > 1 and policy != "failover":
                steps.append(group)
            else:
                steps += [[target] for target in group]
        hops = []

        def hop(step, last, nxt, solo_of=None):
            """A hop to one upstream, or (a step of several targets) to their pool."""
            model = step[0][2]
            entry = {"id": f"{rid}_{len(hops)}", "pos": len(hops), "model": model, "rewrite": model != name,
                     "last": last, "next": nxt, "pool": None, "solo": None, "solo_of": solo_of}  # fmt: skip
            if len(step) > 1:
                p = pool(policy, [ref for _kind, ref, _model in step])
                entry.update(upstream=p["id"], refs=list(p["refs"]), kind="pool", pool=p["id"], base_path="",
                             label=p["label"])  # fmt: skip
            else:
                up = upstream(step[0][0], step[0][1])
                up["single" if last else "benchable"] = True
                entry.update(upstream=up["id"] + ("" if last else "b"), refs=[up["ref"]], kind=up["kind"],
                             base_path=up["base_path"], label=up["label"])  # fmt: skip
            hops.append(entry)
            return entry

        # the chain clients' requests go down: one hop per step, ids in order (the next hop's id is known)
        chain = [
            hop(step, index == len(steps) - 1, None if index == len(steps) - 1 else f"{rid}_{index + 1}")
            for index, step in enumerate(steps)
        ]
        # behind each pool, its replicas one by one, then on to what follows the pool
        for step_hop, step in zip(chain, steps, strict=True):
            if step_hop["pool"]:
                step_hop["solo"] = f"{rid}_{len(hops)}"
                for index, target in enumerate(step):
                    last_solo = index == len(step) - 1
                    nxt = step_hop["next"] if last_solo else f"{rid}_{len(hops) + 1}"
                    hop([target], step_hop["last"] and last_solo, nxt, solo_of=step_hop["id"])
        routes.append({"id": rid, "name": name, "kind": kind, "policy": policy, "hops": hops})

    for name in direct:
        if name in served:
            add_route(name, "model", [[("local", ref, name) for ref in served[name]]])
        else:
            add_route(name, "remote", [[("remote", remote_models[name][0], name)]])
    for name, refs in aliases.items():
        groups, seen = [], []
        for ref in refs:
            resolved, _problem = _resolve(ref, served, remote_models, aliases, parked)
            group = [target for target in resolved or [] if target not in seen]
            seen += group
            if group:
                groups.append(group)
        add_route(name, "alias", groups)
    for name in parked:
        add_route(name, "unavailable", [])

    zones, zone_ids = [], {}
    default_rate = settings.get("default_rate", "10r/s")
    default_burst = settings.get("default_burst", 20)
    names = [r["name"] for r in routes]
    clients = []
    entries = [c for c in spec.get("clients") or [] if isinstance(c, dict)]
    if spec.get("health_hash"):
        entries = [
            {"name": HEALTH_CLIENT, "models": "*", "rate": settings.get("health_rate", default_rate), "_hash": True}
        ] + entries
    for client in entries:
        rate = client.get("rate") or default_rate
        burst = client.get("burst", default_burst)
        if (rate, burst) not in zone_ids:
            number, unit = _rate_parts(rate)
            zone_ids[(rate, burst)] = f"z{len(zones)}"
            zones.append({"id": zone_ids[(rate, burst)], "rate": rate, "burst": burst, "number": number, "unit": unit})
        every = client.get("models", "*") == "*"
        clients.append(
            {
                "name": client["name"],
                "hash": spec["health_hash"] if client.get("_hash") else sha256_hex(client["key"]),
                "all": every,
                "models": list(names) if every else [m for m in names if m in client["models"]],
                "zone": zone_ids[(rate, burst)],
            }
        )
    # every hop sets the body it sends (gateway.js rewrite: the hop's model, a stream's usage asked for)
    positions = sorted({h["pos"] for r in routes for h in r["hops"]})
    return {
        "upstreams": upstreams,
        "pools": pools,
        "routes": routes,
        "names": names,
        "clients": clients,
        "zones": zones,
        "rewrite_positions": positions,
        # the clients' budgets, tokens a day (rigops-llm-gateway-usage's config)
        "budgets": {c["name"]: c["tokens_per_day"] for c in entries if c.get("tokens_per_day")},
    }


def js_table(tbl):
    """The table as the njs module reads it: a JSON literal, ASCII only (safe in any JS source)."""
    tbl = _plain(tbl)
    data = {
        "clients": {
            c["hash"]: {"name": c["name"], "all": c["all"], "models": dict.fromkeys(c["models"], 1)}
            for c in tbl["clients"]
        },
        "routes": {
            r["name"]: {"hop": r["hops"][0]["id"] if r["hops"] else "", "kind": r["kind"]} for r in tbl["routes"]
        },
        "hops": {
            h["id"]: dict(
                {"model": h["model"], "label": h["label"], "next": h["next"] or ""},
                **({"replicas": h["refs"], "solo": h["solo"]} if h.get("pool") else {}),
            )
            for r in tbl["routes"]
            for h in r["hops"]
        },
        "names": tbl["names"],
        "who": {c["name"]: c["hash"] for c in tbl["clients"]},
        # a pool's replica by the id of its socket (uN.sock): the logs name the replica that answered
        "sockets": {u["id"]: u["ref"] for u in tbl["upstreams"] if u.get("pooled")},
    }
    return json.dumps(data, ensure_ascii=True, sort_keys=True, separators=(",", ":"))


def gate_plan(tbl, down=None, skip=None, drained=None):
    """[{name, gate, why}]: the gate sends a chat to each name with at least one reachable upstream
    (``down``: refs the probe did not reach; ``drained``: refs the health feed routes around), except the
    names in ``skip`` (llm_gateway_gate_skip)."""
    tbl = _plain(tbl)
    down = set(_plain(down or []))
    skip = set(_plain(skip or []))
    drained = set(_plain(drained or []))
    plan = []
    for route in tbl["routes"]:
        refs = list(dict.fromkeys(ref for h in route["hops"] for ref in h["refs"]))
        if route["name"] in skip:
            plan.append({"name": route["name"], "gate": False, "why": "llm_gateway_gate_skip"})
        elif not refs:
            plan.append({"name": route["name"], "gate": False, "why": "no upstream is in the routing table"})
        elif all(ref in drained for ref in refs):
            plan.append({"name": route["name"], "gate": False, "why": "drained by GPU health: " + ", ".join(refs)})
        elif all(ref in down or ref in drained for ref in refs):
            plan.append({"name": route["name"], "gate": False, "why": "unreachable: " + ", ".join(refs)})
        else:
            plan.append({"name": route["name"], "gate": True, "why": ""})
    return plan


def summary(tbl, url, self_signed=False, config_id="", down=None):
    """What the report and the client settings read: no key, no key hash."""
    tbl = _plain(tbl)
    return {
        "url": url,
        "config_id": config_id,
        "self_signed": bool(self_signed),
        "models": list(tbl["names"]),
        "routes": {r["name"]: [h["label"] for h in r["hops"] if not h.get("solo_of")] for r in tbl["routes"]},
        "policies": {r["name"]: r["policy"] for r in tbl["routes"] if any(h.get("pool") for h in r["hops"])},
        "clients": {c["name"]: list(c["models"]) for c in tbl["clients"] if c["name"] != HEALTH_CLIENT},
        "unreachable": sorted(_plain(down or [])),
    }


def san(names):
    """openssl's subjectAltName value for these names: IP:<address> or DNS:<name>, each once."""
    out = []
    for name in _plain(names or []):
        name = str(name)
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            if not re.match(r"\A[A-Za-z0-9*][A-Za-z0-9.*-]*\Z", name):
                raise ValueError(f"{name!r} is neither an IP address nor a DNS name") from None
            entry = f"DNS:{name}"
        if entry not in out:
            out.append(entry)
    return ",".join(out)


class FilterModule:
    """The gateway's routing table and its checks (see the module's docstring)."""

    def filters(self):
        return {
            "gateway_backends": _filter(backends),
            "gateway_failed_hosts": _filter(failed_hosts),
            "gateway_drain": _filter(drain),
            "gateway_drain_targets": _filter(drain_targets),
            "gateway_drains_update": _filter(drains_update),
            "gateway_health_sources": _filter(health_sources),
            "gateway_key_reads": _filter(key_reads),
            "gateway_upstream_keys": _filter(upstream_keys),
            "gateway_problems": _filter(problems),
            "gateway_table": _filter(table),
            "gateway_js": _filter(js_table),
            "gateway_gate_plan": _filter(gate_plan),
            "gateway_summary": _filter(summary),
            "gateway_sha256": _filter(sha256_hex),
            "gateway_san": _filter(san),
        }
