# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One round of the GPU health sentinel, and what it keeps between rounds.

The gpu_health role installs ``rigops-gpu-health`` on a host with this file and gpu_health beside it;
the service calls :func:`check` every interval. On a rig (config ``source: nvidia_smi``) a round runs
``nvidia-smi -q -x`` and the kernel log command of the config and judges them with gpu_health; on a Jetson
board (``source: tegrastats``) it reads one tegrastats line and the board's thermal zones and judges them
with board_thermal (one integrated GPU, which every instance of the board uses). It returns the state the
service writes:
GPUs and their findings, and per vLLM instance whether it is healthy and whether it may take traffic
(``routable``: a sick instance takes it again only after ``recover_checks`` healthy rounds in a row).

An Xid stays a finding for the rest of the boot: the kernel log keeps it, and a GPU that needed a reset
is not well because a later round saw nothing new. An operator who has dealt with it says so with
``rigops-gpu-health ack``: the Xid lines seen then, by their text, count no more.

Host side: Python 3.8 and the standard library only. Nothing here resets or reboots anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from ansible_collections.rigops.fleet.plugins.module_utils import board_thermal, gpu_health
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_platform import parse_tegrastats
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_tegrastats import first_line
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_smi import normalize_bus_id

STATE_VERSION = 1
SOURCES = ("nvidia_smi", "tegrastats")
# keys every config has; a source's own keys besides (SOURCE_KEYS)
# optional: nvlink_links (the NVLinks each GPU should have up; 0 or absent: the most seen up), dcgmi
# (DCGM's dcgmi as argv, read first where it exists)
CONFIG_KEYS = (
    "kernel_log",
    "expected_bus_ids",
    "instances",
    "recover_checks",
    "ignore_xids",
    "interval",
    "state_file",
    "acks_file",
    "textfile",
)
SOURCE_KEYS = {
    "nvidia_smi": ("nvidia_smi",),
    "tegrastats": ("tegrastats", "sysfs_root", "thermal_limits", "thermal_margin"),
}
TEGRASTATS_TIMEOUT = 10


def check_config(config):
    """Problems of a sentinel config (the role writes it; a hand edit may break it)."""
    source = config.get("source", "nvidia_smi")
    if source not in SOURCES:
        return [f"config: source must be one of {', '.join(SOURCES)}, got {source!r}"]
    keys = CONFIG_KEYS + SOURCE_KEYS[source]
    problems = [f"config: {key} missing" for key in keys if key not in config]
    for key in ("nvidia_smi", "kernel_log", "tegrastats"):
        value = config.get(key)
        if key in config and not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
            problems.append(f"config: {key} must be a command as a list of strings")
    listen = config.get("listen", {"address": "127.0.0.1", "port": 0})
    if not (
        isinstance(listen, dict)
        and isinstance(listen.get("address"), str)
        and isinstance(listen.get("port"), int)
        and 0 <= listen["port"] <= 65535
    ):
        problems.append("config: listen must be {address: an address, port: 0 (none) to 65535}")
    limits = config.get("thermal_limits", {})
    if not (isinstance(limits, dict) and all(_is_number(v) for v in limits.values())):
        problems.append("config: thermal_limits must map sensor names to degrees C")
    if "thermal_margin" in config and not (_is_number(config["thermal_margin"]) and config["thermal_margin"] >= 0):
        problems.append("config: thermal_margin must be a number of degrees C, at least 0")
    recover = config.get("recover_checks")
    if "recover_checks" in config and not (isinstance(recover, int) and recover >= 1):
        problems.append("config: recover_checks must be a whole number of at least 1")
    return problems


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_previous(previous):
    """(the config a host has as a mapping, or {}; a problem, or None) from ``previous``: its file's text, a
    mapping, or None. A config that is not the sentinel's JSON object is not overwritten: it holds the GPUs
    the host expects, and rewriting it would forget a GPU that is missing now."""
    if previous is None:
        return {}, None
    if isinstance(previous, str):
        try:
            previous = json.loads(previous)
        except ValueError as exc:
            previous = exc
    if isinstance(previous, dict) and isinstance(previous.get("expected_bus_ids", []), list):
        return previous, None
    why = f"not JSON ({previous})" if isinstance(previous, ValueError) else "not the sentinel's config object"
    return {}, (
        f"the config the host has (gpu_health_config_file) is {why}: it records the GPUs the host expects, so it"
        " is left as it is; restore it from a backup, or remove it to start again from the GPUs shown now"
        " (a GPU missing now is then no longer expected)"
    )


def build_config(instances, gpus, previous, settings):
    """(the sentinel's config, problems): what the gpu_health role writes on a host.

    ``instances``: the host's vLLM instances, merged with their defaults; each one's ``gpus`` are nvidia-smi
    indices. ``gpus``: the ``nvidia_gpu`` fact's GPUs now (index, pci_bus_id). ``previous``: the config the
    host has, as its file's text or parsed (or None: it has none). ``settings``: the other keys of the config
    (``forget_bus_ids`` besides).

    The GPUs expected are those shown now and those the previous config expected, less the forgotten ones:
    a GPU that fell off the bus stays expected. An instance's indices are turned into bus ids while every
    expected GPU is present; when one is missing, indices shift, so an instance keeps the bus ids the
    previous config gave the same indices, and an instance with no such record is a problem.
    """
    if settings.get("source") == "tegrastats":
        # a board has one integrated GPU, which every instance of the board uses: its previous config records
        # nothing to keep, so it is rewritten whatever it holds
        config = dict(settings)
        config.pop("forget_bus_ids", None)
        out = [{"name": i.get("name"), "indices": [], "gpus": [board_thermal.BOARD_GPU]} for i in instances or []]
        config.update(expected_bus_ids=[], instances=out)
        return config, []
    previous, unreadable = read_previous(previous)
    if unreadable:
        return None, [unreadable]
    forget = {normalize_bus_id(b) for b in settings.get("forget_bus_ids") or []}
    present = {}
    for gpu in gpus or []:
        if gpu.get("index") is not None and gpu.get("pci_bus_id"):
            present[int(gpu["index"])] = normalize_bus_id(gpu["pci_bus_id"])
    expected = (set(present.values()) | set(previous.get("expected_bus_ids") or [])) - forget
    complete = expected <= set(present.values())
    before = {i["name"]: i for i in previous.get("instances") or [] if isinstance(i, dict) and "name" in i}
    problems, out = [], []
    for inst in instances or []:
        name = inst.get("name")
        indices = inst.get("gpus") or []
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            problems.append(f"instance {name}: gpus must be a list of GPU indices, got {indices!r}")
            continue
        old = before.get(name)
        if not complete and old is not None and old.get("indices") == indices:
            out.append(old)
            continue
        unknown = [i for i in indices if i not in present]
        if unknown or not complete:
            missing = sorted(expected - set(present.values()))
            problems.append(
                "instance {}: GPU(s) {} cannot be told by bus id: nvidia-smi shows {} GPU(s) (indices {}){}".format(
                    name,
                    unknown or indices,
                    len(present),
                    sorted(present),
                    ", and expected {} is missing".format(", ".join(missing)) if missing else "",
                )
            )
            continue
        out.append({"name": name, "indices": indices, "gpus": [present[i] for i in indices]})
    config = dict(settings)
    config.pop("forget_bus_ids", None)
    config.update(expected_bus_ids=sorted(expected), instances=out)
    return config, problems


def run_command(argv, timeout=30):
    """(exit status, stdout, stderr) of ``argv``; a command that cannot run is status 127."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=dict(os.environ, LC_ALL="C"),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, "", str(exc)
    return proc.returncode, proc.stdout, proc.stderr


def line_id(line):
    """How an acknowledged kernel log line is remembered: by its whole text (time stamp included)."""
    return hashlib.sha256(line.strip().encode("utf-8")).hexdigest()[:32]


def xid_events(config, run=run_command):
    """(Xid events of the kernel log, error or None)."""
    rc, out, err = run(config["kernel_log"])
    if rc != 0:
        return [], "kernel log: {} exited {}: {}".format(config["kernel_log"][0], rc, (err or out).strip()[:200])
    ignored = set(config.get("ignore_xids") or [])
    return [e for e in gpu_health.parse_kernel_log(out) if e["xid"] not in ignored], None


def acknowledge(config, acked, gpu=None, run=run_command):
    """``acked`` (line ids) plus the Xid lines now in the kernel log, of GPU ``gpu`` (bus id) or all."""
    events, error = xid_events(config, run)
    if error:
        raise RuntimeError(error)
    want = normalize_bus_id(gpu) if gpu else None
    new = {line_id(e["line"]) for e in events if want is None or normalize_bus_id(e["bus_id"]) == want}
    return sorted(set(acked) | new)


def board_result(config, read_line=first_line):
    """(the board's verdict, errors) from one tegrastats line and the thermal zones (source tegrastats)."""
    line, error = read_line(config["tegrastats"], TEGRASTATS_TIMEOUT)
    sample = parse_tegrastats(line) if line else None
    if line and sample is None:
        error = f"tegrastats printed no sample: {line[:200]!r}"
    board_limits = board_thermal.limits(board_thermal.read_zones(config["sysfs_root"]), config["thermal_limits"])
    result = board_thermal.evaluate(sample, error, board_limits, config["thermal_margin"])
    return result, ([] if sample else [f"tegrastats: {error}"])


def check(config, previous=None, acked=(), run=run_command, now=0.0, read_line=first_line):
    """One round: the new state (see the module's docstring)."""
    previous = previous or {}
    if config.get("source") == "tegrastats":
        result, errors = board_result(config, read_line)
        return _state(config, previous, result, errors, [], acked, now)
    errors = []
    rc, out, err = run(config["nvidia_smi"] + ["-q", "-x"])
    if rc == 0:
        try:
            gpus = gpu_health.read_smi_xml(out)
        except ValueError as exc:
            gpus, errors = [], [f"nvidia-smi -q -x: {exc}"]
    else:
        # Every expected GPU then shows as missing: the driver does not answer for any of them.
        gpus = []
        errors.append(f"nvidia-smi exited {rc}: {(err or out).strip()[:200]}")
    events, error = xid_events(config, run)
    if error:
        errors.append(error)
    known = set(acked)
    live = [e for e in events if line_id(e["line"]) not in known]
    nvlink, kept, nvlink_errors = nvlink_round(config, gpus, previous.get("nvlink") or {}, run)
    dcgm, dcgm_errors = dcgm_round(config, run)
    result = gpu_health.evaluate(gpus, live, config["expected_bus_ids"], extra=nvlink, dcgm=dcgm)
    state = _state(config, previous, result, errors + nvlink_errors + dcgm_errors, events, acked, now)
    return dict(state, nvlink=kept, dcgm=sorted(dcgm))


def dcgm_round(config, run=run_command, exists=os.path.exists):
    """(DCGM's findings per bus id of the GPUs it answered for, errors), where DCGM is installed (the config's
    ``dcgmi`` exists; else nothing, and nvidia-smi judges everything). With no health watch set (a fresh or
    restarted host engine), the round sets them all (``dcgmi health -s a``) and DCGM answers from the next."""
    dcgmi = config.get("dcgmi") or []
    if not dcgmi or not exists(dcgmi[0]):
        return {}, []
    rc, out, err = run(dcgmi + ["health", "-c"])
    # the table, whatever the exit status (a report of failures need not exit 0)
    health = gpu_health.parse_dcgmi_health(out)
    if not health["watches"]:
        rc, out, err = run(dcgmi + ["health", "-s", "a"])
        return {}, ([] if rc == 0 else [f"dcgmi health -s a exited {rc}: {(err or out).strip()[:200]}"])
    if health["overall"] is None:
        return {}, [f"dcgmi health -c exited {rc}: {(err or out).strip()[:200]}"]
    rc, out, err = run(dcgmi + ["discovery", "-l"])
    ids = gpu_health.parse_dcgmi_discovery(out) if rc == 0 else {}
    if not ids:
        return {}, [f"dcgmi discovery -l exited {rc} and named no GPU: {(err or out).strip()[:200]}"]
    # a GPU DCGM lists and reports nothing for is healthy by DCGM: its memory and NVLink are DCGM's to judge
    return {bus: gpu_health.dcgm_findings(health["gpus"].get(i, {})) for i, bus in ids.items()}, []


def nvlink_round(config, gpus, before, run=run_command):
    """(NVLink findings per bus id, what the state keeps per bus id, errors) of one round.

    ``nvidia-smi nvlink -s`` says which links are up; where any GPU has links, ``-e`` gives the error counters.
    The state keeps per GPU the most links seen up (``expected``; the config's ``nvlink_links`` when set) and
    the counters, so a link that went down and a counter that grew since the last round are findings. A rig
    without NVLink costs one ``-s`` a round and keeps nothing."""
    by_uuid = {g["uuid"]: g["bus_id"] for g in gpus if g.get("uuid") and g.get("bus_id")}
    rc, out, err = run(config["nvidia_smi"] + ["nvlink", "-s"])
    if rc != 0:
        # a GPU without NVLink may answer so; a rig that had links up must answer
        problem = f"nvidia-smi nvlink -s exited {rc}: {(err or out).strip()[:200]}"
        return {}, before, ([problem] if any(v.get("expected") for v in before.values()) else [])
    status = {by_uuid[u]: v for u, v in gpu_health.parse_nvlink(out).items() if u in by_uuid}
    wanted = int(config.get("nvlink_links") or 0)
    expected = {
        bus: max(wanted, (before.get(bus) or {}).get("expected", 0), gpu_health.nvlink_active(v["links"]))
        for bus, v in status.items()
    }
    if not any(expected.values()) and not any(v["links"] or v["all_inactive"] for v in status.values()):
        return {}, {}, []
    rc, out, err = run(config["nvidia_smi"] + ["nvlink", "-e"])
    errors = [] if rc == 0 else [f"nvidia-smi nvlink -e exited {rc}: {(err or out).strip()[:200]}"]
    counters = {by_uuid[u]: v["links"] for u, v in gpu_health.parse_nvlink(out).items() if u in by_uuid and rc == 0}
    findings, kept = {}, dict(before)  # a GPU nvidia-smi does not show now keeps its record
    for bus, entry in status.items():
        last = (before.get(bus) or {}).get("counters") or {}
        now = counters.get(bus, last)
        findings[bus] = gpu_health.nvlink_findings(entry, now, last, expected[bus])
        kept[bus] = {"expected": expected[bus], "counters": {str(k): v for k, v in now.items()}}
    return findings, kept, errors


def _state(config, previous, result, errors, events, acked, now):
    """The state of a round from its verdict: instances and whether they may take traffic."""
    acked = set(acked)
    verdicts = gpu_health.instance_verdicts(result, config["instances"])

    instances = {}
    before = previous.get("instances", {})
    for name, verdict in sorted(verdicts.items()):
        last = before.get(name)
        streak = (last["healthy_streak"] + 1 if last else 1) if verdict["healthy"] else 0
        if last is None:
            routable = verdict["healthy"]
        else:
            routable = verdict["healthy"] and (last["routable"] or streak >= config["recover_checks"])
        instances[name] = dict(verdict, healthy_streak=streak, routable=routable)
    return {
        "version": STATE_VERSION,
        "checked_at": now,
        "interval": config["interval"],
        "healthy": result["healthy"] and not errors,
        "errors": errors,
        "gpus": result["gpus"],
        "instances": instances,
        # the acknowledged lines still in the log (older ones went with a reboot)
        "acked": sorted(acked & {line_id(e["line"]) for e in events}),
    }


def metrics(state):
    """The state in Prometheus' text format, for node exporter's textfile collector."""
    result = {"healthy": state["healthy"], "gpus": state["gpus"]}
    lines = [gpu_health.prometheus(result, state["instances"]).rstrip("\n")]
    lines += [
        "# HELP rigops_vllm_instance_routable Whether the instance may take traffic"
        " (healthy for recover_checks rounds in a row).",
        "# TYPE rigops_vllm_instance_routable gauge",
    ]
    lines += [
        'rigops_vllm_instance_routable{{vllm_instance="{}"}} {}'.format(name, int(v["routable"]))
        for name, v in sorted(state["instances"].items())
    ]
    lines += [
        "# HELP rigops_gpu_health_errors Probes of the last round that could not run (nvidia-smi, kernel log).",
        "# TYPE rigops_gpu_health_errors gauge",
        "rigops_gpu_health_errors {}".format(len(state["errors"])),
        "# HELP rigops_gpu_health_last_check_timestamp_seconds When the sentinel last completed a round.",
        "# TYPE rigops_gpu_health_last_check_timestamp_seconds gauge",
        "rigops_gpu_health_last_check_timestamp_seconds {:.3f}".format(state["checked_at"]),
    ]
    return "\n".join(lines) + "\n"


def summary(state, host):
    """What the run's report says of a host: healthy or not, and each finding in a line."""
    lines = {"critical": [], "warning": []}
    for gpu in state["gpus"]:
        for finding in gpu["findings"]:
            lines[finding["severity"]].append(
                "GPU {} ({}): {}: {}; {}".format(
                    "?" if gpu.get("index") is None else gpu["index"],
                    gpu["bus_id"],
                    finding["check"],
                    finding["detail"],
                    finding["action"],
                )
            )
    return {
        "host": host,
        "healthy": state["healthy"],
        "gpus": len(state["gpus"]),
        "unhealthy_gpus": [g["bus_id"] for g in state["gpus"] if not g["healthy"]],
        "instances": {name: v["healthy"] for name, v in sorted(state["instances"].items())},
        "problems": state["errors"] + lines["critical"],
        "warnings": lines["warning"],
    }


def served_state(state, now):
    """What the sentinel answers on GET /state (the gateway's health feed reads it): the state without the
    acknowledged lines' ids, with its age by this host's clock (no other host's clock is compared with it)
    and the interval, so a reader can tell a state the sentinel stopped renewing."""
    if state is None:
        return None
    out = {k: v for k, v in state.items() if k != "acked"}
    out["age_seconds"] = round(max(0.0, now - state["checked_at"]), 3)
    return out
