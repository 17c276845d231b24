"""The collection's artifact, as people get it: what goes in and what stays out, and that the main job runs
from it (installed into an empty folder, run from a folder outside the checkout) down to every stage's tasks.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import pytest
import yaml
from collection_build import ROOT, build, install, outside_env, run, tool

# The artifact's top level: exactly these (a new folder in the checkout goes in, or into galaxy.yml's
# build_ignore, by decision).
TOP_LEVEL = {
    "CHANGELOG.md", "FILES.json", "LICENSE", "MANIFEST.json", "README.md", "bindep.txt", "requirements.txt",
    "requirements-bench.txt", "requirements.yml", "commands", "docs", "inventories", "meta", "playbooks", "plugins",
    "roles",
}  # fmt: skip
# Folders of the checkout that ship whole (every file in them is in the artifact).
SHIPPED = ["plugins", "roles", "playbooks", "inventories", "docs", "meta", "commands"]
# What never ships (at the top level; __pycache__ nowhere): the lab, the tests, the checkout's own tooling
# and settings, what builds leave.
LEFT_OUT = {
    ".collections", ".venv", ".ci", ".config", ".git", "tests", "molecule", "lab",
    "reports", "build", "context", "strategy_plugins", "rigops", "site.yml", "ansible.cfg", "pyproject.toml",
    "requirements-dev.txt", "execution-environment.yml",
}  # fmt: skip
# The gpu-rigs job's plays (playbooks/gpu_rigs.yml, after site.yml's caches), each by the start of its name,
# with a task of its own: the role's tasks come from the installed collection by their FQCN.
STAGES = {
    "Caches": "rigops.fleet.fleet_cache : Preflight | Variables are of their kinds and consistent",
    "Preflight": "Preflight | The stages this run selects start",
    "Driver": "rigops.fleet.nvidia_driver : Preflight | Variables are of their kinds and consistent",
    "Topology": "rigops.fleet.gpu_topology : ",
    "Runtime": "rigops.fleet.vllm_runtime : Preflight | Judge the host against the build",
    "Weights": "rigops.fleet.model_weights : ",
    "Services": "rigops.fleet.vllm_service : ",
    "Health": "Health | Gate every instance of the rig",
    "Gateway": "rigops.fleet.llm_gateway : ",
    "Report": "Report | JSON of the run",
}
# Plays of a stage record on the host that they passed (playbooks/tasks/stage_*.yml; the preflight records that
# they started).
RECORDED = ["Driver", "Topology", "Runtime", "Weights", "Services", "Health", "Gateway"]


def _real_files(folder: Path) -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("build"))


@pytest.fixture(scope="module")
def installed(artifact, tmp_path_factory) -> Path:
    """The collection installed from the artifact into an empty collections path: its folder."""
    return install(artifact, tmp_path_factory.mktemp("collections"))


def test_the_artifact_holds_what_ships_and_nothing_of_the_lab(artifact):
    with tarfile.open(artifact) as tar:
        names = {m.name.removeprefix("./").rstrip("/") for m in tar.getmembers()}
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert {n.split("/")[0] for n in names} == TOP_LEVEL
    missing = set().union(*(_real_files(ROOT / d) for d in SHIPPED)) - names
    assert not missing, f"in the checkout but not in the artifact: {sorted(missing)[:20]}"
    leaked = sorted(n for n in names if n.split("/")[0] in LEFT_OUT or "__pycache__" in n or n.endswith(".pyc"))
    assert not leaked, f"in the artifact but not meant to ship: {leaked[:20]}"
    for command in ("rollout.py", "bench_report.py", "fleet_plan.py"):
        assert f"commands/{command}" in names
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    info = manifest["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("rigops", "fleet", galaxy["version"])
    assert info["dependencies"] == galaxy["dependencies"]


def test_playbooks_name_no_file_outside_the_collection(installed):
    """A path built from playbook_dir must lie inside the installed collection (the checkout's own folders,
    reports/ next to site.yml or commands/, are not there): reports go under the current folder instead."""
    for path in [*installed.glob("playbooks/**/*.yml"), *installed.glob("roles/**/*.yml")]:
        text, where = path.read_text(), path.relative_to(installed)
        assert not re.search(r"playbook_dir\s*\|\s*dirname", text), f"{where}: playbook_dir's parent"
        for target in re.findall(r"playbook_dir\s*~\s*'/([^']+)'", text):  # playbook_dir: playbooks/
            resolved = (installed / "playbooks" / target).resolve()
            assert resolved.is_relative_to(installed) and resolved.exists(), f"{where}: {target}"


def _plays(listing: str) -> list[tuple[str, str, list[str]]]:
    """(hosts, name, task names) of each play of `ansible-playbook --list-tasks`."""
    plays = []
    for line in listing.splitlines():
        play = re.match(r"\s+play #\d+ \(([^)]*)\): (.*?)\tTAGS:", line)
        if play:
            plays.append((play.group(1), play.group(2), []))
        elif plays and line.startswith("      ") and line.strip():
            plays[-1][2].append(line.strip().split("\tTAGS:")[0])
    return plays


def test_the_site_playbook_runs_from_the_installed_collection_outside_the_checkout(installed, tmp_path):
    """`ansible-playbook rigops.fleet.site --list-tasks -l gpu-rigs` from a folder with no ansible.cfg, with the
    install folder as the only collections path: every stage of the job, its roles' tasks from the install."""
    collections_path = installed.parents[2]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(ROOT.resolve()) and not (elsewhere / "ansible.cfg").exists()
    env = outside_env(collections_path)

    # the only rigops.fleet Ansible finds is the installed one (not the checkout's .collections)
    found = run([tool("ansible-galaxy"), "collection", "list", "rigops.fleet", "--format", "json"], elsewhere, env)
    assert found.returncode == 0, found.stderr
    assert list(json.loads(found.stdout)) == [str(collections_path / "ansible_collections")], found.stdout

    inventory = installed / "inventories" / "sandbox"
    cmd = [tool("ansible-playbook"), "rigops.fleet.site", "--list-tasks", "-l", "gpu-rigs", "-i", inventory]
    proc = run(cmd, elsewhere, env)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert "[ERROR]" not in proc.stderr, proc.stderr
    assert f"playbook: {installed / 'playbooks' / 'site.yml'}" in proc.stdout
    assert str(ROOT) not in proc.stdout + proc.stderr

    plays = _plays(proc.stdout)
    gpu = [(name, tasks) for hosts, name, tasks in plays if hosts in ("gpu-rigs", "caches", "")]
    for stage, task in STAGES.items():
        mine = [tasks for name, tasks in gpu if name.startswith(f"{stage} | ")]
        assert mine, f"no {stage} play in the listing:\n{proc.stdout[:3000]}"
        assert any(t.startswith(task) for tasks in mine for t in tasks), f"{stage}: no task {task!r}: {mine[0][:8]}"
        if stage in RECORDED:
            assert all("Stage | Record that it passed, with its figures" in tasks for tasks in mine), stage
    roles = {t.split(" : ")[0] for _, tasks in gpu for t in tasks if " : " in t}
    assert roles >= {f"rigops.fleet.{r}" for r in ("nvidia_driver", "gpu_topology", "vllm_runtime", "model_weights")}
