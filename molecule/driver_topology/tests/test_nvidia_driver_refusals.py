"""Refusals and dry runs: each leaves the host as it was, with a message that says why.

These run the role again through ansible-playbook against the scenario's inventory,
with the variables of each case.
"""

import os
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook, installed_packages, recap

SCENARIO = Path(os.environ.get("MOLECULE_SCENARIO_DIRECTORY", Path(__file__).resolve().parent.parent))
testinfra_hosts = ["drv-nogpu", "drv-fresh", "drv-archive"]


def play(limit, *extra):
    return ansible_playbook(SCENARIO / "negative.yml", "-l", limit, *extra)


def nvidia_packages(host):
    return installed_packages(host, "nvidia-*", "cuda-drivers")


def test_no_gpu_is_refused_before_any_change(host, hostname):
    if hostname != "drv-nogpu":
        pytest.skip("case for drv-nogpu")
    rc, out = play(hostname)
    assert rc != 0
    assert "has no NVIDIA PCI device" in out
    assert "nvidia_driver_expect_gpu: false" in out
    assert nvidia_packages(host) == []
    assert not host.file("/etc/apt/sources.list.d/rigops-nvidia.sources").exists


def test_check_mode_on_a_fresh_rig_changes_nothing(host, hostname):
    if hostname != "drv-fresh":
        pytest.skip("case for drv-fresh")
    rc, out = play(hostname, "--check")
    assert rc == 0, out[-3000:]
    assert recap(out, hostname)["changed"] > 0  # it reports what it would do
    assert nvidia_packages(host) == []
    for path in (
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/modules-load.d/nvidia.conf",
        "/etc/apt/sources.list.d/rigops-nvidia.sources",
        "/etc/apt/keyrings/rigops-nvidia-archive.asc",
    ):
        assert not host.file(path).exists, path


def test_branch_change_on_a_serving_rig_is_refused(host, hostname):
    if hostname != "drv-archive":
        pytest.skip("case for drv-archive")
    host.run("systemd-run --unit=vllm@canary.service sleep 600")
    try:
        assert host.service("vllm@canary").is_running
        rc, out = play(hostname, "-e", "nvidia_driver_branch=590")
        assert rc != 0
        assert "serves (vllm@canary.service)" in out
        assert "nvidia_driver_allow_branch_change=true" in out
        assert host.package("nvidia-driver-595-open").is_installed
        assert not host.package("nvidia-driver-590-open").is_installed
    finally:
        host.run("systemctl stop vllm@canary.service")


def loaded_version(host):
    return host.file("/run/nvidia-sim/proc/driver/nvidia/version").content_string


def test_downgrade_then_upgrade_between_branches(host, hostname):
    """590 then 595 on the archive flavour, then the CUDA flavour: no held-package errors."""
    if hostname != "drv-fresh":
        pytest.skip("case for drv-fresh")
    rc, out = play(hostname, "-e", "nvidia_driver_branch=590")
    assert rc == 0, out[-3000:]
    assert host.package("nvidia-driver-590-open").version.startswith("590.")
    assert "590." in loaded_version(host)
    assert "nvidia-driver-590-open" in host.check_output("apt-mark showhold").split()

    rc, out = play(hostname, "-e", "nvidia_driver_branch=595")
    assert rc == 0, out[-3000:]
    assert host.package("nvidia-driver-595-open").is_installed
    assert not host.package("nvidia-driver-590-open").is_installed
    assert "595." in loaded_version(host)

    rc, out = play(hostname, "-e", "nvidia_driver_branch=590", "-e", "nvidia_driver_source=cuda")
    assert rc == 0, out[-3000:]
    assert host.package("nvidia-open").version.startswith("590.")
    assert host.package("nvidia-driver-pinning-590").is_installed
    assert not host.package("nvidia-driver-595-open").is_installed
    assert "590." in loaded_version(host)
