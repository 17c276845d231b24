"""What the nvidia_driver role reads from a host in one call (plugins/module_utils/nvidia_driver_probe.py),
tested on real captures (tests/fixtures/nvidia-driver/real, SOURCES.md there)."""

from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils.dpkg import names_regex, parse_dpkg
from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_driver_probe import (
    dead_proxies,
    is_jetson,
    nvidia_pci_devices,
    parse_lsmod,
    parse_proc_version,
    parse_sb_state,
    parse_units,
    read_text,
)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-driver" / "real"
# the role's own: every package name that can be "the driver" of some branch (roles/nvidia_driver/vars/main.yml)
DRIVER_REGEX = r"^(nvidia-driver-[0-9]+(-open|-server|-server-open)?|nvidia-open|cuda-drivers)$"


def real(prefix: str) -> str:
    (path,) = REAL.glob(f"{prefix}_*.txt")
    return path.read_text()


def test_dpkg_installed_packages_and_holds():
    """dpkg-query's lines: a held package is both installed and held; a package selected for removal that dpkg
    has not removed yet is still installed."""
    text = real("d01")
    packages, holds = parse_dpkg(text, r"^(bash|sudo|apt)$")
    assert packages == {"apt": "2.6.1", "bash": "5.2.15-2+b13", "sudo": "1.9.13p3-1+deb12u4"}
    assert holds == ["bash"]
    # none of them is a driver
    assert parse_dpkg(text, DRIVER_REGEX) == ({}, ["bash"])
    # the driver's own lines (what dpkg-query prints for them) and lines that are not dpkg-query's
    driver = (
        "hold ok installed\tnvidia-driver-595-open\t595.45.04-0ubuntu1\n"
        "deinstall ok config-files\tnvidia-driver-580-open\t580.82.07-0ubuntu1\n"
        "install ok installed\tnvidia-utils-595\t595.45.04-0ubuntu1\n"
        "dpkg-query: no packages found matching x\n"
    )
    assert parse_dpkg(driver, DRIVER_REGEX) == ({"nvidia-driver-595-open": "595.45.04-0ubuntu1"},
                                                ["nvidia-driver-595-open"])  # fmt: skip


def test_jetson_by_release_file_or_device_tree_model():
    assert is_jetson(True, "")
    assert is_jetson(False, "NVIDIA Jetson AGX Orin Developer Kit\x00")
    assert not is_jetson(False, "")
    assert not is_jetson(False, "Raspberry Pi 5 Model B Rev 1.0\x00")


def test_nvidia_pci_devices_by_vendor_in_sysfs(tmp_path):
    devices = tmp_path / "bus" / "pci" / "devices"
    for address, vendor in [("0000:01:00.0", "0x10de"), ("0000:01:00.1", "0x10de"), ("0000:00:1f.0", "0x8086")]:
        (devices / address).mkdir(parents=True)
        (devices / address / "vendor").write_text(vendor + "\n")
    (devices / "0000:02:00.0").mkdir()  # no vendor file readable
    assert nvidia_pci_devices(str(tmp_path)) == ["0000:01:00.0", "0000:01:00.1"]
    assert nvidia_pci_devices(str(tmp_path / "nothing")) == []


def test_units_and_files_that_are_not_there():
    units = "vllm@chat.service   loaded active running vLLM chat\nvllm@embed.service loaded active running vLLM\n"
    assert parse_units(units) == ["vllm@chat.service", "vllm@embed.service"]
    assert parse_units("") == []
    assert read_text("/nonexistent/rigops/version") == ""
    assert parse_proc_version("") == ""
    assert parse_sb_state("") == "unknown"
    assert parse_lsmod("") == []


def output_of(prefix: str, command: str) -> str:
    """What the command printed, from a capture that may start with the shell prompt that ran it."""
    lines = real(prefix).splitlines(keepends=True)
    if command in lines[0]:
        lines = lines[1:]
    return "".join(lines)


@pytest.mark.parametrize(
    "prefix, version",
    [
        ("v01", "384.98"),  # proprietary, x86_64, with the prompt that printed it
        ("v02", "565.57.01"),  # open modules ("Open Kernel Module for x86_64")
        ("v03", "35.3.1"),  # a Jetson's (aarch64): L4T's release, never compared (the role skips Jetsons)
        ("v04", "525.60.11"),  # open, no build date
        ("v05", "535.113.01"),  # proprietary, an empty GCC line
    ],
)
def test_the_loaded_modules_version(prefix, version):
    assert parse_proc_version(real(prefix)) == version


@pytest.mark.parametrize(
    "prefix, state",
    [("m01", "enabled"), ("m02", "disabled"), ("m03", "unknown"), ("m04", "disabled")],
)
def test_secure_boot_state(prefix, state):
    """Enabled refuses unsigned modules; disabled (in setup mode too) and a machine without EFI do not."""
    assert parse_sb_state(output_of(prefix, "mokutil")) == state


def test_loaded_modules_with_and_without_lsmods_header():
    with_nvidia = parse_lsmod(output_of("l01", "lsmod"))
    assert with_nvidia[:3] == ["msr", "ccm", "cmac"] and "Module" not in with_nvidia
    assert {"nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset"} <= set(with_nvidia)
    assert "nouveau" not in with_nvidia
    nouveau = parse_lsmod(output_of("l02", "lsmod"))
    assert nouveau[:2] == ["nouveau", "ttm"] and "nvidia" not in nouveau
    # lsmod | grep: no header line
    assert parse_lsmod(real("l03"))[:5] == ["nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", "drm_kms_helper"]


def test_other_packages_are_read_by_exact_name():
    text = (
        "install ok installed\tdkms\t3.0.10-8+deb12u1\n"
        "install ok installed\tdkms-extra\t1\n"
        "deinstall ok config-files\tnvidia-driver-pinning-595\t595.45.04-1\n"
    )
    assert parse_dpkg(text, names_regex(["dkms", "nvidia-driver-pinning-595"]))[0] == {"dkms": "3.0.10-8+deb12u1"}
    assert parse_dpkg(text, names_regex([]))[0] == {}
    assert parse_dpkg("install ok installed\tg++\t12\n", names_regex(["g++"]))[0] == {"g++": "12"}


def test_dead_local_proxies_are_named(tmp_path):
    import socket  # noqa: PLC0415

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = f"127.0.0.1:{listening.getsockname()[1]}"
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            dead = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused

        def connect(address):
            socket.create_connection(address, timeout=2).close()

        assert dead_proxies([alive, dead, "[::1]:notaport"], connect) == [dead, "[::1]:notaport"]
