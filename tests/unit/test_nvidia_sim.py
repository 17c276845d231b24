"""The simulated NVIDIA stack: hardware stand-ins, nvidia-smi emulator, persistence daemon.

Everything runs against a scratch root (NVIDIA_SIM_ROOT), never the host's /.
The emulator's layouts are checked against the shapes of real captures.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "lab" / "sandbox"
HW = SANDBOX / "hardware"
SMI = SANDBOX / "driver_repo" / "nvidia-smi"
PERSISTENCED = SANDBOX / "driver_repo" / "nvidia-persistenced"
PROFILES = SANDBOX / "profiles"
KREL = "6.1.0-nvsim-test"

sys.path.insert(0, str(HW / "lib"))


class Host:
    """One simulated machine in a scratch root."""

    def __init__(self, root: Path, profile: str | dict):
        self.root = root
        self.env = dict(os.environ, NVIDIA_SIM_ROOT=str(root), NVIDIA_SIM_KERNEL_RELEASE=KREL, HOME=str(root / "root"))
        self.env.pop("NVIDIA_SIM_DRIVER_VERSION", None)
        (root / "etc/nvidia-sim").mkdir(parents=True)
        (root / "root").mkdir()
        data = profile if isinstance(profile, dict) else yaml.safe_load((PROFILES / f"{profile}.yaml").read_text())
        (root / "etc/nvidia-sim/profile.yaml").write_text(yaml.safe_dump(data))
        self.profile = data

    def run(self, exe: Path | str, *args: str, euid: int | None = None, **env: str) -> subprocess.CompletedProcess:
        e = dict(self.env, **env)
        if euid is not None:
            e["NVIDIA_SIM_FAKE_EUID"] = str(euid)
        return subprocess.run(
            [sys.executable, str(exe), *args], env=e, capture_output=True, text=True, timeout=60, check=False
        )

    def tool(self, name: str, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(HW / "bin" / name, *args, **kw)

    def smi(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(SMI, *args, **kw)

    def install_hardware(self, *args: str) -> subprocess.CompletedProcess:
        return self.run(HW / "install-hardware", *args)

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def install_driver(self, version: str = "595.45.04", flavour: str = "open") -> None:
        """What the stand-in nvidia-dkms postinst leaves behind."""
        code = f"from nvsim import kmod; kmod.install_driver_modules({version!r}, {flavour!r})"
        subprocess.run([sys.executable, "-c", code], env=dict(self.env, PYTHONPATH=str(HW / "lib")), check=True)

    def configure_driver(self) -> None:
        """The driver role's files: nouveau blacklist + modules at boot."""
        self.path("/etc/modprobe.d").mkdir(parents=True, exist_ok=True)
        self.path("/etc/modprobe.d/blacklist-nouveau.conf").write_text("blacklist nouveau\noptions nouveau modeset=0\n")
        self.path("/etc/modules-load.d").mkdir(parents=True, exist_ok=True)
        self.path("/etc/modules-load.d/nvidia.conf").write_text("nvidia\nnvidia_uvm\n")

    def reboot(self) -> None:
        shutil.rmtree(self.path("/run"), ignore_errors=True)
        assert self.tool("nvidia-sim-boot", "--no-services").returncode == 0

    def ready(self) -> Host:
        """Hardware + driver installed, nouveau blacklisted, initramfs rebuilt, rebooted."""
        self.install_driver()
        self.configure_driver()
        assert self.tool("update-initramfs", "-u").returncode == 0
        self.reboot()
        return self


@pytest.fixture
def host(tmp_path):
    hosts = []

    def make(profile: str | dict, ready: bool = False) -> Host:
        h = Host(tmp_path / f"root{len(hosts)}", profile)
        r = h.install_hardware()
        assert r.returncode == 0, r.stderr
        hosts.append(h)
        return h.ready() if ready else h

    yield make
    for h in hosts:  # stop any daemon a test left running
        pidfile = h.path("/run/nvidia-persistenced/nvidia-persistenced.pid")
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


EXPECTED = {  # profile: (GPUs nvidia-smi reports, memory.total, NICs)
    "rtx5090x8": (8, "32607 MiB", 0),
    "rtx5090x8-p2p": (8, "32607 MiB", 0),
    "h100x8": (8, "81559 MiB", 4),
    "rtx5090x2": (2, "32607 MiB", 0),
    "broken": (7, "32607 MiB", 0),
}


# ---------------------------------------------------------------- install-hardware
def _tree(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes().hex()[:64] + oct(p.stat().st_mode)
    return out


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES.glob("*.yaml")))
def test_install_hardware_is_idempotent(host, profile):
    h = host(profile)
    before = _tree(h.root / "etc")
    again = h.install_hardware()
    assert again.returncode == 0
    assert again.stdout.strip() == "install-hardware: unchanged"
    assert _tree(h.root / "etc") == before
    assert h.path("/etc/systemd/system/sysinit.target.wants/nvidia-sim-boot.service").is_symlink()
    assert os.readlink(h.path("/usr/sbin/modprobe")) == str(HW / "bin" / "modprobe")


def test_install_hardware_needs_a_profile(tmp_path):
    env = dict(os.environ, NVIDIA_SIM_ROOT=str(tmp_path))
    r = subprocess.run(
        [sys.executable, str(HW / "install-hardware")], env=env, capture_output=True, text=True, check=False
    )
    assert r.returncode == 1
    assert "no hardware profile" in r.stderr


def test_sysfs_iommu_groups_follow_acs(host):
    good = host("rtx5090x8")
    grp = good.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:05:00.0/iommu_group")
    assert grp.is_symlink()
    # GPUs behind one host bridge without ACS redirect share a group
    assert os.path.realpath(grp) == os.path.realpath(
        good.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:08:00.0/iommu_group")
    )
    assert good.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:05:00.0/vendor").read_text() == "0x10de\n"
    assert good.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:85:00.0/numa_node").read_text() == "1\n"
    bad = host("broken")
    g5 = os.path.realpath(bad.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:05:00.0/iommu_group"))
    g8 = os.path.realpath(bad.path("/etc/nvidia-sim/sys/bus/pci/devices/0000:08:00.0/iommu_group"))
    assert g5 != g8
    members = sorted(os.listdir(os.path.join(g5, "devices")))
    assert members == ["0000:05:00.0", "0000:05:00.1"]  # the GPU and its audio function


def test_profile_files(host):
    bad = host("broken")
    assert "NCCL_P2P_DISABLE=1" in bad.path("/etc/environment").read_text().splitlines()
    thor = host("jetson-thor")
    assert thor.path("/etc/nv_tegra_release").read_text().startswith("# R38 (release), REVISION: 2.0,")
    assert thor.path("/etc/nvidia-sim/proc/device-tree/model").read_bytes() == b"NVIDIA Jetson AGX Thor Developer Kit\0"
    assert not thor.path("/usr/bin/nvidia-smi").exists()  # JetPack 7.0: no nvidia-smi
    assert not host("rtx5090x2").path("/etc/nvidia-sim/proc/device-tree/model").exists()


# ---------------------------------------------------------------- modules and boot
def test_fresh_rig_boots_with_nouveau_and_smi_fails(host):
    h = host("rtx5090x8")
    assert "nouveau" in h.tool("lsmod").stdout
    r = h.smi()
    assert r.returncode == 9
    assert r.stdout.strip() == (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    h.install_driver()
    r = h.tool("modprobe", "nvidia")
    assert r.returncode == 1 and "could not insert 'nvidia': No such device" in r.stderr
    assert h.smi("-L").returncode == 9  # nouveau still holds the GPUs


def test_blacklist_needs_initramfs_rebuild_and_reboot(host):
    h = host("rtx5090x8")
    h.install_driver()
    h.configure_driver()
    h.reboot()  # blacklist only on the root fs: the old initramfs still loads nouveau
    assert "nouveau" in h.tool("lsmod").stdout
    assert h.tool("update-initramfs", "-u", "-k", "all").returncode == 0
    log = h.path("/var/log/nvidia-sim/initramfs.log").read_text().splitlines()
    assert len(log) == 1 and "update-initramfs -u -k all" in log[0]
    h.reboot()
    mods = h.tool("lsmod").stdout
    assert "nouveau" not in mods
    assert "nvidia_uvm" in mods and "nvidia " in mods
    assert h.path("/run/nvidia-sim/sys/module/nvidia/version").read_text() == "595.45.04\n"
    assert h.path("/etc/nvidia-sim/sys/module/nvidia/version").read_text() == "595.45.04\n"
    proc = h.path("/etc/nvidia-sim/proc/driver/nvidia/version").read_text()
    assert proc.startswith("NVRM version: NVIDIA UNIX Open Kernel Module for ")
    assert "  595.45.04  Release Build  " in proc


def test_smi_autoloads_the_module_like_nvidia_modprobe(host):
    h = host("rtx5090x2")
    h.install_driver()
    h.configure_driver()
    h.tool("update-initramfs", "-u")
    h.path("/etc/modules-load.d/nvidia.conf").unlink()
    h.path("/etc/modprobe.d/no-nvidia.conf").write_text("blacklist nvidia\n")  # no modalias load either
    h.reboot()
    assert "nvidia" not in h.tool("lsmod").stdout
    assert h.smi("-L").returncode == 0
    assert h.tool("lsmod").stdout.splitlines()[1].startswith("nvidia ")


def test_modprobe_rmmod_modinfo(host):
    h = host("rtx5090x8", ready=True)
    r = h.tool("rmmod", "nvidia")
    assert r.returncode == 1 and "Module nvidia is in use by: nvidia_uvm" in r.stderr
    assert h.tool("modprobe", "-r", "nvidia_uvm").returncode == 0
    assert "nvidia" not in h.tool("lsmod").stdout
    assert not h.path("/run/nvidia-sim/proc/driver/nvidia/version").exists()
    assert h.tool("modinfo", "-F", "version", "nvidia").stdout == "595.45.04\n"
    r = h.tool("modinfo", "bogus")
    assert r.returncode == 1 and "Module bogus not found" in r.stderr
    r = h.tool("modprobe", "bogus")
    assert r.returncode == 1 and "FATAL: Module bogus not found in directory /lib/modules/" + KREL in r.stderr
    assert h.tool("modprobe", "nvidia_drm").returncode == 0
    assert {"nvidia", "nvidia_modeset", "nvidia_drm"} <= set(h.tool("lsmod").stdout.split())


def test_no_gpu_and_secure_boot(host):
    h = host("nogpu")
    h.install_driver()
    r = h.tool("modprobe", "nvidia")
    assert r.returncode == 1 and "No such device" in r.stderr
    assert h.smi().returncode == 9
    assert h.tool("lspci", "-d", "10de:").stdout == ""
    assert h.tool("mokutil", "--sb-state").stdout == "SecureBoot disabled\n"
    data = yaml.safe_load((PROFILES / "rtx5090x2.yaml").read_text())
    data["system"]["secure_boot"] = True
    sb = host(data)
    sb.install_driver()
    sb.configure_driver()
    sb.tool("update-initramfs", "-u")
    sb.reboot()
    assert sb.tool("mokutil", "--sb-state").stdout == "SecureBoot enabled\n"
    r = sb.tool("modprobe", "nvidia")
    assert r.returncode == 1 and "Key was rejected by service" in r.stderr


# ---------------------------------------------------------------- nvidia-smi output
@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_query_xml(host, profile):
    n, mem, _ = EXPECTED[profile]
    h = host(profile, ready=True)
    r = h.smi("-q", "-x")
    assert r.returncode == 0, r.stdout
    assert r.stdout.startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n')
    log = ET.fromstring(r.stdout.split("\n", 2)[2])
    assert log.tag == "nvidia_smi_log"
    assert log.findtext("driver_version") == "595.45.04"
    assert log.findtext("cuda_version") == "13.2"
    assert log.findtext("attached_gpus") == str(n)
    gpus = log.findall("gpu")
    assert len(gpus) == n
    for g in gpus:
        assert g.get("id") == g.findtext("pci/pci_bus_id")
        assert g.get("id").startswith("00000000:")
        assert g.findtext("fb_memory_usage/total") == mem
        assert g.findtext("persistence_mode") == "Disabled"
        assert g.findtext("uuid").startswith("GPU-")
        assert g.findtext("product_architecture") in ("Blackwell", "Hopper")
    assert len({g.findtext("uuid") for g in gpus}) == n


def test_query_text_and_list(host):
    h = host("h100x8", ready=True)
    q = h.smi("-q", "-i", "0").stdout
    assert "==============NVSMI LOG==============" in q
    assert "\nAttached GPUs                             : 8\n" in q
    assert "\n    Product Name                          : NVIDIA H100 80GB HBM3\n" in q
    assert "\n        Bus Id                            : 00000000:13:00.0\n" in q
    assert "\n        Bus                               : 0x13\n" in q
    assert q.count("\nGPU 0000") == 1
    lines = h.smi("-L").stdout.splitlines()
    assert len(lines) == 8
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    summary = h.smi().stdout
    assert "| NVIDIA-SMI 595.45.04              Driver Version: 595.45.04      CUDA Version: 13.2     |" in summary
    assert all(len(line) == 91 for line in summary.splitlines()[1:] if line.startswith(("|", "+")))


def test_query_gpu_csv(host):
    h = host("rtx5090x8", ready=True)
    fields = "index,uuid,name,memory.total,driver_version,compute_cap,persistence_mode,pci.bus_id"
    fields += ",memory.used,utilization.gpu"
    r = h.smi(f"--query-gpu={fields}", "--format=csv")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0] == (
        "index, uuid, name, memory.total [MiB], driver_version, compute_cap, persistence_mode, "
        "pci.bus_id, memory.used [MiB], utilization.gpu [%]"
    )
    assert len(lines) == 9
    row = lines[1].split(", ")
    assert row[0] == "0" and row[2] == "NVIDIA GeForce RTX 5090" and row[3] == "32607 MiB"
    assert row[4:8] == ["595.45.04", "12.0", "Disabled", "00000000:05:00.0"]
    assert row[9] == "0 %"
    r = h.smi("--query-gpu=index,memory.total,compute_cap", "--format=csv,noheader,nounits")
    assert r.stdout.splitlines()[:2] == ["0, 32607, 12.0", "1, 32607, 12.0"]
    r = h.smi("--query-gpu=memory.used", "--format=csv,noheader", "-i", "3")
    assert r.stdout == "2 MiB\n"
    h.path("/run/nvidia-sim/usage.yaml").write_text("'3': {memory_used_mib: 27000, utilization_gpu: 97}\n")
    r = h.smi("--query-gpu=memory.used,utilization.gpu", "--format=csv,nounits", "-i", "3")
    assert r.stdout == "memory.used [MiB], utilization.gpu [%]\n27000, 97\n"


def _topo(text: str):
    lines = text.split("\n")
    header = lines[0].split("\t")
    rows = []
    for line in lines[1:]:
        if not line:
            break
        rows.append(line.split("\t"))
    return header, rows, text


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_topo_matrix_layout(host, profile):
    n, _, nics = EXPECTED[profile]
    h = host(profile, ready=True)
    r = h.smi("topo", "-m")
    assert r.returncode == 0
    header, rows, text = _topo(r.stdout)
    cols = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(nics)]
    assert header == ["", *cols, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert len(rows) == n + nics
    for i, row in enumerate(rows[:n]):
        assert row[0] == f"GPU{i}"
        assert row[1 + i] == " X "
        assert len(row) == len(header) + 1  # NUMA Affinity is followed by an empty cell, as printed
        assert row[-2] == "" and row[-1] == "N/A"
    for i, row in enumerate(rows[n:]):
        assert row[0] == f"NIC{i}" and row[1 + n + i] == " X "
        assert row[-4:] == ["", "", "", ""]
    assert "\nLegend:\n\n  X    = Self\n" in text
    assert "  NV#  = Connection traversing a bonded set of # NVLinks\n" in text
    assert ("\nNIC Legend:\n\n  NIC0: mlx5_0\n" in text) == bool(nics)


def test_topo_link_codes(host):
    h = host("rtx5090x8", ready=True)
    _, rows, _ = _topo(h.smi("topo", "-m").stdout)
    assert rows[0][1:9] == [" X ", "PXB", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert rows[0][9:11] == ["0-31,64-95", "0"]
    assert rows[5][9:11] == ["32-63,96-127", "1"]
    h100 = host("h100x8", ready=True)
    _, rows, text = _topo(h100.smi("topo", "-m").stdout)
    assert all(c == "NV18" for r in rows[:8] for j, c in enumerate(r[1:9]) if j != rows.index(r))
    assert rows[0][9:13] == ["PIX", "NODE", "SYS", "SYS"]  # GPU0 shares a switch with NIC0
    assert rows[8][1:9] == ["PIX", "PIX", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert "  NIC3: mlx5_3\n" in text
    _, rows, _ = _topo(h100.smi("topo", "-mp").stdout)
    assert rows[0][2] == "PIX"  # PCIe path only
    two = host("rtx5090x2", ready=True)
    _, rows, _ = _topo(two.smi("topo", "-m").stdout)
    assert rows[0][1:3] == [" X ", "PHB"]


def _p2p(text: str) -> list[list[str]]:
    lines = text.split("\n")
    assert lines[0].startswith(" \tGPU0\t") and lines[0].endswith("\t")
    out = []
    for line in lines[1:]:
        if not line:
            break
        assert line.startswith(" GPU") and line.endswith("\t")
        out.append(line.strip().split("\t"))
    assert "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n  CNS  = Chipset not supported\n" in text
    return out


def test_topo_p2p(host):
    h = host("rtx5090x8", ready=True)
    r = _p2p(h.smi("topo", "-p2p", "r").stdout)
    # the stock driver on GeForce cards: GNS on every pair (real captures p01, p02, t02)
    assert r[0] == ["GPU0", "X"] + ["GNS"] * 7
    p2p_driver = host("rtx5090x8-p2p", ready=True)
    assert _p2p(p2p_driver.smi("topo", "-p2p", "r").stdout)[0] == (
        ["GPU0", "X", "OK", "OK", "OK", "CNS", "CNS", "CNS", "CNS"]
    )
    assert _p2p(h.smi("topo", "-p2p", "n").stdout)[0][2] == "NS"
    h100 = host("h100x8", ready=True)
    for cap in "rwna":
        assert {c for row in _p2p(h100.smi("topo", "-p2p", cap).stdout) for c in row[1:]} == {"X", "OK"}
    bad = host("broken", ready=True)
    rows = _p2p(bad.smi("topo", "-p2p", "w").stdout)
    assert len(rows) == 7 and rows[0][2] == "CNS"
    r = h.smi("topo", "-p2p")
    assert r.returncode == 2 and r.stdout == 'Option "-p2p" is missing its value.\n'
    assert h.smi("topo", "-p2p", "x").returncode == 2


def test_errors_and_exit_codes(host):
    h = host("rtx5090x2", ready=True)
    r = h.smi("--bogus")
    assert r.returncode == 2 and r.stdout == "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'.\n"
    r = h.smi("--query-gpu=name")
    assert r.returncode == 2 and "Invalid combination of input arguments" in r.stdout
    r = h.smi("--query-gpu=nope", "--format=csv")
    assert r.returncode == 2 and 'Field "nope" is not a valid field to query.' in r.stdout
    r = h.smi("-i", "5", "-L")
    assert r.returncode == 6 and r.stdout == "No devices were found\n"
    assert h.smi("-i", "GPU-" + "0" * 8, "-L").returncode == 6
    uuid = h.smi("--query-gpu=uuid", "--format=csv,noheader", "-i", "1").stdout.strip()
    assert h.smi("-i", uuid, "-L").stdout.startswith("GPU 1: ")
    # library from a newer package than the loaded module: needs a reboot
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from nvsim import smi; "
        "sys.exit(smi.main(['-L'], {'driver_version': '590.48.01'}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(HW / "lib")], env=h.env, capture_output=True, text=True, check=False
    )
    assert r.returncode == 18
    assert r.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48\n"


# ---------------------------------------------------------------- persistence
def _pm(h: Host) -> list[str]:
    return h.smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout.split()


def test_legacy_persistence_mode(host):
    h = host("rtx5090x2", ready=True)
    r = h.smi("-pm", "1", euid=1000)
    assert r.returncode == 4
    assert r.stdout == (
        "Unable to set persistence mode for GPU 00000000:01:00.0: Insufficient Permissions\n"
        "Terminating early due to previous errors.\n"
    )
    assert _pm(h) == ["Disabled", "Disabled"]
    r = h.smi("-pm", "1")
    assert r.returncode == 0
    assert r.stdout == (
        "Enabled Legacy persistence mode for GPU 00000000:01:00.0.\n"
        "Enabled Legacy persistence mode for GPU 00000000:02:00.0.\nAll done.\n"
    )
    assert _pm(h) == ["Enabled", "Enabled"]
    assert "<persistence_mode>Enabled</persistence_mode>" in h.smi("-q", "-x").stdout
    assert (
        h.smi("-i", "1", "-pm", "0").stdout == "Disabled Legacy persistence mode for GPU 00000000:02:00.0.\nAll done.\n"
    )
    assert _pm(h) == ["Enabled", "Disabled"]
    h.reboot()  # legacy persistence does not survive a reboot
    assert _pm(h) == ["Disabled", "Disabled"]
    assert h.smi("-pm", "2").returncode == 2


def _wait(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_persistenced_daemon(host):
    h = host("rtx5090x8", ready=True)
    r = h.run(PERSISTENCED, "--user", "nvidia-persistenced", "--verbose")
    assert r.returncode == 0, r.stderr
    pid = int(h.path("/run/nvidia-persistenced/nvidia-persistenced.pid").read_text())
    assert set(_pm(h)) == {"Enabled"}
    assert h.run(PERSISTENCED).returncode == 1  # one instance only
    r = h.tool("rmmod", "nvidia_uvm")
    assert r.returncode == 0
    r = h.tool("rmmod", "nvidia")
    assert r.returncode == 1 and "Module nvidia is in use" in r.stderr
    assert h.smi("-i", "2", "-pm", "0").stdout == "Disabled persistence mode for GPU 00000000:25:00.0.\nAll done.\n"
    assert _pm(h)[2] == "Disabled"
    assert h.smi("-i", "0", "-pm", "1").stdout.startswith("Persistence mode is already Enabled for GPU")
    os.kill(pid, signal.SIGTERM)
    assert _wait(lambda: not h.path("/run/nvidia-persistenced/nvidia-persistenced.pid").exists())
    assert set(_pm(h)) == {"Disabled"}


def test_persistenced_no_persistence_mode_and_foreground(host):
    h = host("rtx5090x2", ready=True)
    proc = subprocess.Popen(
        [sys.executable, str(PERSISTENCED), "--no-persistence-mode", "-f"],
        env=h.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait(lambda: h.path("/run/nvidia-sim/persistenced.json").exists())
        assert _pm(h) == ["Disabled", "Disabled"]  # Ubuntu's unit runs it like this
        assert h.smi("-pm", "1").stdout.startswith("Enabled persistence mode for GPU 00000000:01:00.0.\n")
        assert _pm(h) == ["Enabled", "Enabled"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert _pm(h) == ["Disabled", "Disabled"]


def test_persistenced_fails_without_driver(host):
    h = host("rtx5090x8")  # nouveau loaded, no driver
    r = h.run(PERSISTENCED)
    assert r.returncode == 1
    assert "nvidia-persistenced failed to initialize. Check syslog for more details." in r.stderr


# ---------------------------------------------------------------- lspci
def test_lspci(host):
    h = host("broken", ready=True)
    lines = h.tool("lspci", "-d", "10de:").stdout.splitlines()
    assert len(lines) == 16  # 8 GPUs (one invisible to nvidia-smi) + their audio functions
    assert lines[0] == "05:00.0 VGA compatible controller: NVIDIA Corporation GB202 [GeForce RTX 5090] (rev a1)"
    nn = h.tool("lspci", "-nn", "-s", "88:00.0").stdout
    assert nn == (
        "88:00.0 VGA compatible controller [0300]: NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85] (rev a1)\n"
    )
    vvv = h.tool("lspci", "-vvv").stdout
    acs = [ln.strip() for ln in vvv.splitlines() if "ACSCtl:" in ln]
    assert acs and all("ReqRedir+" in a and "CmpltRedir+" in a for a in acs)
    assert "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" in vvv
    assert "\tKernel driver in use: nvidia\n" in vvv
    assert "Capabilities: <access denied>" in h.tool("lspci", "-vvv", euid=1000).stdout
    good = host("rtx5090x8")
    vvv = good.tool("lspci", "-vvv", "-s", "0000:00:01.1").stdout
    assert "ReqRedir-" in vvv and "IOMMU group:" in vvv and "NUMA node: 0" in vvv
    assert "\tKernel driver in use: nouveau\n" in good.tool("lspci", "-k", "-s", "05:00.0").stdout


# ---------------------------------------------------------------- Jetson
def test_jetson_tools(host):
    h = host("jetson-thor")
    assert h.tool("nvpmodel", "-q").stdout == "NV Power Mode: MAXN\n0\n"
    assert h.tool("nvpmodel", "-m", "1", euid=1000).returncode == 1
    assert h.tool("nvpmodel", "-m", "1").returncode == 0  # MAXN -> 120W: same GPU partitions, live
    assert h.tool("nvpmodel", "-q").stdout == "NV Power Mode: 120W\n1\n"
    assert h.tool("nvpmodel", "-m", "9").returncode == 1
    show = h.tool("jetson_clocks", "--show").stdout
    assert show.startswith("SOC family:tegra264  Machine:NVIDIA Jetson AGX Thor Developer Kit\n")
    assert "NV Power Mode: 120W" in show and "MinFreq=972000 " in show
    assert h.tool("jetson_clocks", "--store").returncode == 0
    assert h.tool("jetson_clocks").returncode == 0
    assert "MinFreq=2601000 " in h.tool("jetson_clocks", "--show").stdout
    assert h.tool("jetson_clocks", "--restore").returncode == 0
    assert "MinFreq=972000 " in h.tool("jetson_clocks", "--show").stdout
    assert {"nvidia", "nvidia_modeset", "nvidia_drm"} <= set(h.tool("lsmod").stdout.split())
    assert "nouveau" not in h.tool("lsmod").stdout
    assert h.tool("lspci", "-d", "10de:").stdout.startswith("0001:00:00.0 PCI bridge: NVIDIA Corporation")
    assert h.tool("nvpmodel", "-q").returncode == 0
    assert host("rtx5090x2").tool("nvpmodel", "-q").returncode == 1


def _with_stdin(h, args, text, **env):
    e = dict(h.env, **env)
    return subprocess.run(
        [sys.executable, str(HW / "bin" / "nvpmodel"), *args],
        env=e, input=text, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_nvpmodel_asks_for_a_reboot_like_the_real_one(host):
    """MAXN -> 90W on a Thor power-gates GPU partitions: the prompt, refused unless YES (tests/fixtures/jetson)."""
    h = host("jetson-thor")
    real = (ROOT / "tests/fixtures/jetson/nvpmodel/m-thor-90w-declined.txt").read_text().splitlines()
    declined = _with_stdin(h, ["-m", "2"], "no\n")
    assert declined.returncode == 1
    assert (declined.stdout + declined.stderr).splitlines() == real
    assert _with_stdin(h, ["-m", "2"], "").returncode == 1  # no answer at all: refused as well
    assert h.tool("nvpmodel", "-q").stdout == "NV Power Mode: MAXN\n0\n"
    assert not h.path("/var/lib/nvpmodel/status").exists()
    yes = _with_stdin(h, ["-m", "2"], "YES\n")
    assert yes.returncode == 0 and "NVPM WARN: rebooting" in yes.stdout
    assert h.path("/var/lib/nvpmodel/status").read_text() == "pmode:0002 fmode:quiet\n"
    assert h.tool("nvpmodel", "-q").stdout == "NV Power Mode: MAXN\n0\n"  # until the board boots
    h.reboot()
    assert h.tool("nvpmodel", "-q").stdout == "NV Power Mode: 90W\n2\n"


def test_nvpmodel_query_as_a_normal_user_adds_errors(host):
    h = host("jetson-orin")
    r = h.tool("nvpmodel", "-q", euid=1000)
    assert r.returncode == 0 and r.stdout == "NV Power Mode: MODE_30W\n2\n"
    assert r.stderr.startswith("NVPM ERROR: Error opening /sys/kernel/nvpmodel_emc_cap/emc_iso_cap: 13\n")


def test_orin_profile(host):
    h = host("jetson-orin")
    assert h.path("/etc/nv_tegra_release").read_text().startswith("# R36 (release), REVISION: 4.0, GCID: 37537400,")
    assert h.path("/etc/nvidia-sim/proc/device-tree/model").read_bytes() == b"NVIDIA Jetson AGX Orin Developer Kit\0"
    compatible = h.path("/etc/nvidia-sim/proc/device-tree/compatible").read_bytes()
    assert compatible == b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0"
    assert "nvgpu" in h.tool("lsmod").stdout.split()
    assert not h.path("/usr/bin/nvidia-smi").exists()
    assert h.tool("nvpmodel", "-m", "1").returncode == 0  # 30W -> 15W: live
    assert _with_stdin(h, ["-m", "0"], "no\n").returncode == 1  # 15W -> MAXN: needs a boot


@pytest.mark.parametrize("profile, ram, swap", [("jetson-orin", 62801, True), ("jetson-thor", 125772, False)])
def test_tegrastats_prints_the_boards_layout_until_stopped(host, profile, ram, swap):
    from ansible_collections.rigops.fleet.plugins.module_utils import jetson_platform  # noqa: PLC0415 (tests/conftest.py adds module_utils)

    h = host(profile)
    proc = subprocess.Popen(
        [sys.executable, str(HW / "bin" / "tegrastats"), "--interval", "200"],
        env=h.env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    for line in lines:
        sample = jetson_platform.parse_tegrastats(line)
        assert sample["ram_total_mb"] == ram and 0 < sample["ram_used_mb"] <= ram
        assert (sample["swap_total_mb"] is not None) is swap
        assert sample["temperatures_c"]["gpu"] > 30 and sample["input_power_mw"] > 0
    assert host("rtx5090x2").tool("tegrastats").returncode == 1


def _tegrastats_line(h) -> str:
    proc = subprocess.Popen(
        [sys.executable, str(HW / "bin" / "tegrastats"), "--interval", "200"],
        env=h.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        return proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_orin_thermal_zones_agree_with_the_real_board_and_a_thermal_fault_throttles_it(host):
    from ansible_collections.rigops.fleet.plugins.module_utils import board_thermal, jetson_platform  # noqa: PLC0415

    h = host("jetson-orin")
    zones = board_thermal.read_zones(str(h.path("/etc/nvidia-sim/sys")))
    real = (ROOT / "tests/fixtures/jetson/thermal/agx-orin-jp6-zones.txt").read_text()
    assert [z["type"] for z in zones] == [line.split("type=")[1].split()[0] for line in real.splitlines()]
    limits = board_thermal.limits(zones)
    # NVIDIA's Tegra234 trips (tests/fixtures/jetson/thermal/): throttle 99 C, board sensors off at 107 C;
    # cpu-thermal's 70 C trip drives only hot-surface-alert
    assert {s: (v["limit_c"], v["kind"]) for s, v in limits.items() if s in ("cpu", "gpu", "tj", "tboard")} == {
        "cpu": (99.0, "throttle"), "gpu": (99.0, "throttle"), "tj": (99.0, "throttle"), "tboard": (107.0, "shutdown")
    }  # fmt: skip
    idle = jetson_platform.parse_tegrastats(_tegrastats_line(h))
    assert board_thermal.evaluate(idle, None, limits, 5)["healthy"]
    assert h.tool("nvidia-sim-fault", "set", "0", "thermal", "--value", "101").returncode == 0
    hot = jetson_platform.parse_tegrastats(_tegrastats_line(h))
    assert hot["temperatures_c"]["gpu"] == 101.0 and hot["temperatures_c"]["tj"] == 101.0
    result = board_thermal.evaluate(hot, None, limits, 5)
    assert not result["healthy"]
    assert {f["sensor"] for f in result["gpus"][0]["findings"]} == {"gpu", "tj"}
    assert h.tool("nvidia-sim-fault", "clear").returncode == 0
    assert jetson_platform.parse_tegrastats(_tegrastats_line(h))["temperatures_c"]["gpu"] == 41.5
    thor = host("jetson-thor")
    assert sorted(board_thermal.limits(board_thermal.read_zones(str(thor.path("/etc/nvidia-sim/sys"))))) == [
        "cpu", "gpu", "tj"
    ]  # fmt: skip


def test_nvlink_status_errors_and_faults_as_the_sentinel_reads_them(host):
    from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health  # noqa: PLC0415
    from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health_sentinel as sentinel  # noqa: PLC0415

    h = host("h100x8", ready=True)

    def run(argv, timeout=30):
        r = h.smi(*argv[1:])
        return r.returncode, r.stdout, r.stderr

    status = h.smi("nvlink", "-s", "-i", "0").stdout.splitlines()
    assert status[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert status[1:] == [f"\t Link {n}: 26.562 GB/s" for n in range(18)]  # as the real H100 (n02)
    errors = h.smi("nvlink", "-e", "-i", "0").stdout.splitlines()
    assert errors[1:5] == [
        "\t Link 0: Replay Errors: 0",
        "\t Link 0: Recovery Errors: 0",
        "\t Link 0: CRC Errors: 0",
        "",
    ]
    gpus = gpu_health.read_smi_xml(h.smi("-q", "-x").stdout)
    config = {"nvidia_smi": ["nvidia-smi"]}
    found, kept, problems = sentinel.nvlink_round(config, gpus, {}, run)
    assert problems == [] and all(f == [] for f in found.values()) and len(found) == 8
    assert {v["expected"] for v in kept.values()} == {18}
    bus = gpus[2]["bus_id"]
    assert _fault(h, "set", "2", "nvlink_down", "--value", "5").returncode == 0
    assert _fault(h, "set", "2", "nvlink_errors", "--value", "3").returncode == 0
    found, kept, problems = sentinel.nvlink_round(config, gpus, kept, run)
    assert [(f["severity"], f["detail"]) for f in found[bus]] == [
        ("critical", "NVLink down: 17 of 18 link(s) up (inactive: 5)"),
        ("warning", "NVLink crc errors grew since the last round: link 0 +30"),
        ("critical", "NVLink recovery errors grew since the last round: link 0 +3"),
        ("critical", "NVLink replay errors grew since the last round: link 0 +3"),
    ]
    assert all(f == [] for b, f in found.items() if b != bus)
    # the counters stay where they are: no new finding for them, the link is still down
    found, kept, _ = sentinel.nvlink_round(config, gpus, kept, run)
    assert [f["detail"] for f in found[bus]] == ["NVLink down: 17 of 18 link(s) up (inactive: 5)"]
    assert _fault(h, "clear", "2").returncode == 0  # a GPU reset: links back, counters at 0
    found, kept, _ = sentinel.nvlink_round(config, gpus, kept, run)
    assert found[bus] == []
    assert _fault(h, "set", "2", "nvlink_down", "--value", "18").stderr.endswith("has NVLinks 0 to 17, not 18\n")
    rtx = host("rtx5090x2", ready=True)
    assert rtx.tool("nvidia-sim-fault", "set", "0", "nvlink_errors").returncode == 2
    rtx_gpus = gpu_health.read_smi_xml(rtx.smi("-q", "-x").stdout)
    assert sentinel.nvlink_round(config, rtx_gpus, {}, lambda argv, timeout=30: (0, rtx.smi(*argv[1:]).stdout, "")) == (
        {}, {}, []
    )  # fmt: skip


def test_dcgmi_reports_the_faults_in_dcgms_own_tables(host):
    from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health  # noqa: PLC0415
    from ansible_collections.rigops.fleet.plugins.module_utils import gpu_health_sentinel as sentinel  # noqa: PLC0415

    h = host("h100x8", ready=True)
    dcgmi = h.path("/usr/bin/dcgmi")
    assert dcgmi.is_symlink() and not host("rtx5090x2").path("/usr/bin/dcgmi").exists()
    real = (ROOT / "tests/fixtures/gpu-health/real/d01_l4_dcgmi_health_c_power_warning_461.txt").read_text()
    assert h.run(dcgmi, "health", "-c").stdout == (
        "Health watches not enabled.\nPlease enable watches.\n"  # as d04: a fresh host engine
    )

    def run(argv, timeout=30):
        r = h.run(dcgmi, *argv[1:]) if argv[0] == "dcgmi" else h.smi(*argv[1:])
        return r.returncode, r.stdout, r.stderr

    config = {"dcgmi": ["dcgmi"], "nvidia_smi": ["nvidia-smi"]}
    assert sentinel.dcgm_round(config, run, exists=lambda p: True) == ({}, [])  # it set the watches
    found, problems = sentinel.dcgm_round(config, run, exists=lambda p: True)
    assert problems == [] and len(found) == 8 and all(f == [] for f in found.values())
    discovery = h.run(dcgmi, "discovery", "-l").stdout.splitlines()
    assert discovery[0] == "8 GPUs found (Active)." and discovery[1:3] == real_discovery_head()
    assert _fault(h, "set", "1", "power_brake").returncode == 0
    assert _fault(h, "set", "4", "xid48", "--value", "2").returncode == 0
    table = h.run(dcgmi, "health", "-c").stdout
    # the layout of the real table: the same rules, the same column widths, the same wrapping
    assert table.splitlines()[:3] == real.splitlines()[1:4]
    assert "\n".join(table.splitlines()[5:11]) == "\n".join(real.splitlines()[6:12]).replace(
        "GPU 0.", "GPU 1."
    ).replace("| -> 0 ", "| -> 1 ")
    found, problems = sentinel.dcgm_round(config, run, exists=lambda p: True)
    gpus = gpu_health.read_smi_xml(h.smi("-q", "-x").stdout)
    bus = {g["index"]: g["bus_id"] for g in gpus}
    assert [(f["severity"], f["detail"]) for f in found[bus[4]]] == [
        ("critical", "DCGM Memory system: Failure: Detected 2 volatile double-bit ECC error(s) in GPU 4.")
    ]
    result = gpu_health.evaluate(gpus, [], None, dcgm=found)

    def checks(index):  # (this scratch host runs no persistence daemon)
        return sorted(f["check"] for f in result["gpus"][index]["findings"] if f["check"] != "persistence")

    # DCGM judged GPU 4's memory: nvidia-smi's ECC and row remapping findings give way to it
    assert checks(4) == ["dcgm"]
    assert sorted(f["check"] for f in gpu_health.evaluate(gpus, [])["gpus"][4]["findings"]) == [
        "ecc", "persistence", "row_remap"
    ]  # fmt: skip
    # DCGM's power warning stands beside nvidia-smi's power brake slowdown
    assert checks(1) == ["dcgm", "slowdown", "slowdown"]  # hw_slowdown and hw_power_brake_slowdown
    assert sentinel.dcgm_round(config, run, exists=lambda p: False) == ({}, [])  # not installed: nvidia-smi alone


def real_discovery_head():
    real = (ROOT / "tests/fixtures/gpu-health/real/d02_l4_dcgmi_discovery_l_461.txt").read_text().splitlines()
    return real[2:4]


def test_jetson_with_l4t_nvidia_smi(host):
    data = yaml.safe_load((PROFILES / "jetson-thor.yaml").read_text())
    data["jetson"]["nvidia_smi"] = True
    h = host(data)
    smi = h.path("/usr/bin/nvidia-smi")
    assert smi.exists() and os.access(smi, os.X_OK)
    r = h.run(smi, "--query-gpu=name,compute_cap,driver_version,persistence_mode", "--format=csv,noheader")
    assert r.returncode == 0, r.stdout
    assert r.stdout == "NVIDIA Thor, 11.0, 580.00, [N/A]\n"
    assert h.run(smi, "-pm", "1").returncode == 3


# --------------------------------------------------------------------------- against real captures

REAL = ROOT / "tests" / "fixtures" / "nvidia-smi" / "real"
# 2x RTX 5090 on driver 5xx: topo -m and topo -p2p rw pasted from a real rig
REAL_CAPTURE = (REAL / "t02_club3090_1229_2x5090_phb_with_p2p_rw.txt").read_text()


def _legend(text: str, after: str) -> list[str]:
    """Whitespace-normalised lines of the first `Legend:` block after the line `after`."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(after))
    at = next(i for i in range(start, len(lines)) if lines[i].strip() == "Legend:")
    out = []
    for ln in lines[at + 1 :]:
        if ln.strip().startswith("```") or ln.strip().endswith("Legend:"):
            break
        if ln.strip():
            out.append(" ".join(ln.split()))
    return out


def test_topo_legend_matches_a_real_capture(host):
    out = host("rtx5090x2", ready=True).smi("topo", "-m").stdout
    assert _legend(out, "GPU0") == _legend(REAL_CAPTURE, "GPU0")


def test_p2p_legend_matches_a_real_capture(host):
    out = host("rtx5090x2", ready=True).smi("topo", "-p2p", "r").stdout
    real_p2p = REAL_CAPTURE[REAL_CAPTURE.index("topo -p2p rw") :]
    assert _legend(out, "GPU0") == _legend(real_p2p, "GPU0")


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_emulated_topology_reads_like_a_real_capture(host, profile):
    """The parser that reads the real captures reads the emulator's output cleanly."""
    import ansible.module_utils  # noqa: F401  (tests/conftest.py adds module_utils/)
    from ansible_collections.rigops.fleet.plugins.module_utils.nvidia_topology import (
        parse_p2p_matrix,
        parse_topo_matrix,
    )

    h = host(profile, ready=True)
    topo = parse_topo_matrix(h.smi("topo", "-m").stdout)
    assert topo["found"] and topo["warnings"] == []
    assert topo["gpu_count"] == EXPECTED[profile][0]
    assert topo["columns"] == parse_topo_matrix(REAL_CAPTURE)["columns"]
    p2p = parse_p2p_matrix(h.smi("topo", "-p2p", "r").stdout)
    assert p2p["found"] and p2p["warnings"] == []


# --------------------------------------------------------------------------- faults (nvidia-sim-fault)
def _xml_gpus(h: Host, *args: str) -> list[ET.Element]:
    r = h.smi("-q", "-x", *args)
    assert r.returncode == 0, r.stdout
    return ET.fromstring(r.stdout.split("\n", 2)[2]).findall("gpu")


def _xml_gpu(h: Host, bus_id: str) -> ET.Element:
    return next(g for g in _xml_gpus(h) if g.get("id") == bus_id)


def _fault(h: Host, *args: str) -> subprocess.CompletedProcess:
    return h.tool("nvidia-sim-fault", *args)


def _kern(h: Host) -> list[str]:
    path = h.path("/var/log/nvidia-sim/kern.log")
    return path.read_text().splitlines() if path.exists() else []


def _healthy(g: ET.Element) -> None:
    reasons = g.find("clocks_event_reasons")
    assert [c.tag for c in reasons][:6] == [
        "clocks_event_reason_gpu_idle",
        "clocks_event_reason_applications_clocks_setting",
        "clocks_event_reason_sw_power_cap",
        "clocks_event_reason_hw_slowdown",
        "clocks_event_reason_hw_thermal_slowdown",
        "clocks_event_reason_hw_power_brake_slowdown",
    ]
    assert {c.text for c in reasons if c.tag != "clocks_event_reason_gpu_idle"} == {"Not Active"}
    assert g.findtext("clocks_event_reasons/clocks_event_reason_gpu_idle") == "Active"  # idle, like a real GPU
    assert g.findtext("pci/pci_gpu_link_info/link_widths/max_link_width") == "16x"
    assert g.findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "16x"
    assert g.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen") == "5"
    assert g.findtext("pci/pci_gpu_link_info/pcie_gen/current_link_gen") == "1"  # idle: gen 1


def test_health_sections_in_real_order(host):
    """Healthy by default; element names and order as in real -q -x captures of driver 5xx."""
    h = host("h100x8", ready=True)
    g = _xml_gpus(h)[0]
    tags = [c.tag for c in g]
    order = ["pci", "performance_state", "clocks_event_reasons", "fb_memory_usage", "utilization", "ecc_mode"]
    order += ["ecc_errors", "retired_pages", "remapped_rows", "temperature"]
    assert [t for t in tags if t in order] == order
    _healthy(g)
    assert [c.tag for c in g.find("ecc_errors/volatile")] == [
        "sram_correctable",
        "sram_uncorrectable_parity",
        "sram_uncorrectable_secded",
        "dram_correctable",
        "dram_uncorrectable",
    ]
    assert g.findtext("ecc_errors/aggregate/sram_threshold_exceeded") == "No"
    assert {e.text for e in g.iter() if e.tag.startswith(("dram_", "sram_")) and len(e) == 0} <= {"0", "No"}
    assert g.findtext("ecc_mode/current_ecc") == "Enabled"
    assert g.findtext("retired_pages/double_bit_retirement/retired_count") == "N/A"  # Hopper remaps rows
    assert [c.tag for c in g.find("remapped_rows")] == [
        "remapped_row_corr",
        "remapped_row_unc",
        "remapped_row_pending",
        "remapped_row_failure",
        "row_remapper_histogram",
    ]
    assert g.findtext("remapped_rows/remapped_row_pending") == "No"
    geforce = _xml_gpus(host("rtx5090x2", ready=True))[0]
    assert geforce.findtext("ecc_mode/current_ecc") == "N/A"
    assert geforce.findtext("ecc_errors/volatile/dram_uncorrectable") == "N/A"
    q = h.smi("-q", "-i", "0").stdout
    assert "\n    Clocks Event Reasons\n        Idle                              : Active\n" in q
    assert "\n            HW Thermal Slowdown           : Not Active\n" in q
    assert "\n    Remapped Rows\n        Correctable Error                 : 0\n" in q


def test_fault_xid79_falls_off_the_bus(host):
    h = host("h100x8", ready=True)
    assert _kern(h) == []
    r = _fault(h, "set", "13:00.0", "xid79")
    assert r.returncode == 0, r.stderr
    gpus = _xml_gpus(h)
    assert len(gpus) == 7 and "00000000:13:00.0" not in {g.get("id") for g in gpus}
    xml = h.smi("-q", "-x").stdout
    assert "<attached_gpus>7</attached_gpus>" in xml
    assert h.smi("--query-gpu=count", "--format=csv,noheader", "-i", "0").stdout == "7\n"
    lines = h.smi("-L").stdout.splitlines()
    assert len(lines) == 7 and lines[0].startswith("GPU 0: ")  # indices shift, as NVML renumbers
    assert h.smi("--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0").stdout == "00000000:14:00.0\n"
    for ident in ("00000000:13:00.0", "0000:13:00.0", "13:00.0"):
        r = h.smi("-i", ident, "-q")
        assert r.returncode == 6 and r.stdout == "No devices were found\n"
    assert len(_topo(h.smi("topo", "-m").stdout)[1]) == 7 + 4
    kern = _kern(h)
    assert len(kern) == 4
    assert kern[2].endswith(
        " kernel: NVRM: Xid (PCI:0000:13:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert kern[0].split(" kernel: ")[1].startswith("NVRM: GPU at PCI:0000:13:00: GPU-")
    assert kern[3].endswith("kernel: NVRM: GPU 0000:13:00.0: GPU has fallen off the bus.")
    assert len(kern[2].split(" kernel: ")[0].split()) == 4  # Mon DD HH:MM:SS HOSTNAME
    listed = json.loads(_fault(h, "list").stdout)
    assert listed == [
        {"bus_id": "00000000:13:00.0", "uuid": listed[0]["uuid"], "index": None, "kind": "xid79", "value": None}
    ]
    # an operator's reset / reseat: back in nvidia-smi, no new kernel line, the old ones stay
    r = _fault(h, "clear", "00000000:13:00.0")
    assert r.returncode == 0, r.stderr
    assert len(_xml_gpus(h)) == 8
    assert _kern(h) == kern
    h.reboot()
    assert _kern(h) == []  # a new boot, a new kernel log


def test_fault_xid48_row_remapping_and_page_retirement(host):
    h = host("h100x8", ready=True)
    bus = "00000000:43:00.0"
    assert _fault(h, "set", "2", "xid48", "--value", "3").returncode == 0
    g = _xml_gpu(h, bus)
    assert g.findtext("ecc_errors/volatile/dram_uncorrectable") == "3"
    assert g.findtext("ecc_errors/aggregate/dram_uncorrectable") == "3"
    assert g.findtext("remapped_rows/remapped_row_unc") == "3"
    assert g.findtext("remapped_rows/remapped_row_pending") == "Yes"
    assert g.findtext("remapped_rows/remapped_row_failure") == "No"
    assert _xml_gpu(h, "00000000:13:00.0").findtext("ecc_errors/volatile/dram_uncorrectable") == "0"
    q = "ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,remapped_rows.pending"
    assert h.smi(f"--query-gpu={q}", "--format=csv,noheader", "-i", bus).stdout == "3, 3, Yes\n"
    kern = _kern(h)
    xids = [ln.split("NVRM: Xid (PCI:0000:43:00): ")[1] for ln in kern if "NVRM: Xid" in ln]
    assert [x.split(",")[0] for x in xids] == ["48", "63"] * 3
    assert xids[0].startswith(
        "48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU "
        "in the framebuffer at physAddr 0x"
    )
    assert xids[1].endswith("marked for remapping, reset gpu to activate.")
    assert "|                    3 |" in h.smi("-i", "2").stdout  # Volatile Uncorr. ECC column
    # GPU reset: volatile counts go, the remap takes effect, the lifetime figures stay
    assert _fault(h, "clear", bus, "xid48").returncode == 0
    g = _xml_gpu(h, bus)
    assert g.findtext("ecc_errors/volatile/dram_uncorrectable") == "0"
    assert g.findtext("ecc_errors/aggregate/dram_uncorrectable") == "3"
    assert g.findtext("remapped_rows/remapped_row_pending") == "No"
    assert g.findtext("remapped_rows/remapped_row_unc") == "3"
    assert _kern(h) == kern
    h.reboot()
    assert _xml_gpu(h, bus).findtext("ecc_errors/aggregate/dram_uncorrectable") == "3"  # InfoROM survives
    # before Ampere: page retirement instead of row remapping, one sram_uncorrectable
    data = yaml.safe_load((PROFILES / "h100x8.yaml").read_text())
    data["gpu_model"].update(architecture="Volta", name="Tesla V100-SXM2-32GB")
    v = host(data, ready=True)
    assert _fault(v, "set", "0", "xid48").returncode == 0
    g = _xml_gpus(v)[0]
    assert [c.tag for c in g.find("ecc_errors/volatile")] == [
        "sram_correctable",
        "sram_uncorrectable",
        "dram_correctable",
        "dram_uncorrectable",
    ]
    assert g.findtext("ecc_errors/volatile/dram_uncorrectable") == "1"
    assert g.findtext("retired_pages/double_bit_retirement/retired_count") == "1"
    assert g.findtext("retired_pages/pending_retirement") == "Yes"
    assert g.findtext("retired_pages/pending_blacklist") == "Yes"
    assert g.findtext("remapped_rows") == "N/A"
    assert [ln.split(": Xid (PCI:0000:13:00): ")[1][:2] for ln in _kern(v) if ": Xid " in ln] == ["48"]
    assert "        Pending Page Blacklist            : Yes\n" in v.smi("-q", "-i", "0").stdout


@pytest.mark.parametrize(
    ("kind", "reason", "temp"),
    [
        ("thermal", "clocks_event_reason_hw_thermal_slowdown", "92 C"),
        ("power_brake", "clocks_event_reason_hw_power_brake_slowdown", "30 C"),
    ],
)
def test_fault_slowdowns(host, kind, reason, temp):
    h = host("h100x8", ready=True)
    assert _fault(h, "set", "GPU-e4f47307-f423-5559-9310-5845544a0be5".upper(), kind).returncode == 0
    g = _xml_gpus(h)[0]
    active = {c.tag for c in g.find("clocks_event_reasons") if c.text == "Active"}
    assert active == {"clocks_event_reason_gpu_idle", "clocks_event_reason_hw_slowdown", reason}
    assert g.findtext("temperature/gpu_temp") == temp
    q = "clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,"
    q += "clocks_event_reasons.hw_power_brake_slowdown,clocks_event_reasons.active"
    row = h.smi(f"--query-gpu={q}", "--format=csv,noheader", "-i", "0").stdout.strip().split(", ")
    assert row[0] == "Active" and row[1 if kind == "thermal" else 2] == "Active"
    assert row[3] == ("0x0000000000000049" if kind == "thermal" else "0x0000000000000089")
    assert _xml_gpus(h)[1].findtext("clocks_event_reasons/clocks_event_reason_hw_slowdown") == "Not Active"
    assert _kern(h) == []  # slowdowns are not Xids
    assert _fault(h, "clear", "0", kind).returncode == 0
    _healthy(_xml_gpus(h)[0])
    if kind == "thermal":
        assert _fault(h, "set", "1", "thermal", "--value", "97").returncode == 0
        assert _xml_gpus(h)[1].findtext("temperature/gpu_temp") == "97 C"


def test_fault_link_x8_keeps_max_and_idle_gen(host):
    h = host("h100x8", ready=True)
    fields = "pcie.link.width.current,pcie.link.width.max,pcie.link.gen.current,pcie.link.gen.max"
    assert h.smi(f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0").stdout == "16, 16, 1, 5\n"
    assert _fault(h, "set", "0", "link_x8").returncode == 0
    g = _xml_gpus(h)[0]
    assert g.findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "8x"
    assert g.findtext("pci/pci_gpu_link_info/link_widths/max_link_width") == "16x"
    assert g.findtext("pci/pci_gpu_link_info/pcie_gen/current_link_gen") == "1"
    assert g.findtext("pci/pci_gpu_link_info/pcie_gen/max_link_gen") == "5"
    assert h.smi(f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0").stdout == "8, 16, 1, 5\n"
    h.path("/run/nvidia-sim/usage.yaml").write_text("'0': {memory_used_mib: 27000, utilization_gpu: 97}\n")
    assert h.smi(f"--query-gpu={fields}", "--format=csv,noheader", "-i", "0").stdout == "8, 16, 5, 5\n"
    lspci = h.tool("lspci", "-vvv", "-s", "13:00.0").stdout
    assert "LnkCap:\tPort #0, Speed 32GT/s, Width x16" in lspci and "Width x8 (downgraded)" in lspci
    assert _fault(h, "clear").returncode == 0
    assert json.loads(_fault(h, "list").stdout) == []
    assert _xml_gpus(h)[0].findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "16x"


def test_fault_bad_arguments_change_nothing(host):
    h = host("rtx5090x2", ready=True)
    state = h.path("/run/nvidia-sim/faults.json")
    cases = [
        (("set", "7", "xid79"), "no GPU '7'"),
        (("set", "GPU-nope", "thermal"), "give an index, a bus id"),
        (("set", "0", "xid99"), "one of: xid79, xid48, link_x8, thermal, power_brake"),
        (("set", "0", "xid48"), "has no ECC memory"),  # GeForce: no ECC, no DBE
        (("set", "0", "link_x8", "--value", "4"), "link_x8 takes no --value"),
        (("set", "0", "thermal", "--value", "hot"), "whole number"),
        (("clear", "0", "bogus"), "one of: xid79"),
        (("frobnicate",), "usage: nvidia-sim-fault set GPU KIND"),
    ]
    for args, msg in cases:
        r = _fault(h, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert msg in r.stderr, (args, r.stderr)
        assert not state.exists() or json.loads(state.read_text()).get("gpus") == {}
    assert _kern(h) == []
    assert len(_xml_gpus(h)) == 2
    assert _fault(h, "set", "1", "xid79").returncode == 0
    r = _fault(h, "set", "02:00.0", "thermal")  # a GPU off the bus takes no other fault
    assert r.returncode == 2 and "has fallen off the bus (xid79); clear it first" in r.stderr
    r = _fault(h, "set", "1", "thermal")  # the index 1 is gone with it
    assert r.returncode == 2 and "nvidia-smi now shows: 0=00000000:01:00.0" in r.stderr
