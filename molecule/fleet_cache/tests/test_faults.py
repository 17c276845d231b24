"""Failure paths, after the end-state tests: a rig that does not trust the cache's certificate
refuses it (named, nothing changed, no fallback), a file corrupted on the cache is refused by the rig
(named, nothing in place), and the cache stopped mid-pull fails clearly and the next run resumes.
The last case leaves the cache slowed down (fleet_cache_limit_rate): nothing runs after it."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from rigops_testinfra import ansible_playbook, get_host, playbook_command, recap

pytestmark = pytest.mark.changes_state

CONVERGE = Path(__file__).resolve().parents[1] / "converge.yml"
PEERS = Path(__file__).resolve().parents[1] / "peers.yml"
STORE = "/srv/rigops/cache/models"
CACHE_URL = "https://rigops-fc-cache:8081"


def sharded():
    """The ModelScope model (three shards) in the cache's listing, and its folder on a rig."""
    index = json.loads(get_host("fc-cache").file(f"{STORE}/index.json").content_string)
    m = next(m for m in index["models"] if m["hub"] == "modelscope")
    return m, f"modelscope/{m['id']}/{m['commit']}"


def weights(*args):
    """The converge's rig play, model_weights only, on fc-rig1; (rc, output with whitespace collapsed)."""
    rc, out = ansible_playbook(CONVERGE, "-l", "fc-rig1", "--tags", "model_weights", *args)
    return rc, " ".join(out.split()), out


def test_a_rig_without_the_sites_ca_refuses_the_cache_named_and_changes_nothing():
    rig = get_host("fc-rig1")
    ca = "/usr/local/share/ca-certificates/rigops-fc-scenario-ca.crt"
    models = "find /srv/rigops/models /etc/rigops/models.json -printf '%p %s %T@\\n' | sort"
    before = rig.check_output(models)
    rig.check_output(f"mv {ca} /root/ca.crt && update-ca-certificates --fresh >/dev/null")
    try:
        rc, out, raw = weights("-e", "model_weights_fleet_cache_fallback_to_hub=true")
        assert rc != 0 and recap(raw, "fc-rig1")["changed"] == 0, out[-3000:]
        assert f"{CACHE_URL}/index.json: the cache's certificate is refused" in out, out[-3000:]
        assert "CERTIFICATE_VERIFY_FAILED" in out and "update-ca-certificates" in out
        assert rig.check_output(models) == before
    finally:
        rig.check_output(f"mv /root/ca.crt {ca} && update-ca-certificates >/dev/null")


def test_a_file_corrupted_on_the_cache_is_refused_named_and_nothing_moves_into_place():
    m, folder = sharded()
    shard = next(f["path"] for f in m["files"] if f["path"].endswith("00001-of-00003.safetensors"))
    cache, rig = get_host("fc-cache"), get_host("fc-rig1")
    rig.check_output(f"rm -rf /srv/rigops/models/{folder}")
    cache.check_output(f"cp -p {STORE}/{folder}/{shard} /root/shard.good")
    # one byte flipped, same size: only the sha256 tells
    flip = "b=bytearray(open(p,'rb').read()); b[-1]^=1; open(p,'wb').write(b)"
    cache.check_output(f"python3 -c \"p='{STORE}/{folder}/{shard}'; {flip}\"")
    try:
        rc, out, raw = weights()
        assert rc != 0 and recap(raw, "fc-rig1")["failed"] == 1
        assert re.search(rf"{re.escape(shard)}: sha256 [0-9a-f]{{64}}, expected {m_sha(m, shard)}", out), out[-3000:]
        assert f"from the fleet cache {CACHE_URL}" in out
        assert not rig.file(f"/srv/rigops/models/{folder}").exists
        assert not rig.file(f"/srv/rigops/models/{folder}.partial/.rigops-model.json").exists
    finally:
        cache.check_output(f"mv /root/shard.good {STORE}/{folder}/{shard}")
    rc, out, raw = weights()
    assert rc == 0 and rig.file(f"/srv/rigops/models/{folder}/{shard}").sha256sum == m_sha(m, shard), out[-3000:]


def m_sha(m, path):
    return next(f["sha256"] for f in m["files"] if f["path"] == path)


def flip_last_byte(host, path):
    """One byte flipped, same size: only the sha256 tells (flipped twice, the file is back)."""
    flip = "b=bytearray(open(p,'rb').read()); b[-1]^=1; open(p,'wb').write(b)"
    host.check_output(f"python3 -c \"p='{path}'; {flip}\"")


def test_peers_serve_later_batches_verified_files_only_and_stop_when_the_rollout_ends():
    """peers.yml, one rig per batch: fc-rig1 serves fc-rig2, which pulls half the files from it (its place in the
    play: the largest first, then every other) and the rest from the cache. fc-rig1's copy of the ModelScope
    model's largest file has one byte flipped (a size check passes it): the peer hashes it, refuses it (409)
    and fc-rig2 takes it from the cache. The peers stop with the run."""
    index = json.loads(get_host("fc-cache").file(f"{STORE}/index.json").content_string)
    models = {m["hub"]: m for m in index["models"]}
    cache, rig1, rig2 = get_host("fc-cache"), get_host("fc-rig1"), get_host("fc-rig2")
    folder = {hub: f"/srv/rigops/models/{hub}/{m['id']}/{m['commit']}" for hub, m in models.items()}
    order = {hub: [f["path"] for f in sorted(m["files"], key=lambda f: (-f["size"], f["path"]))]
             for hub, m in models.items()}  # fmt: skip
    bad = order["modelscope"][0]
    rig2_ip = rig2.check_output("hostname -I").split()[0]
    rig2.check_output("rm -rf " + " ".join(folder.values()))
    flip_last_byte(rig1, f"{folder['modelscope']}/{bad}")
    before = len(cache.check_output("cat /var/log/nginx/rigops-fleet-cache.log").splitlines())
    since = rig1.check_output("date '+%Y-%m-%d %H:%M:%S'")
    try:
        rc, out = ansible_playbook(PEERS, "-v")
        assert rc == 0 and recap(out, "fc-rig1")["failed"] == recap(out, "fc-rig2")["failed"] == 0, out[-3000:]
        journal = rig1.check_output(f"journalctl -u rigops-model-peer -o cat --no-pager --since '{since}'")
        # the cache's token and the peer's key: on the host for the peer alone, never in what Ansible prints
        key = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"], "tls", "fc-rig1.key").read_text().splitlines()[1]
        for secret in ("fc-sandbox-token-4b1d", key):
            assert secret not in out and secret not in journal
        served = {}  # URL path -> the peer's status for fc-rig2
        for line in journal.splitlines():
            parts = line.split()
            if parts and parts[0] == rig2_ip:
                served[parts[2]] = int(parts[3])
        log = cache.check_output("cat /var/log/nginx/rigops-fleet-cache.log").splitlines()[before:]
        pulled = sorted(
            line.split('"')[1].split()[1] for line in log if line.startswith(rig2_ip + " ") and '"GET /models/' in line
        )
        url = {hub: f"/models/{hub}/{m['id']}/{m['commit']}/" for hub, m in models.items()}
        to_peer = {url[hub] + rel for hub, files in order.items() for rel in files[0::2]}
        to_cache = {url[hub] + rel for hub, files in order.items() for rel in files[1::2]}
        refused = url["modelscope"] + bad
        assert served == {path: 409 if path == refused else 200 for path in to_peer}
        assert pulled == sorted(to_cache | {refused})
        for hub, m in models.items():
            for f in m["files"]:
                assert rig2.file(f"{folder[hub]}/{f['path']}").sha256sum == f["sha256"], f["path"]
        # the rollout's end: nothing serves, nothing of what was served stays
        for rig in (rig1, rig2):
            assert rig.run("systemctl is-active rigops-model-peer").stdout.strip() != "active"
            assert not rig.file("/run/rigops-model-peer").exists
            assert rig.run("bash -c 'echo > /dev/tcp/127.0.0.1/8082'").rc != 0
        # the unit bounds the peer: a lifetime, and no capability but dropping root for nobody
        unit = rig1.file("/etc/systemd/system/rigops-model-peer.service").content_string
        assert "RuntimeMaxSec=7200" in unit and "CapabilityBoundingSet=CAP_SETUID CAP_SETGID" in unit
    finally:
        flip_last_byte(rig1, f"{folder['modelscope']}/{bad}")


def test_the_cache_stopped_mid_pull_fails_clearly_and_the_next_run_resumes():
    m, folder = sharded()
    cache, rig = get_host("fc-cache"), get_host("fc-rig1")
    partial = f"/srv/rigops/models/{folder}.partial"
    rig.check_output(f"rm -rf /srv/rigops/models/{folder} {partial}")
    # slow the cache down (the role's own setting) so that a pull is caught in the middle
    rc, out = ansible_playbook(
        CONVERGE, "-l", "fc-cache", "--tags", "fleet_cache_configure", "-e", "fleet_cache_limit_rate=50k"
    )
    assert rc == 0, out[-3000:]
    # a part's tag runs the preflight too
    assert "fleet_cache : Preflight | Variables are of their kinds and consistent" in out
    try:
        cmd, env = playbook_command(CONVERGE, "-l", "fc-rig1", "--tags", "model_weights")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            sizes = rig.run(f"find {partial} -name '*.part' -size +10k 2>/dev/null").stdout.split()
            if sizes:
                break
            time.sleep(1)
        assert sizes, "no pull was seen in progress"
        cache.check_output("systemctl stop nginx")
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode != 0
        flat = " ".join(out.split())
        assert f"after 3 attempts from the fleet cache {CACHE_URL}" in flat, flat[-3000:]
        assert "a rerun resumes it" in flat
        kept = rig.run(f"find {partial} -name '*.part' -size +10k").stdout.split()
        assert kept and not rig.file(f"/srv/rigops/models/{folder}").exists
    finally:
        cache.check_output("systemctl start nginx")
    before = len(cache.check_output("cat /var/log/nginx/rigops-fleet-cache.log").splitlines())
    rc, flat, raw = weights()
    assert rc == 0, flat[-3000:]
    log = cache.check_output("cat /var/log/nginx/rigops-fleet-cache.log").splitlines()[before:]
    assert any('" 206 ' in line and ".safetensors" in line for line in log), log
    for f in m["files"]:
        assert rig.file(f"/srv/rigops/models/{folder}/{f['path']}").sha256sum == f["sha256"]
