# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The settings files of the tools people point at the gateway (roles/llm_clients), as a filter.

- ``summary | rigops.fleet.clients_settings(client, options)``: the client settings files of one
  client of the gateway: OpenAI SDK env, Claude Code, Codex, Continue, a provider registry.
"""

from __future__ import annotations

import json
import shlex

from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import filter_errors as _filter
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain

try:
    import tomli_w
except ImportError:  # reported when the filter is used, with the fix
    tomli_w = None

KEY_ENV = "RIGOPS_LLM_API_KEY"


def _sh(value):
    return shlex.quote(str(value))


def _dump(data):
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def client_settings(summary, client, options):
    """{relative path: text} of every client settings file for one client of the gateway.

    summary: the gateway's summary.json (url with /v1, clients: {client: [names]}); options:
    {key, inline, key_file, ca_file, bundle_file, active, small}. The key is in a file only when
    ``inline`` (else the settings read it from the key file or from $RIGOPS_LLM_API_KEY).
    """
    if tomli_w is None:
        raise ValueError("the Python package tomli-w is missing on the controller: pip install -r requirements.txt")
    summary, options = _plain(summary or {}), _plain(options or {})
    clients = summary.get("clients") or {}
    if client not in clients:
        raise ValueError(f"the gateway has no client {client!r}; its clients: {', '.join(sorted(clients)) or 'none'}")
    names = list(clients[client])
    if not names:
        raise ValueError(f"client {client!r} may use no model on the gateway")
    active = options.get("active") or names[0]
    if active not in names:
        raise ValueError(f"llm_clients_active_model {active!r} is not one of {client}'s models: {', '.join(names)}")
    small = options.get("small") or active
    if small not in names:
        raise ValueError(f"llm_clients_small_model {small!r} is not one of {client}'s models: {', '.join(names)}")
    base = str(summary["url"]).rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    inline = options.get("inline") is True
    key = str(options.get("key") or "")
    if inline and not key:
        raise ValueError(f"no key for client {client!r} (llm_gateway_clients on the gateway)")
    key_file = str(options.get("key_file") or "")
    ca_file, bundle = str(options.get("ca_file") or ""), str(options.get("bundle_file") or "")
    ordered = [active] + [n for n in names if n != active]
    head = f"rigops llm_clients: client {client} of the gateway {base}; active model {active}"

    env = [
        f"# {head}",
        "# Source it in a shell: . ./openai.env (the key is read from the key file beside it, or given inline).",
        f"export OPENAI_BASE_URL={_sh(base)}",
        f"export OPENAI_API_KEY={_sh(key)}" if inline else f'export OPENAI_API_KEY="$(cat {_sh(key_file)})"',
        f'export {KEY_ENV}="$OPENAI_API_KEY"',
        f"export OPENAI_MODEL={_sh(active)}",
    ]
    if bundle:
        env += [
            "# the gateway's own CA, with the system's CAs (Python, OpenSSL, requests):",
            f"export SSL_CERT_FILE={_sh(bundle)}",
            f"export REQUESTS_CA_BUNDLE={_sh(bundle)}",
        ]
    if ca_file:
        env += [
            "# Node tools (Claude Code, Cline, Continue) add it to theirs:",
            f"export NODE_EXTRA_CA_CERTS={_sh(ca_file)}",
        ]

    claude_env = {
        # Claude Code speaks Anthropic's Messages API (POST /v1/messages), which the gateway passes
        # on by model to vLLM's own /v1/messages; the base URL is the root, without /v1.
        "ANTHROPIC_BASE_URL": root,
        "ANTHROPIC_MODEL": active,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": active,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": active,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": small,
        "ANTHROPIC_SMALL_FAST_MODEL": small,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if ca_file:
        claude_env["NODE_EXTRA_CA_CERTS"] = ca_file
    claude = {"env": claude_env}
    if inline:
        claude_env["ANTHROPIC_AUTH_TOKEN"] = key
    else:
        # run by Claude Code in /bin/sh; sent as Authorization: Bearer (and X-Api-Key, which the gateway drops)
        claude["apiKeyHelper"] = f"cat {_sh(key_file)}"

    provider = {"name": f"rigops gateway ({client})", "base_url": base, "wire_api": "responses"}
    if inline:
        provider["experimental_bearer_token"] = key
    else:
        provider["env_key"] = KEY_ENV
    codex = {"model": active, "model_provider": "rigops", "model_providers": {"rigops": provider}}
    codex_text = (
        f"# {head}\n# Use with CODEX_HOME=<this folder> codex, or copy into ~/.codex/config.toml. Codex speaks the\n"
        f"# Responses API (POST /v1/responses), which the gateway passes on by model.\n"
    ) + tomli_w.dumps(codex)

    continue_models = []
    for name in ordered:
        entry = {"title": f"{name} (rigops)", "provider": "openai", "model": name, "apiBase": base}
        if inline:
            entry["apiKey"] = key
        continue_models.append(entry)

    registry = {
        "active": active,
        "client": client,
        "gateway": {"base_url": base, "anthropic_base_url": root, "ca_file": ca_file},
        "providers": {
            name: {
                "name": name,
                "base_url": base,
                "anthropic_base_url": root,
                "model": name,
                "api_format": "openai",
                **({"api_key": key} if inline else {"api_key_env": KEY_ENV, "api_key_file": key_file}),
            }
            for name in ordered
        },
    }
    return {
        "openai.env": "\n".join(env) + "\n",
        "claude-code/settings.json": _dump(claude),
        "codex/config.toml": codex_text,
        "continue.json": _dump({"models": continue_models}),
        "providers.json": _dump(registry),
    }


class FilterModule:
    """The client settings of the gateway's clients (see the module's docstring)."""

    def filters(self):
        return {"clients_settings": _filter(client_settings)}
