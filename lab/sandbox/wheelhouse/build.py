#!/usr/bin/env python3
"""Build a pinned, hash-locked wheelhouse for one runtime flavour.

Two steps, both driven by a flavour's input file (``cpu.in`` here; a production site
writes ``cu128.in``):

``build.py lock [--in cpu.in]``
    Resolve the input's top-level pins with pip (``pip install --dry-run --report``,
    which uses pip's own configuration: find-links, index URLs, constraints) and write
    ``<flavour>.lock``: every distribution of the closure as ``name==version
    --hash=sha256:...``, minus the input's ``exclude`` list. Needs the network (or the
    local mirrors). The lock is committed.

``build.py [build] [--in cpu.in] [--out DIR]``
    Download exactly the lock (``pip download --no-deps --require-hashes``) into
    ``DIR/wheels``, check every sha256, write a PEP 503 index ``DIR/simple/<project>/``
    with ``#sha256=`` fragments and ``DIR/requirements.lock``. Skipped when ``DIR``
    already holds a build of the same lock (the cache key is the lock's sha256). Prints
    the build time, cold or warm.

Install from it (the lock is the complete closure, hence ``--no-deps``)::

    pip install --no-deps --require-hashes --no-index \
        --find-links DIR/wheels -r DIR/requirements.lock
    # or, served by ``python3 -m http.server -d DIR 8091``:
    pip install --no-deps --require-hashes --index-url http://HOST:8091/simple \
        -r requirements.lock

Directives in the input file (comment lines ``# rigops: key = value``):
``python-version`` (resolve for that CPython), ``platform`` (a wheel platform tag, for
building on another machine than the target), ``exclude`` (names dropped from the lock),
``extra-index-url`` (added only when reachable, so a machine whose pip configuration
already finds the wheels is not slowed down by an unreachable index).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAMP = ".rigops-wheelhouse.json"


def cache_root() -> Path:
    return Path(os.environ.get("RIGOPS_CACHE") or Path.home() / ".cache" / "rigops")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_input(path: Path) -> tuple[list[str], dict[str, str]]:
    """Return (requirement lines, directives) of a flavour input file."""
    reqs: list[str] = []
    directives: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        m = re.match(r"#\s*rigops:\s*([\w-]+)\s*=\s*(.*)$", line)
        if m:
            directives[m.group(1)] = m.group(2).strip()
            continue
        if not line or line.startswith("#"):
            continue
        reqs.append(line)
    return reqs, directives


def index_reachable(url: str, timeout: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=timeout):
            return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def pip_index_args(directives: dict[str, str]) -> list[str]:
    args: list[str] = []
    for url in directives.get("extra-index-url", "").split():
        if index_reachable(url):
            args += ["--extra-index-url", url]
        else:
            print(f"note: {url} unreachable; relying on pip's configuration", file=sys.stderr)
    return args


def target_args(directives: dict[str, str]) -> list[str]:
    args: list[str] = []
    if "python-version" in directives:
        args += ["--python-version", directives["python-version"]]
    if "platform" in directives:
        args += ["--platform", directives["platform"]]
    if args:
        args += ["--only-binary=:all:"]
    return args


def lock_path_for(inp: Path) -> Path:
    return inp.with_suffix(".lock")


def input_digest(inp: Path) -> str:
    return hashlib.sha256(inp.read_bytes()).hexdigest()


def read_lock_header(lock: Path) -> dict[str, str]:
    header: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"#\s*([\w-]+):\s*(\S+)$", line)
        if m:
            header[m.group(1)] = m.group(2)
    return header


def parse_lock(lock: Path) -> list[tuple[str, str, str]]:
    """Return [(name, version, sha256)] from a lock written by :func:`do_lock`."""
    entries = []
    text = lock.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if not m:
            raise SystemExit(f"{lock}: cannot parse lock line: {line!r}")
        entries.append((m.group(1), m.group(2), m.group(3)))
    return entries


def do_lock(inp: Path, lock: Path) -> None:
    reqs, directives = parse_input(inp)
    excluded = {canonical(n) for n in directives.get("exclude", "").split()}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--quiet", "--report", str(report),
            *target_args(directives),
            *(["--target", str(Path(tmp) / "t")] if target_args(directives) else []),
            *pip_index_args(directives), *reqs,
        ]  # fmt: skip
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        data = json.loads(report.read_text())
    lines = []
    for item in data["install"]:
        meta = item["metadata"]
        info = item["download_info"]
        if canonical(meta["name"]) in excluded:
            continue
        url = info["url"]
        if not url.split("#")[0].endswith(".whl"):
            raise SystemExit(f"{meta['name']}: no wheel ({url}); the wheelhouse holds wheels only")
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            raise SystemExit(f"{meta['name']}: the resolver reported no sha256 for {url}")
        lines.append((canonical(meta["name"]), meta["version"], digest))
    lines.sort()
    pyver = directives.get("python-version", "{}.{}".format(*sys.version_info[:2]))
    out = [
        f"# generated by lab/sandbox/wheelhouse/build.py lock from {inp.name}; do not edit",
        f"# input-sha256: {input_digest(inp)}",
        f"# python-version: {pyver}",
        f"# excluded: {','.join(sorted(excluded)) or '-'}",
    ]
    out += [f"{n}=={v} \\\n    --hash=sha256:{h}" for n, v, h in lines]
    lock.write_text("\n".join(out) + "\n")
    print(f"locked {len(lines)} distributions into {lock} in {time.monotonic() - t0:.1f}s")


def write_index(out: Path, wheels: dict[str, tuple[str, str]]) -> None:
    """PEP 503 simple index: DIR/simple/index.html and DIR/simple/<project>/index.html."""
    simple = out / "simple"
    if simple.exists():
        shutil.rmtree(simple)
    simple.mkdir(parents=True)
    by_project: dict[str, list[tuple[str, str]]] = {}
    for filename, (project, digest) in sorted(wheels.items()):
        by_project.setdefault(project, []).append((filename, digest))
    root_links = []
    for project, files in sorted(by_project.items()):
        (simple / project).mkdir()
        links = "".join(
            f'<a href="../../wheels/{html.escape(f)}#sha256={d}">{html.escape(f)}</a><br>\n' for f, d in files
        )
        (simple / project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
        root_links.append(f'<a href="{project}/">{project}</a><br>\n')
    (simple / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n" + "".join(root_links) + "</body></html>\n")


def do_build(inp: Path, lock: Path, out: Path, force: bool = False) -> dict:
    t0 = time.monotonic()
    if not lock.exists():
        raise SystemExit(f"{lock} missing: run `{sys.argv[0]} lock --in {inp}` first")
    header = read_lock_header(lock)
    if header.get("input-sha256") != input_digest(inp):
        raise SystemExit(f"{lock} is stale ({inp.name} changed): run `build.py lock --in {inp}`")
    key = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp_file = out / STAMP
    if not force and stamp_file.exists():
        stamp = json.loads(stamp_file.read_text())
        wheels_ok = all((out / "wheels" / f).is_file() for f in stamp.get("wheels", {}))
        if stamp.get("lock-sha256") == key and wheels_ok:
            dt = time.monotonic() - t0
            print(f"wheelhouse {out}: warm (lock {key[:12]} cached) in {dt:.2f}s", file=sys.stderr)
            return {**stamp, "state": "warm", "seconds": dt}
    entries = parse_lock(lock)
    _, directives = parse_input(inp)
    wheels_dir = out / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    req = out / "requirements.lock"
    shutil.copyfile(lock, req)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
        "--only-binary=:all:", "--progress-bar", "off", "--quiet", "-d", str(wheels_dir),
        *target_args(directives), *pip_index_args(directives), "-r", str(req),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    expected = {(canonical(n), v): h for n, v, h in entries}
    wheels: dict[str, tuple[str, str]] = {}
    for whl in sorted(wheels_dir.glob("*.whl")):
        digest = sha256_file(whl)
        parts = whl.name.split("-")
        project, version = canonical(parts[0]), parts[1]
        if expected.get((project, version)) != digest:
            # leftovers of an older lock, or a wheel that does not match: not served
            whl.unlink()
            continue
        wheels[whl.name] = (project, digest)
    missing = set(expected) - {(p, f.split("-")[1]) for f, (p, _) in wheels.items()}
    if missing:
        raise SystemExit(f"wheels missing after download: {sorted(missing)}")
    write_index(out, wheels)
    dt = time.monotonic() - t0
    stamp = {
        "lock-sha256": key,
        "input": inp.name,
        "wheels": {f: d for f, (_, d) in wheels.items()},
        "bytes": sum((wheels_dir / f).stat().st_size for f in wheels),
        "build-seconds": round(dt, 1),
    }
    stamp_file.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
    print(f"wheelhouse {out}: cold build of {len(wheels)} wheels in {dt:.1f}s", file=sys.stderr)
    return {**stamp, "state": "cold", "seconds": dt}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="build", choices=["build", "lock"])
    ap.add_argument("--in", dest="inp", type=Path, default=HERE / "cpu.in", help="flavour input")
    ap.add_argument("--lock", type=Path, help="lock file (default: <input>.lock)")
    ap.add_argument("--out", type=Path, help="wheelhouse dir (default: $RIGOPS_CACHE/wheelhouse/<flavour>)")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args(argv)
    inp = args.inp.resolve()
    lock = (args.lock or lock_path_for(inp)).resolve()
    if args.action == "lock":
        do_lock(inp, lock)
        return 0
    out = (args.out or cache_root() / "wheelhouse" / inp.stem).resolve()
    do_build(inp, lock, out, force=args.force)
    print(out)  # last line: the wheelhouse path
    return 0


if __name__ == "__main__":
    sys.exit(main())
