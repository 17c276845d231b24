# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The maintenance job's bookkeeping (playbooks/maintain.yml) as filters, run on the controller.

- ``given | maintain_settings(hosts)``: the job's switches (``maintain_*``, see the playbook's
  head), checked and with their defaults: ``{"problems": [...], "settings": {...}}``; every
  problem names its variable and what is allowed;
- ``config | maintain_metrics_url``: where one instance's ``/metrics`` answers on its rig (its
  parsed config.toml);
- ``text | maintain_busy``: requests running and waiting in one vLLM's ``/metrics`` text (its
  gauges ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, every engine summed);
- ``registered | maintain_still_busy``: the instances of a uri loop over ``/metrics`` still busy;
- ``gateways | maintain_not_drained(hostvars, host)``: the gateways of the job that do not route
  around ``host`` (their ``llm_gateway_summary`` of this run does not list it as drained);
- ``host_dir | maintain_throughput``: ``{instance: output tokens/s}`` from the result files that
  vLLM's ``vllm bench serve`` wrote through the bench role (``<run>/<host>/<instance>/cNNN/result.json``,
  read on the controller); an instance whose requests failed counts 0;
- ``after | maintain_bench_problems(before, tolerance)``: the instances whose throughput after the
  change is below ``(1 - tolerance)`` of the one before, or that have no figure;
- ``facts | maintain_result``: the rig's result, the one fact the runner reads (commands/maintain.py):
  ``maintained``, ``failed`` (the rig stays drained: the step and why) or ``check``.
"""

from __future__ import annotations

import glob
import json
import posixpath
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.rigops.fleet.plugins.filter.bench import loopback_url
from ansible_collections.rigops.fleet.plugins.filter.rollout import gate_figures, stage_seconds
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain

CHANGES = ("none", "tasks", "driver", "reboot")
DEFAULTS = {
    "change": "none",
    "tasks": "",
    "idle_timeout": 300,
    "idle_poll": 2,
    "bench": True,
    "bench_concurrency": 4,
    "bench_prompts": 16,
    "bench_tolerance": 0.10,
    "report_dir": "",
}
BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# name, optional {labels}, value (an optional timestamp after it is ignored); label values hold no newline
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$")


def _number(value, name, low, high=None, kind=float):
    try:
        number = kind(value)
    except (TypeError, ValueError):
        return None, f"maintain_{name} must be a number (got {value!r})"
    if isinstance(value, bool) or number < low or (high is not None and number > high):
        span = f"{low} to {high}" if high is not None else f"{low} or more"
        return None, f"maintain_{name} must be {span} (got {value!r})"
    return number, None


def maintain_settings(given, inventory_hosts):
    """The switches of the job, checked, with their defaults. ``given``: {name without maintain_: value}."""
    given = {k: v for k, v in plain(given or {}).items() if v is not None}
    known = set(plain(inventory_hosts or []))
    problems, out = [], dict(DEFAULTS)
    hosts = given.get("hosts")
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        problems.append("maintain_hosts must name the rigs of the batch: a list or a comma-separated string")
        hosts = []
    unknown = [h for h in hosts if h not in known]
    if unknown:
        problems.append(f"maintain_hosts: {', '.join(unknown)} not in the inventory's gpu-rigs")
    out["hosts"] = hosts
    change = given.get("change", DEFAULTS["change"])
    if change not in CHANGES:
        problems.append(f"maintain_change must be one of {', '.join(CHANGES)} (got {change!r})")
    out["change"] = change
    tasks = str(given.get("tasks") or "")
    if change == "tasks" and not posixpath.isabs(tasks):
        problems.append(
            f"maintain_tasks must be the absolute path of a tasks file with maintain_change=tasks (got {tasks!r})"
        )
    if change != "tasks" and tasks:
        problems.append("maintain_tasks is read only with maintain_change=tasks")
    out["tasks"] = tasks
    for name, low, high, kind in (
        ("idle_timeout", 1, None, int),
        ("idle_poll", 1, None, int),
        ("bench_concurrency", 1, None, int),
        ("bench_prompts", 1, None, int),
        ("bench_tolerance", 0, 1, float),
    ):
        value, problem = _number(given.get(name, DEFAULTS[name]), name, low, high, kind)
        if problem:
            problems.append(problem)
        out[name] = value
    bench = given.get("bench", DEFAULTS["bench"])
    try:  # -e maintain_bench=false arrives as text, as for any -e key=value
        bench = boolean(bench, strict=True)
    except TypeError:
        problems.append(f"maintain_bench must be true or false (got {bench!r})")
    out["bench"] = bench is True
    out["report_dir"] = str(given.get("report_dir") or "")
    return {"problems": problems, "settings": out}


def maintain_metrics_url(config):
    server = plain(config or {}).get("server") or {}
    if "port" not in server:
        raise AnsibleFilterError("maintain_metrics_url: a config.toml without [server] port")
    return loopback_url(server.get("host"), server["port"]) + "/metrics"


def maintain_busy(text):
    """{"running": n, "waiting": n} of one vLLM's /metrics text (all engines and models summed)."""
    counts = {"running": 0.0, "waiting": 0.0}
    seen = set()
    for line in str(text or "").splitlines():
        if not line.startswith(BUSY):
            continue
        match = _SAMPLE.match(line)
        if not match or match["name"] not in BUSY:
            continue
        try:
            value = float(match["value"])
        except ValueError as exc:
            raise AnsibleFilterError(f"maintain_busy: {match['name']} has no number: {line!r}") from exc
        key = match["name"].rsplit("_", 1)[-1]
        counts[key] += value
        seen.add(key)
    if seen != {"running", "waiting"}:
        raise AnsibleFilterError(
            "maintain_busy: the /metrics text has no vllm:num_requests_running and vllm:num_requests_waiting gauges"
        )
    return {k: int(v) for k, v in counts.items()}


def maintain_still_busy(registered):
    """ "<instance>: N running, M waiting" for each instance of a uri loop over /metrics that was not idle.

    An instance that did not answer 200 runs nothing and is left out."""
    out = []
    for res in plain(registered or {}).get("results", []):
        if res.get("status") != 200:
            continue
        busy = maintain_busy(res.get("content"))
        if busy["running"] or busy["waiting"]:
            name = ((res.get("item") or {}).get("server") or {}).get("instance", "?")
            out.append(f"{name}: {busy['running']} running, {busy['waiting']} waiting")
    return out


def maintain_not_drained(gateways, hostvars, host):
    """Gateways of this run whose routing table of this run does not leave ``host`` out."""
    out = []
    for gateway in plain(gateways or []):
        summary = (hostvars.get(gateway) or {}).get("llm_gateway_summary") if gateway in hostvars else None
        drained = plain((summary or {}).get("drained") or []) if isinstance(summary, Mapping) else []
        if host not in drained:
            out.append(gateway)
    return out


def maintain_throughput(host_dir):
    """{instance: output tokens/s} of the bench results under ``host_dir`` (``<instance>/cNNN/result.json``)."""
    out = {}
    # glob here: the fileglob lookup takes a wildcard in the file name only, not in its folders
    for path in sorted(glob.glob(posixpath.join(str(host_dir), "*", "c[0-9][0-9][0-9]", "result.json"))):
        instance = posixpath.basename(posixpath.dirname(posixpath.dirname(path)))
        try:
            with open(path, encoding="utf-8") as handle:
                result = json.load(handle)
        except (OSError, ValueError) as exc:
            raise AnsibleFilterError(f"maintain_throughput: {path}: {exc}") from exc
        completed = int(result.get("completed") or 0)
        failed = int(result.get("failed") or 0)
        out[instance] = round(float(result.get("output_throughput") or 0.0), 2) if completed and not failed else 0.0
    return out


def maintain_bench_problems(after, before, tolerance):
    """Instances measured before whose throughput after the change fell by more than ``tolerance``."""
    after, before, tolerance = plain(after or {}), plain(before or {}), float(tolerance)
    problems = []
    for name, was in sorted(before.items()):
        now = after.get(name)
        if now is None:
            problems.append(f"{name}: no bench figure after the change")
        elif was > 0 and now < was * (1 - tolerance):
            problems.append(
                f"{name}: {now} output tok/s after the change, {was} before "
                f"({(now / was - 1) * 100:+.1f} %, tolerance -{tolerance * 100:g} %)"
            )
        elif was <= 0 and now <= 0:
            problems.append(f"{name}: every bench request failed")
    return problems


def maintain_bench_best(first, again):
    """Per instance, the better of two readings after the change (``again``: the bench read once more where
    ``first`` was outside the tolerance); an instance in one reading only keeps that one."""
    first, again = plain(first or {}), plain(again or {})
    return {name: max(v for v in (first.get(name), again.get(name)) if v is not None) for name in {*first, *again}}


def maintain_result(facts):
    """The rig's result from what its tasks recorded (see playbooks/maintain.yml)."""
    f = plain(facts or {})
    failure = f.get("failure") or None
    if f.get("check_mode"):
        status = "check"
    elif failure:
        status = "failed"
    else:
        status = "maintained"
    reason = None
    if failure:
        msg = " ".join(str(failure.get("msg", "")).split())
        reason = f"{failure.get('stage', '?')}: {failure.get('task') or ''}: {msg}"[:600]
    return {
        "host": f.get("host"),
        "status": status,
        "ok": status != "failed",
        "batch": f.get("batch"),
        "change": f.get("change"),
        "before": f.get("before") or {},
        "after": f.get("after") or {},
        "bench": {"before": f.get("bench_before") or {}, "after": f.get("bench_after") or {}},
        # left drained at the gateways: a failed rig, and one an operator had drained before the job
        "drained_before": f.get("drained_before") or [],
        "drained": status == "failed" or bool(f.get("drained_before")),
        "failed_stage": (failure or {}).get("stage"),
        "reason": reason,
        "stage_seconds": stage_seconds(f.get("marks"), f.get("end") or 0),
        "gate": gate_figures(f.get("gate")),
    }


class FilterModule:
    def filters(self):
        return {
            "maintain_settings": maintain_settings,
            "maintain_metrics_url": maintain_metrics_url,
            "maintain_busy": maintain_busy,
            "maintain_still_busy": maintain_still_busy,
            "maintain_not_drained": maintain_not_drained,
            "maintain_throughput": maintain_throughput,
            "maintain_bench_problems": maintain_bench_problems,
            "maintain_bench_best": maintain_bench_best,
            "maintain_result": maintain_result,
        }
