"""The simulated NVIDIA stack, checked the way a person would check a real rig."""

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import ansible.module_utils
import pytest

ROOT = os.environ["MOLECULE_PROJECT_DIRECTORY"]
ansible.module_utils.__path__.append(os.path.join(ROOT, "module_utils"))
sys.path.insert(0, os.path.join(ROOT, "lab", "sandbox"))
import fleet  # noqa: E402 (podman as the sandbox runs it: a restart mounts the host as its start did)
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import parse_p2p_matrix, parse_topo_matrix  # noqa: E402

RIGS = {"sb-5090", "sb-h100"}


def rig_only(hostname):
    if hostname not in RIGS:
        pytest.skip("GPU rigs only")


def test_hardware_is_there_before_any_driver(host, profile):
    assert host.file("/etc/nvidia-sim/profile.yaml").exists
    nvidia = host.check_output("lspci -d 10de: -nn").splitlines()
    gpus = [ln for ln in nvidia if "VGA" in ln or "3D controller" in ln]
    if profile.get("gpu_model", {}).get("integrated"):
        return
    assert len(gpus) == len(profile["gpus"])


def test_jetson_markers(host, hostname):
    if hostname != "sb-thor":
        pytest.skip("Jetson only")
    assert host.file("/etc/nv_tegra_release").contains("# R38 (release)")
    assert "Jetson AGX Thor" in host.file("/etc/nvidia-sim/proc/device-tree/model").content_string
    assert host.run("nvpmodel -q").rc == 0
    assert not host.exists("nvidia-smi")  # JetPack 7.0 has none


def test_apt_trusts_the_signed_repository(host, hostname):
    rig_only(hostname)
    update = host.run("apt-get update")
    assert update.rc == 0
    for bad in ("NO_PUBKEY", "not signed", "insecure", "W: GPG"):
        assert bad not in update.stdout + update.stderr
    policy = host.check_output("apt-cache policy nvidia-open")
    assert "rigops-repo:8080/cuda/debian12/x86_64" in policy


def test_driver_installed_by_apt(host, hostname):
    rig_only(hostname)
    assert host.package("nvidia-open").version.startswith("595.45.04")
    owner = host.check_output("dpkg -S /usr/bin/nvidia-smi")
    assert owner.split(":")[0] == "nvidia-driver-cuda"


def test_nouveau_blocks_the_driver_until_blacklisted_and_rebooted(host, hostname, platform):
    """Like a fresh rig: nouveau holds the GPUs; blacklist, initramfs, reboot; then nvidia."""
    rig_only(hostname)
    loaded = host.check_output("lsmod")
    if "nouveau" in loaded:
        smi = host.run("nvidia-smi")
        assert smi.rc == 9
        assert "couldn't communicate with the NVIDIA driver" in smi.stdout + smi.stderr
        host.check_output(
            "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > /etc/modprobe.d/blacklist-nouveau.conf"
        )
        host.check_output("update-initramfs -u")
        reboot(hostname)
    assert "nouveau" not in host.check_output("lsmod")
    assert host.run("nvidia-smi -L").rc == 0


def reboot(hostname):
    env = fleet.podman_env()
    podman = fleet.podman_command()
    subprocess.run([*podman, "restart", "-t", "5", f"rigops-{hostname}"], check=True, env=env, capture_output=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["podman", "exec", f"rigops-{hostname}", "systemctl", "is-system-running"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        ).stdout.strip()
        if state in ("running", "degraded"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{hostname} did not come back after reboot")


def test_xml_reports_the_profile(host, hostname, profile):
    rig_only(hostname)
    root = ET.fromstring(host.check_output("nvidia-smi -q -x"))
    assert root.tag == "nvidia_smi_log"
    assert root.findtext("driver_version") == "595.45.04"
    assert root.findtext("cuda_version") == "13.2"
    assert int(root.findtext("attached_gpus")) == len(profile["gpus"])
    gpus = root.findall("gpu")
    assert [g.findtext("uuid") for g in gpus] == [g["uuid"] for g in profile["gpus"]]
    assert {g.findtext("product_name") for g in gpus} == {profile["gpu_model"]["name"]}
    assert {g.findtext("fb_memory_usage/total") for g in gpus} == {f"{profile['gpu_model']['memory_total_mib']} MiB"}


EXPECTED_LINKS = {
    # 8x RTX 5090: PXB under one host bridge, NODE across bridges of a node, SYS across nodes
    "sb-5090": {"GPU0-GPU1": "PXB", "GPU0-GPU2": "NODE", "GPU0-GPU4": "SYS", "GPU3-GPU7": "SYS", "GPU4-GPU5": "PXB"},
    # 8x H100 SXM: 18 NVLinks between every pair
    "sb-h100": {"GPU0-GPU1": "NV18", "GPU0-GPU7": "NV18", "GPU3-GPU5": "NV18"},
}


def test_topology_matches_the_profile(host, hostname, profile):
    rig_only(hostname)
    out = host.check_output("nvidia-smi topo -m")
    assert "\t" in out.splitlines()[0]
    topo = parse_topo_matrix(out)
    assert topo["gpu_count"] == len(profile["gpus"])
    assert topo["warnings"] == []
    for pair, code in EXPECTED_LINKS[hostname].items():
        assert topo["links"][pair] == code, pair
    assert topo["nics"]["count"] == len(profile.get("nics", []))
    p2p = parse_p2p_matrix(host.check_output("nvidia-smi topo -p2p r"))
    if hostname == "sb-h100":
        assert set(p2p["status"].values()) == {"OK"}
    else:
        assert p2p["status"]["GPU0-GPU4"] != "OK"  # across the two NUMA nodes


def test_persistence_follows_the_daemon(host, hostname):
    rig_only(hostname)

    def modes():
        return set(host.check_output("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader").split())

    host.run("systemctl start nvidia-persistenced")
    assert modes() == {"Enabled"}
    host.run("systemctl stop nvidia-persistenced")
    assert modes() == {"Disabled"}
    host.run("systemctl start nvidia-persistenced")
    assert modes() == {"Enabled"}
