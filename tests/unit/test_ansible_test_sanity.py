"""`ansible-test sanity` on the collection as it ships: installed from its artifact into
<tmp>/ansible_collections/rigops/fleet (ansible-test wants that path as a real folder; the checkout's .collections
link resolves back to the checkout), with tests/sanity/ (the ignore file) copied in, since the artifact leaves
tests/ out.

--venv: ansible-test makes a virtualenv per sanity test under ~/.ansible/test/venv with its own pinned tools
(pylint, pycodestyle, yamllint, voluptuous, ...) from PyPI, and reuses them in later runs. --python: the
controller's Python, the one the tests run on (3.11); the compile and import tests run on it only, so the hosts'
Python 3.8 is checked by test_host_python38.py.

Each of those virtualenvs starts without pip, which ansible-test installs with get-pip.py from
ci-files.testing.ansible.com, a host this network does not reach (PyPI it does). When ansible-test says it could
not download it, a stand-in goes where it says the script can be saved by hand: it installs the same pip from
its wheel on PyPI. Then the run is repeated.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from collection_build import ROOT, build, install, outside_env, run, tool

IGNORES = ROOT / "tests" / "sanity"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
NO_BOOTSTRAP = re.compile(r"The bootstrap script can be manually downloaded and saved to: (\S+get_pip_(\d+)_(\d+)\.py)")
GET_PIP = '''\
"""Stand-in for get-pip.py {version}, written by rigops (tests/unit/test_ansible_test_sanity.py): ansible-test
installs pip into its virtualenvs with get-pip.py from ci-files.testing.ansible.com, which this network does
not reach. This installs pip {version} from its wheel (from PyPI), with the arguments get-pip.py takes."""
import sys

sys.path.insert(0, {wheel!r})
from pip._internal.cli.main import main

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", *args]))
'''


def _get_pip_stand_in(path: Path, version: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", f"pip=={version}"]
    proc = run([*cmd, "-d", path.parent], cwd=path.parent, env=outside_env())
    wheels = sorted(path.parent.glob(f"pip-{version}-*.whl"))
    assert wheels, f"pip download pip=={version} failed: {proc.stderr[-2000:]}"
    path.write_text(GET_PIP.format(version=version, wheel=str(wheels[0])))


def _sanity(collection: Path):
    cmd = [tool("ansible-test"), "sanity", "--python", PYTHON, "--venv", "--color", "no"]
    return run(cmd, cwd=collection, env=outside_env(), timeout=1800)


@pytest.fixture
def shipped_collection(tmp_path):
    """The installed artifact plus the ignore file, in a short temporary folder: ansible-test's virtualenv under
    tests/output names its Python in script shebangs, which Linux cuts at 127 characters."""
    with tempfile.TemporaryDirectory(prefix="rigops-sanity-") as short:
        collection = install(build(tmp_path / "build"), Path(short))
        shutil.copytree(IGNORES, collection / "tests" / "sanity")
        yield collection


def test_ansible_test_sanity_passes_on_the_shipped_collection(shipped_collection):
    proc = _sanity(shipped_collection)
    output = proc.stdout + proc.stderr
    missing = NO_BOOTSTRAP.search(output)
    if proc.returncode and missing:
        _get_pip_stand_in(Path(missing.group(1)), f"{missing.group(2)}.{missing.group(3)}")
        proc = _sanity(shipped_collection)
        output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith(("ERROR:", "FATAL:"))]
    assert proc.returncode == 0, "ansible-test sanity:\n" + "\n".join(errors[:60] or output.splitlines()[-60:])
    assert 'Running sanity test "validate-modules"' in output and 'Running sanity test "pylint"' in output


def test_the_ignore_file_is_short_and_says_why():
    """Each ignored finding of ansible-test names its file, its test and, after #, why it cannot be fixed."""
    lines = (IGNORES / "ignore-2.19.txt").read_text().splitlines()
    assert 0 < len(lines) <= 8
    for line in lines:
        entry, _, why = line.partition(" # ")
        assert (ROOT / entry.split()[0]).is_file() and len(entry.split()) == 2, line
        assert len(why.split()) >= 5, f"no reason given: {line}"
