"""The report of one host of a job, from this run's stage results and the host's stage records.

Used by playbooks/report.yml, for both jobs (gpu_rigs: driver, topology, runtime, weights,
services, health, gpu_health; jetson: platform, runtime, weights, services, health, gpu_health):

    {{ host | rig_report(results, records, summaries, stages, reached, current_stage, stopped_by, job) }}
    {{ entry | report_line }}
    {{ stages | selected_stages(ansible_run_tags, ansible_skip_tags) }}

A host is ``ok`` only when every stage of its job passed on it: in this run, or, for a
stage this run skipped (``--tags``), as recorded on the rig by the last run that ran it
(``<rigops_stage_record_dir>/<stage>.json``, written by playbooks/tasks/stage_*.yml). A
record that still says ``started`` is a stage a run never finished. Python rather than a
Jinja program: the rules are easier to read and are unit-tested (tests/unit/test_report.py).
"""

from __future__ import annotations

STAGE_FIGURES = {
    # stage: the summary keys the report shows, as (report key, summary key)
    "driver": (("driver", "version"), ("driver_source", "source"), ("gpus", "gpu_count")),
    "topology": (("worst_link", "worst_link"),),
    "platform": (
        ("board", "board"),
        ("l4t", "l4t"),
        ("jetpack", "jetpack"),
        ("power_mode", "power_mode"),
        ("swap", "swap"),
        ("memory", "memory"),
    ),
    "runtime": (("runtime_release", "release"), ("vllm", "vllm_version")),
}
# Keys of a health summary that are not instances (instance names never start with "_").
HEALTH_EXTRAS = ("_tegrastats",)


def _stage_view(stage: str, results: dict, records: dict, summaries: dict) -> dict:
    if stage in results:
        view = {
            "status": results[stage].get("status", "failed"),
            "source": "this run" + (" (check mode)" if results[stage].get("check_mode") else ""),
            "seconds": results[stage].get("seconds"),
            "summary": summaries.get(stage) or {},
        }
        if view["status"] == "failed":
            view["msg"] = str(results[stage].get("msg") or "").strip()
            view["task"] = results[stage].get("task") or ""
        return view
    record = records.get(stage)
    if isinstance(record, dict) and record.get("status"):
        view = {
            "status": record["status"],
            "source": f"recorded {record.get('time', '?')}",
            "seconds": record.get("seconds"),
            "summary": record.get("summary") or {},
        }
        if record.get("task"):
            view["task"] = record["task"]
        return view
    return {"status": "missing", "source": "never run on this rig", "seconds": None, "summary": {}}


def _status(stages: list, views: dict, results: dict, reached: bool, current_stage, stopped_by) -> str:
    if results.get("preflight", {}).get("status") == "failed":
        return "failed in preflight"
    if not reached:
        return f"unreachable or failed in {current_stage or 'preflight'}"
    if stopped_by:
        return f"stopped: {stopped_by}"
    for stage in stages:
        if views[stage]["status"] == "failed" and views[stage]["source"].startswith("this run"):
            return f"failed in {stage}"
    open_stages = []
    for stage in stages:
        status = views[stage]["status"]
        if status == "passed":
            continue
        if status == "started":
            open_stages.append(f"{stage} not finished ({views[stage]['source']})")
        elif status == "missing":
            open_stages.append(f"{stage} never run")
        else:
            open_stages.append(f"{stage} {status} ({views[stage]['source']})")
    if open_stages:
        return "incomplete: " + "; ".join(open_stages)
    return "ok"


def rig_report(
    host,
    results,
    records,
    summaries,
    stages,
    reached=True,
    current_stage=None,
    stopped_by=None,
    job="gpu_rigs",
    removed=None,
):
    """The report entry of one host (a dict, the JSON report's element). `removed`: the instances
    this run stopped and moved aside because they left the inventory (vllm_service_removed)."""
    results = dict(results or {})
    records = dict(records or {})
    summaries = dict(summaries or {})
    views = {stage: _stage_view(stage, results, records, summaries) for stage in stages}
    entry = {"host": host, "job": job, "status": _status(stages, views, results, reached, current_stage, stopped_by)}
    failed = [s for s in ["preflight", *stages] if results.get(s, {}).get("status") == "failed"]
    entry["reason"] = (
        f"{results[failed[0]].get('task') or failed[0]}: {str(results[failed[0]].get('msg') or '').strip()}"
        if failed
        else None
    )
    for stage, figures in STAGE_FIGURES.items():
        if stage not in stages:
            continue
        summary = views.get(stage, {}).get("summary") or {}
        for key, name in figures:
            entry[key] = summary.get(name)
    if "topology" in stages:
        topo = views.get("topology", {})
        entry["topology"] = (
            None
            if topo.get("status") in (None, "missing") or not topo.get("summary")
            else ("pass" if topo["summary"].get("passed") else "fail")
        )
        entry["topology_problems"] = (topo.get("summary") or {}).get("problems") or []
        entry["gpus"] = (topo.get("summary") or {}).get("gpus") or entry["gpus"]
    service = views.get("health", {}).get("summary") or views.get("services", {}).get("summary") or {}
    entry["instances"] = [
        dict(figures, name=name) for name, figures in sorted(service.items()) if name not in HEALTH_EXTRAS
    ]
    if "gpu_health" in stages:
        sentinel = views.get("gpu_health", {}).get("summary") or {}
        entry["gpu_health"] = (
            {k: sentinel.get(k) for k in ("healthy", "problems", "warnings", "unhealthy_gpus")} if sentinel else None
        )
    if "platform" in stages:
        platform = views.get("platform", {}).get("summary") or {}
        entry["health"] = service.get("_tegrastats") or platform.get("health") or {}
    if "gateway" in stages:
        gateway = views.get("gateway", {}).get("summary") or {}
        entry["gateway"] = {
            "url": gateway.get("url"),
            "clients": gateway.get("clients") or {},
            "not_gated": sorted(gateway.get("not_gated") or {}),
            "drained": sorted(gateway.get("drained") or []),
        }
    entry["removed"] = sorted(r.get("name") if isinstance(r, dict) else str(r) for r in removed or [])
    entry["stages"] = {
        stage: {k: v for k, v in view.items() if k != "summary" and v not in (None, "")}
        for stage, view in views.items()
    }
    entry["stage_seconds"] = {s: v["seconds"] for s, v in views.items() if v.get("seconds") is not None}
    return entry


def report_line(entry) -> str:
    """The one line a person reads per rig at the end of the run."""

    def show(value):
        return "-" if value in (None, "", []) else str(value)

    instances = "; ".join(
        f"{i['name']} ({show(i.get('served_name'))} at {show(i.get('url'))}, ready {show(i.get('ready_s'))} s, "
        f"first token {show(i.get('ttft_s'))} s)"
        for i in entry.get("instances") or []
    )
    if entry.get("job") == "gateway":
        line = f"{entry['host']}: {entry['status']};"
    elif entry.get("job") == "jetson":
        health = entry.get("health") or {}
        ram = f"{health['ram_used_mb']}/{health['ram_total_mb']}MB" if health.get("ram_total_mb") is not None else "-"
        board = f"{show(entry.get('board'))} (L4T {show(entry.get('l4t'))}, JetPack {show(entry.get('jetpack'))})"
        line = (
            f"{entry['host']}: {entry['status']}; board={board} power={show(entry.get('power_mode'))} "
            f"ram={ram} runtime={show(entry.get('runtime_release'))} instances={instances or '-'}"
        )
    else:
        topology = show(entry.get("topology"))
        if entry.get("topology_problems"):
            topology += f" ({len(entry['topology_problems'])} finding(s))"
        line = (
            f"{entry['host']}: {entry['status']}; driver={show(entry.get('driver'))} gpus={show(entry.get('gpus'))} "
            f"topology={topology} runtime={show(entry.get('runtime_release'))} instances={instances or '-'}"
        )
        if "gpu_health" in entry:
            sentinel = entry["gpu_health"]
            line += " gpu_health=" + (
                "-"
                if not sentinel
                else "healthy"
                if sentinel["healthy"]
                else f"UNHEALTHY ({'; '.join(sentinel.get('problems') or []) or 'see rigops-gpu-health status'})"
            )
    if entry.get("removed"):
        line += f" removed={','.join(entry['removed'])}"
    gateway = entry.get("gateway")
    if gateway:
        clients = "; ".join(f"{name} -> {', '.join(names)}" for name, names in sorted(gateway["clients"].items()))
        line += f" gateway={show(gateway.get('url'))} clients: {clients or '-'}"
        if gateway.get("not_gated"):
            line += f" (not gated: {', '.join(gateway['not_gated'])})"
        if gateway.get("drained"):
            line += f" drained: {', '.join(gateway['drained'])}"
    if entry.get("reason"):
        line += f" | why: {' '.join(entry['reason'].split())[:300]}"
    return line


def selected_stages(stages, run_tags, skip_tags) -> list:
    """The stages of a job that a run with ``--tags run_tags --skip-tags skip_tags`` runs: each stage's play is
    tagged with the stage's name alone, and Ansible selects it by its rules (Taggable.evaluate_tags: ``all``,
    ``tagged``, the stage's own name; skipped by ``all``, ``tagged`` or its name). The preflight records them as
    started; a stage whose play a run does not select keeps its record of the last run that ran it."""
    run, skip = set(run_tags or ["all"]), set(skip_tags or [])
    return [stage for stage in stages if ({"all", "tagged", stage} & run) and not ({"all", "tagged", stage} & skip)]


class FilterModule:
    def filters(self):
        return {"rig_report": rig_report, "report_line": report_line, "selected_stages": selected_stages}
