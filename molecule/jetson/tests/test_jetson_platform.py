"""End state of the Jetson job on three sandbox boards (two Thors, an AGX Orin): the platform stage's
work on each board, the endpoints as a client sees them, and the run's report."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook, installed_packages

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
BASE = "http://127.0.0.1:8000/v1"
STAGES = ["platform", "runtime", "weights", "services", "health", "gpu_health"]
BOARD = {"jet-1": "thor", "jet-2": "thor", "jet-3": "orin"}
MODE = {"thor": ("120W", 1), "orin": ("MODE_15W", 1)}


def completion(host):
    """HTTP status and body of one chat completion on the board (the endpoint listens on loopback)."""
    key = host.check_output("cat /etc/vllm/chat/api_key").strip()
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4})
    cmd = ["curl", "-sS", "--noproxy", "*", "-o", "/tmp/jet-body", "-w", "%{http_code}", "-H",
           f"Authorization: Bearer {key}", "-H", "Content-Type: application/json", "-d", body,
           f"{BASE}/chat/completions"]  # fmt: skip
    status = host.check_output(" ".join(shlex.quote(c) for c in cmd))
    return int(status), host.file("/tmp/jet-body").content_string


@pytest.fixture(scope="module")
def report():
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports" / "latest.json"
    return json.loads(path.read_text())


def test_the_power_mode_asked_for_by_name(host, hostname):
    name, mode_id = MODE[BOARD[hostname]]
    assert host.check_output("nvpmodel -q") == f"NV Power Mode: {name}\n{mode_id}"


def test_clocks_locked_at_boot_on_the_thors_only(host, hostname):
    unit = host.service("rigops-jetson-clocks")
    show = host.check_output("jetson_clocks --show")
    cpu0 = re.search(r"cpu0: .*MinFreq=(\d+) MaxFreq=(\d+)", show)
    if BOARD[hostname] == "thor":
        assert unit.is_enabled and unit.is_running
        assert cpu0.group(1) == cpu0.group(2)  # locked at the maximum
        assert host.file("/var/lib/rigops/jetson_clocks.conf").exists  # what the unit restores when stopped
    else:
        assert not host.file("/etc/systemd/system/rigops-jetson-clocks.service").exists
        assert cpu0.group(1) != cpu0.group(2)


def test_the_swap_file_is_made_and_the_kernels_refusal_reported(host, report, hostname):
    swap = host.file("/var/lib/rigops/swapfile")
    assert swap.is_file and (swap.user, swap.mode, swap.size) == ("root", 0o600, 1024**3)
    assert "/var/lib/rigops/swapfile" not in host.file("/proc/swaps").content_string
    assert "/var/lib/rigops/swapfile" not in host.file("/etc/fstab").content_string
    (board,) = [h for h in report["hosts"] if h["host"] == hostname]
    assert board["swap"]["action"] in ("create", "activate") and board["swap"]["state"] == "refused"
    assert "the kernel refuses a swap file on this filesystem" in board["swap"]["refusal"]


def test_no_desktop_driver_and_the_board_as_l4t_left_it(host):
    assert installed_packages(host, "nvidia-driver-*", "nvidia-open") == []
    assert host.file("/etc/nv_tegra_release").is_file
    # the CPU-build instance sees it as /dev/null (vllm_service_masked_files; else vLLM's Jetson check
    # turns on its CUDA platform and the instance does not start), the host keeps it
    unit = host.check_output("systemctl show -p BindReadOnlyPaths --value vllm@chat")
    assert unit.startswith("/dev/null:/etc/nv_tegra_release")
    assert host.check_output("stat -c %F /etc/nv_tegra_release") == "regular file"


def test_each_board_serves_a_real_completion(host):
    status, body = completion(host)
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] >= 1
    assert host.service("vllm@chat").is_running and host.service("vllm@chat").is_enabled


def test_each_stage_recorded_that_it_passed(host):
    for stage in STAGES:
        record = json.loads(host.file(f"/var/lib/rigops/stages/{stage}.json").content_string)
        assert record["status"] == "passed", (stage, record)
    assert not host.file("/var/lib/rigops/stages/driver.json").exists


def test_report_says_every_board_is_done(report):
    assert report["jobs"] == ["jetson"]
    boards = {h["host"]: h for h in report["hosts"]}
    assert sorted(boards) == sorted(BOARD)
    for name, board in boards.items():
        assert board["status"] == "ok" and board["job"] == "jetson", board
        family = BOARD[name]
        assert board["board"] == ("Jetson AGX Thor (T5000)" if family == "thor" else "Jetson AGX Orin 64GB")
        assert board["jetpack"] == ("7.0" if family == "thor" else "6.1")
        assert board["power_mode"] == MODE[family][0]
        assert board["memory"]["ok"] and board["memory"]["limit"] == 0.8
        assert board["health"]["ram_total_mb"] == (125772 if family == "thor" else 62801)
        # jet-1 is also the gateway of the three (tests/test_serving_through_a_pool.py)
        assert set(STAGES) | ({"gateway"} if name == "jet-1" else set()) == set(board["stage_seconds"])
        (inst,) = board["instances"]
        assert inst["served_name"] == "tiny" and inst["ttft_s"] is not None


def test_limit_jetson_runs_the_jetson_job(hostname):
    """`site.yml -l jetson` on the converged boards: the health stage alone passes, nothing changes."""
    if hostname != "jet-1":
        pytest.skip("one run for the three boards")
    rc, out = ansible_playbook(SCENARIO / "converge.yml", "-l", "jetson", "--tags", "health")
    assert rc == 0, out[-3000:]
    assert re.findall(r"changed=(\d+)", out) == ["0"] * len(BOARD)
    assert "PLAY [Health | Every endpoint answers" in out and "TASK [nvidia_driver" not in out
