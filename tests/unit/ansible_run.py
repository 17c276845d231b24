"""ansible-playbook as the unit tests run it on this machine: the one of the test's virtualenv, in the
project root, with the project's ansible.cfg and no colour (the tests read its output).

The runner (lab/run_tests.py) sets the strategy of these runs through the environment
(ANSIBLE_STRATEGY), which they inherit."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
# The inventory of a run against this machine: localhost, the local connection, this Python.
LOCALHOST = ["-i", "localhost,", "-c", "local", "-e", json.dumps({"ansible_python_interpreter": sys.executable})]


def ansible_playbook(*args, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ansible-playbook with these arguments and wait (check=False: the test reads returncode, stdout
    and stderr). env: added to this process's environment."""
    return subprocess.run(
        [ANSIBLE_PLAYBOOK, *map(str, args)], check=False, cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                              **(env or {})},
    )  # fmt: skip
