# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU health of a Jetson board: its temperatures (tegrastats) against the board's own thermal trip points.

A Jetson has one integrated GPU and no ``nvidia-smi -q -x``: the GPU health sentinel (gpu_health_sentinel,
source ``tegrastats``) reads one tegrastats line per round and the Linux thermal framework's zones under
``<sysfs>/class/thermal``, and judges every sensor of the line against the trip point of its zone
(``gpu@`` against ``gpu-thermal``, ``tj@`` against ``tj-thermal``...):

- at or above the zone's throttle point: critical (the board slows its CPU and GPU clocks: an instance on it
  serves slowly or not at all), so every instance of the board is unhealthy;
- within ``margin`` degrees below it: a warning.

The throttle point of a zone is its lowest ``passive`` or ``hot`` trip bound to a cooling device that slows
clocks (``cpufreq-*``, ``devfreq-*``) or to NVIDIA's ``*-throttle-alert`` device, which announces that
throttle. Trips bound only to other devices do not count: on JetPack 6 Orin, ``cpu-thermal`` has a 70 C
``passive`` trip that drives only ``hot-surface-alert`` (a "do not touch" notice), and its throttle trip is
at 99 C. A zone with no binding to read falls back to its lowest ``passive`` trip (the kernel's meaning of
the type). A zone without a throttle point is judged against its ``critical`` trip (shutdown) less the
margin. A site's own limit for a sensor (``limits``) replaces what the zone says.

Sources (tests/fixtures/jetson/thermal/SOURCES.md): the zone names of an AGX Orin on JetPack 6 and NVIDIA's
Tegra234 thermal patch (99 C passive sw-throttle and 104.5 C critical sw-shutdown on every SoC zone, 107 C
critical on the board's tmp451 zones); NVIDIA's userspace_alert.c for what an ``*-alert`` device does.

Host side: Python 3.8 and the standard library only.
"""

import os
import re

BOARD_GPU = "integrated"  # the id of a board's one GPU in the sentinel's state (it has no PCI bus id)
THROTTLE_TRIP_TYPES = ("passive", "hot")
_ZONE_SUFFIX = re.compile(r"(?:[-_]therm(?:al)?|_tegra)$")


def sensor_name(zone_type):
    """'gpu-thermal' (JetPack 6), 'GPU-therm' (JetPack 5), 'Tboard_tegra' -> the tegrastats name: gpu, tboard."""
    return _ZONE_SUFFIX.sub("", (zone_type or "").strip()).lower()


def slows_clocks(device_type):
    """Whether a cooling device throttles (a clock device, or NVIDIA's announcement of the throttle)."""
    low = (device_type or "").lower()
    return low.startswith(("cpufreq", "devfreq", "thermal-cpufreq", "thermal-devfreq")) or low.endswith(
        "throttle-alert"
    )


def _read(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _number(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _indexed(names, prefix):
    """Sorted (n, name) of entries named prefix<n> (thermal_zone3, trip_point_0_temp, cdev2)."""
    out = []
    for name in names:
        m = re.match(re.escape(prefix) + r"(\d+)$", name)
        if m:
            out.append((int(m.group(1)), name))
    return sorted(out)


def read_zones(sysfs_root):
    """The thermal zones under <sysfs_root>/class/thermal, as plain data; unreadable parts left out.

    [{"zone": "thermal_zone1", "type": "gpu-thermal", "trips": [{"index", "temp_c", "type", "devices"}]}],
    where ``devices`` are the types of the cooling devices bound to the trip (cdevN -> cdevN_trip_point).
    """
    base = os.path.join(sysfs_root, "class", "thermal")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    zones = []
    for _n, zone in _indexed(names, "thermal_zone"):
        path = os.path.join(base, zone)
        try:
            entries = os.listdir(path)
        except OSError:
            continue
        bound = {}
        for _k, cdev in _indexed(entries, "cdev"):
            trip = _number(_read(os.path.join(path, cdev + "_trip_point")))
            device = _read(os.path.join(path, cdev, "type"))
            if trip is not None and device:
                bound.setdefault(trip, []).append(device)
        trips = []
        for name in entries:
            m = re.match(r"trip_point_(\d+)_temp$", name)
            if not m:
                continue
            index = int(m.group(1))
            millis = _number(_read(os.path.join(path, name)))
            kind = _read(os.path.join(path, f"trip_point_{index}_type"))
            if millis is None or not kind:
                continue
            trips.append({"index": index, "temp_c": millis / 1000.0, "type": kind, "devices": bound.get(index, [])})
        zones.append(
            {
                "zone": zone,
                "type": _read(os.path.join(path, "type")) or zone,
                "trips": sorted(trips, key=lambda t: t["index"]),
                "bindings": bool(bound),
            }
        )
    return zones


def limits(zones, overrides=None):
    """Per tegrastats sensor name: {"limit_c", "kind" (throttle, shutdown or site), "source"}."""
    out = {}
    for zone in zones or []:
        name = sensor_name(zone["type"])
        throttle = [
            t
            for t in zone["trips"]
            if t["type"] in THROTTLE_TRIP_TYPES
            and (any(slows_clocks(d) for d in t["devices"]) if zone.get("bindings") else t["type"] == "passive")
        ]
        critical = [t for t in zone["trips"] if t["type"] == "critical"]
        if throttle:
            trip = min(throttle, key=lambda t: t["temp_c"])
            out[name] = {
                "limit_c": trip["temp_c"],
                "kind": "throttle",
                "source": "{} trip {} ({})".format(zone["type"], trip["index"], trip["type"]),
            }
        elif critical:
            trip = min(critical, key=lambda t: t["temp_c"])
            out[name] = {
                "limit_c": trip["temp_c"],
                "kind": "shutdown",
                "source": "{} trip {} (critical)".format(zone["type"], trip["index"]),
            }
    for name, value in (overrides or {}).items():
        out[str(name).lower()] = {"limit_c": float(value), "kind": "site", "source": "gpu_health_thermal_limits"}
    return out


def findings(temperatures, board_limits, margin):
    """Findings of one tegrastats sample's temperatures ({sensor: C}, sensors that are off left out)."""
    found = []
    for sensor, temp in sorted((temperatures or {}).items()):
        limit = board_limits.get(sensor)
        if limit is None:
            continue
        # a shutdown trip warns and fails `margin` degrees before it: the board powers off at the trip itself
        critical_at = limit["limit_c"] - (margin if limit["kind"] == "shutdown" else 0)
        warning_at = critical_at - margin
        what = {"throttle": "throttle point", "shutdown": "shutdown point", "site": "site limit"}[limit["kind"]]
        detail = "{} at {:g} C, its {} is {:g} C ({})".format(sensor, temp, what, limit["limit_c"], limit["source"])
        if temp >= critical_at:
            found.append(
                {
                    "check": "thermal",
                    "severity": "critical",
                    "detail": detail + ": clocks slowed",
                    "action": "check",
                    "sensor": sensor,
                }
            )
        elif temp >= warning_at:
            found.append(
                {
                    "check": "thermal",
                    "severity": "warning",
                    "detail": detail + f": within {margin:g} C",
                    "action": "check",
                    "sensor": sensor,
                }
            )
    return found


def evaluate(sample, error, board_limits, margin):
    """The board's verdict in the shape of gpu_health.evaluate: one GPU entry, ``BOARD_GPU``.

    ``sample``: parsed tegrastats line (jetson_platform.parse_tegrastats) or None, with ``error`` saying why.
    """
    if sample is None:
        found = [
            {
                "check": "tegrastats",
                "severity": "critical",
                "action": "check",
                "detail": "no tegrastats sample: {}".format(error or "the line could not be read"),
            }
        ]
    else:
        found = findings(sample.get("temperatures_c"), board_limits, margin)
    healthy = not any(f["severity"] == "critical" for f in found)
    entry = {"index": 0, "bus_id": BOARD_GPU, "uuid": None, "healthy": healthy, "findings": found}
    return {"healthy": healthy, "gpus": [entry]}
