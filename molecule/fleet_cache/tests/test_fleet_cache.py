"""The end state: the cache serves its verified store and wheelhouse; both rigs got their models
(and fc-rig1 its whole runtime) from it, verified; the hub saw the cache only."""

import json
import urllib.request
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook, ansible_playbooks, get_host, recap

HUB = "http://127.0.0.1:18090"
CACHE = "https://rigops-fc-cache:8081"
TOKEN = "fc-sandbox-token-4b1d"
STORE = "/srv/rigops/cache"
MODELS = {("huggingface", "Qwen/Qwen3.5-9B-Instruct", "v1.0.0"), ("modelscope", "Qwen/Qwen3.5-9B", "master")}
RIGS = ["fc-rig1", "fc-rig2"]
CONVERGE = Path(__file__).resolve().parents[1] / "converge.yml"


def address(name):
    return get_host(name).check_output("hostname -I").split()[0]


def curl(host, path, *args):
    """(status, body) of a GET from host to the cache."""
    out = host.check_output(f"curl -sS --noproxy '*' -w '\\n%{{http_code}}' {' '.join(args)} {CACHE}{path}")
    body, _, status = out.rpartition("\n")
    return int(status), body


@pytest.fixture(scope="module")
def index():
    return json.loads(get_host("fc-cache").file(f"{STORE}/models/index.json").content_string)


def test_the_cache_lists_each_model_once_with_its_verified_files(index):
    cache = get_host("fc-cache")
    assert {(m["hub"], m["id"], m["revision"]) for m in index["models"]} == MODELS
    for m in index["models"]:
        folder = f"{STORE}/models/{m['hub']}/{m['id']}/{m['commit']}"
        marker = json.loads(cache.file(f"{folder}/.rigops-model.json").content_string)
        assert marker["files"] == m["files"] and all(len(f["sha256"]) == 64 for f in m["files"])
        assert cache.file(folder).user == "root" and cache.file(folder).mode == 0o755


def test_nginx_serves_reads_only_with_the_token_for_models_and_open_wheels():
    rig = get_host("fc-rig1")
    assert get_host("fc-cache").service("nginx").is_running and get_host("fc-cache").service("nginx").is_enabled
    assert curl(rig, "/index.json")[0] == 401
    assert curl(rig, "/index.json", "-H 'Authorization: Bearer wrong'")[0] == 401
    status, body = curl(rig, "/index.json", f"-H 'Authorization: Bearer {TOKEN}'")
    assert status == 200 and json.loads(body)["models"]
    assert curl(rig, "/models/", f"-H 'Authorization: Bearer {TOKEN}'")[0] == 403  # no listing of the store
    assert curl(rig, "/index.json", "-X POST", f"-H 'Authorization: Bearer {TOKEN}'")[0] == 405
    status, page = curl(rig, "/wheels/cpu/simple/torch/")
    assert status == 200 and 'href="torch-' in page and ".whl" in page
    assert curl(rig, "/wheels/cpu/requirements.lock")[0] == 200
    assert curl(rig, "/wheels/cpu/.wheelhouse.json")[0] == 404
    # ranges, for resume
    assert curl(rig, "/wheels/cpu/requirements.lock", "-r 0-9", "-o /dev/null")[0] == 206


def test_the_cache_speaks_only_tls_under_the_sites_certificate():
    rig = get_host("fc-rig1")
    # the rig checks the chain against its system store, where the site's CA is (prepare.yml)
    shown = rig.check_output(
        "openssl s_client -connect rigops-fc-cache:8081 -servername rigops-fc-cache -verify_return_error"
        " </dev/null 2>&1"
    )
    assert "Verify return code: 0 (ok)" in shown and "rigops fleet_cache scenario CA" in shown, shown[-2000:]
    plain = CACHE.replace("https:", "http:")
    plain = rig.check_output(f"curl -sS --noproxy '*' -o /dev/null -w '%{{http_code}}' {plain}/index.json")
    assert plain == "400"  # nginx: a plain HTTP request sent to the HTTPS port
    # a host without the site's CA refuses the cache (curl's "unable to get local issuer certificate")
    assert get_host("fc-cache").run(f"curl -sS --noproxy '*' {CACHE}/index.json").rc == 60


def test_the_token_and_the_tls_key_are_in_no_file_nginx_users_read_and_in_no_argv():
    cache = get_host("fc-cache")
    assert cache.file("/etc/nginx/rigops-fleet-cache").mode == 0o700
    key = cache.file("/etc/nginx/rigops-fleet-cache/key.pem")
    assert key.user == "root" and key.mode == 0o600 and "PRIVATE KEY" in key.content_string
    assert "PRIVATE KEY" not in cache.file("/etc/nginx/sites-available/rigops-fleet-cache.conf").content_string
    assert TOKEN not in cache.file("/etc/nginx/sites-available/rigops-fleet-cache.conf").content_string
    assert TOKEN not in cache.check_output("ps -eo args")


@pytest.mark.parametrize("name", RIGS)
def test_each_rig_holds_the_models_pulled_from_the_cache_verified(name, index):
    rig = get_host(name)
    for m in index["models"]:
        folder = f"/srv/rigops/models/{m['hub']}/{m['id']}/{m['commit']}"
        marker = json.loads(rig.file(f"{folder}/.rigops-model.json").content_string)
        assert marker["source"] == "fleet_cache" and marker["files"] == m["files"]
        for f in m["files"]:
            assert rig.file(f"{folder}/{f['path']}").sha256sum == f["sha256"]
        assert not rig.file(f"{folder}.partial").exists
    staged = json.loads(rig.file("/etc/rigops/models.json").content_string)
    assert staged


def test_the_hub_saw_the_cache_only_one_download_per_file(index):
    with urllib.request.urlopen(HUB + "/_admin/log", timeout=10) as resp:
        log = json.loads(resp.read())
    rigs = {address(n) for n in RIGS}
    assert not [e for e in log if e.get("address") in rigs]
    cache = address("fc-cache")
    files = [
        e
        for e in log
        if e.get("address") == cache and e.get("file") and e["method"] == "GET" and e["status"] in (200, 206)
    ]
    per_file = {}
    for e in files:
        per_file[(e["repo"], e["file"])] = per_file.get((e["repo"], e["file"]), 0) + 1
    wanted = {(m["id"], f["path"]) for m in index["models"] for f in m["files"]}
    assert set(per_file) == wanted and set(per_file.values()) == {1}, per_file


def test_the_runtime_of_the_bare_rig_came_from_the_cache_hash_checked():
    rig = get_host("fc-rig1")
    release = rig.file("/opt/rigops/vllm/current").linked_to
    requirements = rig.file(f"{release}/requirements.txt").content_string
    assert "--hash=sha256:" in requirements and "torch==" in requirements
    log = get_host("fc-cache").check_output("cat /var/log/nginx/rigops-fleet-cache.log")
    mine = [line for line in log.splitlines() if line.startswith(address("fc-rig1") + " ")]
    assert any("/wheels/cpu/simple/torch/torch-" in line and '" 200 ' in line for line in mine), mine[-5:]
    assert any("/wheels/cpu/requirements.lock" in line for line in mine)
    # the role's smoke test ran vLLM's kernels from it before current moved (as the service user)
    smoke = json.loads(json.loads(rig.file(f"{release}/.rigops-release.json").content_string)["smoke"])
    assert smoke["vllm"] and smoke["kernel_run"].startswith("_C::silu_and_mul on cpu")


def test_check_mode_on_the_converged_cache_changes_nothing():
    rc, out = ansible_playbook(CONVERGE, "-l", "fc-cache", "--check")
    assert rc == 0 and recap(out, "fc-cache")["changed"] == 0, out[-3000:]


# The first two are refused by the role's argument spec (Ansible's validation, the role's first task), the
# third by its preflight.
BAD = {
    "missing required arguments: index_url, lock_url found in fleet_cache_wheelhouses": (
        '{"fleet_cache_wheelhouses": [{"name": "cpu"}]}'
    ),
    "value of hub must be one of: modelscope, huggingface, got: gitlab found in fleet_cache_extra_models": (
        '{"fleet_cache_extra_models": [{"hub": "gitlab", "id": "a/b"}]}'
    ),
    "fleet_cache_port must be a TCP port from 1 to 65535; got 0": '{"fleet_cache_port": 0}',
}


@pytest.fixture(scope="module")
def refused():
    """The bad inputs, run at once (each stops in the preflight), with the cache's files before and after."""
    cache = get_host("fc-cache")
    files = ("/etc/nginx/sites-available/rigops-fleet-cache.conf", f"{STORE}/models/index.json")
    before = [cache.file(f).sha256sum for f in files]
    runs = ansible_playbooks({needle: (CONVERGE, "-l", "fc-cache", "-e", extra) for needle, extra in BAD.items()})
    return runs, before, [cache.file(f).sha256sum for f in files]


@pytest.mark.parametrize("needle", BAD)
def test_bad_input_is_refused_by_name_and_changes_nothing(refused, needle):
    runs, before, after = refused
    rc, out = runs[needle]
    assert rc != 0 and needle in " ".join(out.split()), out[-3000:]
    assert recap(out, "fc-cache")["changed"] == 0 and before == after
