"""A Jetson board's GPU health: tegrastats temperatures against the board's thermal trip points.

The trip points and zone names come from real artefacts (tests/fixtures/jetson/thermal/SOURCES.md); the
sandbox's Jetson profile lays out the same zones (tested in test_nvidia_sim.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils import board_thermal
from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health_sentinel as sentinel
from ansible_collections.rigops.fleet.plugins.module_utils.jetson_platform import parse_tegrastats

ROOT = Path(__file__).resolve().parents[2]
THERMAL = ROOT / "tests/fixtures/jetson/thermal"
ORIN_LINE = (ROOT / "tests/fixtures/jetson/tegrastats/agx-orin-64gb.txt").read_text().splitlines()[0]


def patch_trips():
    """zone -> [(m°C, type)] of NVIDIA's Tegra234 thermal patch (the cut kept as a fixture)."""
    trips, zone = {}, None
    text = (THERMAL / "tegra234-thermal-patch-trips.txt").read_text()
    for line in text.splitlines():
        if m := re.match(r"^\+\t\t([a-z0-9]+-thermal) \{", line):
            zone = m.group(1)
        elif m := re.search(r"temperature = <(\d+)>", line):
            trips.setdefault(zone, []).append([int(m.group(1)), None])
        elif m := re.search(r'type = "(\w+)"', line):
            trips[zone][-1][1] = m.group(1)
    return {z: [tuple(t) for t in ts] for z, ts in trips.items()}


def zone_types():
    return re.findall(r"type=(\S+)", (THERMAL / "agx-orin-jp6-zones.txt").read_text())


def write_zones(root: Path, zones, devices):
    """A class/thermal tree as the kernel lays it out: zones [(type, [(m°C, type, [devices])])]."""
    base = root / "class/thermal"
    for i, device in enumerate(devices):
        (base / f"cooling_device{i}").mkdir(parents=True)
        (base / f"cooling_device{i}/type").write_text(device + "\n")
    for z, (kind, trips) in enumerate(zones):
        zone = base / f"thermal_zone{z}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n")
        binding = 0
        for k, (millis, trip_type, bound) in enumerate(trips):
            (zone / f"trip_point_{k}_temp").write_text(f"{millis}\n")
            (zone / f"trip_point_{k}_type").write_text(f"{trip_type}\n")
            for device in bound:
                (zone / f"cdev{binding}").symlink_to(f"../cooling_device{devices.index(device)}")
                (zone / f"cdev{binding}_trip_point").write_text(f"{k}\n")
                binding += 1
    return root


@pytest.fixture
def orin(tmp_path):
    """The AGX Orin's zones (real names, in order) with NVIDIA's trips, and cpu-thermal's 70 C trip that only
    drives hot-surface-alert (JetPack 6)."""
    trips = patch_trips()
    zones = []
    for kind in zone_types():
        if kind in ("tboard-thermal", "tdiode-thermal"):
            zones.append((kind, [(trips["tboard-thermal"][0][0], "critical", [])]))
            continue
        name = kind.split("-")[0]
        shutdown, throttle = trips["cpu-thermal"]
        zones.append((kind, [(shutdown[0], shutdown[1], []), (throttle[0], throttle[1], [f"{name}-throttle-alert"])]))
    zones[0][1].append((70000, "passive", ["hot-surface-alert"]))
    devices = [f"{k.split('-')[0]}-throttle-alert" for k in zone_types()] + ["hot-surface-alert"]
    return write_zones(tmp_path, zones, devices)


def test_the_patch_gives_throttle_and_shutdown_points():
    trips = patch_trips()
    assert trips["cpu-thermal"] == [(104500, "critical"), (99000, "passive")]
    assert trips["gpu-thermal"] == [(104500, "critical")]
    assert trips["tboard-thermal"] == [(107000, "critical")]


def test_limits_from_the_zones_skip_a_trip_that_only_warns_of_a_hot_surface(orin):
    zones = board_thermal.read_zones(str(orin))
    assert [z["type"] for z in zones] == zone_types()
    limits = board_thermal.limits(zones)
    assert limits["cpu"] == {"limit_c": 99.0, "kind": "throttle", "source": "cpu-thermal trip 1 (passive)"}
    assert limits["gpu"]["limit_c"] == 99.0 and limits["tj"]["kind"] == "throttle"
    assert limits["tboard"] == {"limit_c": 107.0, "kind": "shutdown", "source": "tboard-thermal trip 0 (critical)"}
    assert board_thermal.limits(zones, {"gpu": 85})["gpu"] == {
        "limit_c": 85.0,
        "kind": "site",
        "source": "gpu_health_thermal_limits",
    }


def test_a_zone_without_bindings_throttles_at_its_lowest_passive_trip(tmp_path):
    root = write_zones(
        tmp_path, [("GPU-therm", [(104500, "critical", []), (96000, "passive", []), (98000, "passive", [])])], []
    )
    assert board_thermal.limits(board_thermal.read_zones(str(root)))["gpu"]["limit_c"] == 96.0
    # a trip bound only to the fan is no throttle: the shutdown point decides
    root = write_zones(
        tmp_path / "fan",
        [("soc0-thermal", [(80000, "active", ["pwm-fan"]), (95000, "passive", ["pwm-fan"]), (104500, "critical", [])])],
        ["pwm-fan"],
    )
    assert board_thermal.limits(board_thermal.read_zones(str(root)))["soc0"]["kind"] == "shutdown"
    assert board_thermal.read_zones(str(tmp_path / "none")) == []


@pytest.mark.parametrize(
    "zone, expected",
    [
        ("gpu-thermal", "gpu"),
        ("GPU-therm", "gpu"),
        ("Tboard_tegra", "tboard"),
        ("tj-thermal", "tj"),
        ("soc2-thermal", "soc2"),
    ],
)
def test_zone_names_map_to_tegrastats_sensors(zone, expected):
    assert board_thermal.sensor_name(zone) == expected


def _hot(line, gpu_c):
    return line.replace("GPU@-256C", f"GPU@{gpu_c}C")


def test_a_real_idle_line_is_healthy_and_a_sensor_that_is_off_is_never_judged(orin):
    limits = board_thermal.limits(board_thermal.read_zones(str(orin)))
    sample = parse_tegrastats(ORIN_LINE)
    assert "gpu" not in sample["temperatures_c"]  # GPU@-256C: rail-gated
    result = board_thermal.evaluate(sample, None, limits, 5)
    assert result == {
        "healthy": True,
        "gpus": [{"index": 0, "bus_id": "integrated", "uuid": None, "healthy": True, "findings": []}],
    }


@pytest.mark.parametrize(
    "gpu_c, severity",
    [(93.9, None), (94.0, "warning"), (98.9, "warning"), (99.0, "critical"), (103.5, "critical")],
)
def test_the_gpu_against_its_throttle_point(orin, gpu_c, severity):
    limits = board_thermal.limits(board_thermal.read_zones(str(orin)))
    result = board_thermal.evaluate(parse_tegrastats(_hot(ORIN_LINE, gpu_c)), None, limits, 5)
    found = [f for f in result["gpus"][0]["findings"] if f["sensor"] == "gpu"]
    assert [f["severity"] for f in found] == ([severity] if severity else [])
    assert result["healthy"] is (severity != "critical")
    if severity == "critical":
        assert found[0]["detail"] == (
            f"gpu at {gpu_c:g} C, its throttle point is 99 C (gpu-thermal trip 1 (passive)): clocks slowed"
        )


def test_a_board_sensor_fails_a_margin_before_its_shutdown_point(orin):
    limits = board_thermal.limits(board_thermal.read_zones(str(orin)))
    line = ORIN_LINE.replace("Tboard@32C", "Tboard@102.5C")
    found = board_thermal.evaluate(parse_tegrastats(line), None, limits, 5)["gpus"][0]["findings"]
    assert [(f["sensor"], f["severity"]) for f in found] == [("tboard", "critical")]


def test_no_sample_is_critical():
    result = board_thermal.evaluate(None, "no line within 10s", {}, 5)
    assert not result["healthy"]
    assert result["gpus"][0]["findings"][0]["detail"] == "no tegrastats sample: no line within 10s"


def _board_config(orin, **extra):
    config, problems = sentinel.build_config(
        [{"name": "chat", "gpus": []}, {"name": "embed", "gpus": [0]}],
        [],
        None,
        {
            "source": "tegrastats",
            "tegrastats": ["tegrastats"],
            "sysfs_root": str(orin),
            "thermal_limits": {},
            "thermal_margin": 5,
            "kernel_log": ["true"],
            "ignore_xids": [],
            "interval": 15,
            "recover_checks": 2,
            "state_file": "/nonexistent/state.json",
            "acks_file": "/nonexistent/acked.json",
            "textfile": "/nonexistent/x.prom",
            **extra,
        },
    )
    assert problems == [] and sentinel.check_config(config) == []
    return config


def test_every_instance_of_a_hot_board_is_unhealthy_until_it_cooled_for_the_recover_checks(orin):
    config = _board_config(orin)
    assert config["instances"] == [
        {"name": "chat", "indices": [], "gpus": ["integrated"]},
        {"name": "embed", "indices": [], "gpus": ["integrated"]},
    ]
    line = {"text": _hot(ORIN_LINE, 100.5)}

    def read_line(argv, timeout):
        assert argv == ["tegrastats"] and timeout == sentinel.TEGRASTATS_TIMEOUT
        return line["text"], None

    hot = sentinel.check(config, None, read_line=read_line)
    assert not hot["healthy"] and hot["errors"] == []
    assert {n: (v["healthy"], v["routable"]) for n, v in hot["instances"].items()} == {
        "chat": (False, False),
        "embed": (False, False),
    }
    assert 'rigops_vllm_instance_gpu_healthy{vllm_instance="chat"} 0' in sentinel.metrics(hot)
    line["text"] = ORIN_LINE
    first = sentinel.check(config, hot, read_line=read_line)
    assert first["healthy"] and not first["instances"]["chat"]["routable"]
    second = sentinel.check(config, first, read_line=read_line)
    assert second["instances"]["chat"]["routable"] and second["instances"]["embed"]["routable"]


def test_a_board_whose_tegrastats_prints_nothing_is_unhealthy(orin):
    state = sentinel.check(_board_config(orin), None, read_line=lambda argv, timeout: (None, "tegrastats: not found"))
    assert not state["healthy"]
    assert state["errors"] == ["tegrastats: tegrastats: not found"]
    assert not state["instances"]["chat"]["healthy"]


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"source": "dcgm"}, "config: source must be one of nvidia_smi, tegrastats, got 'dcgm'"),
        ({"thermal_limits": {"gpu": "hot"}}, "config: thermal_limits must map sensor names to degrees C"),
        ({"thermal_margin": -1}, "config: thermal_margin must be a number of degrees C, at least 0"),
    ],
)
def test_a_bad_board_config_is_refused(orin, change, problem):
    config = dict(_board_config(orin), **change)
    assert problem in sentinel.check_config(config)
    broken = dict(_board_config(orin))
    del broken["sysfs_root"]
    assert sentinel.check_config(broken) == ["config: sysfs_root missing"]
