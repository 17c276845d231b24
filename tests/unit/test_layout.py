"""Where things live (the README's Layout): each role's tests under its name, no product code loading by path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
TEST_FILES = sorted(p.name for p in (ROOT / "tests" / "unit").glob("test_*.py")) + sorted(
    p.name for p in (ROOT / "molecule").glob("*/tests/test_*.py")
)
# What ships: the collection's own code and the commands (galaxy.yml builds everything but the lab and tests).
PRODUCT = sorted(
    p
    for folder in ("plugins", "roles", "playbooks", "commands")
    if (ROOT / folder).is_dir()
    for p in (ROOT / folder).rglob("*")
    if p.is_file() and (p.suffix in (".py", ".yml", ".j2") or p.parent.name == "files")
)


@pytest.mark.parametrize("role", ROLES)
def test_each_roles_tests_are_found_under_its_name(role):
    assert any(name.startswith(f"test_{role}") for name in TEST_FILES), (
        f"no tests/unit/test_{role}*.py nor molecule/*/tests/test_{role}*.py"
    )


def test_no_product_code_loads_a_file_by_path_or_edits_the_import_path():
    bad = re.compile(r"spec_from_file_location|sys\.path\.(insert|append)|role_path \}\}/\.\.|PYTHONPATH")
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in PRODUCT
        for m in [bad.search(p.read_text(errors="replace"))]
        if m
    ]
    assert found == []


def test_the_plain_data_helper_exists_once():
    found = [p.relative_to(ROOT) for p in ROOT.joinpath("plugins").rglob("*.py") if "def plain(" in p.read_text()]
    found += [p.relative_to(ROOT) for p in ROOT.joinpath("plugins").rglob("*.py") if "def _plain(" in p.read_text()]
    assert [str(p) for p in found] == ["plugins/plugin_utils/plain.py"]


def test_one_merge_of_instances():
    """The instance contract is merged in plugins/module_utils/vllm_instances.py only (docs/instances.md)."""
    merges = [
        str(p.relative_to(ROOT))
        for p in ROOT.joinpath("plugins").rglob("*.py")
        if re.search(r"^def (_?merge\w*)\(", p.read_text(), re.M)
    ]
    assert merges == ["plugins/module_utils/vllm_instances.py"]
