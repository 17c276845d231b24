# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Seed a new runtime release from the live one: hardlink the distributions both pin alike.

A release is a fresh venv (a new set of pins never touches the live one). Most releases change
a pin or two: the torch and vLLM wheels, gigabytes once unpacked and byte-compiled, are the same.
``seed`` gives the new venv every distribution of the old one whose name and version the new
requirements pin, file by file from the distribution's RECORD: hardlinks (no bytes copied, no
byte-compiling again), and copies with the interpreter line rewritten for the console scripts
(their ``#!`` names the old venv's python). pip then finds those already installed and installs
only what changed. The smoke test of the release judges the result, as for any release.

Why by hand: pip and venv have no way to reuse an installed distribution in another venv, and
uv (which hardlinks from its cache) is not on the hosts. Only distributions pinned to the same
version are seeded; the rest are pip's. Plain data in and out; the I/O is stdlib (os, csv).
"""

import csv
import os
import re
import shutil

PIN_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


def normalize(name):
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text):
    """{normalised name: version} of the `name==version` lines of a requirements file (hashes,
    continuation lines, comments and options are skipped)."""
    pins = {}
    for line in text.splitlines():
        if line.lstrip().startswith(("#", "-")):
            continue
        m = PIN_RE.match(line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


def site_packages(venv):
    """The venv's site-packages folder (lib/pythonX.Y/site-packages), or None."""
    lib = os.path.join(venv, "lib")
    if not os.path.isdir(lib):
        return None
    for entry in sorted(os.listdir(lib)):
        path = os.path.join(lib, entry, "site-packages")
        if entry.startswith("python") and os.path.isdir(path):
            return path
    return None


def _metadata(dist_info):
    name = version = None
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
    except OSError:
        return None, None
    return name, version


def installed(site):
    """[(normalised name, version, dist-info folder)] of the distributions in a site-packages."""
    out = []
    for entry in sorted(os.listdir(site)):
        if entry.endswith(".dist-info"):
            name, version = _metadata(os.path.join(site, entry))
            if name and version:
                out.append((normalize(name), version, os.path.join(site, entry)))
    return out


def record_files(dist_info, site, venv):
    """Absolute paths of the files a distribution's RECORD lists, each inside the venv; raises
    ValueError on a path that leaves it (a RECORD is data: never follow it outside)."""
    files = []
    with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", newline="") as fh:
        for row in csv.reader(fh):
            if not row or not row[0]:
                continue
            path = os.path.normpath(os.path.join(site, row[0]))
            if os.path.commonpath([path, venv]) != venv:
                raise ValueError(f"RECORD of {os.path.basename(dist_info)} names {row[0]} outside the venv")
            files.append(path)
    return files


def _is_script(path, old_python_dir):
    """A console script of the old venv: a text file whose #! line names the old venv."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return False
    return first.startswith(b"#!") and old_python_dir.encode() in first


def plan(old_venv, new_venv, pins):
    """What seed would do: (dists to seed [(name, version, dist-info)], reasons it cannot seed)."""
    old_site, new_site = site_packages(old_venv), site_packages(new_venv)
    if not old_site or not new_site:
        return [], [f"no site-packages in {old_venv if not old_site else new_venv}"]
    old_python, new_python = (os.path.basename(os.path.dirname(site)) for site in (old_site, new_site))
    if old_python != new_python:
        return [], [f"the venvs are made by different Pythons ({old_python} and {new_python})"]
    present = {name for name, _version, _folder in installed(new_site)}
    dists = [d for d in installed(old_site) if pins.get(d[0]) == d[1] and d[0] not in present]
    return dists, []


def seed(old_venv, new_venv, requirements_text, dry_run=False):
    """Hardlink into new_venv the distributions of old_venv that requirements_text pins alike.

    Returns {"seeded": [name==version], "files": n, "bytes": b, "scripts": n, "reasons": [...]}.
    """
    old_venv, new_venv = os.path.realpath(old_venv), os.path.realpath(new_venv)
    dists, reasons = plan(old_venv, new_venv, parse_pins(requirements_text))
    result = {"seeded": [], "files": 0, "bytes": 0, "scripts": 0, "reasons": reasons}
    if reasons:
        return result
    old_site = site_packages(old_venv)
    old_bin = os.path.join(old_venv, "bin")
    for name, version, dist_info in dists:
        files = record_files(dist_info, old_site, old_venv)
        for src in files:
            if not os.path.isfile(src) or os.path.islink(src):
                continue
            dst = os.path.join(new_venv, os.path.relpath(src, old_venv))
            script = os.path.dirname(src) == old_bin and _is_script(src, old_venv)
            result["files"] += 1
            result["scripts"] += int(script)
            result["bytes"] += 0 if script else os.path.getsize(src)
            if dry_run:
                continue
            parent = os.path.dirname(dst)
            if not os.path.isdir(parent):
                os.makedirs(parent)
            if os.path.lexists(dst):
                os.unlink(dst)
            if script:
                with open(src, "rb") as fh:
                    data = fh.read()
                with open(dst, "wb") as fh:
                    fh.write(data.replace(old_venv.encode(), new_venv.encode(), 1))
                shutil.copymode(src, dst)
            else:
                try:
                    os.link(src, dst)
                except OSError:  # another file system: a copy
                    shutil.copy2(src, dst)
        result["seeded"].append(f"{name}=={version}")
    return result
