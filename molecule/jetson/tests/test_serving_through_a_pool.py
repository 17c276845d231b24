"""The gateway on jet-1 in front of the three boards, which serve one name (`tiny`): a pool of three real vLLMs,
policy session (the default), asked for by the alias `coder`. A short multi-turn trace through it (conversations
with a shared system prompt, each turn resending the conversation so far, as coding agents do): each conversation
stays on one board and the boards share them; the tokens the gateway counts per client are the tokens the vLLMs
counted themselves; a board whose vLLM stops takes only its own conversations with it, to the other boards, and
no request fails. Runs last, after the rollouts (test_rollout.py), which leave every board serving: the board
stopped here is not waited for."""

import json
import time

import pytest
from rigops_testinfra import get_host

pytestmark = pytest.mark.changes_state

BOARDS = ["jet-1", "jet-2", "jet-3"]
KEY = "sandbox-jetson-client-dev-key-0123456789abcdef"
PYTHON = "/opt/rigops/vllm/current/venv/bin/python"
CA = "/etc/rigops-llm-gateway/tls/ca.pem"
USAGE = "/usr/local/lib/rigops-llm-gateway/rigops-llm-gateway-usage"

# Turns of CONVERSATIONS conversations, in rounds (turn 1 of each, then turn 2 of each, ...); prints, per request
# in order, the conversation and turn; the gateway's usage log says which board answered each.
TRACE = """
import json, sys, openai
key, rounds, first = open(sys.argv[1]).read().strip(), int(sys.argv[2]), int(sys.argv[3])
c = openai.OpenAI(base_url="https://127.0.0.1:8443/v1", api_key=key)
system = {"role": "system", "content": "You are a terse assistant of the rigops sandbox. Answer in one word."}
state = json.load(open("/tmp/pool-trace.json")) if first else {}
sent = []
for turn in range(first, first + rounds):
    for n in range(8):
        talk = state.setdefault(str(n), [system, {"role": "user", "content": f"Conversation {n}: name a colour."}])
        if turn:
            talk.append({"role": "user", "content": f"And one more, turn {turn}?"})
        r = c.chat.completions.create(model="coder", messages=talk, max_tokens=3)
        talk.append({"role": "assistant", "content": r.choices[0].message.content or "-"})
        sent.append([n, turn])
json.dump(state, open("/tmp/pool-trace.json", "w"))
print(json.dumps(sent))
"""


def board(name):
    return get_host(name)


def vllm_counters():
    """Prompt and generation tokens each board's vLLM counted (its own /metrics)."""
    out = {}
    for name in BOARDS:
        text = board(name).check_output("curl -sS --noproxy '*' http://127.0.0.1:8000/metrics")
        out[name] = [
            sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric + "{"))
            for metric in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")
        ]
    return out


def trace(gw, rounds, first=0):
    """Run rounds of the trace; [(conversation, turn, board)] in order, from the gateway's usage log."""
    gw.check_output(f"cat > /tmp/pool_trace.py <<'EOF'\n{TRACE}\nEOF")
    gw.check_output(f"install -m 600 /dev/null /tmp/pool-key && cat > /tmp/pool-key <<'EOF'\n{KEY}\nEOF")
    log = "/var/lib/rigops-llm-gateway/usage/$(date +%F).jsonl"
    before = int(gw.check_output(f"cat {log} 2>/dev/null | wc -l"))
    sent = json.loads(gw.check_output(f"SSL_CERT_FILE={CA} {PYTHON} /tmp/pool_trace.py /tmp/pool-key {rounds} {first}"))
    lines = [json.loads(line) for line in gw.check_output(f"tail -n +{before + 1} {log}").splitlines()]
    assert [(line["client"], line["model"], line["status"]) for line in lines] == [("dev", "coder", 200)] * len(sent)
    return [(n, turn, line["target"].split("/")[0]) for (n, turn), line in zip(sent, lines, strict=True)]


def usage(gw):
    rows = json.loads(gw.check_output(f"{USAGE} report --json"))["rows"]
    return next((r for r in rows if (r["client"], r["model"]) == ("dev", "coder")), None) or {
        "requests": 0, "prompt_tokens": 0, "completion_tokens": 0}  # fmt: skip


def where(served):
    """conversation -> the boards that answered it."""
    out = {}
    for n, _turn, name in served:
        out.setdefault(n, set()).add(name)
    return out


def test_a_pool_keeps_each_conversation_on_one_board_and_counts_what_vllm_counted():
    gw = board("jet-1")
    counted, tokens = usage(gw), vllm_counters()
    served = trace(gw, rounds=3)
    boards = where(served)
    assert all(len(on) == 1 for on in boards.values()), boards
    assert len({name for on in boards.values() for name in on}) >= 2, boards  # the boards share the load
    # the usage service sums the day's log every 2 s: the tokens it counted are the tokens the vLLMs counted
    deadline = time.time() + 20
    while time.time() < deadline and usage(gw)["requests"] < counted["requests"] + len(served):
        time.sleep(1)
    now, after = usage(gw), vllm_counters()
    assert now["requests"] - counted["requests"] == len(served)
    prompt = sum(after[b][0] - tokens[b][0] for b in BOARDS)
    generated = sum(after[b][1] - tokens[b][1] for b in BOARDS)
    assert now["prompt_tokens"] - counted["prompt_tokens"] == prompt, (now, counted, prompt)
    assert now["completion_tokens"] - counted["completion_tokens"] == generated, (now, counted, generated)


def test_a_board_that_stops_takes_only_its_conversations_to_the_others():
    gw = board("jet-1")
    served = where(trace(gw, rounds=1, first=3))
    (stopped,) = served[0]  # the board of conversation 0
    gone = {n for n, on in served.items() if stopped in on}
    board(stopped).check_output("systemctl stop vllm@chat")
    try:
        moved = where(trace(gw, rounds=1, first=4))  # every request answered (trace asserts 200 each)
    finally:
        board(stopped).check_output("systemctl start --no-block vllm@chat")
    assert gone and set(moved) == set(served)
    for n, on in moved.items():
        if n in gone:
            assert stopped not in on, (n, on)
        else:
            assert on == served[n], (n, on, served[n])  # the others stay where their prefix is cached
