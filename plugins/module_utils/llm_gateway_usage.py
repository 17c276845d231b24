# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Usage per client key of the LLM gateway: requests, prompt and completion tokens per client and model and
day, and the budgets (tokens per day) of the clients that have one.

Where the state lives. nginx writes one JSON line per request it routed into a log of the day
(``<usage dir>/<YYYY-MM-DD>.jsonl``, the gateway host's day: nginx's $time_iso8601), with the tokens the
request logic (gateway.js) read from the answer's ``usage``. The service ``rigops-llm-gateway-usage`` sums
those lines into the day's file (``<YYYY-MM-DD>.json``: the counts and the offset of the log they cover,
written in one atomic rename, so a restart neither loses nor counts a line twice), writes Prometheus counters
for node exporter's textfile collector, and the spent file: the clients whose budget of the day is spent,
until when. gateway.js reads the spent file on every request (a small file, as the health feed's drained
file) and answers 429 to those clients. Everything is a file: budgets hold across reloads and restarts of
nginx and of the service. (njs 0.7 has no shared dictionary, and one would not outlive a restart.)

Budgets are checked after the fact: a request that starts before the service has summed the request that
spent the budget still runs (at most one interval, and the requests in flight, over the budget).

Host side: Python 3.8 and the standard library only.
"""

import datetime
import json
import os
import re

CONFIG_KEYS = ("interval", "usage_dir", "spent_file", "textfile", "budgets", "keep_days")
DAY_LOG_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.jsonl$")
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "unmetered")
# a day log is read at most this much per round (a backlog is read over several rounds)
READ_CHUNK = 8 * 1024 * 1024


def check_config(config):
    """Problems of a usage config (the role writes it; a hand edit may break it)."""
    if not isinstance(config, dict):
        return ["config: not a JSON object"]
    problems = [f"config: {key} missing" for key in CONFIG_KEYS if key not in config]
    for key in ("interval", "keep_days"):
        value = config.get(key)
        if key in config and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
            problems.append(f"config: {key} must be a number above 0, got {value!r}")
    budgets = config.get("budgets")
    if "budgets" in config and not (
        isinstance(budgets, dict)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in budgets.values())
    ):
        problems.append("config: budgets must map client names to tokens per day (whole numbers above 0)")
    return problems


def _int(value):
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        return None


def new_summary(day):
    return {"day": day, "offset": 0, "clients": {}}


def add(summary, record):
    """Count one line of a day log: a request routed for ``client`` to ``model``, with the tokens of its answer
    (empty when the answer carried no usage: an error, a stream cut short; counted as unmetered)."""
    client, model = record.get("client") or "", record.get("model") or ""
    if not client or not model:
        return
    counts = summary["clients"].setdefault(client, {}).setdefault(model, dict.fromkeys(COUNTS, 0))
    counts["requests"] += 1
    prompt, completion = _int(record.get("prompt_tokens")), _int(record.get("completion_tokens"))
    if prompt is None and completion is None:
        counts["unmetered"] += 1
        return
    counts["prompt_tokens"] += prompt or 0
    counts["completion_tokens"] += completion or 0


def read_lines(path, offset, limit=READ_CHUNK):
    """The whole lines of ``path`` from byte ``offset`` (at most ``limit`` bytes of them) and the offset after
    the last one. A line nginx is still writing (no newline yet) is left for the next round."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(limit)
    end = data.rfind(b"\n") + 1
    lines = []
    for raw in data[:end].splitlines():
        try:
            record = json.loads(raw.decode("utf-8"))
        except ValueError:
            continue  # not a line of ours (a torn write after a crash): skipped, never counted
        if isinstance(record, dict):
            lines.append(record)
    return lines, offset + end


def summarize(usage_dir, day, summary=None):
    """The day's summary brought up to the end of its log; ``(summary, changed)``."""
    summary = summary or new_summary(day)
    path = os.path.join(usage_dir, day + ".jsonl")
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return summary, False
    if size <= summary["offset"]:
        return summary, False
    before = summary["offset"]
    records, summary["offset"] = read_lines(path, before)
    for record in records:
        add(summary, record)
    return summary, summary["offset"] != before


def used(summary, client):
    """Tokens (prompt and completion) the client used in the summary's day."""
    models = summary["clients"].get(client, {})
    return sum(c["prompt_tokens"] + c["completion_tokens"] for c in models.values())


def day_bounds(now):
    """The local day of ``now`` (a timezone-aware datetime) and when it ends (the next day's start)."""
    day = now.date()
    end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(), tzinfo=now.tzinfo)
    return day.isoformat(), end


def spent(summary, budgets, resets_at):
    """The spent file: each client whose budget is used up in the summary's day, until ``resets_at``
    (a timezone-aware datetime, the day's end). gateway.js refuses their requests until then."""
    out = {}
    for client, budget in sorted(budgets.items()):
        tokens = used(summary, client)
        if tokens >= budget:
            out[client] = {"budget": budget, "used": tokens}
    return {
        "day": summary["day"],
        "until": int(resets_at.timestamp()),
        "resets_at": resets_at.isoformat(),
        "spent": out,
    }


def _label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


METRICS = (
    ("requests", "rigops_llm_gateway_requests_total", "Requests the gateway routed, per client and model"),
    ("prompt_tokens", "rigops_llm_gateway_prompt_tokens_total", "Prompt tokens of the answers, per client and model"),
    (
        "completion_tokens",
        "rigops_llm_gateway_completion_tokens_total",
        "Completion tokens of the answers, per client and model",
    ),
    ("unmetered", "rigops_llm_gateway_unmetered_requests_total", "Requests whose answer carried no usage"),
)


def prometheus(summary, budgets):
    """Prometheus text for node exporter's textfile collector. The counters count the gateway host's day:
    they start again from 0 at its start, which Prometheus reads as a counter reset (rate() and increase()
    take it in their stride)."""
    lines = []
    rows = [(c, m, counts) for c, models in sorted(summary["clients"].items()) for m, counts in sorted(models.items())]
    for key, name, text in METRICS:
        lines += [f"# HELP {name} {text} (the gateway host's day).", f"# TYPE {name} counter"]
        for client, model, counts in rows:
            lines.append(f'{name}{{client="{_label(client)}",model="{_label(model)}"}} {counts[key]}')
    lines += [
        "# HELP rigops_llm_gateway_budget_tokens The client's budget, tokens per day.",
        "# TYPE rigops_llm_gateway_budget_tokens gauge",
    ]
    for client, budget in sorted(budgets.items()):
        lines.append(f'rigops_llm_gateway_budget_tokens{{client="{_label(client)}"}} {budget}')
    return "\n".join(lines) + "\n"


def rows(summaries):
    """Per (client, model) over the summaries: the counts summed, sorted by client then model."""
    total = {}
    for summary in summaries:
        for client, models in summary["clients"].items():
            for model, counts in models.items():
                row = total.setdefault((client, model), dict.fromkeys(COUNTS, 0))
                for key in COUNTS:
                    row[key] += counts.get(key, 0)
    return [dict(client=c, model=m, **counts) for (c, m), counts in sorted(total.items())]


def table(report_rows, since, until):
    """The rows as a text table, a total line per client with more than one model."""
    head = ("client", "model", "requests", "prompt", "completion", "total", "unmetered")
    body = []
    for client in sorted({r["client"] for r in report_rows}):
        mine = [r for r in report_rows if r["client"] == client]
        if len(mine) > 1:
            mine = mine + [dict({k: sum(r[k] for r in mine) for k in COUNTS}, client=client, model="(all)")]
        for r in mine:
            body.append(
                (r["client"], r["model"], r["requests"], r["prompt_tokens"], r["completion_tokens"],
                 r["prompt_tokens"] + r["completion_tokens"], r["unmetered"])
            )  # fmt: skip
    out = [f"usage from {since} to {until} (the gateway host's days)"]
    if not body:
        return "\n".join(out + ["no request in that period"]) + "\n"
    widths = [max(len(str(row[i])) for row in [head] + body) for i in range(len(head))]
    for row in [head] + body:
        cells = [str(v).ljust(w) if i < 2 else str(v).rjust(w) for i, (v, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells))
    return "\n".join(line.rstrip() for line in out) + "\n"


def days_between(since, until):
    start = datetime.date.fromisoformat(since)
    end = datetime.date.fromisoformat(until)
    return [(start + datetime.timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def expired(names, today, keep_days):
    """The day logs and day files of ``names`` (a folder's listing) older than ``keep_days`` days."""
    oldest = datetime.date.fromisoformat(today) - datetime.timedelta(days=keep_days - 1)
    out = []
    for name in names:
        m = re.match(r"^(\d{4}-\d{2}-\d{2})\.jsonl?$", name)
        if m and datetime.date.fromisoformat(m.group(1)) < oldest:
            out.append(name)
    return sorted(out)
