"""playbooks/bench.yml on the converged rig vs-rig (CPU build; alpha: tiny-a on 8001, beta: tiny-b on 8002):
a short ladder against alpha gives vLLM's --save-result JSON, the samples, the table and the plots on the
controller; a second run compares with the first; a wrong key is reported FAILED; the key never shows.

Three playbook runs (ladder [1, 4] then [1], 64 input / 16 output tokens): about 2-3 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
from rigops_testinfra import ROOT, ansible_playbook

# it runs load against alpha and installs rigops-bench: after the end-state tests
pytestmark = pytest.mark.changes_state

testinfra_hosts = ["vs-rig"]
BENCH = ROOT / "playbooks" / "bench.yml"
SHORT = ["-e", "bench_instances=alpha", "-e", "bench_input_len=64", "-e", "bench_output_len=16"]


def clean(output: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", output)


def has(output: str, text: str) -> bool:
    """`text` is in `output`, whitespace aside (the callback wraps long messages)."""
    return "".join(text.split()) in "".join(output.split())


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-reports")


@pytest.fixture(scope="module")
def alpha_key(host):
    return host.check_output("cat /etc/vllm/alpha/api_key").strip()


@pytest.fixture(scope="module")
def first(host, reports):
    """The ladder [1, 4] against alpha; beta's MainPID before and after."""
    beta = host.check_output("systemctl show -p MainPID --value vllm@beta")
    rc, out = ansible_playbook(
        BENCH, *SHORT, "-e", '{"bench_concurrency": [1, 4]}', "-e", f"bench_report_dir={reports}",
        "-e", "bench_run_id=first",
    )  # fmt: skip
    return {"rc": rc, "out": clean(out), "dir": reports / "first", "beta": (beta, host.check_output(
        "systemctl show -p MainPID --value vllm@beta"))}  # fmt: skip


def test_the_run_passes_and_prints_the_table(first):
    assert first["rc"] == 0, first["out"][-4000:]
    out = first["out"]
    assert has(out, "vs-rig alpha at concurrency 1: OK completed=8 failed=0 output=")
    assert has(out, "vs-rig alpha at concurrency 4: OK completed=16 failed=0 output=")
    assert has(out, "### vs-rig / alpha (tiny-a)")
    assert has(out, f"Bench report: {first['dir']}/report.md")


def test_vllms_result_json_is_kept_and_counts_every_request(first):
    for step, concurrency, prompts in (("c001", 1, 8), ("c004", 4, 16)):
        d = first["dir"] / "vs-rig" / "alpha" / step
        result = json.loads((d / "result.json").read_text())
        assert (result["completed"], result["failed"], result["max_concurrency"]) == (prompts, 0, concurrency)
        assert result["backend"] == "openai-chat" and result["total_output_tokens"] == prompts * 16
        record = json.loads((d / "step.json").read_text())
        argv = record["argv"]
        for flag, value in (("--endpoint", "/v1/chat/completions"), ("--dataset-name", "random"),
                            ("--random-input-len", "64"), ("--random-output-len", "16"),
                            ("--base-url", "http://127.0.0.1:8001"), ("--served-model-name", "tiny-a")):  # fmt: skip
            assert argv[argv.index(flag) + 1] == value, flag
        assert "--save-result" in argv and record["exit_code"] == 0 and record["errors"] == []
        assert record["key"] == "environment (OPENAI_API_KEY)"
        assert record["load_started"] < record["load_finished"]


def test_memory_and_metrics_were_sampled_on_the_server(host, first):
    pid = int(host.check_output("systemctl show -p MainPID --value vllm@alpha"))
    samples = [
        json.loads(line)
        for line in (first["dir"] / "vs-rig" / "alpha" / "c004" / "samples.jsonl").read_text().splitlines()
    ]
    start = samples[0]
    assert (start["kind"], start["memory"], start["pid"], start["interval"]) == ("start", "proc", pid, 0.5)
    memory = [s for s in samples if s["kind"] == "memory"]
    metrics = [s for s in samples if s["kind"] == "metrics"]
    assert len(memory) >= 4 and all(s["used_mib"] > 300 for s in memory), "the RSS of vLLM's processes"
    assert metrics and all("error" not in s for s in metrics)
    assert {"kv_cache_usage", "running", "waiting"} <= set(metrics[0])
    assert samples[-1]["kind"] == "stop"


def test_the_run_records_what_produced_it(host, first):
    d = first["dir"] / "vs-rig"
    assert (d / "alpha" / "config.toml").read_text() == host.file("/etc/vllm/alpha/config.toml").content_string
    assert json.loads((d / "models.json").read_text()) == json.loads(
        host.file("/etc/rigops/models.json").content_string
    )
    release = host.check_output("readlink -f /opt/rigops/vllm/current")
    runtime = json.loads((d / "alpha" / "runtime.json").read_text())
    assert runtime == json.loads(host.file(f"{release}/.rigops-release.json").content_string)
    facts = json.loads((d / "host.json").read_text())
    assert (facts["host"], facts["flavour"], facts["memory_source"]) == ("vs-rig", "cpu", "proc")
    assert facts["params"]["concurrency"] == [1, 4] and facts["params"]["num_prompts"] == [8, 16]
    instance = json.loads((d / "alpha" / "instance.json").read_text())
    assert (instance["active"], instance["model_name"], instance["tokenizer"]) == (
        "active", "tiny-a", host.check_output("python3 -c \"import tomllib; print(tomllib.load(open("
                                              "'/etc/vllm/alpha/config.toml', 'rb'))['model']['path'])\""),
    )  # fmt: skip


def test_the_report_table_and_plots(first):
    d = first["dir"]
    report = (d / "report.md").read_text()
    rows = [ln for ln in report.splitlines() if re.match(r"\| [14] \| ", ln)]
    assert len(rows) == 2 and all("| ok |" in r for r in rows)
    assert "FAILED" not in report
    assert "vs-rig (" in report and "no published reference matches this hardware" in report
    for name, size in (("throughput.png", (800, 500)), ("ttft.png", (800, 500)), ("memory.png", (900, 600))):
        assert png_size(d / name) == size and (d / name).stat().st_size > 15_000, name
    summary = json.loads((d / "summary.json").read_text())
    assert summary["failed_steps"] == [] and summary["errors"] == []


def test_the_key_never_shows_and_nothing_is_left_on_the_rig(host, first, alpha_key):
    assert alpha_key not in first["out"]
    for path in first["dir"].rglob("*"):
        if path.is_file() and path.suffix != ".png":
            assert alpha_key not in path.read_text(errors="replace"), path
    assert not host.file("/var/lib/rigops/bench/first").exists
    assert host.run("pgrep -f '[r]igops-bench sample'").rc == 1, "a sampler was left running"
    script = host.file("/usr/local/lib/rigops-bench/rigops-bench")
    assert (script.user, script.mode) == ("root", 0o755)


def test_the_other_instance_was_left_alone(first):
    before, after = first["beta"]
    assert before == after and before != "0"


def test_a_second_run_compares_with_the_first(reports, first):
    rc, out = ansible_playbook(
        BENCH, *SHORT, "-e", '{"bench_concurrency": [1]}', "-e", f"bench_report_dir={reports}",
        "-e", "bench_run_id=second", "-e", f"bench_compare={first['dir']}",
    )  # fmt: skip
    out = clean(out)
    assert rc == 0, out[-4000:]
    assert has(out, "## Compared with first")
    compared = (reports / "second" / "report.md").read_text().split("## Compared with first")[1]
    row = next(ln for ln in compared.splitlines() if ln.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    old = json.loads((first["dir"] / "vs-rig" / "alpha" / "c001" / "result.json").read_text())["output_throughput"]
    new = json.loads((reports / "second" / "vs-rig" / "alpha" / "c001" / "result.json").read_text())[
        "output_throughput"
    ]
    assert cells[1:3] == ["ok", "ok"] and cells[5] == f"{new / old:.2f}x"
    assert next(ln for ln in compared.splitlines() if ln.startswith("| 4 |")).split("|")[3].strip() == "not run"


def test_a_wrong_key_is_reported_failed(reports, alpha_key, tmp_path):
    wrong = "sk-rigops-wrong-key-" + "x" * 30
    secrets = tmp_path / "bench-key.yml"
    secrets.write_text(f"bench_api_key: {wrong}\n")
    rc, out = ansible_playbook(
        BENCH, *SHORT, "-e", '{"bench_concurrency": [1]}', "-e", "bench_num_prompts=4", "-e", f"@{secrets}",
        "-e", f"bench_report_dir={reports}", "-e", "bench_run_id=wrongkey",
    )  # fmt: skip
    out = clean(out)
    assert rc != 0
    # no speed for a run whose requests all failed (vLLM itself writes 0 ms and 0 tok/s for it)
    outcome = out.split("Step | Outcome, alpha at concurrency 1]")[1].split("TASK [")[0]
    assert has(outcome, "vs-rig alpha at concurrency 1: FAILED completed=0 failed=4 errors: Unauthorized")
    assert "output=" not in outcome and "ttft" not in outcome
    assert has(out, "bench: 1 step(s) FAILED (vs-rig/alpha c=1: FAILED (all 4 requests failed: Unauthorized))")
    report = (reports / "wrongkey" / "report.md").read_text()
    assert "| 1 | 4 | **FAILED** | — | — | — | — | — | 4 |" in report
    assert wrong not in out and alpha_key not in out
    result = json.loads((reports / "wrongkey" / "vs-rig" / "alpha" / "c001" / "result.json").read_text())
    assert (result["completed"], result["failed"]) == (0, 4)


def test_an_instance_no_host_serves_is_refused_before_anything_runs(reports):
    rc, out = ansible_playbook(BENCH, "-e", "bench_instances=gamma", "-e", f"bench_report_dir={reports}")
    assert rc != 0
    assert has(clean(out), "bench_instances names gamma, which no host of this run serves (they serve: alpha, beta)")
