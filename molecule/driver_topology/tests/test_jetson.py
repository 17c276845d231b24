"""A Jetson keeps the driver that comes with L4T: the role changes nothing there."""

testinfra_hosts = ["drv-thor"]


def test_no_desktop_driver_installed(host):
    out = host.check_output("dpkg-query -W -f '${Package}\\n' 'nvidia-driver-*' 'nvidia-open' 2>/dev/null || true")
    assert out.strip() == ""


def test_no_driver_configuration_written(host):
    for path in (
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/modules-load.d/nvidia.conf",
        "/etc/apt/sources.list.d/rigops-nvidia.sources",
    ):
        assert not host.file(path).exists, path


def test_still_a_jetson(host):
    assert host.file("/etc/nv_tegra_release").contains("R38")
