"""build_repo.py: stand-in driver packages in a signed apt repository.

Builds into a temporary directory, checks the packages with dpkg-deb, the signatures
with gpgv, and the package relations with apt-get's solver in simulation mode against
a private apt root (nothing is installed on the host).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "lab" / "sandbox" / "driver_repo" / "build_repo.py"
HW = ROOT / "lab" / "sandbox" / "hardware"
PROFILES = ROOT / "lab" / "sandbox" / "profiles"
UV = {"590": "590.48.01-0ubuntu0.24.04.1", "595": "595.45.04-0ubuntu0.24.04.1"}
CV = {"590": "590.48.01-1", "595": "595.45.04-1"}

pytestmark = pytest.mark.needs("dpkg-dev")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    out = tmp_path_factory.mktemp("nvsim-repo")
    first = subprocess.run([sys.executable, str(BUILD), "--out", str(out)], capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, str(BUILD), "--out", str(out)], capture_output=True, text=True, check=True)
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    return {"out": out, "repo": out / "repo", "first": first.stdout, "second": second.stdout, "arch": arch}


def _deb(repo, name: str, version: str) -> Path:
    hits = list(repo["repo"].rglob(f"{name}_{version}_*.deb"))
    assert hits, f"{name} {version} not built"
    return hits[0]


def test_build_then_cached(repo):
    assert repo["first"].startswith("nvidia-sim repo: built (")
    assert repo["second"].startswith("nvidia-sim repo: cached (")
    assert (repo["out"] / "gnupg").stat().st_mode & 0o777 == 0o700
    assert not (repo["repo"] / "gnupg").exists()  # the secret key is never served


def test_layout_and_signatures(repo):
    r = repo["repo"]
    keyring = r / "rigops-sim-archive-keyring.gpg"
    assert keyring.read_bytes()[:1] != b"-"  # binary
    assert (r / "rigops-sim-archive-keyring.asc").read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    cuda_arch = {"amd64": "x86_64", "arm64": "sbsa"}.get(repo["arch"], repo["arch"])
    dirs = [
        r / "ubuntu/dists/noble",
        r / "ubuntu/dists/bookworm",
        r / f"cuda/ubuntu2404/{cuda_arch}",
        r / f"cuda/debian12/{cuda_arch}",
    ]
    for d in dirs:
        subprocess.run(["gpgv", "--keyring", str(keyring), str(d / "InRelease")], check=True, capture_output=True)
        subprocess.run(
            ["gpgv", "--keyring", str(keyring), str(d / "Release.gpg"), str(d / "Release")],
            check=True,
            capture_output=True,
        )
    release = (r / "ubuntu/dists/noble/Release").read_text()
    assert "Suite: noble" in release and "Components: restricted" in release
    assert f"restricted/binary-{repo['arch']}/Packages" in release
    flat = (dirs[-1] / "Packages").read_text()
    assert "Filename: ./nvidia-open_595.45.04-1_" in flat


def _index(text: str) -> set[tuple[str, str, str]]:
    out = set()
    for stanza in text.strip().split("\n\n"):
        f = dict(ln.split(": ", 1) for ln in stanza.splitlines() if ": " in ln and not ln.startswith(" "))
        out.add((f["Package"], f["Version"], f["Architecture"]))
    return out


def test_package_index(repo):
    arch = repo["arch"]
    ub = _index((repo["repo"] / f"ubuntu/dists/noble/restricted/binary-{arch}/Packages").read_text())
    for b in ("590", "595"):
        for name in (
            f"nvidia-driver-{b}-open",
            f"nvidia-driver-{b}",
            f"nvidia-utils-{b}",
            f"nvidia-compute-utils-{b}",
            f"nvidia-dkms-{b}-open",
            f"nvidia-dkms-{b}",
            f"nvidia-kernel-common-{b}",
        ):
            assert (name, UV[b], arch) in ub
    assert len(ub) == 14
    cuda = _index(next(repo["repo"].glob("cuda/debian12/*/Packages")).read_text())
    for b in ("590", "595"):
        for name in (
            "nvidia-open",
            "cuda-drivers",
            "nvidia-driver-cuda",
            "nvidia-persistenced",
            "nvidia-kernel-open-dkms",
        ):
            assert (name, CV[b], arch) in cuda
        assert (f"nvidia-driver-pinning-{b}", CV[b], "all") in cuda


def _info(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-I", str(deb)], capture_output=True, text=True, check=True).stdout


def _file(deb: Path, path: str, tmp: Path) -> str:
    d = tmp / deb.stem
    subprocess.run(["dpkg-deb", "-x", str(deb), str(d)], check=True)
    return (d / path.lstrip("/")).read_text()


def test_package_contents(repo, tmp_path):
    meta = _info(_deb(repo, "nvidia-driver-595-open", UV["595"]))
    assert f"Depends: nvidia-utils-595 (= {UV['595']}), nvidia-compute-utils-595 (= {UV['595']}), " in meta
    assert f"nvidia-dkms-595-open (= {UV['595']})" in meta
    assert "Conflicts: nvidia-driver-590-open, nvidia-driver-590, nvidia-driver-595, nvidia-open, cuda-drivers" in meta
    smi = _file(_deb(repo, "nvidia-utils-595", UV["595"]), "/usr/bin/nvidia-smi", tmp_path)
    assert "'driver_version': '595.45.04'" in smi and "'lib': '/usr/lib/nvidia-sim/nvidia-utils-595'" in smi
    unit = _file(
        _deb(repo, "nvidia-compute-utils-595", UV["595"]),
        "/usr/lib/systemd/system/nvidia-persistenced.service",
        tmp_path,
    )
    assert "--user nvidia-persistenced --no-persistence-mode --verbose" in unit
    assert "[Install]" not in unit  # static, like Ubuntu's
    unit = _file(
        _deb(repo, "nvidia-persistenced", CV["595"]), "/usr/lib/systemd/system/nvidia-persistenced.service", tmp_path
    )
    assert "[Install]\nWantedBy=multi-user.target" in unit and "--no-persistence-mode" not in unit
    pin = _file(
        _deb(repo, "nvidia-driver-pinning-590", CV["590"]), "/etc/apt/preferences.d/nvidia-driver-pinning-590", tmp_path
    )
    assert "Pin: version 590.*\nPin-Priority: 1000\n" in pin
    dkms = _info(_deb(repo, "nvidia-dkms-595-open", UV["595"]))
    assert "postinst" in dkms and "prerm" in dkms and "Provides: nvidia-dkms-kernel" in dkms
    rules = _file(_deb(repo, "nvidia-kernel-common-595", UV["595"]), "/usr/lib/udev/rules.d/71-nvidia.rules", tmp_path)
    assert "systemctl start --no-block nvidia-persistenced.service" in rules


def test_maintainer_scripts_parse(repo, tmp_path):
    for deb in repo["repo"].glob("ubuntu/pool/**/*.deb"):
        d = tmp_path / deb.stem
        subprocess.run(["dpkg-deb", "-e", str(deb), str(d)], check=True)
        for script in ("postinst", "prerm", "postrm"):
            if (d / script).exists():
                assert os.access(d / script, os.X_OK)
                subprocess.run(["sh", "-n", str(d / script)], check=True)


class AptSim:
    """apt-get -s against a private root: a dpkg status file we write, our repo as the only source."""

    def __init__(self, tmp: Path, repo: dict):
        self.s = tmp / "apt"
        for d in ("etc/apt/preferences.d", "etc/apt/apt.conf.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial"):
            (self.s / d).mkdir(parents=True)
        (self.s / "var/cache/apt/archives/partial").mkdir(parents=True)
        (self.s / "var/lib/dpkg").mkdir(parents=True)
        (self.s / "log").mkdir()
        self.status = self.s / "var/lib/dpkg/status"
        self.status.write_text("")
        self.repo = repo
        key = repo["repo"] / "rigops-sim-archive-keyring.gpg"
        cuda = next(repo["repo"].glob("cuda/debian12/*"))
        (self.s / "etc/apt/sources.list").write_text(
            f"deb [signed-by={key}] file:{repo['repo']}/ubuntu bookworm restricted\n"
            f"deb [signed-by={key}] file:{cuda}/ /\n"
        )
        self.apt("update")

    def apt(self, *args: str) -> str:
        base = [
            "apt-get",
            "-o", f"Dir={self.s}",
            "-o", f"Dir::State::status={self.status}",
            "-o", f"Dir::Etc::Parts={self.s}/etc/apt/apt.conf.d",
            "-o", f"Dir::Log={self.s}/log",
            "-o", "Debug::NoLocking=1",
            "-o", f"APT::Architecture={self.repo['arch']}",
        ]  # fmt: skip
        r = subprocess.run(
            [*base, *args], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def installed(self, *debs: Path) -> None:
        entries = []
        for deb in debs:
            ctl = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
            first, rest = ctl.split("\n", 1)  # "Package: <name>" comes first
            entries.append(f"{first}\nStatus: install ok installed\n{rest}")
        self.status.write_text("\n".join(e.rstrip("\n") + "\n" for e in entries))

    def plan(self, *pkgs: str) -> tuple[set[str], set[str]]:
        out = self.apt("-s", "install", *pkgs)
        inst = {ln.split()[1] + "=" + ln.split()[2].strip("(") for ln in out.splitlines() if ln.startswith("Inst ")}
        remv = {ln.split()[1] for ln in out.splitlines() if ln.startswith("Remv ")}
        return inst, remv


def test_apt_fresh_installs(repo, tmp_path):
    apt = AptSim(tmp_path, repo)
    inst, remv = apt.plan("nvidia-driver-595-open")
    assert inst == {
        f"{n}={UV['595']}"
        for n in (
            "nvidia-driver-595-open",
            "nvidia-utils-595",
            "nvidia-compute-utils-595",
            "nvidia-dkms-595-open",
            "nvidia-kernel-common-595",
        )
    }
    assert not remv
    inst, _ = apt.plan("nvidia-open")
    assert f"nvidia-open={CV['595']}" in inst and f"nvidia-kernel-open-dkms={CV['595']}" in inst


def test_apt_switches_branch_and_flavour(repo, tmp_path):
    apt = AptSim(tmp_path, repo)
    old = [
        _deb(repo, n, UV["590"])
        for n in (
            "nvidia-driver-590-open",
            "nvidia-utils-590",
            "nvidia-compute-utils-590",
            "nvidia-dkms-590-open",
            "nvidia-kernel-common-590",
        )
    ]
    apt.installed(*old)
    inst, remv = apt.plan("nvidia-driver-595-open")
    assert f"nvidia-driver-595-open={UV['595']}" in inst
    assert {"nvidia-driver-590-open", "nvidia-utils-590", "nvidia-dkms-590-open"} <= remv
    inst, remv = apt.plan("nvidia-open")
    assert f"nvidia-driver-cuda={CV['595']}" in inst and "nvidia-utils-590" in remv
    inst, remv = apt.plan("nvidia-driver-590")  # open -> proprietary modules, same branch
    assert f"nvidia-dkms-590={UV['590']}" in inst and "nvidia-dkms-590-open" in remv


def test_apt_pinning_package_selects_the_branch(repo, tmp_path):
    apt = AptSim(tmp_path, repo)
    pin_deb = _deb(repo, "nvidia-driver-pinning-590", CV["590"])
    apt.installed(pin_deb)
    pin = _file(pin_deb, "/etc/apt/preferences.d/nvidia-driver-pinning-590", tmp_path)
    (apt.s / "etc/apt/preferences.d/nvidia-driver-pinning-590").write_text(pin)
    inst, _ = apt.plan("nvidia-open")
    assert f"nvidia-open={CV['590']}" in inst and f"nvidia-driver-cuda={CV['590']}" in inst
    inst, remv = apt.plan("nvidia-driver-pinning-595")
    assert "nvidia-driver-pinning-590" in remv


def test_packaged_smi_reports_its_version(repo, tmp_path):
    """The nvidia-smi inside the .deb, unpacked, against a simulated host with 595 loaded."""
    sim = tmp_path / "root"
    (sim / "etc/nvidia-sim").mkdir(parents=True)
    shutil.copy(PROFILES / "rtx5090x2.yaml", sim / "etc/nvidia-sim/profile.yaml")
    env = dict(
        os.environ, NVIDIA_SIM_ROOT=str(sim), NVIDIA_SIM_KERNEL_RELEASE="6.1.0-nvsim-test", PYTHONPATH=str(HW / "lib")
    )
    subprocess.run([sys.executable, str(HW / "install-hardware"), "-q", "--no-boot"], env=env, check=True)
    subprocess.run(
        [sys.executable, "-c", "from nvsim import kmod; kmod.install_driver_modules('595.45.04')"], env=env, check=True
    )
    env.pop("PYTHONPATH")
    for ver, deb_ver, rc in (("595", UV["595"], 0), ("590", UV["590"], 18)):
        d = tmp_path / ver
        subprocess.run(["dpkg-deb", "-x", str(_deb(repo, f"nvidia-utils-{ver}", deb_ver)), str(d)], check=True)
        r = subprocess.run(
            [sys.executable, str(d / "usr/bin/nvidia-smi"), "--query-gpu=driver_version", "--format=csv,noheader"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == rc, r.stdout + r.stderr
        if rc == 0:
            assert r.stdout == "595.45.04\n595.45.04\n"
        else:
            assert "Driver/library version mismatch" in r.stdout
