"""Sanity of every custom module, the way Ansible's own sanity tests check a collection.

For each ``library/*.py``: ``DOCUMENTATION``, ``EXAMPLES`` and ``RETURN`` parse as YAML;
the documented options match the module's ``argument_spec`` (names, types, defaults,
choices, required, aliases, ``no_log`` for secrets); check mode is documented and matches
``supports_check_mode``; every ``RETURN`` key has a description and a type; the examples
call the module by its name; and ``ansible-doc`` renders the module.

The argument spec is read the way ansible-test's validate-modules reads it: ``main()``
runs with ``AnsibleModule`` replaced by a stand-in that records its arguments and stops.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "plugins" / "modules").glob("*.py"))
# Option names that carry secrets: declared no_log (a path to a secret, api_key_file, is not one).
SECRET = re.compile(r"(^|_)(token|password|secret|api_key)$")


class _Captured(Exception):
    def __init__(self, kwargs):
        super().__init__("captured")
        self.kwargs = kwargs


def _doc_blocks(path: Path) -> dict[str, str]:
    blocks = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                blocks[name] = node.value.value
    return blocks


def _argument_spec(path: Path, monkeypatch) -> dict:
    module = importlib.import_module(f"ansible_collections.rigops.fleet.plugins.modules.{path.stem}")

    def _capture(*args, **kwargs):
        if args:
            kwargs["argument_spec"] = args[0]
        raise _Captured(kwargs)

    monkeypatch.setattr(module, "AnsibleModule", _capture)
    with pytest.raises(_Captured) as info:
        module.main()
    return info.value.kwargs


@pytest.fixture(params=MODULES, ids=lambda p: p.stem)
def module_file(request) -> Path:
    return request.param


def test_doc_blocks_are_yaml(module_file):
    blocks = _doc_blocks(module_file)
    assert sorted(blocks) == ["DOCUMENTATION", "EXAMPLES", "RETURN"], f"{module_file.name}: missing doc blocks"
    for name, text in blocks.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail(f"{module_file.name}: {name} is not valid YAML: {exc}")


def _normalise_default(value, kind):
    if kind == "path" and value is not None:
        return str(value)
    return value


def test_documented_options_match_argument_spec(module_file, monkeypatch):
    doc = yaml.safe_load(_doc_blocks(module_file)["DOCUMENTATION"])
    assert doc["module"] == module_file.stem
    kwargs = _argument_spec(module_file, monkeypatch)
    spec = kwargs["argument_spec"]
    documented = doc.get("options") or {}
    assert sorted(documented) == sorted(spec), (
        f"{module_file.name}: documented options {sorted(documented)} differ from argument_spec {sorted(spec)}"
    )
    problems = []
    for name, arg in spec.items():
        opt = documented[name]
        kind = arg.get("type", "str")
        if opt.get("type", "str") != kind:
            problems.append(f"{name}: type {opt.get('type', 'str')} documented, {kind} in the spec")
        if _normalise_default(opt.get("default"), kind) != _normalise_default(arg.get("default"), kind):
            problems.append(f"{name}: default {opt.get('default')!r} documented, {arg.get('default')!r} in the spec")
        if list(opt.get("choices") or []) != list(arg.get("choices") or []):
            problems.append(f"{name}: choices {opt.get('choices')} documented, {arg.get('choices')} in the spec")
        if bool(opt.get("required", False)) != bool(arg.get("required", False)):
            problems.append(f"{name}: required {opt.get('required', False)} documented, {arg.get('required')} in spec")
        if sorted(opt.get("aliases") or []) != sorted(arg.get("aliases") or []):
            problems.append(f"{name}: aliases {opt.get('aliases')} documented, {arg.get('aliases')} in the spec")
        if kind == "list" and opt.get("elements") != arg.get("elements"):
            problems.append(f"{name}: elements {opt.get('elements')} documented, {arg.get('elements')} in the spec")
        if not opt.get("description"):
            problems.append(f"{name}: no description")
        if SECRET.search(name) and not arg.get("no_log"):
            problems.append(f"{name}: carries a secret but is not no_log in the spec")
    assert not problems, f"{module_file.name}:\n  " + "\n  ".join(problems)


def test_check_mode_is_documented_and_supported(module_file, monkeypatch):
    doc = yaml.safe_load(_doc_blocks(module_file)["DOCUMENTATION"])
    support = doc.get("attributes", {}).get("check_mode", {}).get("support")
    assert support in ("full", "partial", "none"), f"{module_file.name}: attributes.check_mode.support missing"
    kwargs = _argument_spec(module_file, monkeypatch)
    assert bool(kwargs.get("supports_check_mode")) == (support != "none"), (
        f"{module_file.name}: check_mode support {support} documented, supports_check_mode="
        f"{kwargs.get('supports_check_mode')} in the module"
    )


def test_return_keys_are_described(module_file):
    ret = yaml.safe_load(_doc_blocks(module_file)["RETURN"]) or {}

    def walk(entries, prefix=""):
        for key, entry in entries.items():
            where = f"{prefix}{key}"
            assert isinstance(entry, dict), f"{module_file.name}: RETURN {where} is not a mapping"
            # like validate-modules: `returned` on top-level keys; description and type everywhere
            for field in ("description", "type") + (() if prefix else ("returned",)):
                assert entry.get(field) not in (None, ""), f"{module_file.name}: RETURN {where} has no {field}"
            if "contains" in entry:
                walk(entry["contains"], where + ".")

    walk(ret)


def test_examples_call_the_module(module_file):
    examples = yaml.safe_load(_doc_blocks(module_file)["EXAMPLES"])
    assert isinstance(examples, list) and examples, f"{module_file.name}: EXAMPLES is not a list of tasks"
    assert all(task.get("name") for task in examples), f"{module_file.name}: an example has no name"
    assert any(module_file.stem in task for task in examples), f"{module_file.name}: no example calls the module"


def _ansible_doc(names: list[str]) -> tuple[int, dict, str]:
    exe = shutil.which("ansible-doc", path=str(Path(sys.executable).parent)) or shutil.which("ansible-doc")
    assert exe, "ansible-doc not found next to the test's Python"
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
    )
    proc = subprocess.run(
        [exe, "-t", "module", "--json", *names],
        check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    return proc.returncode, (yaml.safe_load(proc.stdout) or {}) if proc.stdout.strip() else {}, proc.stderr


@pytest.fixture(scope="module")
def ansible_doc() -> dict[str, tuple[int, dict, str]]:
    """``ansible-doc -t module --json`` of each module: one run for all of them (each run costs a second
    of start-up and plugin loading), and a run per module only when that one fails (one module it cannot
    render fails the whole run), so that a failure names its module."""
    names = [f"rigops.fleet.{m.stem}" for m in MODULES]
    rc, out, stderr = _ansible_doc(names)
    if rc == 0 and set(names) <= set(out):
        return {name: (rc, {name: out[name]}, stderr) for name in names}
    return {name: _ansible_doc([name]) for name in names}


def test_ansible_doc_renders_it(module_file, ansible_doc):
    name = f"rigops.fleet.{module_file.stem}"
    rc, out, stderr = ansible_doc[name]
    assert rc == 0, f"ansible-doc {name}: {stderr.strip()[-800:]}"
    assert "ERROR" not in stderr and "WARNING" not in stderr, stderr
    assert name in out and out[name]["doc"]["module"] == module_file.stem


HOST_CODE = sorted((ROOT / "plugins" / "module_utils").glob("*.py")) + MODULES


@pytest.mark.parametrize("path", HOST_CODE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_host_code_stays_python_38(path):
    """Modules and module_utils run on the managed hosts (Python 3.8+: Ubuntu 20.04 and newer,
    JetPack 5/6): no newer syntax, no zip(strict=) (3.10)."""
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "zip":
            assert not any(k.arg == "strict" for k in node.keywords), f"{path.name}: zip(strict=) needs Python 3.10"
