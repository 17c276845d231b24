"""Usage per client of the LLM gateway: plugins/module_utils/llm_gateway_usage.py (the service
rigops-llm-gateway-usage's logic) on day logs in nginx's llm_usage format. What nginx and gateway.js write
into those logs, and the 429 of a spent budget, are tested against a real nginx in test_llm_gateway.py."""

from __future__ import annotations

import datetime
import json

from ansible_collections.rigops.fleet.plugins.module_utils import llm_gateway_usage as usage

# Lines as nginx's log_format llm_usage writes them (escape=json; the tokens are strings, empty when the answer
# carried no usage).
LINES = [
    {"time": "2026-12-05T10:00:00+00:00", "client": "alice", "model": "qwen", "status": 200,
     "prompt_tokens": "120", "completion_tokens": "30", "target": "rig-1/a", "request_id": "1"},
    {"time": "2026-12-05T10:00:01+00:00", "client": "alice", "model": "qwen", "status": 200,
     "prompt_tokens": "80", "completion_tokens": "5", "target": "rig-1/a", "request_id": "2"},
    {"time": "2026-12-05T10:00:02+00:00", "client": "alice", "model": "embed", "status": 200,
     "prompt_tokens": "7", "completion_tokens": "0", "target": "rig-2/e", "request_id": "3"},
    # an upstream that failed: routed, no usage
    {"time": "2026-12-05T10:00:03+00:00", "client": "bob", "model": "qwen", "status": 502,
     "prompt_tokens": "", "completion_tokens": "", "target": "rig-1/a", "request_id": "4"},
    {"time": "2026-12-05T10:00:04+00:00", "client": "bob", "model": "qwen", "status": 200,
     "prompt_tokens": "10", "completion_tokens": "2", "target": "rig-1/a", "request_id": "5"},
]  # fmt: skip
UTC = datetime.UTC


def write_log(folder, day, lines, tail=b""):
    path = folder / f"{day}.jsonl"
    with path.open("ab") as handle:
        handle.write(b"".join(json.dumps(line).encode() + b"\n" for line in lines) + tail)
    return path


def test_a_day_log_is_summed_once_and_a_torn_line_waits(tmp_path):
    write_log(tmp_path, "2026-12-05", LINES[:3], tail=b'{"time":"2026-12-05T10:00:03+00:00","cli')
    summary, changed = usage.summarize(str(tmp_path), "2026-12-05")
    assert changed and summary["clients"]["alice"]["qwen"] == {
        "requests": 2, "prompt_tokens": 200, "completion_tokens": 35, "unmetered": 0}  # fmt: skip
    offset = summary["offset"]
    assert offset == (tmp_path / "2026-12-05.jsonl").stat().st_size - len(b'{"time":"2026-12-05T10:00:03+00:00","cli')
    # nothing new: nothing read again
    assert usage.summarize(str(tmp_path), "2026-12-05", summary) == (summary, False)
    # nginx finishes the line (here: the rest of the file is replaced by whole lines from the offset on)
    path = tmp_path / "2026-12-05.jsonl"
    data = path.read_bytes()[:offset]
    path.write_bytes(data + b"".join(json.dumps(line).encode() + b"\n" for line in LINES[3:]))
    summary, changed = usage.summarize(str(tmp_path), "2026-12-05", summary)
    assert changed and summary["clients"]["bob"]["qwen"] == {
        "requests": 2, "prompt_tokens": 10, "completion_tokens": 2, "unmetered": 1}  # fmt: skip
    assert usage.summarize(str(tmp_path), "2026-12-06") == (usage.new_summary("2026-12-06"), False)


def test_lines_without_a_client_or_not_json_are_not_counted(tmp_path):
    path = tmp_path / "2026-12-05.jsonl"
    path.write_bytes(b'not json\n{"client":"","model":"qwen","prompt_tokens":"5"}\n[1]\n'
                     b'{"client":"alice","model":"qwen","prompt_tokens":"-3","completion_tokens":"x"}\n')  # fmt: skip
    summary, _ = usage.summarize(str(tmp_path), "2026-12-05")
    assert summary["clients"] == {
        "alice": {"qwen": {"requests": 1, "prompt_tokens": 0, "completion_tokens": 0, "unmetered": 0}}}  # fmt: skip


def test_spent_names_the_clients_at_or_over_budget_until_the_day_ends(tmp_path):
    write_log(tmp_path, "2026-12-05", LINES)
    summary, _ = usage.summarize(str(tmp_path), "2026-12-05")
    now = datetime.datetime(2026, 12, 5, 15, 30, tzinfo=UTC)
    day, end = usage.day_bounds(now)
    assert day == "2026-12-05" and end == datetime.datetime(2026, 12, 6, tzinfo=UTC)
    doc = usage.spent(summary, {"alice": 242, "bob": 13, "carol": 1}, end)
    assert doc == {"day": "2026-12-05", "until": int(end.timestamp()), "resets_at": "2026-12-06T00:00:00+00:00",
                   "spent": {"alice": {"budget": 242, "used": 242}}}  # fmt: skip
    assert usage.spent(summary, {"bob": 12}, end)["spent"] == {"bob": {"budget": 12, "used": 12}}


def test_prometheus_counters_and_the_report_table(tmp_path):
    write_log(tmp_path, "2026-12-05", LINES)
    summary, _ = usage.summarize(str(tmp_path), "2026-12-05")
    text = usage.prometheus(summary, {"alice": 1000, 'odd"name': 5})
    assert 'rigops_llm_gateway_prompt_tokens_total{client="alice",model="qwen"} 200' in text
    assert 'rigops_llm_gateway_unmetered_requests_total{client="bob",model="qwen"} 1' in text
    assert "# TYPE rigops_llm_gateway_requests_total counter" in text
    assert 'rigops_llm_gateway_budget_tokens{client="odd\\"name"} 5' in text
    other = usage.new_summary("2026-12-04")
    usage.add(other, {"client": "alice", "model": "qwen", "prompt_tokens": "1", "completion_tokens": "1"})
    rows = usage.rows([summary, other])
    assert rows[0] == {"client": "alice", "model": "embed", "requests": 1, "prompt_tokens": 7,
                       "completion_tokens": 0, "unmetered": 0}  # fmt: skip
    assert rows[1]["requests"] == 3 and rows[1]["prompt_tokens"] == 201
    table = usage.table(rows, "2026-12-04", "2026-12-05").splitlines()
    assert table[0] == "usage from 2026-12-04 to 2026-12-05 (the gateway host's days)"
    assert table[1].split() == ["client", "model", "requests", "prompt", "completion", "total", "unmetered"]
    assert table[2].split() == ["alice", "embed", "1", "7", "0", "7", "0"]
    assert table[4].split() == ["alice", "(all)", "4", "208", "36", "244", "0"]
    assert table[5].split() == ["bob", "qwen", "2", "10", "2", "12", "1"]
    assert usage.table([], "2026-12-05", "2026-12-05").endswith("no request in that period\n")


def test_old_days_expire_and_configs_are_checked():
    names = ["2026-01-01.jsonl", "2026-01-01.json", "2026-12-04.json", "2026-12-05.jsonl", "spent.json", ".x.tmp"]
    assert usage.expired(names, "2026-12-05", 2) == ["2026-01-01.json", "2026-01-01.jsonl"]
    assert usage.expired(names, "2026-12-05", 1) == ["2026-01-01.json", "2026-01-01.jsonl", "2026-12-04.json"]
    assert usage.days_between("2026-11-30", "2026-12-02") == ["2026-11-30", "2026-12-01", "2026-12-02"]
    good = {"interval": 2, "usage_dir": "/u", "spent_file": "/u/s", "textfile": "", "budgets": {"a": 5},
            "keep_days": 400}  # fmt: skip
    assert usage.check_config(good) == []
    assert usage.check_config(dict(good, budgets={"a": 0}))[0].startswith("config: budgets must map")
    assert usage.check_config({k: v for k, v in good.items() if k != "spent_file"}) == ["config: spent_file missing"]
    assert usage.check_config(dict(good, interval=True)) == ["config: interval must be a number above 0, got True"]
    assert usage.check_config([]) == ["config: not a JSON object"]
