"""End state of nvidia_driver on the two rigs: one per package source."""

import xml.etree.ElementTree as ET

testinfra_hosts = ["drv-archive", "drv-cuda"]

PACKAGES = {
    "drv-archive": ["nvidia-driver-595-open"],
    "drv-cuda": ["nvidia-open", "nvidia-driver-pinning-595"],
}
KEYRING = {"drv-archive": "archive", "drv-cuda": "cuda"}


def test_driver_packages_installed_and_held(host, hostname):
    held = host.check_output("apt-mark showhold").split()
    for name in PACKAGES[hostname]:
        pkg = host.package(name)
        assert pkg.is_installed, name
        assert pkg.version.startswith("595."), (name, pkg.version)
        assert name in held


def test_other_source_not_installed(host, hostname):
    other = "nvidia-open" if hostname == "drv-archive" else "nvidia-driver-595-open"
    assert not host.package(other).is_installed


def test_repository_signed_by_its_own_keyring(host, hostname):
    keyring = f"/etc/apt/keyrings/rigops-nvidia-{KEYRING[hostname]}.asc"
    key = host.file(keyring)
    assert key.is_file and key.user == "root" and key.mode == 0o644
    assert "BEGIN PGP PUBLIC KEY BLOCK" in key.content_string
    sources = host.file("/etc/apt/sources.list.d/rigops-nvidia.sources")
    assert sources.mode == 0o644
    assert f"Signed-By: {keyring}" in sources.content_string
    assert "http://rigops-repo:8080/" in sources.content_string
    # apt trusts the repository: no unauthenticated warning on update
    out = host.run("apt-get update")
    assert out.rc == 0 and "NO_PUBKEY" not in out.stderr and "not signed" not in out.stderr


def test_nouveau_blacklisted(host):
    f = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    lines = [ln for ln in f.content_string.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["blacklist nouveau", "options nouveau modeset=0"]


def test_modules_at_boot(host):
    f = host.file("/etc/modules-load.d/nvidia.conf")
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    lines = [ln for ln in f.content_string.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["nvidia", "nvidia_uvm"]
    assert not host.file("/etc/modprobe.d/nvidia.conf").exists


def test_modules_loaded_and_nouveau_gone(host):
    loaded = [ln.split()[0] for ln in host.check_output("lsmod").splitlines()[1:]]
    assert "nvidia" in loaded and "nvidia_uvm" in loaded
    assert "nouveau" not in loaded


def test_initramfs_rebuilt_once(host):
    """Converge wrote the blacklist (one rebuild); the idempotence run none."""
    log = host.file("/var/log/nvidia-sim/initramfs.log")
    assert log.exists
    assert len([ln for ln in log.content_string.splitlines() if ln.strip()]) == 1


def test_persistence_daemon(host):
    svc = host.service("nvidia-persistenced")
    assert svc.is_running
    assert svc.is_enabled


def test_nvidia_smi_reports_profile_and_persistence(host, profile):
    root = ET.fromstring(host.check_output("nvidia-smi -q -x"))
    assert root.findtext("driver_version").startswith("595.")
    gpus = root.findall("gpu")
    assert len(gpus) == len(profile["gpus"])
    assert {g.findtext("persistence_mode") for g in gpus} == {"Enabled"}
    assert {g.findtext("product_name") for g in gpus} == {profile["gpu_model"]["name"]}
