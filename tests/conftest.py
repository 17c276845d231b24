"""What every test shares.

The collection's Python is imported as Ansible imports it: by collection path. pyproject.toml puts
.collections (where ansible_collections/rigops/fleet links back to this checkout) on pytest's path,
so ``ansible_collections.rigops.fleet.plugins...`` is the code under test.

A test that needs a tool says so with ``@pytest.mark.needs("<tool>")`` (TOOLS below). Where the
tool is missing it is skipped with the reason, except under ``./rigops test`` (RIGOPS_REQUIRE_TOOLS=1,
set by lab/run_tests.py, which installs every tool first): there it fails, so that a missing tool
can never let a step pass.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
REQUIRED = os.environ.get("RIGOPS_REQUIRE_TOOLS") == "1"


def _nginx_with_njs() -> bool:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    return bool(nginx) and Path("/usr/lib/nginx/modules/ngx_http_js_module.so").exists()


# tool: (is it here?, what installs it)
TOOLS = {
    "nginx with njs": (_nginx_with_njs, "apt-get install nginx libnginx-mod-http-js"),
    "systemd-analyze": (lambda: bool(shutil.which("systemd-analyze")), "apt-get install systemd"),
    "dpkg-dev": (
        lambda: all(shutil.which(t) for t in ("dpkg-deb", "apt-ftparchive", "gpg", "gpgv", "apt-get")),
        "apt-get install dpkg-dev apt-utils gnupg",
    ),
    "shellcheck": (lambda: bool(shutil.which("shellcheck")), "apt-get install shellcheck"),
    "promtool": (
        lambda: bool(os.environ.get("RIGOPS_PROMTOOL") or shutil.which("promtool")),
        "the prometheus package's promtool (./rigops extracts it into its cache and sets RIGOPS_PROMTOOL)",
    ),
}


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(tool): the test needs this tool (tests/conftest.py TOOLS)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs"):
        for tool in mark.args:
            present, install = TOOLS[tool]
            if present():
                continue
            why = f"{tool} is missing ({install})"
            if REQUIRED:
                pytest.fail(f"{why}: ./rigops test needs it; a test that needs a tool never passes without it")
            pytest.skip(why)
