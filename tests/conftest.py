"""The collection's Python is imported as Ansible imports it: by collection path.

pyproject.toml puts .collections (where ansible_collections/rigops/fleet links back to this
checkout) on pytest's path, so ``ansible_collections.rigops.fleet.plugins...`` is the code under test.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
