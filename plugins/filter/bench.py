# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the bench role, run on the controller.

- ``text | bench_from_toml``: an instance's config.toml (as vllm_service wrote it) as a dict;
- ``cfg | bench_target(name, settings)``: what one instance's bench steps need from that
  config: URLs (direct or through the gateway), the model id to request, the tokenizer, the
  runtime's python, the key's file, the GPUs, the memory sampler. No secret goes in or out.
- ``concurrency | bench_num_prompts(setting)``: requests of one step.
"""

from __future__ import annotations

import tomllib

from ansible.errors import AnsibleFilterError

MEMORY_BY_FLAVOUR = {"cuda": "nvidia-smi", "jetson": "tegrastats", "cpu": "proc"}
MEMORY_SOURCES = ("nvidia-smi", "tegrastats", "proc", "none")


def from_toml(text):
    try:
        return tomllib.loads(str(text))
    except tomllib.TOMLDecodeError as exc:
        raise AnsibleFilterError(f"bench_from_toml: not TOML: {exc}") from exc


def loopback_url(host, port):
    host = str(host or "127.0.0.1")
    if host in ("0.0.0.0", "", "*"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def target(cfg, name, settings):
    """One instance's bench target from its config.toml and the role's settings.

    settings: through_gateway, gateway_url, model_names, memory_source, flavour (the release's,
    or None), client_python, unit_template.
    """
    server, model = cfg.get("server") or {}, cfg.get("model") or {}
    if "port" not in server or "served_name" not in model:
        raise AnsibleFilterError(f"bench_target: {name}'s config.toml has no [server] port or [model] served_name")
    direct = loopback_url(server.get("host"), server["port"])
    gateway = bool(settings.get("through_gateway"))
    memory = settings.get("memory_source") or "auto"
    if memory == "auto":
        memory = MEMORY_BY_FLAVOUR.get(settings.get("flavour") or "", "proc")
    if memory not in MEMORY_SOURCES:
        raise AnsibleFilterError(f"bench_target: memory source {memory!r} is not one of {MEMORY_SOURCES}")
    python = str(server.get("python") or "")
    return {
        "name": name,
        "served_name": model["served_name"],
        "model_name": (settings.get("model_names") or {}).get(name) or model["served_name"],
        "base_url": str(settings.get("gateway_url") or "").rstrip("/") if gateway else direct,
        "metrics_url": direct + "/metrics",
        "through_gateway": gateway,
        "tokenizer": str(model.get("path") or ""),
        "trust_remote_code": bool(model.get("trust_remote_code")),
        "model_commit": model.get("commit") or "",
        "model_id": model.get("id") or "",
        "python": str(settings.get("client_python") or python),
        "server_python": python,
        # <release>/venv/bin/python -> <release>/.rigops-release.json
        "release_marker": python.rsplit("/venv/bin/", 1)[0] + "/.rigops-release.json" if "/venv/bin/" in python else "",
        "key_file": str(server.get("key_file") or ""),
        "gpus": [int(g) for g in server.get("gpus") or []],
        "memory_source": memory,
        "unit": str(settings.get("unit_template") or "vllm@{name}.service").replace("{name}", name),
    }


def num_prompts(concurrency, setting):
    concurrency, setting = int(concurrency), int(setting or 0)
    return setting if setting > 0 else max(8, 4 * concurrency)


class FilterModule:
    def filters(self):
        return {"bench_from_toml": from_toml, "bench_target": target, "bench_num_prompts": num_prompts}
