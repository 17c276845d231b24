"""Bench: the report (commands/bench_report.py), the rig-side sampler and vllm bench serve wrapper
(roles/bench/files/rigops-bench), the role's filters, and playbooks/bench.yml's preflight.

The runs under tests/fixtures/bench/ are real: playbooks/bench.yml against a local vLLM CPU server
(tests/fixtures/bench/SOURCES.md): a clean ladder, a dead server, a wrong key.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.machinery
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.filter import bench as bench_filters
from ansible_run import ansible_playbook

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "bench"
SCRIPT = ROOT / "roles" / "bench" / "files" / "rigops-bench"
REFERENCES = ROOT / "roles" / "bench" / "files" / "references.yml"

sys.path.insert(0, str(ROOT / "commands"))
import bench_report  # noqa: E402


def _load_script():
    loader = importlib.machinery.SourceFileLoader("rigops_bench", str(SCRIPT))
    spec = importlib.util.spec_from_loader("rigops_bench", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


rb = _load_script()


@pytest.fixture
def run(tmp_path):
    """A copy of a fixture run (the report writes into the run's folder)."""

    def _copy(name):
        dst = tmp_path / name
        shutil.copytree(FIX / name, dst)
        return dst

    return _copy


def result(name, instance, step):
    return json.loads((FIX / name / "localrig" / instance / step / "result.json").read_text())


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------- one step, from vLLM's JSON


def test_a_clean_step_takes_vllms_figures_and_the_sampled_peaks():
    loaded = bench_report.load_run(FIX / "run-before")
    (host,) = loaded["hosts"]
    (alpha,) = host["instances"]
    c1, c4 = alpha["steps"]
    raw1, raw4 = result("run-before", "alpha", "c001"), result("run-before", "alpha", "c004")
    assert (c1["concurrency"], c4["concurrency"]) == (1, 4)
    assert c1["status"] == c4["status"] == "ok"
    assert (c1["completed"], c1["failed"], c1["num_prompts"]) == (raw1["completed"], 0, 8)
    assert c1["output_tok_s"] == raw1["output_throughput"] and c4["output_tok_s"] == raw4["output_throughput"]
    assert c1["ttft_p50_ms"] == raw1["p50_ttft_ms"] and c1["ttft_p99_ms"] == raw1["p99_ttft_ms"]
    assert c4["itl_p50_ms"] == raw4["p50_itl_ms"] and c4["e2el_p50_ms"] == raw4["p50_e2el_ms"]
    # peaks come from the sampler's lines, inside the load window when it holds samples
    samples = bench_report.read_samples(FIX / "run-before" / "localrig" / "alpha" / "c004" / "samples.jsonl")
    mem = [s["used_mib"] for s in samples if s["kind"] == "memory"]
    assert c4["memory_source"] == "proc" and c4["memory_samples"] == len(mem) > 10
    assert min(mem) <= c4["peak_mem_mib"] <= max(mem)
    kv = [s["kv_cache_usage"] for s in samples if s["kind"] == "metrics" and "kv_cache_usage" in s]
    assert c1["peak_kv_cache"] is not None and 0 <= c4["peak_kv_cache"] <= max(kv) < 1


def test_the_load_window_picks_the_peak_during_the_requests():
    samples = [
        {"kind": "start", "memory": "proc", "interval": 0.5, "t": 0},
        {"kind": "memory", "used_mib": 900.0, "t": 1.0},  # before: something else's peak
        {"kind": "memory", "used_mib": 500.0, "t": 10.0},
        {"kind": "memory", "used_mib": 600.0, "t": 10.5},
        {"kind": "memory", "used_mib": 400.0, "t": 20.0},
    ]
    assert bench_report.memory_stats(samples, (10.2, 10.4))["peak_mem_mib"] == 600.0
    assert bench_report.memory_stats(samples)["peak_mem_mib"] == 900.0
    # a window without a sample (shorter than the interval) falls back to the whole step
    assert bench_report.memory_stats(samples, (30.0, 30.1))["peak_mem_mib"] == 900.0


def test_a_wrong_key_is_failed_never_a_fast_run(run):
    raw = result("run-wrongkey", "alpha", "c001")
    # what vLLM wrote: nothing completed, every figure 0 (a "0 ms TTFT"), and its exit code was 0
    assert (raw["completed"], raw["failed"], raw["median_ttft_ms"], raw["output_throughput"]) == (0, 8, 0.0, 0.0)
    record = json.loads((FIX / "run-wrongkey" / "localrig" / "alpha" / "c001" / "step.json").read_text())
    assert record["exit_code"] == 0 and record["errors"][0] == "Unauthorized"
    out = bench_report.build(run("run-wrongkey"))
    (row,) = out["summary"]["hosts"][0]["instances"][0]["steps"]
    assert row["status"] == "FAILED" and "output_tok_s" not in row and "ttft_p50_ms" not in row
    assert row["why"] == "all 8 requests failed: Unauthorized"
    md = out["markdown"]
    assert "**FAILED: 1 step(s) with failed requests** (localrig/alpha c=1)" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "**FAILED**" and cells[3:8] == ["—"] * 5 and cells[8] == "8"
    assert "0.0" not in cells[3:8]
    assert out["summary"]["failed_steps"] == ["localrig/alpha c=1: FAILED (all 8 requests failed: Unauthorized)"]


def test_a_dead_server_is_failed_with_the_connection_error(run):
    out = bench_report.build(run("run-after"), plots=False)
    beta = next(i for i in out["summary"]["hosts"][0]["instances"] if i["name"] == "beta")
    assert [s["status"] for s in beta["steps"]] == ["FAILED", "FAILED"]
    assert all("ConnectionRefusedError" in s["why"] and "127.0.0.1', 18802" in s["why"] for s in beta["steps"])
    assert beta["meta"]["active"] == "inactive" and beta["steps"][0]["memory_samples"] == 0
    assert "unit vllm@beta.service: **inactive** at the start" in out["markdown"]
    assert len(out["summary"]["failed_steps"]) == 2
    alpha = next(i for i in out["summary"]["hosts"][0]["instances"] if i["name"] == "alpha")
    assert [s["status"] for s in alpha["steps"]] == ["ok", "ok"]


def test_partly_failed_and_missing_results():
    half = {"completed": 3, "failed": 1, "num_prompts": 4, "output_throughput": 99.0, "p50_ttft_ms": 5.0}
    row = bench_report.summarize_step(half, {"concurrency": 2, "errors": ["Not Found", "Not Found"]}, [])
    assert row["status"] == "FAILED" and row["why"] == "1 of 4 requests failed: Not Found"
    assert row["errors"] == ["Not Found"]
    none = bench_report.summarize_step(None, {"concurrency": 2, "error": "vllm bench serve ran over 60 s"}, [])
    assert (none["status"], none["why"]) == ("ERROR", "vllm bench serve ran over 60 s")
    assert bench_report.table_row(none).split("|")[3].strip() == "**ERROR**"


def test_a_torn_sample_line_is_skipped(tmp_path):
    src = FIX / "run-before" / "localrig" / "alpha" / "c001" / "samples.jsonl"
    torn = tmp_path / "samples.jsonl"
    torn.write_text(src.read_text() + '{"kind": "memory", "used_m')
    assert len(bench_report.read_samples(torn)) == len(bench_report.read_samples(src))


def test_a_step_without_result_json_is_an_error(run):
    d = run("run-before")
    (d / "localrig" / "alpha" / "c004" / "result.json").unlink()
    out = bench_report.build(d, plots=False)
    c4 = out["summary"]["hosts"][0]["instances"][0]["steps"][1]
    assert c4["status"] == "ERROR" and out["summary"]["failed_steps"] == [
        "localrig/alpha c=4: ERROR (vllm bench serve saved no result)"
    ]


def test_an_instance_that_could_not_run_is_reported(run):
    d = run("run-before")
    (d / "localrig" / "gamma").mkdir()
    (d / "localrig" / "gamma" / "error.txt").write_text("Run | Each instance's config.toml: file not found\n")
    out = bench_report.build(d, plots=False)
    assert out["summary"]["errors"] == ["localrig/gamma: Run | Each instance's config.toml: file not found"]
    assert "**ERROR: not measured**: Run | Each instance's config.toml: file not found" in out["markdown"]


def test_not_a_run_folder(tmp_path):
    with pytest.raises(SystemExit, match="no host folder"):
        bench_report.load_run(tmp_path)
    with pytest.raises(SystemExit, match="is not a folder"):
        bench_report.load_run(tmp_path / "missing")


# --------------------------------------------------------------------------- the report as a person reads it


def test_the_table_per_instance_and_concurrency(run):
    out = bench_report.build(run("run-before"), plots=False)
    md = out["markdown"]
    raw1 = result("run-before", "alpha", "c001")
    assert "### localrig / alpha (tiny-a)" in md
    assert "runtime: cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-localtest" in md
    assert "model: Qwen/Qwen3.5-9B @ 046faecc3573" in md
    assert "random prompts of 64 tokens in, 16 out, openai-chat on /v1/chat/completions, concurrency [1, 4]" in md
    head = next(ln for ln in md.splitlines() if ln.startswith("| concurrency"))
    for column in (
        "output tok/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "E2E p50 s",
        "failed",
        "peak memory MiB",
    ):
        assert column in head
    line = next(ln for ln in md.splitlines() if ln.startswith("| 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["1", "8", "ok"]
    assert cells[3] == f"{raw1['output_throughput']:,.1f}" and cells[4] == f"{raw1['p50_ttft_ms']:,.1f}"
    assert cells[7] == f"{raw1['p50_e2el_ms'] / 1000:,.2f}" and cells[8] == "0"
    assert "FAILED" not in md and out["summary"]["failed_steps"] == []
    assert (Path(out["summary"]["run"]).name, out["summary"]["files"][0]) == ("run-before", "report.md")


def test_without_matplotlib_the_report_has_its_tables_and_says_why(run, monkeypatch, capsys):
    """A production controller (requirements.txt) has no matplotlib: tables only, and the fix named."""
    real = bench_report.importlib.util.find_spec
    monkeypatch.setattr(
        bench_report.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a)
    )
    d = run("run-after")
    out = bench_report.build(d, compare=FIX / "run-before")
    assert out["summary"]["files"] == ["report.md", "summary.json"] and not list(d.glob("*.png"))
    assert "pip install -r requirements-bench.txt" in capsys.readouterr().err
    assert "| concurrency |" in (d / "report.md").read_text()


def test_plots_are_pngs_of_the_expected_size(run):
    d = run("run-after")
    out = bench_report.build(d, compare=FIX / "run-before")
    for name, size in (("throughput.png", (800, 500)), ("ttft.png", (800, 500)), ("memory.png", (900, 600))):
        assert png_size(d / name) == size
        assert (d / name).stat().st_size > 15_000, f"{name} looks empty"
    assert set(out["summary"]["files"]) == {"report.md", "summary.json", "throughput.png", "ttft.png", "memory.png"}
    summary = json.loads((d / "summary.json").read_text())
    assert summary["failed_steps"] == out["summary"]["failed_steps"]


def test_every_step_failed_still_makes_valid_plots(run):
    d = run("run-wrongkey")
    bench_report.build(d)
    assert png_size(d / "throughput.png") == (800, 500) and png_size(d / "memory.png") == (900, 600)


def test_compare_two_runs_side_by_side_with_ratios(run):
    d = run("run-after")
    out = bench_report.build(d, compare=FIX / "run-before", plots=False)
    pairs = out["summary"]["compare"]["pairs"]
    # alpha is in both runs; beta only in the later one
    assert [(p["before"], p["after"]) for p in pairs] == [(["localrig", "alpha"], ["localrig", "alpha"])]
    rows = {r["concurrency"]: r for r in pairs[0]["rows"]}
    for c, step in ((1, "c001"), (4, "c004")):
        old, new = result("run-before", "alpha", step), result("run-after", "alpha", step)
        assert rows[c]["output_tok_s_ratio"] == pytest.approx(new["output_throughput"] / old["output_throughput"])
        assert rows[c]["ttft_p50_ratio"] == pytest.approx(new["p50_ttft_ms"] / old["p50_ttft_ms"])
    md = out["markdown"]
    assert "## Compared with run-before" in md
    ratio = new["output_throughput"] / old["output_throughput"]
    line = next(ln for ln in md.split("## Compared with")[1].splitlines() if ln.startswith("| 4 |"))
    assert f"{ratio:.2f}x" in line


def test_compare_with_a_failed_run_shows_no_ratio(run):
    d = run("run-wrongkey")
    out = bench_report.build(d, compare=FIX / "run-before", plots=False)
    rows = {r["concurrency"]: r for r in out["summary"]["compare"]["pairs"][0]["rows"]}
    assert rows[1]["output_tok_s_ratio"] is None and rows[1]["after"]["status"] == "FAILED"
    assert rows[4]["after"] is None  # not run this time
    line = next(ln for ln in out["markdown"].split("## Compared with")[1].splitlines() if ln.startswith("| 1 |"))
    assert "| ok | **FAILED** |" in line and "x |" not in line.split("**FAILED**")[1].split("|")[3]
    line4 = next(ln for ln in out["markdown"].split("## Compared with")[1].splitlines() if ln.startswith("| 4 |"))
    assert "| ok | not run |" in line4


def test_the_cli_writes_the_report_and_prints_it(run):
    d = run("run-after")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "commands" / "bench_report.py"), str(d), "--compare", str(FIX / "run-before")],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (d / "report.md").read_text()
    assert png_size(d / "ttft.png") == (800, 500)


# --------------------------------------------------------------------------- published figures


def host_facts(d: Path, **facts):
    path = d / "localrig" / "host.json"
    data = json.loads(path.read_text())
    data.update(facts)
    path.write_text(json.dumps(data))


def test_no_reference_for_a_cpu_box(run):
    out = bench_report.build(run("run-before"), references=REFERENCES, plots=False)
    assert "localrig (AMD EPYC, 2 cores, no GPU): no published reference matches this hardware" in out["markdown"]
    assert out["summary"]["references"]["localrig"]["matches"] == []


def test_eight_rtx_5090_match_the_large_moe_figure(run):
    d = run("run-before")
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 5090", "memory_total_mib": 32607.0} for i in range(8)]
    host_facts(d, gpus=gpus)
    out = bench_report.build(d, references=REFERENCES, plots=False)
    ref = out["summary"]["references"]["localrig"]
    assert ref["matches"] == ["rtx5090x8-large-moe"] and ref["hardware"] == "8x NVIDIA GeForce RTX 5090"
    (c,) = ref["comparisons"]
    best = max(result("run-before", "alpha", s)["output_throughput"] for s in ("c001", "c004"))
    assert c["step"]["output_tok_s"] == best and c["ratio"] == pytest.approx(best / 1200)
    assert "| rtx5090x8-large-moe | a large MoE model, tensor parallel 8 | best | 1,200 | 0.8–1.2 |" in out["markdown"]


@pytest.mark.parametrize(
    "gpus",
    [
        [{"index": i, "name": "NVIDIA GeForce RTX 5090"} for i in range(4)],  # count differs
        [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)],  # name differs
    ],
)
def test_other_gpus_have_no_reference(run, gpus):
    d = run("run-before")
    host_facts(d, gpus=gpus)
    out = bench_report.build(d, references=REFERENCES, plots=False)
    assert out["summary"]["references"]["localrig"]["matches"] == []
    assert "no published reference matches this hardware" in out["markdown"]


def test_a_jetson_thor_matches_the_49_stream_figures_at_concurrency_49(run):
    d = run("run-before")
    host_facts(d, jetson_model="NVIDIA Jetson AGX Thor Developer Kit")
    out = bench_report.build(d, references=REFERENCES, plots=False)
    ref = out["summary"]["references"]["localrig"]
    assert ref["matches"] == ["jetson-t5000-small-vlm-49", "jetson-t5000-9b-49"]
    # the ladder stopped at 4: there is no step to set beside a 49-stream figure
    assert all(c["step"] is None for c in ref["comparisons"])
    assert (
        "| jetson-t5000-small-vlm-49 | a small vision-language model, 49 concurrent camera streams | 49 | 525 |"
        in (out["markdown"])
    )
    assert "no such ok step" in out["markdown"]


def test_published_figures_only_when_asked(run):
    out = bench_report.build(run("run-before"), plots=False)
    assert "## Published figures" not in out["markdown"] and out["summary"]["references"] is None
    d = run("run-after")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "commands" / "bench_report.py"), str(d), "--no-plots", "--reference"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0 and "no published reference matches this hardware" in proc.stdout
    proc = subprocess.run(
        [sys.executable, str(ROOT / "commands" / "bench_report.py"), str(d), "--reference", "--references", "/nope"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "--references /nope: no such file" in proc.stderr


def test_every_reference_names_its_source_and_figure():
    refs = bench_report.load_references(REFERENCES)
    assert {r["id"] for r in refs} == {"rtx5090x8-large-moe", "jetson-t5000-small-vlm-49", "jetson-t5000-9b-49"}
    for ref in refs:
        assert ref["source"] and ref["output_tok_s"] > 0 and ref["match"], ref["id"]


# --------------------------------------------------------------------------- rig side: parsers and sampler


def test_tegrastats_real_lines():
    lines = (FIX / "sampler" / "tegrastats-real.txt").read_text().splitlines()
    parsed = [rb.parse_tegrastats_line(ln) for ln in lines]
    assert parsed[0] == {"used_mib": 36529.0, "total_mib": 125749.0}  # Thor JetPack 7.2: no GR3D_FREQ
    assert parsed[1] == {"used_mib": 37755.0, "total_mib": 125749.0}
    assert parsed[2] == {"used_mib": 20642.0, "total_mib": 62817.0, "gpu_util": 12}  # Orin: 12%@[1300,1300]
    assert parsed[3] == {"used_mib": 14700.0, "total_mib": 15692.0, "gpu_util": 0}  # Xavier
    assert rb.parse_tegrastats_line("startup noise") is None


def test_nvidia_smi_lines():
    assert rb.parse_nvidia_smi_line("0, 25187, 32607") == (0, 25187.0, 32607.0)
    assert rb.parse_nvidia_smi_line("3, 25187 MiB, 32607 MiB") == (3, 25187.0, 32607.0)
    assert rb.parse_nvidia_smi_line("1, 4") == (1, 4.0, None)
    # a Jetson's nvidia-smi has no memory figures (unified memory): no sample, not a zero
    assert rb.parse_nvidia_smi_line("0, [N/A], [N/A]") is None
    assert rb.parse_nvidia_smi_line("index, memory.used [MiB], memory.total [MiB]") is None


def test_metrics_of_a_real_vllm_server():
    idle = rb.parse_metrics((FIX / "metrics" / "vllm-0.32.0-cpu-idle.txt").read_text())
    busy = rb.parse_metrics((FIX / "metrics" / "vllm-0.32.0-cpu-16-running.txt").read_text())
    assert idle == {"kv_cache_usage": 0.0, "running": 0.0, "waiting": 0.0}
    assert busy == {"kv_cache_usage": pytest.approx(0.0782013685), "running": 16.0, "waiting": 0.0}
    # older vLLM: gpu_cache_usage_perc; two engines: the counts add up, the cache keeps the fullest
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_running{engine="0"} 2\n'
    old += 'vllm:num_requests_running{engine="1"} 3\nvllm:gpu_cache_usage_perc{model_name="n"} 0.25\n'
    assert rb.parse_metrics(old) == {"kv_cache_usage": 0.5, "running": 5.0}


def test_process_tree_rss_counts_the_children(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         "p = subprocess.Popen([sys.executable, '-c', 'x = bytearray(64 << 20); import time; time.sleep(30)']); "
         "time.sleep(30)"],
    )  # fmt: skip
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            kib = rb.process_tree_rss_kib(child.pid)
            if kib and kib > 64 * 1024:
                break
            time.sleep(0.2)
        own = int(next(ln for ln in Path(f"/proc/{child.pid}/status").read_text().splitlines()
                       if ln.startswith("VmRSS:")).split()[1])  # fmt: skip
        assert kib > 64 * 1024 > own, "the grandchild's 64 MiB must be counted"
    finally:
        for p in Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split():
            os.kill(int(p), 9)
        child.kill()
        child.wait()
    assert rb.process_tree_rss_kib(child.pid) is None


class _Metrics(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(handler):
    """A /metrics stand-in on a free port with this handler; its URL."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def metrics_server():
    _Metrics.body = (FIX / "metrics" / "vllm-0.32.0-cpu-16-running.txt").read_bytes()
    with serving(_Metrics) as url:
        yield url


def stand_in(tmp_path: Path, name: str, lines: list[str]) -> Path:
    """A tool that prints these lines one by one, every 0.1 s, forever (like -lms / --interval)."""
    path = tmp_path / name
    path.write_text(
        "#!/bin/sh\nwhile true; do\n" + "".join(f"  printf '%s\\n' '{ln}'\n" for ln in lines) + "  sleep 0.1\ndone\n"
    )
    path.chmod(0o755)
    return path


def run_sampler(tmp_path: Path, *args: str, seconds: float = 1.5) -> list[dict]:
    out, stop = tmp_path / "s" / "samples.jsonl", tmp_path / "stop"
    stop.unlink(missing_ok=True)  # a stop file that is already there stops the sampler at once
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "sample", "--out", str(out), "--stop-file", str(stop), "--interval", "0.2",
         "--max-seconds", "30", *args],
    )  # fmt: skip
    time.sleep(seconds)
    stop.touch()
    assert proc.wait(timeout=10) == 0
    return bench_report.read_samples(out)


def test_sampler_nvidia_smi_sums_the_instances_gpus(tmp_path, metrics_server):
    smi = stand_in(tmp_path, "nvidia-smi", ["0, 1000, 32607", "1, 2000, 32607", "2, 4000, 32607"])
    rows = run_sampler(tmp_path, "--memory", "nvidia-smi", "--nvidia-smi", str(smi), "--gpus", "0,2",
                       "--metrics-url", metrics_server)  # fmt: skip
    assert rows[0]["kind"] == "start" and rows[0]["gpus"] == [0, 2] and rows[-1]["kind"] == "stop"
    mem = [r for r in rows if r["kind"] == "memory"]
    assert len(mem) >= 3
    assert all(r["used_mib"] == 5000.0 and r["total_mib"] == 2 * 32607.0 for r in mem)
    assert mem[0]["per_gpu"] == {"0": 1000.0, "1": 2000.0, "2": 4000.0}
    met = [r for r in rows if r["kind"] == "metrics"]
    assert len(met) >= 3 and met[0]["running"] == 16.0 and met[0]["kv_cache_usage"] == pytest.approx(0.0782013685)


def test_sampler_on_a_jetson_reads_tegrastats(tmp_path):
    line = (FIX / "sampler" / "tegrastats-real.txt").read_text().splitlines()[0]
    tool = stand_in(tmp_path, "tegrastats", [line])
    rows = run_sampler(tmp_path, "--memory", "tegrastats", "--tegrastats", str(tool))
    mem = [r for r in rows if r["kind"] == "memory"]
    assert len(mem) >= 3 and mem[0]["used_mib"] == 36529.0 and mem[0]["total_mib"] == 125749.0


def test_sampler_on_the_cpu_build_reads_the_servers_rss(tmp_path, metrics_server):
    server = subprocess.Popen([sys.executable, "-c", "x = bytearray(32 << 20); import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        rows = run_sampler(tmp_path, "--memory", "proc", "--pid", str(server.pid), "--metrics-url", metrics_server)
    finally:
        server.kill()
        server.wait()
    mem = [r for r in rows if r["kind"] == "memory"]
    assert len(mem) >= 4 and all(r["used_mib"] > 32 for r in mem)
    # a dead server is said, not sampled as zero
    rows = run_sampler(tmp_path, "--memory", "proc", "--pid", str(server.pid), seconds=0.6)
    assert not [r for r in rows if r["kind"] == "memory"]
    assert any(r["kind"] == "error" and "is gone" in r["error"] for r in rows)


def test_sampler_records_an_unreachable_metrics_endpoint(tmp_path):
    rows = run_sampler(tmp_path, "--metrics-url", "http://127.0.0.1:9/metrics", seconds=0.8)
    met = [r for r in rows if r["kind"] == "metrics"]
    assert met and all("error" in r for r in met)
    assert bench_report.memory_stats(rows)["metrics_errors"] == len(met)


class _SlowMetrics(_Metrics):
    """/metrics of a server busy with the load: each answer takes longer than the sampling interval."""

    delay = 0.5

    def do_GET(self):  # noqa: N802
        time.sleep(self.delay)
        super().do_GET()


def test_a_slow_metrics_endpoint_is_waited_for_and_the_memory_keeps_its_cadence(tmp_path):
    """A scrape that takes 2.5 intervals is not cut off, and the memory samples go on every interval."""
    _SlowMetrics.body = (FIX / "metrics" / "vllm-0.32.0-cpu-16-running.txt").read_bytes()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with serving(_SlowMetrics) as url:
            args = ("--memory", "proc", "--pid", str(server.pid), "--metrics-url", url)
            rows = run_sampler(tmp_path, *args, seconds=2.2)
    finally:
        server.kill()
        server.wait()
    met = [r for r in rows if r["kind"] == "metrics"]
    assert len(met) >= 3 and all("error" not in r and r["running"] == 16.0 for r in met), met
    # one scrape per tick it did not overrun: no burst of catching up
    assert len(met) <= 2.2 / _SlowMetrics.delay + 1
    mem = [r for r in rows if r["kind"] == "memory"]
    # every 0.2 s while the scrapes wait (~10; a loop waiting on each 0.5 s scrape makes ~4)
    assert len(mem) >= 6, len(mem)
    assert rows[-1]["kind"] == "stop"


def test_a_scrape_past_its_timeout_is_recorded_as_an_error(tmp_path):
    _SlowMetrics.body = b""
    with serving(_SlowMetrics) as url:
        rows = run_sampler(tmp_path, "--metrics-url", url, "--metrics-timeout", "0.2", seconds=1.2)
    met = [r for r in rows if r["kind"] == "metrics"]
    assert met and all("timed out" in r["error"] for r in met), met


def test_a_stop_file_already_there_stops_the_sampler_at_once(tmp_path):
    """The playbook may touch the stop file before the background sampler has even started (a step that
    failed at once): the sampler must then end, not run until --max-seconds."""
    stop = tmp_path / "stop"
    stop.touch()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "sample", "--out", str(tmp_path / "s.jsonl"), "--stop-file", str(stop),
         "--max-seconds", "60"],
        check=False, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0 and time.monotonic() - t0 < 10
    kinds = [r["kind"] for r in bench_report.read_samples(tmp_path / "s.jsonl")]
    assert kinds == ["start", "stop"]


# --------------------------------------------------------------------------- rig side: the serve wrapper

# A stand-in for the runtime's python: runs the child like vLLM would, echoing what it got.
FAKE_PYTHON = textwrap.dedent(
    """\
    #!/bin/sh
    echo "the key: $OPENAI_API_KEY"
    echo "Starting main benchmark run..."
    echo "Failed requests during benchmark run detected (capping to 10):"
    echo "Error 0: Traceback (most recent call last):"
    echo "  File x, line 1"
    echo "ConnectionRefusedError: [Errno 111] Connect call failed"
    echo "============ Serving Benchmark Result ============"
    exit 3
    """
)


def serve(tmp_path, *args, env=None):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "serve", "--base-url", "http://127.0.0.1:9", "--model-name", "tiny-a",
         "--tokenizer", "/nonexistent", "--concurrency", "1", "--num-prompts", "2", *args],
        capture_output=True, text=True, check=False, timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(proc.stdout)


def test_serve_never_prints_the_key_and_reads_the_errors(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    key = "sk-test-" + "k" * 40
    keyfile = tmp_path / "api_key"
    keyfile.write_text(key + "\n")
    text, rec = serve(tmp_path, "--python", str(fake), "--key-file", str(keyfile))
    assert key not in text
    assert "the key: <key>" in rec["log_tail"]  # it did reach the child, in its environment only
    assert rec["key"] == "environment (OPENAI_API_KEY)"
    assert rec["errors"] == ["ConnectionRefusedError: [Errno 111] Connect call failed"]
    assert rec["exit_code"] == 3 and rec["status"] == "error" and rec["result_text"] is None
    assert rec["load_started"] <= rec["load_finished"]
    # the environment wins over the file (a gateway's key)
    text, rec = serve(tmp_path, "--python", str(fake), "--key-file", str(keyfile), env={"OPENAI_API_KEY": key + "X"})
    assert key not in text and "the key: <key>" in rec["log_tail"]


def test_serve_without_vllm_or_key_says_why(tmp_path):
    text, rec = serve(tmp_path, "--key-file", str(tmp_path / "missing"))
    assert rec["status"] == "error" and "cannot read the key file" in rec["error"]
    # the controller's python has no vLLM: no result, and the log says so
    text, rec = serve(tmp_path)
    assert rec["status"] == "error" and rec["result_text"] is None and rec["key"] == "none"
    assert any("No module named 'vllm'" in ln for ln in rec["log_tail"])


def test_bench_flags_are_vllms_and_carry_no_secret():
    ns = type("A", (), dict(endpoint="/v1/chat/completions", base_url="http://127.0.0.1:8001/", tokenizer="/m",
                            model_name="tiny-a", input_len=512, output_len=256, num_prompts=8, concurrency=2,
                            seed=0, num_warmups=1, trust_remote_code=False))  # fmt: skip
    flags = rb.bench_flags(ns, "/tmp/x", "result.json")
    got = {f: v for f, v, _ in flags}
    assert got["--backend"] == "openai-chat" and got["--endpoint"] == "/v1/chat/completions"
    assert got["--dataset-name"] == "random" and got["--base-url"] == "http://127.0.0.1:8001"
    assert (got["--random-input-len"], got["--random-output-len"], got["--max-concurrency"]) == (512, 256, 2)
    assert "--save-result" in got and "--ignore-eos" in got
    assert not any("key" in f for f in got) and "--header" not in got
    optional = {f for f, _, opt in flags if opt}
    assert optional == {"--disable-tqdm", "--ready-check-timeout-sec", "--num-warmups"}
    assert "--insecure" not in got and "--trust-remote-code" not in got
    ns.insecure, ns.trust_remote_code = True, True  # a gateway's self-signed certificate; a model's own code
    got = {f: opt for f, _, opt in rb.bench_flags(ns, "/tmp/x", "result.json")}
    assert got["--insecure"] is False and got["--trust-remote-code"] is False  # required: never dropped


def test_facts_name_the_sampler_by_the_runtime_flavour(tmp_path):
    markers = {}
    for flavour in ("cuda", "jetson", "cpu"):
        m = tmp_path / flavour / ".rigops-release.json"
        m.parent.mkdir()
        m.write_text(json.dumps({"release": f"{flavour}-x", "flavour": flavour}))
        markers[flavour] = m
    for flavour, memory in (("cuda", "nvidia-smi"), ("jetson", "tegrastats"), ("cpu", "proc")):
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "facts", "--marker", str(markers[flavour]), "--nvidia-smi", "no-such-tool"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        facts = json.loads(proc.stdout)
        assert (facts["flavour"], facts["memory_source"]) == (flavour, memory)
        assert facts["releases"][str(markers[flavour])]["release"] == f"{flavour}-x"
        assert facts["gpus"] == [] and facts["cpu_count"] >= 1


# --------------------------------------------------------------------------- the role's filters


def test_target_from_the_sandbox_rigs_config_toml():
    cfg = bench_filters.from_toml((ROOT / "tests/unit/fixtures/vllm_service/alpha.config.toml").read_text())
    t = bench_filters.target(cfg, "alpha", {"flavour": "cpu", "memory_source": "auto"})
    assert t["base_url"] == "http://127.0.0.1:8001" and t["metrics_url"] == "http://127.0.0.1:8001/metrics"
    assert (t["model_name"], t["served_name"]) == ("tiny-a", "tiny-a")
    assert t["tokenizer"].startswith("/srv/rigops/models/modelscope/Qwen/Qwen3.5-9B/")
    assert t["release_marker"] == (
        "/opt/rigops/vllm/releases/cpu-cpu-vllm0.32.0-torch2.13.0+cpu-py3.11-a9d0c1e63ea8/.rigops-release.json"
    )
    assert (t["key_file"], t["memory_source"], t["unit"]) == ("/etc/vllm/alpha/api_key", "proc", "vllm@alpha.service")
    assert t["python"] == t["server_python"] and t["gpus"] == [] and t["through_gateway"] is False
    gw = bench_filters.target(
        cfg, "alpha", {"through_gateway": True, "gateway_url": "https://gw:8443/", "model_names": {"alpha": "chat"},
                       "flavour": "cuda", "memory_source": "auto", "client_python": "/opt/py"},
    )  # fmt: skip
    assert (gw["base_url"], gw["model_name"], gw["memory_source"], gw["python"]) == (
        "https://gw:8443", "chat", "nvidia-smi", "/opt/py",
    )  # fmt: skip
    # /metrics is always read on the rig's loopback, whatever the bind address
    cfg["server"]["host"] = "0.0.0.0"
    assert bench_filters.target(cfg, "alpha", {})["metrics_url"] == "http://127.0.0.1:8001/metrics"
    cfg["server"]["host"] = "::1"
    assert bench_filters.target(cfg, "alpha", {})["base_url"] == "http://[::1]:8001"


def test_filters_refuse_what_they_cannot_read():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="not TOML"):
        bench_filters.from_toml("[server\nport = 1")
    with pytest.raises(AnsibleFilterError, match=r"no \[server\] port"):
        bench_filters.target({"server": {}}, "x", {})
    with pytest.raises(AnsibleFilterError, match="memory source"):
        bench_filters.target({"server": {"port": 1}, "model": {"served_name": "m"}}, "x", {"memory_source": "bogus"})


@pytest.mark.parametrize(("concurrency", "setting", "want"), [(1, 0, 8), (4, 0, 16), (32, 0, 128), (32, 10, 10)])
def test_requests_per_step(concurrency, setting, want):
    assert bench_filters.num_prompts(concurrency, setting) == want


# --------------------------------------------------------------------------- the playbook, on the controller


def playbook(tmp_path, *extra):
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        textwrap.dedent(
            """\
            all:
              children:
                gpu-rigs:
                  hosts:
                    rig-a:
                      ansible_connection: local
                      ansible_python_interpreter: "{{ ansible_playbook_python }}"
                      vllm_instances:
                        - {name: alpha, port: 8001, model: {source: local, path: /m, served_name: tiny-a}}
                        - {name: beta, port: 8002, model: {source: local, path: /m, served_name: tiny-b}}
            """
        )
    )
    proc = ansible_playbook("-i", inv, ROOT / "playbooks" / "bench.yml", "--tags", "bench_preflight", *extra)
    return proc.returncode, proc.stdout + proc.stderr


def test_playbook_refuses_an_instance_no_host_serves(tmp_path):
    rc, out = playbook(tmp_path, "-e", "bench_instances=alpha,gamma")
    assert rc != 0
    assert "bench_instances names gamma, which no host of this run serves (they serve: alpha, beta)" in out


def test_playbook_refuses_a_bad_ladder_and_a_gateway_without_url(tmp_path):
    rc, out = playbook(tmp_path, "-e", '{"bench_concurrency": [1, 0]}')
    assert rc != 0 and "bench_concurrency must list 1 or more steps, each 1 or more; got [1, 0]" in out
    rc, out = playbook(tmp_path, "-e", "bench_through_gateway=true")
    assert rc != 0 and "bench_gateway_url is not a base URL" in out


def test_playbook_preflight_accepts_the_defaults(tmp_path):
    rc, out = playbook(tmp_path, "-e", "bench_instances=beta")
    assert rc == 0, out[-3000:]
    assert "rig-a                      : ok=" in out and "failed=0" in out
