"""The fleet cache's wheelhouse: a runtime build's hash-locked wheels laid out as a PEP 503 index.

plugins/modules/fleet_cache_wheelhouse.py calls it on the cache host. pip (the real one, run by
the module) downloads every wheel of the lock with --require-hashes into <dest>/files;
this file checks what is there against the lock's hashes, lays out <dest>/simple/<project>/
(one symbolic link per file, nginx's autoindex lists each folder: a PEP 503 project page)
and records the result, so a second run reads sizes only. Plain functions on plain data
and a folder, tested in tests/unit/test_fleet_cache_wheelhouse.py on the sandbox's real lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from urllib.parse import urlsplit

from ansible_collections.rigops.fleet.plugins.module_utils.vllm_runtime_seed import PIN_RE, normalize

HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
RECORD = ".wheelhouse.json"


def lock_hashes(text: str) -> dict[str, str]:
    """{sha256: project} of a hash-locked requirements file (pip-compile --generate-hashes layout)."""
    out, project = {}, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0] if not raw.lstrip().startswith("--hash") else raw
        m = PIN_RE.match(line)
        if m:
            project = normalize(m.group(1))
        for digest in HASH_RE.findall(line):
            if project is None:
                raise ValueError(f"a hash before any requirement: {raw.strip()!r}")
            out[digest] = project
    if not out:
        raise ValueError("the lock holds no --hash=sha256 entries: a fleet cache serves hash-locked builds only")
    return out


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def lock_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def recorded(dest: str, lock_text: str) -> bool:
    """True when the record says this lock's wheelhouse is complete and every file has its recorded size."""
    try:
        with open(os.path.join(dest, RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return False
    if record.get("lock_sha256") != lock_sha256(lock_text):
        return False
    for name, size in record.get("files", {}).items():
        path = os.path.join(dest, "files", name)
        if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) != size:
            return False
    return True


def check_files(files_dir: str, hashes: dict[str, str]) -> dict:
    """Which files of the folder the lock names (by sha256), which it does not, which projects lack a file."""
    known, stray = {}, []
    for name in sorted(os.listdir(files_dir)) if os.path.isdir(files_dir) else []:
        path = os.path.join(files_dir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            stray.append(name)
            continue
        digest = sha256_file(path)
        if digest in hashes:
            known[name] = {"project": hashes[digest], "size": os.path.getsize(path), "sha256": digest}
        else:
            stray.append(name)
    missing = sorted(set(hashes.values()) - {f["project"] for f in known.values()})
    return {"files": known, "stray": stray, "missing": missing}


def layout(dest: str, files: dict) -> bool:
    """<dest>/simple/<project>/<file> -> ../../files/<file> for every file; stale links removed. Changed?"""
    simple = os.path.join(dest, "simple")
    want = {(info["project"], name) for name, info in files.items()}
    changed = False
    have = set()
    for project in sorted(os.listdir(simple)) if os.path.isdir(simple) else []:
        folder = os.path.join(simple, project)
        for name in sorted(os.listdir(folder)):
            if (project, name) in want and os.readlink(os.path.join(folder, name)) == f"../../files/{name}":
                have.add((project, name))
            else:
                os.unlink(os.path.join(folder, name))
                changed = True
        if not os.listdir(folder):
            os.rmdir(folder)
            changed = True
    for project, name in sorted(want - have):
        os.makedirs(os.path.join(simple, project), mode=0o755, exist_ok=True)
        os.symlink(f"../../files/{name}", os.path.join(simple, project, name))
        changed = True
    return changed


def record(dest: str, lock_text: str, files: dict) -> None:
    data = {
        "lock_sha256": lock_sha256(lock_text),
        "files": {name: info["size"] for name, info in sorted(files.items())},
    }
    tmp = os.path.join(dest, RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.rename(tmp, os.path.join(dest, RECORD))


# Environment of the cache's pip runs: no pip.conf of the host counts, and an https index signed by
# the site's own CA is trusted as the host trusts it (pip before 24.2 reads only its certifi bundle).
PIP_ENVIRONMENT = {"PIP_CONFIG_FILE": "/dev/null", "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt"}


def pip_download_argv(python: str, lock_path: str, index_url: str, files_dir: str) -> list[str]:
    """The pip run that fetches the lock's wheels, each checked against its hash by pip itself.

    A plain-http index (a mirror on a private network) is named trusted: the hashes still decide.
    """
    trusted = [f"--trusted-host={urlsplit(index_url).hostname}"] if index_url.startswith("http://") else []
    return [
        python, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:",
        "--disable-pip-version-check", f"--index-url={index_url}", *trusted, "-r", lock_path, "-d", files_dir,
    ]  # fmt: skip
