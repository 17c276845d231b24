"""The GPU health sentinel: its config from the inventory, its rounds, acknowledgements, and the host script.

The script runs as on a host (python3, its logic copied beside it as the role lays it out), against a stand-in
nvidia-smi that prints a real capture (tests/fixtures/nvidia-smi/real/) and a kernel log file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.filter import gpu_health as gpu_health_filter
from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health_sentinel as sentinel
from ansible_collections.rigops.fleet.plugins.module_utils import llm_gateway_health_feed as feed

ROOT = Path(__file__).resolve().parents[2]
A100 = ROOT / "tests/fixtures/nvidia-smi/real/x01_telegraf_a100_sxm4_80gb_mig_v12.xml"
SCRIPT = ROOT / "roles/gpu_health/files/rigops-gpu-health"
# the module_utils files the role installs beside the script (roles/gpu_health/tasks/sentinel.yml)
SHIPPED = [
    "board_thermal",
    "gpu_health",
    "gpu_health_sentinel",
    "jetson_platform",
    "jetson_tegrastats",
    "nvidia_smi",
    "state_file",
]
FEED_SCRIPT = ROOT / "roles/llm_gateway/files/rigops-llm-gateway-health"


def a100_bus_id():
    from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health

    return gpu_health.read_smi_xml(A100.read_text())[0]["bus_id"]


def xid_line(bus, xid, text, second=1):
    """A kernel log line as journalctl -k -o short prints the driver's Xid report."""
    short = bus.split(":", 1)[1].rsplit(".", 1)[0]  # 0000:07:00.0 -> 07:00
    prefix = f"Dec 03 10:00:{second:02d} rig kernel: NVRM:"
    return f"{prefix} Xid (PCI:0000:{short}): {xid}, pid='<unknown>', name=<unknown>, {text}"


# --------------------------------------------------------------------------- the config the role writes


GPUS = [{"index": i, "pci_bus_id": f"00000000:{0x11 + i:02X}:00.0"} for i in range(4)]
BUS = [f"0000:{0x11 + i:02x}:00.0" for i in range(4)]


def test_config_records_instances_by_bus_id():
    config, problems = sentinel.build_config(
        [{"name": "left", "gpus": [0, 1]}, {"name": "right", "gpus": [2, 3]}, {"name": "cpu", "gpus": []}],
        GPUS,
        None,
        {"interval": 15, "forget_bus_ids": []},
    )
    assert problems == []
    assert config["expected_bus_ids"] == BUS
    assert config["instances"] == [
        {"name": "left", "indices": [0, 1], "gpus": BUS[:2]},
        {"name": "right", "indices": [2, 3], "gpus": BUS[2:]},
        {"name": "cpu", "indices": [], "gpus": []},
    ]
    assert config["interval"] == 15 and "forget_bus_ids" not in config


def test_config_keeps_a_gpu_that_fell_off_and_the_instances_mapping():
    before, _ = sentinel.build_config([{"name": "right", "gpus": [2, 3]}], GPUS, None, {})
    # GPU 2 fell off the bus: nvidia-smi numbers the others 0..2, so index 2 is now the old GPU 3
    now = [{"index": i, "pci_bus_id": b} for i, b in enumerate(BUS[:2] + BUS[3:])]
    config, problems = sentinel.build_config([{"name": "right", "gpus": [2, 3]}], now, before, {})
    assert problems == []
    assert config["expected_bus_ids"] == BUS
    assert config["instances"] == [{"name": "right", "indices": [2, 3], "gpus": BUS[2:]}]
    # an instance new since then cannot be told by bus id while a GPU is missing
    _, problems = sentinel.build_config([{"name": "new", "gpus": [0]}], now, before, {})
    assert problems and "new" in problems[0] and BUS[2] in problems[0]
    # forgetting the GPU makes the rest complete again
    config, problems = sentinel.build_config([{"name": "new", "gpus": [2]}], now, before, {"forget_bus_ids": [BUS[2]]})
    assert problems == [] and config["expected_bus_ids"] == BUS[:2] + BUS[3:]
    assert config["instances"] == [{"name": "new", "indices": [2], "gpus": [BUS[3]]}]


def test_config_reads_the_hosts_file_and_refuses_one_that_is_not_its_config():
    before, _ = sentinel.build_config([{"name": "right", "gpus": [2, 3]}], GPUS, None, {})
    now = [{"index": i, "pci_bus_id": b} for i, b in enumerate(BUS[:2] + BUS[3:])]
    # the file's text (what the role slurps) counts as the parsed config: GPU 2 stays expected
    config, problems = sentinel.build_config([{"name": "right", "gpus": [2, 3]}], now, json.dumps(before), {})
    assert problems == [] and config["expected_bus_ids"] == BUS
    # a cut file, another JSON value or a wrong expected list: refused, naming the variable, never rewritten
    for text in (json.dumps(before)[:40], "[]", '{"expected_bus_ids": "0000:11:00.0"}'):
        config, problems = sentinel.build_config([{"name": "right", "gpus": [2, 3]}], now, text, {})
        assert config is None and len(problems) == 1, text
        assert problems[0].startswith("the config the host has (gpu_health_config_file) is not "), problems
        assert "remove it to start again" in problems[0]
    assert "not JSON (" in sentinel.build_config([], now, "{", {})[1][0]
    # a Jetson board's config records no GPU to keep: rewritten whatever it holds
    config, problems = sentinel.build_config([{"name": "chat", "gpus": []}], [], "{", {"source": "tegrastats"})
    assert problems == [] and config["expected_bus_ids"] == [] and config["instances"][0]["name"] == "chat"
    # the filter passes the text through and returns the problem with no config
    built = gpu_health_filter.gpu_health_config([], now, "{", {})
    assert built["config"] is None and built["problems"][0].startswith("the config the host has")


def test_config_refuses_gpus_that_are_not_indices():
    instances = [{"name": "x", "gpus": ["0", True]}, {"name": "y", "gpus": [9]}]
    _, problems = sentinel.build_config(instances, GPUS, None, {})
    assert len(problems) == 2
    assert problems[0].startswith("instance x: gpus must be a list of GPU indices")
    assert problems[1].startswith("instance y: GPU(s) [9] cannot be told by bus id: nvidia-smi shows 4 GPU(s)")


def test_config_check_names_each_bad_key():
    keys = sentinel.CONFIG_KEYS + sentinel.SOURCE_KEYS["nvidia_smi"]
    assert sentinel.check_config({}) == [f"config: {k} missing" for k in keys]
    good = dict.fromkeys(sentinel.CONFIG_KEYS, [])
    good.update(nvidia_smi=["nvidia-smi"], kernel_log=["journalctl", "-k"], recover_checks=3)
    assert sentinel.check_config(good) == []
    assert sentinel.check_config(dict(good, nvidia_smi="nvidia-smi", recover_checks=0)) == [
        "config: nvidia_smi must be a command as a list of strings",
        "config: recover_checks must be a whole number of at least 1",
    ]
    assert sentinel.check_config(dict(good, listen={"address": "0.0.0.0", "port": 70000})) == [
        "config: listen must be {address: an address, port: 0 (none) to 65535}"
    ]


def test_served_state_has_its_age_and_no_acknowledged_line_ids():
    state = {"checked_at": 100.0, "interval": 15, "instances": {}, "acked": ["abc"]}
    assert sentinel.served_state(state, 112.5) == {"checked_at": 100.0, "interval": 15, "instances": {},
                                                  "age_seconds": 12.5}  # fmt: skip
    assert sentinel.served_state(None, 1.0) is None


# --------------------------------------------------------------------------- rounds


def fake_run(xml, log, smi_rc=0):
    def run(argv):
        if argv[0] == "nvidia-smi":
            return smi_rc, xml if smi_rc == 0 else "", "" if smi_rc == 0 else "NVIDIA-SMI has failed"
        return 0, log, ""

    return run


def config_for(bus, recover=2):
    return {
        "nvidia_smi": ["nvidia-smi"],
        "kernel_log": ["journalctl", "-k"],
        "expected_bus_ids": [bus],
        "instances": [{"name": "solo", "indices": [0], "gpus": [bus]}],
        "recover_checks": recover,
        "ignore_xids": [],
        "interval": 15,
    }


def test_a_round_judges_gpus_and_instances_and_recovery_takes_rounds():
    bus = a100_bus_id()
    config = config_for(bus)
    xml = A100.read_text()
    state = sentinel.check(config, None, run=fake_run(xml, ""), now=1.0)
    assert state["healthy"] and state["errors"] == []
    assert state["instances"]["solo"]["healthy"] and state["instances"]["solo"]["routable"]

    sick = xid_line(bus, 79, "GPU has fallen off the bus.")
    state = sentinel.check(config, state, run=fake_run(xml, sick + "\n"), now=2.0)
    assert not state["healthy"]
    assert not state["instances"]["solo"]["routable"] and state["instances"]["solo"]["healthy_streak"] == 0
    (gpu,) = state["gpus"]
    assert [f["check"] for f in gpu["findings"] if f["severity"] == "critical"] == ["xid"]

    # the line stays in the log: still sick; acknowledged, it counts no more, and the instance needs 2 rounds
    state = sentinel.check(config, state, run=fake_run(xml, sick), now=3.0)
    assert not state["healthy"]
    acked = sentinel.acknowledge(config, [], bus, run=fake_run(xml, sick))
    assert len(acked) == 1
    state = sentinel.check(config, state, acked, run=fake_run(xml, sick), now=4.0)
    assert state["healthy"] and state["acked"] == acked
    assert state["instances"]["solo"]["healthy"] and not state["instances"]["solo"]["routable"]
    state = sentinel.check(config, state, acked, run=fake_run(xml, sick), now=5.0)
    assert state["instances"]["solo"]["routable"] and state["instances"]["solo"]["healthy_streak"] == 2

    # a new Xid of the same GPU is a new line: not acknowledged
    again = sick + "\n" + xid_line(bus, 79, "GPU has fallen off the bus.", second=9)
    assert not sentinel.check(config, state, acked, run=fake_run(xml, again), now=6.0)["healthy"]
    # after a reboot the log is new: the acknowledgement of a line no longer there is dropped
    assert sentinel.check(config, state, acked, run=fake_run(xml, ""), now=7.0)["acked"] == []


def test_nvidia_smi_failing_makes_every_expected_gpu_missing():
    bus = a100_bus_id()
    state = sentinel.check(config_for(bus), None, run=fake_run("", "", smi_rc=9), now=1.0)
    assert not state["healthy"]
    assert state["errors"] == ["nvidia-smi exited 9: NVIDIA-SMI has failed"]
    assert [g["bus_id"] for g in state["gpus"] if not g["healthy"]] == [bus]
    assert not state["instances"]["solo"]["routable"]


def test_metrics_and_summary():
    bus = a100_bus_id()
    sick = xid_line(bus, 48, "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.")
    state = sentinel.check(config_for(bus), None, run=fake_run(A100.read_text(), sick), now=1700000000.5)
    text = sentinel.metrics(state)
    assert 'rigops_vllm_instance_routable{vllm_instance="solo"} 0' in text
    assert "rigops_gpu_health_last_check_timestamp_seconds 1700000000.500" in text
    assert "rigops_gpu_health_errors 0" in text
    assert not re.search(r'[{,]instance="', text)  # Prometheus' own label: the instance is vllm_instance
    assert text == sentinel.metrics(state)
    summary = gpu_health_filter.gpu_health_summary(state, "rig1")
    assert summary["host"] == "rig1" and not summary["healthy"] and summary["unhealthy_gpus"] == [bus]
    assert summary["instances"] == {"solo": False}
    assert any("xid" in line and "48" in line for line in summary["problems"])


# --------------------------------------------------------------------------- the host script


def executable(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def host(tmp_path):
    """The script and its logic laid out as the role installs them, with a stand-in nvidia-smi and kernel log."""
    home = tmp_path / "lib"
    package = home / "ansible_collections/rigops/fleet/plugins/module_utils"
    package.mkdir(parents=True)
    shutil.copy(SCRIPT, home / "rigops-gpu-health")
    for name in SHIPPED:
        shutil.copy(ROOT / f"plugins/module_utils/{name}.py", package / f"{name}.py")
    kern = tmp_path / "kern.log"
    kern.write_text("Dec 03 10:00:00 rig kernel: Linux version 6.1.0\n")
    smi = executable(tmp_path / "nvidia-smi", f"#!/bin/sh\ncat {A100}\n")
    state = tmp_path / "state"
    state.mkdir()
    config = {
        "nvidia_smi": [smi],
        "kernel_log": ["cat", str(kern)],
        "expected_bus_ids": [a100_bus_id()],
        "instances": [{"name": "solo", "indices": [0], "gpus": [a100_bus_id()]}],
        "recover_checks": 1,
        "ignore_xids": [],
        "interval": 1,
        "state_file": str(state / "state.json"),
        "acks_file": str(state / "acked.json"),
        "textfile": str(state / "rigops_gpu_health.prom"),
        "listen": {"address": "127.0.0.1", "port": free_port()},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The host's python3, as the service runs it (-E -s: nothing of this checkout's environment; the script's folder
# stays first on the path, which is how it finds its logic).
PYTHON = [shutil.which("python3", path="/usr/bin") or sys.executable, "-E", "-s"]


def script(host, *args, timeout=30):
    return subprocess.run(
        [*PYTHON, str(host / "lib/rigops-gpu-health"), *args, "--config", str(host / "config.json")],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={"PATH": os.environ["PATH"]},
    )


def test_the_role_installs_the_logic_the_script_imports():
    tasks = (ROOT / "roles/gpu_health/tasks/sentinel.yml").read_text()
    shipped = re.search(r"rigops.fleet.module_util_file',(.*?)files_in", tasks, re.DOTALL).group(1)
    assert sorted(re.findall(r"'(\w+)'", shipped)) == SHIPPED
    # and the lookup that finds them for the role knows each one
    from ansible_collections.rigops.fleet.plugins.lookup.module_util_file import SHIPPED as KNOWN  # noqa: PLC0415

    assert set(SHIPPED) <= set(KNOWN)


def test_script_on_a_jetson_board_judges_tegrastats_against_the_thermal_zones(host):
    orin = (ROOT / "tests/fixtures/jetson/tegrastats/agx-orin-64gb.txt").read_text().splitlines()[0]
    line = host / "line.txt"
    line.write_text(orin.replace("GPU@-256C", "GPU@100.5C") + "\n")
    # tegrastats prints until stopped: the stand-in too
    tegrastats = executable(host / "tegrastats", f"#!/bin/sh\nwhile :; do cat {line}; sleep 1; done\n")
    zone = host / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    for name, text in {"type": "gpu-thermal", "trip_point_0_temp": "99000", "trip_point_0_type": "passive"}.items():
        (zone / name).write_text(text + "\n")
    config = json.loads((host / "config.json").read_text())
    config.update(
        source="tegrastats",
        tegrastats=[tegrastats],
        sysfs_root=str(host / "sys"),
        thermal_limits={},
        thermal_margin=5,
        instances=[{"name": "chat", "indices": [], "gpus": ["integrated"]}],
        expected_bus_ids=[],
    )
    (host / "config.json").write_text(json.dumps(config))
    res = script(host, "check")
    assert res.returncode == 1, res.stderr
    state = json.loads(res.stdout)
    assert state["gpus"][0]["findings"][0]["detail"] == (
        "gpu at 100.5 C, its throttle point is 99 C (gpu-thermal trip 0 (passive)): clocks slowed"
    )
    assert state["instances"]["chat"]["healthy"] is False
    line.write_text(orin + "\n")
    res = script(host, "check")
    assert res.returncode == 0, res.stdout


def test_script_check_ack_status_and_the_service_loop(host):
    res = script(host, "check")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["healthy"]
    assert not (host / "state/state.json").exists()  # check writes nothing

    bus = a100_bus_id()
    with open(host / "kern.log", "a") as log:
        log.write(xid_line(bus, 79, "GPU has fallen off the bus.") + "\n")
    res = script(host, "check")
    assert res.returncode == 1 and not json.loads(res.stdout)["healthy"]

    # the service's loop writes the state and the metrics; stopped by SIGTERM like systemd does
    proc = subprocess.Popen(
        [*PYTHON, str(host / "lib/rigops-gpu-health"), "run", "--config", str(host / "config.json")],
        env={"PATH": os.environ["PATH"]},
    )
    url = "http://127.0.0.1:{}/state".format(json.loads((host / "config.json").read_text())["listen"]["port"])
    try:
        for _ in range(100):
            if (host / "state/rigops_gpu_health.prom").exists():
                break
            time.sleep(0.1)
        # GET /state: what the gateway's health feed reads; the feed drains the instance on the sick GPU
        state, error = feed.fetch_state(url, 3)
        assert error is None and state["instances"]["solo"]["routable"] is False, (state, error)
        assert "acked" not in state and 0 <= state["age_seconds"] < 5 and state["interval"] == 1
        doc = feed.poll([{"host": "rig", "url": url, "instances": ["solo"]}], feed.fetch_state)
        assert doc["drained"] == ["rig/solo"] and doc["hosts"]["rig"]["status"] == "ok"
        assert "79" in " ".join(doc["why"]["rig/solo"]["findings"])
        # the feed as the role installs it on a gateway: check prints the same, exit 1 (something drained)
        feed_host = gateway_feed(host, [{"host": "rig", "url": url, "instances": ["solo"]}])
        res = subprocess.run([*PYTHON, str(feed_host / "rigops-llm-gateway-health"), "check", "--config",
                              str(feed_host / "feed.json")], capture_output=True, text=True, check=False,
                             env={"PATH": os.environ["PATH"]})  # fmt: skip
        assert res.returncode == 1 and json.loads(res.stdout)["drained"] == ["rig/solo"], res.stderr
        # read-only: nothing but GET /state
        for method, path, status in (("GET", "/", 404), ("POST", "/state", 405), ("DELETE", "/state", 405)):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url.replace("/state", path), method=method), timeout=3)
            assert err.value.code == status
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    # a sentinel that is not there drains nothing (fail open), and says why
    doc = feed.poll([{"host": "rig", "url": url, "instances": ["solo"]}], feed.fetch_state, timeout=1)
    assert doc["drained"] == [] and doc["hosts"]["rig"]["status"] == "unreachable"
    metrics = (host / "state/rigops_gpu_health.prom").read_text()
    assert 'rigops_vllm_instance_gpu_healthy{vllm_instance="solo"} 0' in metrics
    assert oct((host / "state/rigops_gpu_health.prom").stat().st_mode & 0o777) == "0o644"
    res = script(host, "status")
    assert res.returncode == 1 and json.loads(res.stdout)["instances"]["solo"]["healthy"] is False

    res = script(host, "ack", bus)
    assert res.returncode == 0 and "1 Xid line(s) acknowledged" in res.stdout
    assert oct((host / "state/acked.json").stat().st_mode & 0o777) == "0o600"
    res = script(host, "check")
    assert res.returncode == 0, res.stdout


def gateway_feed(host, sources):
    """The gateway's health feed laid out as the llm_gateway role installs it, with its config."""
    home = host / "feed"
    package = home / "ansible_collections/rigops/fleet/plugins/module_utils"
    package.mkdir(parents=True)
    shutil.copy(FEED_SCRIPT, home / "rigops-llm-gateway-health")
    for name in ("llm_gateway_health_feed", "state_file"):
        shutil.copy(ROOT / f"plugins/module_utils/{name}.py", package / f"{name}.py")
    config = {"interval": 1, "timeout": 2, "drained_file": str(home / "drained.json"), "sources": sources}
    (home / "feed.json").write_text(json.dumps(config))
    return home


def test_script_refuses_a_broken_config_and_names_the_key(host):
    config = json.loads((host / "config.json").read_text())
    del config["kernel_log"]
    (host / "config.json").write_text(json.dumps(config))
    res = script(host, "check")
    assert res.returncode == 2 and "config: kernel_log missing" in res.stderr
    res = script(host, "status", "0000:07:00.0")
    assert res.returncode == 2 and "a GPU is given to ack only" in res.stderr


def test_dcgm_that_does_not_answer_is_an_error_and_nvidia_smi_judges_alone():
    config = {"dcgmi": ["/usr/bin/dcgmi"]}
    down = "Error: unable to establish a connection to the specified host: localhost\n"
    found, problems = sentinel.dcgm_round(config, lambda argv, timeout=30: (1, down, ""), exists=lambda p: True)
    assert found == {} and problems == [f"dcgmi health -c exited 1: {down.strip()}"]
    # not installed (the default path absent), or switched off: no DCGM, no error
    assert sentinel.dcgm_round(config, lambda *a, **k: 1 / 0, exists=lambda p: False) == ({}, [])
    assert sentinel.dcgm_round({"dcgmi": []}, lambda *a, **k: 1 / 0) == ({}, [])
