"""Fixtures for host-side integration tests: wheelhouse, runtime venv, tiny model, hub.

Everything slow is cached under ``$RIGOPS_CACHE`` (default ``~/.cache/rigops``): the
wheelhouse (keyed by the lock's sha256), the venv built from it (same key) and the tiny
model (keyed by its recipe). Timings and cache paths are printed (``pytest -s`` shows
them; they are also in the terminal summary).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMINGS: list[str] = []


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RIGOPS_INTEGRATION") == "1":
        return
    skip = pytest.mark.skip(reason="integration test: set RIGOPS_INTEGRATION=1")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("rigops sandbox runtime: caches and timings")
        for line in TIMINGS:
            terminalreporter.write_line(line)


def _step(label: str, cmd: list[str], **kw) -> str:
    t0 = time.monotonic()
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)
    path = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    detail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    line = f"{label}: {time.monotonic() - t0:.1f}s  {path}  [{detail}]"
    TIMINGS.append(line)
    print(line)
    return path


def cache_root() -> Path:
    return Path(os.environ.get("RIGOPS_CACHE") or Path.home() / ".cache" / "rigops")


@pytest.fixture(scope="session")
def wheelhouse() -> Path:
    out = cache_root() / "wheelhouse" / "cpu"
    _step("wheelhouse", [sys.executable, str(ROOT / "lab/sandbox/wheelhouse/build.py"), "--out", str(out)])
    return out


@pytest.fixture(scope="session")
def runtime_python(wheelhouse) -> Path:
    venv = _step(
        "runtime venv",
        [sys.executable, str(ROOT / "lab/sandbox/wheelhouse/mkvenv.py"), "--wheelhouse", str(wheelhouse)],
    )
    return Path(venv) / "bin" / "python"


@pytest.fixture(scope="session")
def tiny_model(runtime_python) -> Path:
    # the runtime venv has numpy, safetensors and tokenizers (vLLM needs them)
    return Path(_step("tiny model", [str(runtime_python), str(ROOT / "lab/sandbox/model/make_tiny_model.py")]))


@pytest.fixture(scope="session")
def hub_server(tiny_model, tmp_path_factory):
    sys.path.insert(0, str(ROOT / "lab" / "sandbox" / "hub"))
    import hub

    log = tmp_path_factory.mktemp("hub") / "requests.jsonl"
    srv = hub.make_server(tiny_model, host="127.0.0.1", port=0, log=log)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    srv.endpoint = f"http://127.0.0.1:{srv.server_address[1]}"
    srv.log_path = log
    TIMINGS.append(f"hub: {srv.endpoint} root={tiny_model} log={log}")
    yield srv
    srv.shutdown()
    srv.server_close()
