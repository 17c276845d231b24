"""A Jetson keeps the driver that comes with L4T: the role changes nothing there."""

from rigops_testinfra import installed_packages

testinfra_hosts = ["drv-thor"]


def test_no_desktop_driver_installed(host):
    assert installed_packages(host, "nvidia-driver-*", "nvidia-open") == []


def test_no_driver_configuration_written(host):
    for path in (
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/modules-load.d/nvidia.conf",
        "/etc/apt/sources.list.d/rigops-nvidia.sources",
    ):
        assert not host.file(path).exists, path


def test_still_a_jetson(host):
    assert host.file("/etc/nv_tegra_release").contains("R38")
