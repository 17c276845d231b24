"""execution-environment.yml: `ansible-builder create` writes the image's build context from it, with the
collection's artifact, the controller's Python requirements and bindep.txt in it, and its pins agree with
requirements.txt and galaxy.yml. (Building the image needs a container registry: not here.)
"""

from __future__ import annotations

import re
import shutil

import yaml
from collection_build import ROOT, build, outside_env, run, tool

EE = ROOT / "execution-environment.yml"


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_the_pins_agree_with_requirements_and_galaxy():
    ee = yaml.safe_load(EE.read_text())
    deps, pins = ee["dependencies"], _pins()
    assert deps["ansible_core"]["package_pip"] == f"ansible-core=={pins['ansible-core']}"
    assert deps["ansible_runner"]["package_pip"] == f"ansible-runner=={pins['ansible-runner']}"
    assert deps["python"] == "requirements.txt" and deps["system"] == "bindep.txt"
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    assert deps["galaxy"]["collections"] == [{"name": f"/build/rigops/rigops-fleet-{version}.tar.gz", "type": "file"}]


def test_ansible_builder_create_writes_the_build_context(tmp_path):
    """The definition and the files it names, laid out as in the checkout, the artifact in build/."""
    for name in ("execution-environment.yml", "requirements.txt", "bindep.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    artifact = build(tmp_path / "build")
    cmd = [tool("ansible-builder"), "create", "-f", tmp_path / "execution-environment.yml", "-c", tmp_path / "context"]
    proc = run(cmd, cwd=tmp_path, env=outside_env())
    assert proc.returncode == 0, f"ansible-builder create:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "No matches" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr

    built = tmp_path / "context" / "_build"
    assert (built / "rigops" / artifact.name).read_bytes() == artifact.read_bytes()
    assert (built / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()
    assert (built / "bindep.txt").read_text() == (ROOT / "bindep.txt").read_text()
    galaxy = yaml.safe_load((built / "requirements.yml").read_text())
    assert galaxy == {"collections": [{"name": f"/build/rigops/{artifact.name}", "type": "file"}]}
    containerfile = (tmp_path / "context" / "Containerfile").read_text()
    assert 'ARG ANSIBLE_GALAXY_CLI_COLLECTION_OPTS="--no-deps"' in containerfile
    assert "COPY _build /build" in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    assert "introspect --user-pip=requirements.txt --user-bindep=bindep.txt" in containerfile
