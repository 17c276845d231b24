#!/usr/bin/env python3
"""The generated parts of the docs: `./rigops docs` writes them, `./rigops docs --check` says which are stale.

- docs/measurements.md, from docs/measurements.yml: every figure the project states, as data (value,
  unit, the command that measured it, its date), grouped as the file groups them;
- the variable reference of each role's README (between its BEGIN_ANSIBLE_DOCS / END_ANSIBLE_DOCS
  markers), from the role's meta/argument_specs.yml by aar-doc with docs/templates/role-variables.md.j2.

tests/unit/test_docs.py runs the check: a generated part that no longer matches its source fails.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MEASUREMENTS = ROOT / "docs" / "measurements.yml"
MEASUREMENTS_PAGE = ROOT / "docs" / "measurements.md"
ROLE_TEMPLATE = ROOT / "docs" / "templates" / "role-variables.md.j2"
FIELDS = ("group", "what", "value", "unit", "command", "date")


def measurement_problems(data) -> list[str]:
    """Why docs/measurements.yml is not a mapping of figures with every field ([] when it is)."""
    if not isinstance(data, dict) or not data:
        return ["docs/measurements.yml: not a mapping of figures"]
    problems = []
    for key, entry in data.items():
        if not isinstance(entry, dict):
            problems.append(f"{key}: not a mapping of {', '.join(FIELDS)}")
            continue
        missing = [f for f in FIELDS if f not in entry]
        extra = sorted(set(entry) - set(FIELDS))
        if missing or extra:
            problems.append(f"{key}: missing {missing}, unknown {extra}; the fields are {', '.join(FIELDS)}")
        elif entry["value"] is not None and entry["date"] is None:
            problems.append(f"{key}: a value without the date it was measured")
        elif not str(entry["command"]).strip():
            problems.append(f"{key}: no command; every figure names the command that measured it")
    return problems


def _cell(value) -> str:
    return "not measured yet" if value is None else str(value).replace("|", "\\|")


def measurements_page(data: dict) -> str:
    """docs/measurements.md: one table per group, in the file's order."""
    lines = [
        "# Measurements",
        "",
        "Every figure the project states, measured by a command of this repository on its 2-core",
        "development machine (sandbox hosts share its cores: figures are for comparison, not promises).",
        "Generated from [measurements.yml](measurements.yml) by `./rigops docs`; edit the data, not this page.",
    ]
    groups: dict[str, list[tuple[str, dict]]] = {}
    for key, entry in data.items():
        groups.setdefault(entry["group"], []).append((key, entry))
    for group, entries in groups.items():
        lines += ["", f"## {group}", "", "| figure | value | unit | date | command |", "|---|---:|---|---|---|"]
        for key, e in entries:
            what = f"{_cell(e['what'])} (`{key}`)"
            lines.append(f"| {what} | {_cell(e['value'])} | {_cell(e['unit'])} | {_cell(e['date'])} | "
                         f"`{_cell(e['command'])}` |")  # fmt: skip
    return "\n".join(lines) + "\n"


def role_readmes(root: Path) -> list[Path]:
    return sorted(p / "README.md" for p in (root / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())


def render_role(readme: Path) -> None:
    """The role's variable reference into its README, between the markers (aar-doc's inject mode)."""
    aar_doc = shutil.which("aar-doc", path=str(Path(sys.executable).parent)) or shutil.which("aar-doc")
    if not aar_doc:
        raise SystemExit("aar-doc not found: install requirements-dev.txt (./rigops bootstrap --dev)")
    cmd = [aar_doc, "--output-template", str(ROLE_TEMPLATE), "--output-file", readme.name, str(readme.parent)]
    subprocess.run([*cmd, "markdown"], check=True, capture_output=True, text=True)


def generate(root: Path, roles: list[str] | None = None) -> list[Path]:
    """Write every generated part under `root` (of the roles named, when `roles` is given); return the files."""
    data = yaml.safe_load((root / "docs" / "measurements.yml").read_text())
    problems = measurement_problems(data)
    if problems:
        raise SystemExit("docs/measurements.yml:\n  " + "\n  ".join(problems))
    page = root / "docs" / "measurements.md"
    page.write_text(measurements_page(data))
    written = [page]
    for readme in role_readmes(root):
        if roles is not None and readme.parent.name not in roles:
            continue
        if "<!-- BEGIN_ANSIBLE_DOCS -->" not in readme.read_text():
            raise SystemExit(f"{readme.relative_to(root)}: no <!-- BEGIN_ANSIBLE_DOCS --> marker")
        render_role(readme)
        written.append(readme)
    return written


def stale(root: Path = ROOT, roles: list[str] | None = None) -> list[str]:
    """The generated files that differ from what their sources make now (relative paths); `roles` as generate's."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "tree"
        copy.mkdir()
        shutil.copytree(root / "docs", copy / "docs")
        shutil.copytree(root / "roles", copy / "roles")
        out = []
        for path in generate(copy, roles):
            rel = path.relative_to(copy)
            if path.read_text() != (root / rel).read_text():
                out.append(str(rel))
        return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a generated part is stale")
    args = parser.parse_args()
    if args.check:
        found = stale()
        for rel in found:
            print(f"stale: {rel} (run ./rigops docs)")
        return 1 if found else 0
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
