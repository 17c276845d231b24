#!/usr/bin/env python
"""The report of a bench run (playbooks/bench.yml): tables a person reads, plots, comparisons.

    commands/bench_report.py RUN_DIR [--compare EARLIER_RUN_DIR] [--reference [--references FILE]] [--no-plots]

RUN_DIR is a run's folder (reports/bench/<UTC time>/): per host ``host.json`` (hardware,
runtime releases, the run's parameters) and per instance ``instance.json``, ``config.toml``,
``runtime.json`` and one folder per concurrency step ``c<NNN>/`` holding vLLM's
``--save-result`` JSON (``result.json``, verbatim: the source of truth), the step record
(``step.json``) and the samples (``samples.jsonl``: memory every 500 ms and vLLM's /metrics).

Writes into RUN_DIR: ``report.md`` (one table per instance: output tok/s, TTFT p50/p99, ITL
p50, E2E p50, failed requests, peak memory, peak KV cache; a side-by-side table with ratios
against ``--compare``; with ``--reference``, published figures for the same hardware, or a line
saying none matches), ``summary.json`` (the same figures), ``throughput.png``, ``ttft.png`` and
``memory.png``; prints the markdown.

A step counts as FAILED when any request failed or none completed (a wrong key, an unknown
model, a dead server): its speed and latency are not shown, so a failed run never reads as a
fast one. vLLM's exit code is not used (it is 0 even when every request failed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = ROOT / "roles" / "bench" / "files" / "references.yml"
DASH = "—"


# --------------------------------------------------------------------------- reading a run


def read_json(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def read_samples(path: Path) -> list[dict]:
    """samples.jsonl: one JSON object per line; a torn last line (a sampler killed hard) is skipped."""
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def _num(value):
    """A finite float, or None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _pct(result: dict, metric: str, p: str):
    """A percentile of vLLM's result (p50 falls back to the median, which vLLM always writes)."""
    value = _num(result.get(f"p{p}_{metric}_ms"))
    if value is None and p == "50":
        value = _num(result.get(f"median_{metric}_ms"))
    return value


def memory_stats(samples: list[dict], window: tuple[float, float] | None = None) -> dict:
    """Peak memory and /metrics gauges of one step's samples.

    With the load window (when vLLM started and finished sending the measured requests), the
    peaks are taken inside it, widened by one interval, when it holds samples; otherwise over
    the whole step (the sampler runs a little longer than the load)."""
    start = next((s for s in samples if s.get("kind") == "start"), {})
    interval = _num(start.get("interval")) or 0.5
    memory = [s for s in samples if s.get("kind") == "memory" and _num(s.get("used_mib")) is not None]
    metrics = [s for s in samples if s.get("kind") == "metrics" and "error" not in s]

    def inside(rows):
        if not window:
            return rows
        lo, hi = window[0] - interval, window[1] + interval
        picked = [r for r in rows if lo <= (_num(r.get("t")) or 0) <= hi]
        return picked or rows

    mem_rows = inside(memory)
    met_rows = inside(metrics)
    peak = max((_num(s["used_mib"]) for s in mem_rows), default=None)
    totals = [_num(s.get("total_mib")) for s in mem_rows if _num(s.get("total_mib"))]

    def peak_of(key):
        values = [_num(s.get(key)) for s in met_rows if _num(s.get(key)) is not None]
        return max(values) if values else None

    return {
        "memory_source": start.get("memory"),
        "peak_mem_mib": peak,
        "mem_total_mib": max(totals) if totals else None,
        "baseline_mem_mib": _num(memory[0]["used_mib"]) if memory else None,
        "peak_kv_cache": peak_of("kv_cache_usage"),
        "peak_running": peak_of("running"),
        "peak_waiting": peak_of("waiting"),
        "memory_samples": len(memory),
        "metrics_samples": len(metrics),
        "metrics_errors": sum(1 for s in samples if s.get("kind") == "metrics" and "error" in s),
        "sampler_errors": [s.get("error") for s in samples if s.get("kind") == "error"][:3],
    }


def summarize_step(result: dict | None, record: dict | None, samples: list[dict]) -> dict:
    """One row of the table: vLLM's figures, the verdict, the sampled peaks."""
    record = record or {}
    window = None
    if _num(record.get("load_started")) and _num(record.get("load_finished")):
        window = (float(record["load_started"]), float(record["load_finished"]))
    row = {
        "concurrency": record.get("concurrency") or (result or {}).get("max_concurrency"),
        "num_prompts": (result or {}).get("num_prompts", record.get("num_prompts")),
        "errors": list(dict.fromkeys(record.get("errors") or [])),
        **memory_stats(samples, window),
    }
    if not result:
        row.update(status="ERROR", completed=0, failed=None)
        row["why"] = record.get("error") or "vllm bench serve saved no result"
        return row
    completed = int(result.get("completed") or 0)
    failed = int(result.get("failed") or 0)
    prompts = int(result.get("num_prompts") or record.get("num_prompts") or completed + failed)
    row.update(completed=completed, failed=failed, num_prompts=prompts, duration_s=_num(result.get("duration")))
    if completed == 0:
        row["status"] = "FAILED"
        row["why"] = f"all {failed or prompts} requests failed" + (f": {row['errors'][0]}" if row["errors"] else "")
        return row
    if failed or completed < prompts:
        row["status"] = "FAILED"
        row["why"] = f"{failed or prompts - completed} of {prompts} requests failed" + (
            f": {row['errors'][0]}" if row["errors"] else ""
        )
    else:
        row["status"] = "ok"
    row.update(
        output_tok_s=_num(result.get("output_throughput")),
        total_tok_s=_num(result.get("total_token_throughput")),
        request_per_s=_num(result.get("request_throughput")),
        ttft_p50_ms=_pct(result, "ttft", "50"),
        ttft_p99_ms=_pct(result, "ttft", "99"),
        itl_p50_ms=_pct(result, "itl", "50"),
        tpot_p50_ms=_pct(result, "tpot", "50"),
        e2el_p50_ms=_pct(result, "e2el", "50"),
    )
    return row


def load_run(run_dir: Path) -> dict:
    """A run folder as {run, hosts: [{host, facts, instances: [{name, meta, config, runtime, steps, error}]}]}."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SystemExit(f"bench_report: {run_dir} is not a folder (a run of playbooks/bench.yml)")
    run = {"dir": str(run_dir), "run": read_json(run_dir / "run.json", {}), "hosts": []}
    for host_dir in sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / "host.json").exists()):
        facts = read_json(host_dir / "host.json", {})
        host = {"host": facts.get("host") or host_dir.name, "facts": facts, "instances": []}
        for inst_dir in sorted(p for p in host_dir.iterdir() if p.is_dir()):
            meta = read_json(inst_dir / "instance.json", {})
            instance = {
                "name": meta.get("name") or inst_dir.name,
                "meta": meta,
                "runtime": read_json(inst_dir / "runtime.json"),
                "error": (inst_dir / "error.txt").read_text().strip() if (inst_dir / "error.txt").exists() else None,
                "steps": [],
            }
            for step_dir in sorted(p for p in inst_dir.iterdir() if p.is_dir() and p.name.startswith("c")):
                result = read_json(step_dir / "result.json")
                record = read_json(step_dir / "step.json", {})
                row = summarize_step(result, record, read_samples(step_dir / "samples.jsonl"))
                if row["concurrency"] is None:
                    row["concurrency"] = int(step_dir.name[1:]) if step_dir.name[1:].isdigit() else None
                row["step"] = step_dir.name
                instance["steps"].append(row)
            instance["steps"].sort(key=lambda r: r["concurrency"] or 0)
            host["instances"].append(instance)
        run["hosts"].append(host)
    if not run["hosts"]:
        raise SystemExit(f"bench_report: no host folder (with host.json) in {run_dir}")
    return run


def time_series(run_dir: Path, host: str, instance: str) -> tuple[list[dict], dict]:
    """Memory and KV cache over the whole ladder of one instance, seconds from its first sample, and
    each step's load window ({step: (start, end)}, same clock) when its record has one."""
    inst_dir = Path(run_dir) / host / instance
    rows, windows, t0 = [], {}, None
    for step_dir in sorted(p for p in inst_dir.iterdir() if p.is_dir() and p.name.startswith("c")):
        for s in read_samples(step_dir / "samples.jsonl"):
            t = _num(s.get("t"))
            if t is None or s.get("kind") not in ("memory", "metrics") or "error" in s:
                continue
            t0 = t if t0 is None else min(t0, t)
            rows.append(dict(s, step=step_dir.name))
        record = read_json(step_dir / "step.json", {})
        if _num(record.get("load_started")) and _num(record.get("load_finished")):
            windows[step_dir.name] = (float(record["load_started"]), float(record["load_finished"]))
    for r in rows:
        r["rel_t"] = r["t"] - t0
    # no sample, no time axis to place the windows on
    windows = {k: (a - t0, b - t0) for k, (a, b) in windows.items()} if t0 is not None else {}
    return sorted(rows, key=lambda r: r["t"]), windows


# --------------------------------------------------------------------------- the hardware


def hardware(facts: dict) -> str:
    gpus = facts.get("gpus") or []
    if gpus:
        names = sorted({g.get("name") or "?" for g in gpus})
        return " + ".join(f"{sum(1 for g in gpus if g.get('name') == n)}x {n}" for n in names)
    if facts.get("jetson_model"):
        return facts["jetson_model"]
    cpu = facts.get("cpu_model") or "CPU"
    return f"{cpu}, {facts.get('cpu_count') or '?'} cores, no GPU"


def load_references(path: Path) -> list[dict]:
    import yaml  # PyYAML comes with Ansible

    data = yaml.safe_load(Path(path).read_text()) or {}
    return list(data.get("references") or [])


def matching_references(facts: dict, references: list[dict]) -> list[dict]:
    """The references whose hardware is this host's (GPU name and count, or the Jetson board)."""
    out = []
    gpus = facts.get("gpus") or []
    board = (facts.get("jetson_model") or "").lower()
    for ref in references:
        match = ref.get("match") or {}
        if "gpu_name" in match:
            want = str(match["gpu_name"]).lower()
            if gpus and all(want in str(g.get("name", "")).lower() for g in gpus):
                if match.get("gpu_count") in (None, len(gpus)):
                    out.append(ref)
        elif "jetson_model" in match:
            names = match["jetson_model"]
            names = [names] if isinstance(names, str) else names
            if board and any(str(n).lower() in board for n in names):
                out.append(ref)
    return out


def compare_reference(ref: dict, steps: list[dict]) -> dict:
    """This instance's figure next to a published one: the step at the reference's concurrency,
    else the best step (output tok/s) of the ladder."""
    ok = [s for s in steps if s["status"] == "ok" and s.get("output_tok_s") is not None]
    step = None
    if ref.get("concurrency") is not None:
        step = next((s for s in ok if s["concurrency"] == ref["concurrency"]), None)
    elif ok:
        step = max(ok, key=lambda s: s["output_tok_s"])
    entry = {"id": ref.get("id"), "reference": ref, "step": step}
    if step is not None:
        entry["ratio"] = step["output_tok_s"] / ref["output_tok_s"] if ref.get("output_tok_s") else None
    return entry


# --------------------------------------------------------------------------- comparing two runs


def index_steps(run: dict) -> dict:
    """(host, instance) -> {concurrency: row}."""
    return {
        (h["host"], i["name"]): {s["concurrency"]: s for s in i["steps"]} for h in run["hosts"] for i in h["instances"]
    }


def pair_instances(before: dict, after: dict) -> list[tuple[tuple, tuple]]:
    """Which instance of the earlier run each instance of this run is compared with: the same
    host and name, else the same name on the only host, else the only instance of each run."""
    b, a = index_steps(before), index_steps(after)
    pairs = []
    for key in a:
        if key in b:
            pairs.append((key, key))
            continue
        same_name = [k for k in b if k[1] == key[1]]
        if len(same_name) == 1:
            pairs.append((same_name[0], key))
    if not pairs and len(a) == 1 and len(b) == 1:
        pairs.append((next(iter(b)), next(iter(a))))
    return pairs


def ratio(after, before):
    a, b = _num(after), _num(before)
    if a is None or b is None or b == 0:
        return None
    return a / b


def compare_runs(before: dict, after: dict) -> list[dict]:
    b, a = index_steps(before), index_steps(after)
    out = []
    for bkey, akey in pair_instances(before, after):
        rows = []
        for c in sorted(set(b[bkey]) | set(a[akey]), key=lambda x: x or 0):
            old, new = b[bkey].get(c), a[akey].get(c)
            both_ok = old is not None and new is not None and old["status"] == new["status"] == "ok"
            rows.append(
                {
                    "concurrency": c,
                    "before": old,
                    "after": new,
                    "output_tok_s_ratio": ratio(new.get("output_tok_s"), old.get("output_tok_s")) if both_ok else None,
                    "ttft_p50_ratio": ratio(new.get("ttft_p50_ms"), old.get("ttft_p50_ms")) if both_ok else None,
                    "ttft_p99_ratio": ratio(new.get("ttft_p99_ms"), old.get("ttft_p99_ms")) if both_ok else None,
                    "peak_mem_ratio": ratio(new.get("peak_mem_mib"), old.get("peak_mem_mib"))
                    if old is not None and new is not None
                    else None,
                }
            )
        out.append({"before": list(bkey), "after": list(akey), "rows": rows})
    return out


# --------------------------------------------------------------------------- markdown


def fmt(value, digits=1, scale=1.0):
    v = _num(value)
    if v is None:
        return DASH
    v *= scale
    return f"{v:,.{digits}f}"


def fmt_ratio(value):
    v = _num(value)
    return DASH if v is None else f"{v:.2f}x"


def status_cell(row: dict | None) -> str:
    if row is None:
        return "not run"
    if row["status"] == "ok":
        return "ok"
    return f"**{row['status']}**"


def instance_heading(host: dict, instance: dict) -> list[str]:
    meta, runtime = instance["meta"], instance["runtime"] or {}
    via = "gateway" if meta.get("through_gateway") else "direct"
    lines = [
        f"### {host['host']} / {instance['name']} ({meta.get('model_name') or meta.get('served_name') or '?'})",
        "",
    ]
    details = [
        f"hardware: {hardware(host['facts'])}",
        f"runtime: {runtime.get('release') or '?'}",
        f"model: {meta.get('model_id') or '?'} @ {(meta.get('model_commit') or '?')[:12]}",
        f"{via}: {meta.get('base_url') or '?'}",
        f"memory: {memory_label(meta.get('memory_source'))}",
    ]
    if meta.get("active") not in (None, "active"):
        details.append(f"unit {meta.get('unit')}: **{meta.get('active')}** at the start")
    lines.append("; ".join(details))
    lines.append("")
    return lines


def memory_label(source) -> str:
    return {
        "nvidia-smi": "GPU memory used (nvidia-smi, the instance's GPUs)",
        "tegrastats": "RAM used, unified with the GPU (tegrastats)",
        "proc": "RSS of the server's processes (/proc)",
        "none": "not sampled",
    }.get(source or "", str(source))


TABLE_HEAD = (
    "| concurrency | requests | status | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | E2E p50 s "
    "| failed | peak memory MiB | peak KV cache |",
    "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
)


def table_row(row: dict) -> str:
    ok = row["status"] == "ok"
    failed = DASH if row.get("failed") is None else str(row["failed"])
    cells = [
        str(row["concurrency"]),
        str(row.get("num_prompts") or DASH),
        status_cell(row),
        fmt(row.get("output_tok_s")) if ok else DASH,
        fmt(row.get("ttft_p50_ms")) if ok else DASH,
        fmt(row.get("ttft_p99_ms")) if ok else DASH,
        fmt(row.get("itl_p50_ms"), 2) if ok else DASH,
        fmt(row.get("e2el_p50_ms"), 2, 0.001) if ok else DASH,
        failed,
        fmt(row.get("peak_mem_mib"), 0),
        fmt(row.get("peak_kv_cache"), 1, 100.0) + "%" if row.get("peak_kv_cache") is not None else DASH,
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(run: dict, comparison: list[dict] | None, before: dict | None, refs: dict | None) -> str:
    out = [f"# Bench {Path(run['dir']).name}", ""]
    first = run["hosts"][0]["facts"].get("params") or {}
    if first:
        out.append(
            f"{first.get('dataset', 'random')} prompts of {first.get('input_len')} tokens in, "
            f"{first.get('output_len')} out, {first.get('backend', 'openai-chat')} on "
            f"{first.get('endpoint', '/v1/chat/completions')}, concurrency {first.get('concurrency')}, "
            f"seed {first.get('seed')}; memory and /metrics every {first.get('sample_interval')} s."
        )
        out.append("")
    failed = [
        f"{h['host']}/{i['name']} c={r['concurrency']}"
        for h in run["hosts"]
        for i in h["instances"]
        for r in i["steps"]
        if r["status"] != "ok"
    ]
    if failed:
        out.append(f"**FAILED: {len(failed)} step(s) with failed requests** ({', '.join(failed)}).")
        out.append("")
    for host in run["hosts"]:
        for instance in host["instances"]:
            out += instance_heading(host, instance)
            if instance["error"]:
                out += [f"**ERROR: not measured**: {instance['error']}", ""]
            if instance["steps"]:
                out += list(TABLE_HEAD)
                out += [table_row(r) for r in instance["steps"]]
                out.append("")
            whys = [f"c={r['concurrency']}: {r['why']}" for r in instance["steps"] if r.get("why")]
            if whys:
                out += ["Why: " + "; ".join(whys), ""]
            short = [
                r["concurrency"] for r in instance["steps"] if (r.get("num_prompts") or 0) < (r["concurrency"] or 0)
            ]
            if short:
                out += [
                    f"Note: fewer requests than the concurrency at c={short}: that concurrency was never reached.",
                    "",
                ]
    if comparison is not None:
        out += compare_markdown(comparison, before)
    if refs is not None:
        out += reference_markdown(refs)
    return "\n".join(out).rstrip() + "\n"


def compare_markdown(comparison: list[dict], before: dict) -> list[str]:
    out = ["## Compared with " + Path(before["dir"]).name, ""]
    if not comparison:
        return out + ["No instance of this run matches one of the earlier run (same host and name, or same name).", ""]
    out.append(
        "Ratios are this run / the earlier run: output tok/s above 1 is faster, TTFT and memory below 1 are better."
    )
    out.append("")
    for pair in comparison:
        out.append(f"### {'/'.join(pair['after'])} against {'/'.join(pair['before'])}")
        out.append("")
        out.append(
            "| concurrency | status before | status now | output tok/s before | now | ratio | TTFT p50 ms before "
            "| now | ratio | TTFT p99 ms before | now | ratio | peak memory MiB before | now | ratio |"
        )
        out.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in pair["rows"]:
            old, new = r["before"], r["after"]

            def val(row, key, digits=1):
                return fmt(row.get(key), digits) if row is not None and row["status"] == "ok" else DASH

            def mem(row):
                return fmt(row.get("peak_mem_mib"), 0) if row is not None else DASH

            cells = [
                str(r["concurrency"]),
                status_cell(old),
                status_cell(new),
                val(old, "output_tok_s"),
                val(new, "output_tok_s"),
                fmt_ratio(r["output_tok_s_ratio"]),
                val(old, "ttft_p50_ms"),
                val(new, "ttft_p50_ms"),
                fmt_ratio(r["ttft_p50_ratio"]),
                val(old, "ttft_p99_ms"),
                val(new, "ttft_p99_ms"),
                fmt_ratio(r["ttft_p99_ratio"]),
                mem(old),
                mem(new),
                fmt_ratio(r["peak_mem_ratio"]),
            ]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return out


def reference_markdown(refs: dict) -> list[str]:
    out = ["## Published figures", ""]
    for host, entry in refs.items():
        if not entry["matches"]:
            known = ", ".join(sorted({r.get("hardware", "?") for r in entry["known"]})) or "none"
            out.append(
                f"{host} ({entry['hardware']}): no published reference matches this hardware (references: {known})."
            )
            out.append("")
            continue
        out.append(f"{host} ({entry['hardware']}), against figures users published for the same hardware:")
        out.append("")
        out.append(
            "| reference | workload | concurrency | published output tok/s | published TTFT s | instance "
            "| this run's step | output tok/s | ratio | TTFT p50 s |"
        )
        out.append("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
        for c in entry["comparisons"]:
            ref, step = c["reference"], c["step"]
            ttft = ref.get("ttft_s")
            out.append(
                "| "
                + " | ".join(
                    [
                        str(ref.get("id")),
                        str(ref.get("workload")),
                        str(ref.get("concurrency") or "best"),
                        fmt(ref.get("output_tok_s"), 0),
                        f"{ttft[0]}–{ttft[1]}" if isinstance(ttft, list) and len(ttft) == 2 else DASH,
                        c["instance"],
                        str(step["concurrency"]) if step else "no such ok step",
                        fmt(step.get("output_tok_s")) if step else DASH,
                        fmt_ratio(c.get("ratio")),
                        fmt(step.get("ttft_p50_ms"), 2, 0.001) if step else DASH,
                    ]
                )
                + " |"
            )
        out.append("")
        out.append("The published figures come from other models and loads (sources in references.yml): read the ratio")
        out.append("as an order of magnitude.")
        out.append("")
    return out


def failed_steps(run: dict) -> list[str]:
    return [
        f"{h['host']}/{i['name']} c={r['concurrency']}: {r['status']}" + (f" ({r['why']})" if r.get("why") else "")
        for h in run["hosts"]
        for i in h["instances"]
        for r in i["steps"]
        if r["status"] != "ok"
    ]


def references_for(run: dict, references: list[dict]) -> dict:
    out = {}
    for host in run["hosts"]:
        matches = matching_references(host["facts"], references)
        comparisons = []
        for ref in matches:
            for instance in host["instances"]:
                entry = compare_reference(ref, instance["steps"])
                entry["instance"] = instance["name"]
                comparisons.append(entry)
        out[host["host"]] = {
            "hardware": hardware(host["facts"]),
            "matches": [r.get("id") for r in matches],
            "comparisons": comparisons,
            "known": references,
        }
    return out


# --------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ladder(run: dict, before: dict | None, key: str, ylabel: str, title: str, path: Path, p99_key=None):
    """One line per instance: `key` against concurrency (log2 axis); FAILED steps as red crosses on
    the axis; the earlier run dashed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    drawn = 0

    def draw(r, label_prefix, style):
        nonlocal drawn
        for h in r["hosts"]:
            for i in h["instances"]:
                steps = i["steps"]
                ok = [s for s in steps if s["status"] == "ok" and _num(s.get(key)) is not None]
                bad = [s for s in steps if s["status"] != "ok"]
                label = f"{label_prefix}{h['host']}/{i['name']}"
                if ok:
                    line = ax.plot([s["concurrency"] for s in ok], [s[key] for s in ok], style, marker="o", label=label)
                    drawn += 1
                    if p99_key:
                        p99 = [s for s in ok if _num(s.get(p99_key)) is not None]
                        if p99:
                            ax.plot(
                                [s["concurrency"] for s in p99],
                                [s[p99_key] for s in p99],
                                ":",
                                color=line[0].get_color(),
                                marker=".",
                                label=label + " p99",
                            )
                if bad:
                    ax.scatter(
                        [s["concurrency"] for s in bad],
                        [0] * len(bad),
                        marker="x",
                        color="red",
                        s=80,
                        zorder=5,
                        label=f"{label} FAILED",
                    )
                    drawn += 1

    draw(run, "", "-")
    if before is not None:
        draw(before, f"{Path(before['dir']).name}: ", "--")
    ladder = sorted({s["concurrency"] for r in [run, before] if r for h in r["hosts"] for i in h["instances"]
                     for s in i["steps"] if s["concurrency"]})  # fmt: skip
    ax.set_xscale("log", base=2)
    if ladder:
        ax.set_xticks(ladder, [str(c) for c in ladder])
        ax.minorticks_off()
    ax.set_xlabel("concurrency (max concurrent requests)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no step to draw", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def plot_memory(run: dict, path: Path):
    """Memory (top) and KV cache usage (bottom) over time, one line per instance, each step shaded."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), dpi=100, sharex=False)
    drawn = 0
    for h in run["hosts"]:
        for i in h["instances"]:
            series, windows = time_series(Path(run["dir"]), h["host"], i["name"])
            mem = [r for r in series if r["kind"] == "memory"]
            kv = [r for r in series if r["kind"] == "metrics" and _num(r.get("kv_cache_usage")) is not None]
            label = f"{h['host']}/{i['name']}"
            if mem:
                top.plot([r["rel_t"] for r in mem], [r["used_mib"] for r in mem], label=label)
                drawn += 1
            if kv:
                bottom.plot([r["rel_t"] for r in kv], [100 * r["kv_cache_usage"] for r in kv], label=label)
            steps = {}
            for r in series:
                lo, hi = steps.get(r["step"], (r["rel_t"], r["rel_t"]))
                steps[r["step"]] = (min(lo, r["rel_t"]), max(hi, r["rel_t"]))
            for n, (name, (lo, hi)) in enumerate(sorted(steps.items(), key=lambda kv_: kv_[1][0])):
                top.axvspan(lo, hi, alpha=0.06 if n % 2 else 0.12, color="grey")
                top.text((lo + hi) / 2, 1.0, "c=" + name.lstrip("c0"), transform=top.get_xaxis_transform(),
                         ha="center", va="bottom", fontsize=7)  # fmt: skip
            for lo, hi in windows.values():  # the measured requests, inside each step
                for ax in (top, bottom):
                    ax.axvspan(lo, max(hi, lo + 0.05), alpha=0.25, color="tab:orange", lw=0)
    source = {i["meta"].get("memory_source") for h in run["hosts"] for i in h["instances"]} - {None}
    top.set_ylabel("MiB")
    top.set_title("memory: " + ", ".join(memory_label(s) for s in sorted(source)) if source else "memory", pad=14)
    bottom.set_ylabel("KV cache usage %")
    bottom.set_xlabel("seconds since the first sample (grey: each step; orange: its measured requests)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    if drawn:
        top.legend(fontsize=8)
    else:
        top.text(0.5, 0.5, "no memory sample", ha="center", va="center", transform=top.transAxes)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


# --------------------------------------------------------------------------- main


def build(run_dir: Path, compare: Path | None = None, references: Path | None = None, plots: bool = True) -> dict:
    """The report of a run; `references`: the published figures' file (None: no such section)."""
    run = load_run(run_dir)
    before = load_run(compare) if compare else None
    comparison = compare_runs(before, run) if before else None
    refs = references_for(run, load_references(references)) if references else None
    text = markdown(run, comparison, before, refs)
    run_dir = Path(run_dir)
    (run_dir / "report.md").write_text(text)
    files = ["report.md", "summary.json"]
    if plots and importlib.util.find_spec("matplotlib") is None:
        # the plots are optional: a production controller's requirements.txt leaves matplotlib out
        print("bench report: no plots: matplotlib is not installed (pip install -r requirements-bench.txt)",
              file=sys.stderr)  # fmt: skip
        plots = False
    if plots:
        plot_ladder(run, before, "output_tok_s", "output tokens / s", "Throughput against concurrency",
                    run_dir / "throughput.png")  # fmt: skip
        plot_ladder(run, before, "ttft_p50_ms", "time to first token, ms (p50; dotted: p99)",
                    "Time to first token against concurrency", run_dir / "ttft.png", p99_key="ttft_p99_ms")  # fmt: skip
        plot_memory(run, run_dir / "memory.png")
        files += ["throughput.png", "ttft.png", "memory.png"]
    summary = {
        "run": run_dir.name,
        "hosts": [
            {
                "host": h["host"],
                "hardware": hardware(h["facts"]),
                "instances": [
                    {"name": i["name"], "error": i["error"], "steps": i["steps"], "meta": i["meta"]}
                    for i in h["instances"]
                ],
            }
            for h in run["hosts"]
        ],
        "failed_steps": failed_steps(run),
        "errors": [
            f"{h['host']}/{i['name']}: {i['error']}" for h in run["hosts"] for i in h["instances"] if i["error"]
        ],
        "compare": {"with": str(compare), "pairs": comparison} if comparison is not None else None,
        "references": {h: {k: v for k, v in e.items() if k != "known"} for h, e in refs.items()} if refs else None,
        "files": files,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return {"markdown": text, "summary": summary}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a run's folder, reports/bench/<UTC time>")
    parser.add_argument("--compare", type=Path, help="an earlier run's folder: side by side, with ratios")
    parser.add_argument(
        "--reference", action="store_true", help="set published figures for the same hardware beside the run"
    )
    parser.add_argument(
        "--references", type=Path, default=REFERENCES, help=f"the published figures (default {REFERENCES})"
    )
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    args = parser.parse_args(argv)
    if args.reference and not args.references.exists():
        parser.error(f"--references {args.references}: no such file")
    out = build(args.run_dir, args.compare, args.references if args.reference else None, plots=not args.no_plots)
    sys.stdout.write(out["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
