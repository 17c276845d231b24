"""The module_utils fleet_cache_wheelhouse: the wheelhouse a fleet cache serves, on the sandbox's real lock."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ansible_collections.rigops.fleet.plugins.module_utils import fleet_cache_wheelhouse as fc

ROOT = Path(__file__).resolve().parents[2]
LOCK = (ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()


def test_the_sandbox_lock_gives_one_project_per_pin_and_hashes_only():
    hashes = fc.lock_hashes(LOCK)
    pins = [line.split("==")[0] for line in LOCK.splitlines() if "==" in line and not line.startswith("#")]
    assert set(hashes.values()) == {fc.normalize(p) for p in pins}
    assert all(len(h) == 64 for h in hashes)
    assert hashes[next(h for h, p in hashes.items() if p == "torch")] == "torch"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("torch==2.8.0\n", "holds no --hash=sha256"),
        ("    --hash=sha256:" + "a" * 64 + "\n", "a hash before any requirement"),
    ],
)
def test_a_lock_without_hashes_is_refused(text, needle):
    with pytest.raises(ValueError, match=needle):
        fc.lock_hashes(text)


def wheel(folder: Path, name: str, data: bytes) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_files_are_checked_laid_out_as_an_index_and_recorded(tmp_path):
    files = tmp_path / "files"
    a = wheel(files, "Foo_Bar-1.0-py3-none-any.whl", b"foo")
    b = wheel(files, "idna-3.10-py3-none-any.whl", b"idna")
    lock = f"Foo.Bar==1.0 \\\n    --hash=sha256:{a}\nidna==3.10 \\\n    --hash=sha256:{b}\n"
    check = fc.check_files(str(files), fc.lock_hashes(lock))
    assert check["missing"] == [] and check["stray"] == []
    assert fc.layout(str(tmp_path), check["files"])
    link = tmp_path / "simple" / "foo-bar" / "Foo_Bar-1.0-py3-none-any.whl"
    assert os.readlink(link) == "../../files/Foo_Bar-1.0-py3-none-any.whl" and link.read_bytes() == b"foo"
    assert not fc.layout(str(tmp_path), check["files"])  # a second run changes nothing
    assert not fc.recorded(str(tmp_path), lock)
    fc.record(str(tmp_path), lock, check["files"])
    assert fc.recorded(str(tmp_path), lock) and not fc.recorded(str(tmp_path), lock + "# changed\n")
    (files / "idna-3.10-py3-none-any.whl").write_bytes(b"idn")  # a file cut short: no longer complete
    assert not fc.recorded(str(tmp_path), lock)


def test_a_file_the_lock_does_not_pin_is_a_stray_and_its_project_missing(tmp_path):
    files = tmp_path / "files"
    a = wheel(files, "idna-3.10-py3-none-any.whl", b"idna")
    wheel(files, "evil-1.0-py3-none-any.whl", b"evil")
    lock = f"idna==3.10 --hash=sha256:{a}\nfoo==1.0 --hash=sha256:{'0' * 64}\n"
    check = fc.check_files(str(files), fc.lock_hashes(lock))
    assert check["stray"] == ["evil-1.0-py3-none-any.whl"] and check["missing"] == ["foo"]
    (tmp_path / "simple" / "old").mkdir(parents=True)
    os.symlink("../../files/gone.whl", tmp_path / "simple" / "old" / "gone.whl")
    assert fc.layout(str(tmp_path), check["files"])
    assert sorted(p.name for p in (tmp_path / "simple").iterdir()) == ["idna"]


def test_pip_downloads_every_wheel_against_its_hash_and_nothing_else():
    argv = fc.pip_download_argv("/py", "/lock", "https://idx/simple", "/d/files")
    assert argv[:4] == ["/py", "-m", "pip", "download"]
    assert {"--no-deps", "--require-hashes", "--only-binary=:all:", "--index-url=https://idx/simple"} <= set(argv)
    assert not [a for a in argv if a.startswith("--trusted-host")]
    http = fc.pip_download_argv("/py", "/lock", "http://mirror.lan:8070/simple", "/d/files")
    assert "--trusted-host=mirror.lan" in http


def test_the_caches_pip_runs_read_no_pip_conf_and_trust_the_hosts_ca_bundle():
    assert fc.PIP_ENVIRONMENT == {"PIP_CONFIG_FILE": "/dev/null", "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt"}
    install = (Path(__file__).resolve().parents[2] / "roles/fleet_cache/tasks/install.yml").read_text()
    assert all(f"{k}: {v}" in install for k, v in fc.PIP_ENVIRONMENT.items())  # the hub clients' pip too
