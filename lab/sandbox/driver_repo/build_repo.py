#!/usr/bin/env python3
"""Build the sandbox's signed apt repository of stand-in NVIDIA driver packages.

    build_repo.py --out DIR [--force] [--arch ARCH]

Writes DIR/repo/ (served to the sandbox hosts as http://rigops-repo:8080/):

    rigops-sim-archive-keyring.gpg   public key, binary  (for /etc/apt/keyrings/, signed-by)
    rigops-sim-archive-keyring.asc   public key, armored
    ubuntu/                          Ubuntu-archive flavour, suites noble and bookworm, component restricted
      dists/<suite>/{Release,InRelease,Release.gpg}, dists/<suite>/restricted/binary-<arch>/Packages{,.gz}
      pool/restricted/n/nvidia-graphics-drivers-<branch>/*.deb
    cuda/<distro>/<cuda-arch>/       CUDA-repo flavour, flat ("/") like developer.download.nvidia.com:
                                     distro ubuntu2404 and debian12, cuda-arch x86_64 or sbsa

The signing key is generated once under DIR/gnupg and reused; it is never committed
(DIR is lab/sandbox/.state/... in the fleet). A stamp of the sources' hash makes a rebuild a
no-op: the script prints "cached" or "built", with the time taken. No network is used:
only dpkg-deb, apt-ftparchive and gpg.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.realpath(__file__))
LIB = os.path.join(HERE, "..", "hardware", "lib", "nvsim")

# branch -> upstream driver release
BRANCHES = {"590": "590.48.01", "595": "595.45.04"}
CUDA_BY_BRANCH = {"590": "13.1", "595": "13.2"}
UBUNTU_REV = "-0ubuntu0.24.04.1"
CUDA_REV = "-1"
SUITES = ("noble", "bookworm")
CUDA_DISTROS = ("ubuntu2404", "debian12")
KEY_UID = "rigops sandbox NVIDIA stand-in repository <nvidia-sim@rigops.invalid>"
KEYRING = "rigops-sim-archive-keyring"
MAINTAINER = "rigops sandbox <nvidia-sim@rigops.invalid>"
STANDIN = (
    "\n .\n rigops sandbox stand-in: models the real package's names, files and services for"
    "\n the simulated NVIDIA stack; it contains no NVIDIA software."
)

UBUNTU_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target
Before=systemd-backlight@backlight:nvidia_0.service

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
"""
# Ubuntu's real unit also has StopWhenUnneeded=true; the udev rule below keeps it wanted on
# real hardware. A container has no device unit to hold it, so the stand-in leaves it out.

CUDA_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=forking
PIDFile=/var/run/nvidia-persistenced/nvidia-persistenced.pid
Restart=always
ExecStart=/usr/bin/nvidia-persistenced --verbose
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""

UDEV_RULES = """# Tag the device as master-of-seat so that logind is happy
# (see LP: #1365336)
SUBSYSTEM=="pci", ATTRS{vendor}=="0x10de", DRIVERS=="nvidia", TAG+="seat", TAG+="master-of-seat"

# Start and stop nvidia-persistenced on power on and power off
# respectively
ACTION=="add" DEVPATH=="/bus/pci/drivers/nvidia" RUN+="/bin/systemctl start --no-block nvidia-persistenced.service"
ACTION=="remove" DEVPATH=="/bus/pci/drivers/nvidia" RUN+="/bin/systemctl stop --no-block nvidia-persistenced"
"""

DKMS_CONF = """PACKAGE_NAME="nvidia"
PACKAGE_VERSION="{ver}"
AUTOINSTALL="yes"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
BUILT_MODULE_NAME[1]="nvidia-modeset"
DEST_MODULE_LOCATION[1]="/updates/dkms"
BUILT_MODULE_NAME[2]="nvidia-drm"
DEST_MODULE_LOCATION[2]="/updates/dkms"
BUILT_MODULE_NAME[3]="nvidia-uvm"
DEST_MODULE_LOCATION[3]="/updates/dkms"
BUILT_MODULE_NAME[4]="nvidia-peermem"
DEST_MODULE_LOCATION[4]="/updates/dkms"
# rigops sandbox stand-in: flavour={flavour}
"""

# What DKMS does in a container: "build" marker modules for the running kernel.
DKMS_POSTINST = """#!/bin/sh
set -e
VER="{ver}"
FLAVOUR="{flavour}"
KVER="$(uname -r)"
case "$1" in
  configure)
    echo "Loading new nvidia-$VER DKMS files..."
    echo "Building for $KVER"
    echo "Building initial module for $KVER"
    DEST="/lib/modules/$KVER/updates/dkms"
    mkdir -p "$DEST" "/var/lib/dkms/nvidia/$VER/$KVER"
    SIGNER=""
    if [ -f /var/lib/shim-signed/mok/MOK.der ]; then SIGNER="rigops sandbox MOK"; fi
    case "$FLAVOUR" in open) LIC="Dual MIT/GPL" ;; *) LIC="NVIDIA" ;; esac
    for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
      printf 'name=%s\\nversion=%s\\nflavour=%s\\nlicense=%s\\nsigner=%s\\nbuilddate=%s\\n' \\
        "$(echo $m | tr - _)" "$VER" "$FLAVOUR" "$LIC" "$SIGNER" "Mon Jan 12 20:19:47 UTC 2026" > "$DEST/$m.ko"
    done
    echo "$FLAVOUR" > "/var/lib/dkms/nvidia/$VER/$KVER/installed"
    echo "Done."
    echo ""
    echo "nvidia.ko:"
    echo "Running module version sanity check."
    echo " - Original module"
    echo "   - No original module exists within this kernel"
    echo " - Installation"
    echo "   - Installing to $DEST/"
    echo "depmod...."
    ;;
esac
exit 0
"""

DKMS_PRERM = """#!/bin/sh
set -e
VER="{ver}"
case "$1" in
  remove|upgrade|deconfigure)
    for d in /var/lib/dkms/nvidia/$VER/*/; do
      [ -d "$d" ] || continue
      K="$(basename "$d")"
      for m in nvidia nvidia-uvm nvidia-modeset nvidia-drm nvidia-peermem; do
        f="/lib/modules/$K/updates/dkms/$m.ko"
        if [ -f "$f" ] && grep -qx "version=$VER" "$f"; then rm -f "$f"; fi
      done
      echo "Module nvidia-$VER for kernel $K was removed"
    done
    rm -rf "/var/lib/dkms/nvidia/$VER"
    ;;
esac
exit 0
"""

USER_POSTINST = """#!/bin/sh
set -e
if [ "$1" = configure ]; then
  if ! getent passwd nvidia-persistenced >/dev/null; then
    useradd --system --home-dir / --no-create-home --shell /usr/sbin/nologin \\
      --comment "NVIDIA Persistence Daemon" nvidia-persistenced
  fi
  if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
{extra}  fi
fi
exit 0
"""
CUDA_PERSISTENCED_EXTRA = """    systemctl enable nvidia-persistenced.service >/dev/null 2>&1 || true
    systemctl start nvidia-persistenced.service >/dev/null 2>&1 || true
"""
SERVICE_PRERM = """#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl stop nvidia-persistenced.service >/dev/null 2>&1 || true
fi
exit 0
"""
SERVICE_POSTRM = """#!/bin/sh
set -e
if [ "$1" = purge ] || [ "$1" = remove ]; then
  rm -f /etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service
  if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
fi
exit 0
"""


@dataclass
class Pkg:
    name: str
    version: str
    description: str
    arch: str
    section: str = "restricted/libs"
    depends: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)
    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    source: str = ""

    def control(self) -> str:
        lines = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            f"Architecture: {self.arch}",
            f"Maintainer: {MAINTAINER}",
            f"Section: {self.section}",
            "Priority: optional",
        ]
        if self.source:
            lines.append(f"Source: {self.source}")
        if self.depends:
            lines.append("Depends: " + ", ".join(self.depends))
        if self.conflicts:
            lines.append("Conflicts: " + ", ".join(self.conflicts))
            lines.append("Replaces: " + ", ".join(self.conflicts))
        if self.provides:
            lines.append("Provides: " + ", ".join(self.provides))
        size = sum(len(d) for d, _ in self.files.values()) // 1024 + 1
        lines.append(f"Installed-Size: {size}")
        lines.append("Description: " + self.description + STANDIN)
        return "\n".join(lines) + "\n"


def _lib_files(pkgname: str) -> dict[str, tuple[bytes, int]]:
    out = {}
    for f in sorted(os.listdir(LIB)):
        if f.endswith(".py"):
            with open(os.path.join(LIB, f), "rb") as fh:
                out[f"/usr/lib/nvidia-sim/{pkgname}/nvsim/{f}"] = (fh.read(), 0o644)
    return out


def _entry_script(src: str, pkgname: str, ver: str, branch: str, flavour: str) -> bytes:
    with open(os.path.join(HERE, src), encoding="utf-8") as fh:
        text = fh.read()
    package = {
        "driver_version": ver,
        "cuda_version": CUDA_BY_BRANCH[branch],
        "lib": f"/usr/lib/nvidia-sim/{pkgname}",
        "flavour": flavour,
    }
    marker = 'PACKAGE = {"driver_version": None, "cuda_version": None, "lib": None, "flavour": None}'
    if marker not in text:
        raise SystemExit(f"build_repo: {src} lacks the PACKAGE placeholder line")
    return text.replace(marker, f"PACKAGE = {package!r}").encode()


def packages(arch: str) -> tuple[list[Pkg], list[Pkg]]:
    """(ubuntu flavour, cuda flavour) packages for every branch."""
    comp: dict[str, list[str]] = {"smi": [], "pd": [], "kmod": [], "common": [], "meta": [], "pin": []}
    for b in BRANCHES:
        comp["smi"].append(f"nvidia-utils-{b}")
        comp["pd"].append(f"nvidia-compute-utils-{b}")
        comp["kmod"] += [f"nvidia-dkms-{b}-open", f"nvidia-dkms-{b}"]
        comp["common"].append(f"nvidia-kernel-common-{b}")
        comp["meta"] += [f"nvidia-driver-{b}-open", f"nvidia-driver-{b}"]
        comp["pin"].append(f"nvidia-driver-pinning-{b}")
    comp["smi"].append("nvidia-driver-cuda")
    comp["pd"].append("nvidia-persistenced")
    comp["kmod"] += ["nvidia-kernel-open-dkms", "nvidia-kernel-dkms"]
    comp["common"].append("nvidia-kernel-common")
    comp["meta"] += ["nvidia-open", "cuda-drivers"]

    def others(c: str, me: str) -> list[str]:
        return [n for n in comp[c] if n != me]

    ubuntu: list[Pkg] = []
    cuda: list[Pkg] = []
    for b, ver in BRANCHES.items():
        uv = ver + UBUNTU_REV
        cv = ver + CUDA_REV
        src = f"nvidia-graphics-drivers-{b}"
        fw = {f"/usr/lib/firmware/nvidia/{ver}/gsp_ga10x.bin": (b"rigops sandbox GSP firmware marker\n", 0o644)}

        def common(name: str, version: str, udev: bool, ver=ver, src=src, fw=fw) -> Pkg:
            files = dict(fw)
            if udev:
                files["/usr/lib/udev/rules.d/71-nvidia.rules"] = (UDEV_RULES.encode(), 0o644)
            return Pkg(
                name,
                version,
                f"Shared files used by the NVIDIA kernel modules ({ver})",
                arch,
                conflicts=others("common", name),
                files=files,
                source=src,
            )

        def dkms(name: str, version: str, common_dep: str, flavour: str, ver=ver, src=src) -> Pkg:
            kind = "open kernel modules" if flavour == "open" else "kernel modules"
            return Pkg(
                name,
                version,
                f"NVIDIA DKMS package ({kind}, {ver})",
                arch,
                section="restricted/kernel",
                depends=[common_dep],
                conflicts=others("kmod", name),
                provides=["nvidia-dkms-kernel"],
                files={
                    f"/usr/src/nvidia-{ver}/dkms.conf": (DKMS_CONF.format(ver=ver, flavour=flavour).encode(), 0o644)
                },
                scripts={
                    "postinst": DKMS_POSTINST.format(ver=ver, flavour=flavour),
                    "prerm": DKMS_PRERM.format(ver=ver),
                },
                source=src,
            )

        def smi(name: str, version: str, flavour: str, ver=ver, b=b, src=src) -> Pkg:
            files = _lib_files(name)
            files["/usr/bin/nvidia-smi"] = (_entry_script("nvidia-smi", name, ver, b, flavour), 0o755)
            return Pkg(
                name,
                version,
                f"NVIDIA driver support binaries: nvidia-smi ({ver})",
                arch,
                section="restricted/utils",
                conflicts=others("smi", name),
                files=files,
                source=src,
            )

        def pd(name: str, version: str, flavour: str, unit: str, extra: str, ver=ver, b=b, src=src) -> Pkg:
            files = _lib_files(name)
            files["/usr/bin/nvidia-persistenced"] = (_entry_script("nvidia-persistenced", name, ver, b, flavour), 0o755)
            files["/usr/lib/systemd/system/nvidia-persistenced.service"] = (unit.encode(), 0o644)
            return Pkg(
                name,
                version,
                f"NVIDIA compute utilities: nvidia-persistenced ({ver})",
                arch,
                section="restricted/utils",
                conflicts=others("pd", name),
                files=files,
                scripts={
                    "postinst": USER_POSTINST.format(extra=extra),
                    "prerm": SERVICE_PRERM,
                    "postrm": SERVICE_POSTRM,
                },
                source=src,
            )

        # ---- Ubuntu archive flavour
        ubuntu += [
            common(f"nvidia-kernel-common-{b}", uv, udev=True),
            dkms(f"nvidia-dkms-{b}-open", uv, f"nvidia-kernel-common-{b} (= {uv})", "open"),
            dkms(f"nvidia-dkms-{b}", uv, f"nvidia-kernel-common-{b} (= {uv})", "proprietary"),
            smi(f"nvidia-utils-{b}", uv, "ubuntu"),
            pd(f"nvidia-compute-utils-{b}", uv, "ubuntu", UBUNTU_PERSISTENCED_UNIT, ""),
        ]
        for meta, kmod_pkg in (
            (f"nvidia-driver-{b}-open", f"nvidia-dkms-{b}-open"),
            (f"nvidia-driver-{b}", f"nvidia-dkms-{b}"),
        ):
            ubuntu.append(
                Pkg(
                    meta,
                    uv,
                    f"NVIDIA driver metapackage ({'open kernel modules' if meta.endswith('-open') else 'proprietary'},"
                    f" {b})",
                    arch,
                    depends=[
                        f"nvidia-utils-{b} (= {uv})",
                        f"nvidia-compute-utils-{b} (= {uv})",
                        f"{kmod_pkg} (= {uv})",
                        f"nvidia-kernel-common-{b} (= {uv})",
                    ],
                    conflicts=others("meta", meta),
                    provides=["nvidia-driver-binary"],
                    source=src,
                )
            )
        # ---- CUDA repository flavour (unversioned names, branch chosen by a pinning package)
        cuda += [
            common("nvidia-kernel-common", cv, udev=False),
            dkms("nvidia-kernel-open-dkms", cv, f"nvidia-kernel-common (= {cv})", "open"),
            dkms("nvidia-kernel-dkms", cv, f"nvidia-kernel-common (= {cv})", "proprietary"),
            smi("nvidia-driver-cuda", cv, "cuda"),
            pd("nvidia-persistenced", cv, "cuda", CUDA_PERSISTENCED_UNIT, CUDA_PERSISTENCED_EXTRA),
        ]
        for meta, kmod_pkg in (("nvidia-open", "nvidia-kernel-open-dkms"), ("cuda-drivers", "nvidia-kernel-dkms")):
            cuda.append(
                Pkg(
                    meta,
                    cv,
                    f"NVIDIA driver metapackage ({'open kernel modules' if meta == 'nvidia-open' else 'proprietary'})",
                    arch,
                    depends=[
                        f"nvidia-driver-cuda (= {cv})",
                        f"nvidia-persistenced (= {cv})",
                        f"{kmod_pkg} (= {cv})",
                        f"nvidia-kernel-common (= {cv})",
                    ],
                    conflicts=others("meta", meta),
                    source="nvidia-driver",
                )
            )
        pin_names = " ".join(
            ("nvidia-open", "cuda-drivers", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms")
            + ("nvidia-kernel-common", "nvidia-persistenced")
        )
        pin = f"Package: {pin_names}\nPin: version {b}.*\nPin-Priority: 1000\n"
        cuda.append(
            Pkg(
                f"nvidia-driver-pinning-{b}",
                cv,
                f"Pins the NVIDIA driver packages of the CUDA repository to the {b} branch",
                "all",
                section="multiverse/devel",
                conflicts=others("pin", f"nvidia-driver-pinning-{b}"),
                files={f"/etc/apt/preferences.d/nvidia-driver-pinning-{b}": (pin.encode(), 0o644)},
                source="nvidia-driver-pinning",
            )
        )
    return ubuntu, cuda


def build_deb(pkg: Pkg, outdir: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(os.path.join(root, "DEBIAN"))
        conffiles = []
        files = dict(pkg.files)
        files.setdefault(
            f"/usr/share/doc/{pkg.name}/README.rigops",
            (
                f"{pkg.name} {pkg.version}: rigops sandbox stand-in (lab/sandbox/driver_repo/README.md).\n".encode(),
                0o644,
            ),
        )
        for path, (data, mode) in files.items():
            full = os.path.join(root, path.lstrip("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as fh:
                fh.write(data)
            os.chmod(full, mode)
            if path.startswith("/etc/"):
                conffiles.append(path)
        with open(os.path.join(root, "DEBIAN", "control"), "w", encoding="utf-8") as fh:
            fh.write(pkg.control())
        if conffiles:
            with open(os.path.join(root, "DEBIAN", "conffiles"), "w", encoding="utf-8") as fh:
                fh.write("\n".join(conffiles) + "\n")
        for name, body in pkg.scripts.items():
            p = os.path.join(root, "DEBIAN", name)
            with open(p, "w", encoding="utf-8") as fh:
                fh.write(body)
            os.chmod(p, 0o755)
        for dirpath, dirnames, _ in os.walk(root):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
        out = os.path.join(outdir, f"{pkg.name}_{pkg.version}_{pkg.arch}.deb")
        os.makedirs(outdir, exist_ok=True)
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", root, out], check=True, stdout=subprocess.DEVNULL
        )
        return out


# ---------------------------------------------------------------- signing
def _gpg(gnupg: str, *args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, GNUPGHOME=gnupg, LC_ALL="C")
    return subprocess.run(["gpg", "--batch", "--quiet", "--no-tty", *args], env=env, check=True, **kw)


def ensure_key(gnupg: str) -> str:
    os.makedirs(gnupg, mode=0o700, exist_ok=True)
    os.chmod(gnupg, 0o700)
    listed = _gpg(gnupg, "--with-colons", "--list-secret-keys", capture_output=True, text=True)
    fprs = [ln.split(":")[9] for ln in listed.stdout.splitlines() if ln.startswith("fpr:")]
    if fprs:
        return fprs[0]
    _gpg(gnupg, "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
    listed = _gpg(gnupg, "--with-colons", "--list-secret-keys", capture_output=True, text=True)
    return [ln.split(":")[9] for ln in listed.stdout.splitlines() if ln.startswith("fpr:")][0]


def sign_release(gnupg: str, fpr: str, release: str) -> None:
    d = os.path.dirname(release)
    _gpg(
        gnupg,
        "--yes",
        "--local-user",
        fpr,
        "--clearsign",
        "--digest-algo",
        "SHA512",
        "-o",
        os.path.join(d, "InRelease"),
        release,
    )
    _gpg(
        gnupg,
        "--yes",
        "--local-user",
        fpr,
        "-abs",
        "--digest-algo",
        "SHA512",
        "-o",
        os.path.join(d, "Release.gpg"),
        release,
    )


def _ftparchive(args: list[str], cwd: str) -> bytes:
    return subprocess.run(["apt-ftparchive", *args], cwd=cwd, check=True, capture_output=True).stdout


def _release_opts(suite: str, arch: str, components: str | None, label: str) -> list[str]:
    opts = {
        "Origin": "rigops-sim",
        "Label": label,
        "Suite": suite,
        "Codename": suite,
        "Architectures": arch,
        "Description": "rigops sandbox stand-in NVIDIA driver packages (not NVIDIA software)",
    }
    if components:
        opts["Components"] = components
    out = []
    for k, v in opts.items():
        out += ["-o", f"APT::FTPArchive::Release::{k}={v}"]
    return out


def _write_packages(dirpath: str, data: bytes) -> None:
    os.makedirs(dirpath, exist_ok=True)
    with open(os.path.join(dirpath, "Packages"), "wb") as fh:
        fh.write(data)
    with gzip.GzipFile(os.path.join(dirpath, "Packages.gz"), "wb", mtime=0) as fh:
        fh.write(data)


def build_repo(out: str, arch: str) -> str:
    gnupg = os.path.join(out, "gnupg")
    fpr = ensure_key(gnupg)
    stage = tempfile.mkdtemp(prefix="repo.", dir=out)
    ubuntu, cuda = packages(arch)
    # Ubuntu archive flavour
    uroot = os.path.join(stage, "ubuntu")
    for pkg in ubuntu:
        branch = pkg.name.split("-")[-2] if pkg.name.endswith("-open") else pkg.name.split("-")[-1]
        build_deb(pkg, os.path.join(uroot, "pool", "restricted", "n", f"nvidia-graphics-drivers-{branch}"))
    pk = _ftparchive(["packages", "pool"], uroot)
    for suite in SUITES:
        dist = os.path.join(uroot, "dists", suite)
        _write_packages(os.path.join(dist, "restricted", f"binary-{arch}"), pk)
        rel = _ftparchive([*_release_opts(suite, arch, "restricted", "rigops-sim ubuntu"), "release", "."], dist)
        with open(os.path.join(dist, "Release"), "wb") as fh:
            fh.write(rel)
        sign_release(gnupg, fpr, os.path.join(dist, "Release"))
    # CUDA repository flavour: flat repositories
    cuda_arch = {"amd64": "x86_64", "arm64": "sbsa"}.get(arch, arch)
    first = None
    for distro in CUDA_DISTROS:
        d = os.path.join(stage, "cuda", distro, cuda_arch)
        os.makedirs(d, exist_ok=True)
        if first is None:
            for pkg in cuda:
                build_deb(pkg, d)
            first = d
        else:
            for f in os.listdir(first):
                if f.endswith(".deb"):
                    shutil.copy2(os.path.join(first, f), os.path.join(d, f))
        _write_packages(d, _ftparchive(["packages", "."], d))
        rel = _ftparchive([*_release_opts(distro, arch, None, f"rigops-sim cuda {distro}"), "release", "."], d)
        with open(os.path.join(d, "Release"), "wb") as fh:
            fh.write(rel)
        sign_release(gnupg, fpr, os.path.join(d, "Release"))
    # public key at the root, binary and armored
    with open(os.path.join(stage, f"{KEYRING}.gpg"), "wb") as fh:
        fh.write(_gpg(gnupg, "--export", fpr, capture_output=True).stdout)
    with open(os.path.join(stage, f"{KEYRING}.asc"), "wb") as fh:
        fh.write(_gpg(gnupg, "--armor", "--export", fpr, capture_output=True).stdout)
    final = os.path.join(out, "repo")
    old = final + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(stage, final)
    os.chmod(final, 0o755)
    shutil.rmtree(old, ignore_errors=True)
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(os.environ, GNUPGHOME=gnupg), check=False)
    return fpr


def source_hash(arch: str) -> str:
    h = hashlib.sha256(arch.encode())
    files = [os.path.realpath(__file__), os.path.join(HERE, "nvidia-smi"), os.path.join(HERE, "nvidia-persistenced")]
    files += [os.path.join(LIB, f) for f in sorted(os.listdir(LIB)) if f.endswith(".py")]
    for f in files:
        h.update(os.path.basename(f).encode())
        with open(f, "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory; the served tree is OUT/repo")
    ap.add_argument("--force", action="store_true", help="rebuild even when the sources are unchanged")
    default_arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=False).stdout
    ap.add_argument(
        "--arch", default=default_arch.strip() or "amd64", help="Debian architecture (default: this host's)"
    )
    args = ap.parse_args(argv)
    for tool in ("dpkg-deb", "apt-ftparchive", "gpg"):
        if not shutil.which(tool):
            sys.stderr.write(f"build_repo: {tool} is missing (apt-get install dpkg-dev apt-utils gnupg)\n")
            return 2
    t0 = time.monotonic()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    stamp = os.path.join(out, ".source-hash")
    digest = source_hash(args.arch)
    try:
        with open(stamp, encoding="utf-8") as fh:
            old = fh.read().strip()
    except FileNotFoundError:
        old = ""
    complete = os.path.exists(os.path.join(out, "repo", f"{KEYRING}.gpg"))
    if old == digest and complete and not args.force:
        print(f"nvidia-sim repo: cached ({time.monotonic() - t0:.1f}s) {out}/repo")
        return 0
    build_repo(out, args.arch)
    with open(stamp, "w", encoding="utf-8") as fh:
        fh.write(digest + "\n")
    print(f"nvidia-sim repo: built ({time.monotonic() - t0:.1f}s) {out}/repo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
