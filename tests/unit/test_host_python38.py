"""Modules and module_utils run on the managed hosts, whose Python may be 3.8 (Ubuntu 20.04, JetPack 5): no newer
syntax, no zip(strict=) (3.10). ansible-test's compile test covers 3.8 only where a python3.8 is installed, which a
Debian 12 controller has not (test_ansible_test_sanity.py runs it on the controller's Python)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# and the roles' Python scripts that run as services or tools on the hosts (roles/*/files, python3 shebang)
SHEBANG = b"#!/usr/bin/python3"
SCRIPTS = [p for p in (ROOT / "roles").glob("*/files/*") if p.is_file() and p.read_bytes().startswith(SHEBANG)]
HOST_CODE = sorted(
    [*(ROOT / "plugins" / "module_utils").glob("*.py"), *(ROOT / "plugins" / "modules").glob("*.py"), *SCRIPTS]
)


@pytest.mark.parametrize("path", HOST_CODE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_host_code_stays_python_38(path):
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "zip":
            assert not any(k.arg == "strict" for k in node.keywords), f"{path.name}: zip(strict=) needs Python 3.10"
