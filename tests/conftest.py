"""Make the project's module_utils importable the way Ansible loads them.

Modules import their logic as ``ansible.module_utils.<name>``; unit tests import the
same path, so what is tested is what runs on the host.
"""

import sys
from pathlib import Path

import ansible.module_utils

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
sys.path.insert(0, str(ROOT / "library"))
