"""lab/device_check.sh against the sandbox's nvidia-smi emulator, before a real device is lent.

The emulator (lab/sandbox/driver_repo/nvidia-smi) answers as the driver of a simulated 8x RTX 5090
rig (NVIDIA_SIM_ROOT, booted with the driver loaded, as tests/unit/test_nvidia_sim.py does); a
wrapper puts it on PATH as `nvidia-smi`. The script captures, parses, runs the modules through
Ansible and renders and scores a GPU unit, and prints one line.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "device_check.sh"
HW = ROOT / "lab" / "sandbox" / "hardware"
SMI = ROOT / "lab" / "sandbox" / "driver_repo" / "nvidia-smi"


def sim_rig(root, profile):
    """A simulated rig in `root` with the 595 driver loaded: the environment its tools need."""
    env = dict(os.environ, NVIDIA_SIM_ROOT=str(root), NVIDIA_SIM_KERNEL_RELEASE="6.1.0-nvsim-test")
    env.pop("NVIDIA_SIM_DRIVER_VERSION", None)
    (root / "etc" / "nvidia-sim").mkdir(parents=True)
    (root / "etc" / "nvidia-sim" / "profile.yaml").write_text(yaml.safe_dump(profile))

    def run(*argv, **kw):
        proc = subprocess.run(
            [sys.executable, *map(str, argv)], env=env, capture_output=True, text=True, check=False, **kw
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    run(HW / "install-hardware")
    run("-c", "from nvsim import kmod; kmod.install_driver_modules('595.45.04', 'open')", cwd=HW / "lib")
    (root / "etc" / "modprobe.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "modprobe.d" / "blacklist-nouveau.conf").write_text(
        "blacklist nouveau\noptions nouveau modeset=0\n"
    )
    (root / "etc" / "modules-load.d").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "modules-load.d" / "nvidia.conf").write_text("nvidia\nnvidia_uvm\n")
    run(HW / "bin" / "update-initramfs", "-u")
    shutil.rmtree(root / "run", ignore_errors=True)
    run(HW / "bin" / "nvidia-sim-boot", "--no-services")
    return env


def profile(name):
    return yaml.safe_load((ROOT / "lab" / "sandbox" / "profiles" / f"{name}.yaml").read_text())


def device_check(tmp, rig_profile, path_extra=()):
    """Run the script on a simulated rig; (process, output folder)."""
    env = sim_rig(tmp / "rig", rig_profile)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SMI}" "$@"\n')
    wrapper.chmod(0o755)
    # the emulator before any real nvidia-smi, then what the case brings (the test's python3 and ansible)
    env["PATH"] = ":".join([str(bin_dir), *path_extra, "/usr/bin", "/bin"])
    env["PYTHON"] = sys.executable
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp / "out")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    return proc, tmp / "out"


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return device_check(
        tmp_path_factory.mktemp("device_check"), profile("rtx5090x8"), [str(Path(sys.executable).parent)]
    )


def test_one_summary_line_with_the_rigs_figures(checked):
    proc, out = checked
    assert proc.returncode == 0, (proc.stdout, (out / "checks.log").read_text()[-3000:])
    (line,) = proc.stdout.splitlines()
    assert line == (out / "summary.txt").read_text().strip()
    assert re.fullmatch(
        r"device_check: \S+ GPUs=8 \(NVIDIA GeForce RTX 5090, cc 12\.0, minors 0,1,2,3,4,5,6,7\) driver=595\.45\.04 "
        r"CUDA=\d+\.\d+ worst_link=SYS p2p=GNSx28 parse=ok modules=(ok|skipped\(no ansible\)) "
        r"unit=(ok\(verify silent, exposure [0-9.]+\)|skipped\(no ansible-playbook or systemd-analyze\))",
        line,
    ), line
    if shutil.which("systemd-analyze"):
        exposure = float(re.search(r"exposure ([0-9.]+)", line).group(1))
        assert exposure <= 2.0


def test_the_captures_are_fixtures_with_a_header(checked):
    _, out = checked
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "checks.log",
            "nvidia-smi-q-x.xml",
            "query-gpu.csv",
            "summary.txt",
            "topo-m.txt",
            "topo-p2p-r.txt",
            "vllm@gpu0.devices.conf",
            "vllm@gpu0.service",
        ]
    )  # at most 8 files: what a device machine's $OUT sends back
    host = os.uname().nodename
    xml = (out / "nvidia-smi-q-x.xml").read_text().splitlines()
    assert xml[0].startswith("<?xml") and xml[1].startswith(f"<!-- nvidia-smi -q -x on {host} (")
    for name, command in (
        ("query-gpu.csv", "nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version,compute_cap,"),
        ("topo-m.txt", "nvidia-smi topo -m"),
        ("topo-p2p-r.txt", "nvidia-smi topo -p2p r"),
    ):
        head = (out / name).read_text().splitlines()
        assert head[0].startswith(f"# {command}") and head[1].startswith(f"# on {host} ("), name
        assert re.search(r" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ by lab/device_check\.sh$", head[1]), name
    assert (out / "query-gpu.csv").read_text().splitlines()[2].startswith("0, GPU-")


@pytest.mark.needs("systemd-analyze")
def test_the_unit_for_gpu_0_allows_its_node_only(checked):
    _, out = checked
    text = (out / "vllm@gpu0.devices.conf").read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("DeviceAllow=/dev/char/195:")] == [
        "DeviceAllow=/dev/char/195:0 rwm",
        "DeviceAllow=/dev/char/195:255 rwm",
    ]


def test_one_gpu_without_ansible_like_a_lent_device_machine(tmp_path):
    """One GPU (no pair: no link, no p2p matrix), no Ansible on PATH: the parsers alone, the rest skipped."""
    if shutil.which("ansible", path="/usr/bin:/bin"):
        pytest.skip("this machine has ansible in /usr/bin: no PATH without it")
    one = profile("rtx5090x2")
    one["gpus"] = one["gpus"][:1]
    proc, out = device_check(tmp_path, one)
    assert proc.returncode == 0, (out / "checks.log").read_text()[-3000:]
    (line,) = proc.stdout.splitlines()
    assert " GPUs=1 (NVIDIA GeForce RTX 5090, cc 12.0, minors 0) driver=595.45.04 " in line
    assert line.endswith(
        " worst_link=n/a p2p=n/a parse=ok modules=skipped(no ansible) "
        "unit=skipped(no ansible-playbook or systemd-analyze)"
    )


def test_a_failing_driver_fails_the_check(tmp_path):
    """nvidia-smi present but the driver not loaded (the emulator's exit 9): exit 1, the line says FAILED."""
    rig = tmp_path / "rig"
    (rig / "etc" / "nvidia-sim").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    env["PYTHON"] = sys.executable
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 1
    (line,) = proc.stdout.splitlines()
    assert line.endswith(" FAILED") and "parse=FAILED" in line
    assert "FAILED: nvidia-smi -q -x" in (tmp_path / "out" / "checks.log").read_text()


@pytest.mark.needs("shellcheck")
def test_the_script_is_shellcheck_clean():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
