"""The hub stand-in over plain HTTP (urllib): listings, revisions, Range, 404s, faults, log.

No client libraries and no generated model: the fixture writes a small fake repository.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lab" / "sandbox" / "hub"))

import hub  # noqa: E402

BIG = bytes(range(256)) * 1024  # 256 KiB, "LFS" file (.safetensors)
FILES = {
    "config.json": b'{"model_type": "llama"}\n',
    "model.safetensors": BIG,
    "sub/dir/notes.txt": b"nested\n",
}
CATALOG = {
    "repos": [
        {"hub": "modelscope", "id": "Org/Model-MS", "branches": {"master": "v2"}, "tags": {"v1.0": "v1"}},
        {"hub": "huggingface", "id": "Org/Model-HF", "branches": {"main": "v2"}, "tags": {"v1.0": "v1"}},
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubroot")
    for snap in ("v1", "v2"):
        for name, data in FILES.items():
            p = root / snap / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data if snap == "v2" or name != "config.json" else b"{}\n")
    (root / "catalog.json").write_text(json.dumps(CATALOG))
    log = root / "requests.jsonl"
    srv = hub.make_server(root, port=0, log=log)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    srv.log_path = log
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def _no_faults(server):
    server.faults.clear()
    yield
    server.faults.clear()


def get(server, path, method="GET", headers=None, data=None):
    req = urllib.request.Request(server.base + path, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def ms_data(server, path):
    status, _, body = get(server, path)
    assert status == 200, body
    payload = json.loads(body)
    assert payload["Code"] == 200 and payload["Success"] is True
    return payload["Data"]


def test_modelscope_listing_has_sizes_and_sha256(server):
    data = ms_data(server, "/api/v1/models/Org/Model-MS/repo/files?Revision=master&Recursive=True")
    blobs = {f["Path"]: f for f in data["Files"] if f["Type"] == "blob"}
    assert set(blobs) == set(FILES)
    for path, content in FILES.items():
        assert blobs[path]["Size"] == len(content)
        assert blobs[path]["Sha256"] == hashlib.sha256(content).hexdigest()
    trees = {f["Path"] for f in data["Files"] if f["Type"] == "tree"}
    assert trees == {"sub", "sub/dir"}


def test_modelscope_non_recursive_listing_and_root(server):
    data = ms_data(server, "/api/v1/models/Org/Model-MS/repo/files?Revision=master&Recursive=False")
    assert {f["Path"] for f in data["Files"]} == {"config.json", "model.safetensors", "sub"}
    data = ms_data(server, "/api/v1/models/Org/Model-MS/repo/files?Revision=master&Recursive=True&Root=sub")
    assert {f["Path"] for f in data["Files"]} == {"sub/dir", "sub/dir/notes.txt"}


def test_modelscope_revisions_and_tag_content(server):
    data = ms_data(server, "/api/v1/models/Org/Model-MS/revisions")
    branches = {b["Revision"]: b["CommitId"] for b in data["RevisionMap"]["Branches"]}
    tags = {t["Revision"]: t["CommitId"] for t in data["RevisionMap"]["Tags"]}
    assert set(branches) == {"master"} and set(tags) == {"v1.0"}
    assert branches["master"] != tags["v1.0"]
    # a tag and a commit id both resolve
    for rev in ("v1.0", tags["v1.0"]):
        status, _, body = get(server, f"/api/v1/models/Org/Model-MS/repo?Revision={rev}&FilePath=config.json")
        assert (status, body) == (200, b"{}\n")
    assert ms_data(server, "/api/v1/models/Org/Model-MS")["Name"] == "Model-MS"


def test_modelscope_range_download(server):
    url = "/api/v1/models/Org/Model-MS/repo?Revision=master&FilePath=model.safetensors"
    status, headers, body = get(server, url, headers={"Range": "bytes=1000-"})
    assert status == 206
    assert body == BIG[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(BIG) - 1}/{len(BIG)}"
    assert headers["Content-Length"] == str(len(BIG) - 1000)
    assert headers["X-Linked-Etag"].strip('"') == hashlib.sha256(BIG).hexdigest()
    status, headers, _ = get(server, url, headers={"Range": f"bytes={len(BIG)}-"})
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(BIG)}"


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/models/Org/Nope/repo/files?Revision=master&Recursive=True",
        "/api/v1/models/Org/Model-MS/repo/files?Revision=nope&Recursive=True",
        "/api/v1/models/Org/Model-MS/repo?Revision=master&FilePath=nope.bin",
        "/api/v1/models/Org/Model-HF",  # ids are per hub
    ],
)
def test_modelscope_not_found_body(server, path):
    status, _, body = get(server, path)
    assert status == 404
    payload = json.loads(body)
    assert payload["Success"] is False and payload["Code"] == hub.MS_NOT_FOUND_CODE and payload["Message"]


def test_huggingface_revision_tree_and_head(server):
    status, _, body = get(server, "/api/models/Org/Model-HF/revision/main")
    info = json.loads(body)
    assert status == 200 and info["id"] == "Org/Model-HF" and len(info["sha"]) == 40
    assert {s["rfilename"] for s in info["siblings"]} == set(FILES)
    status, _, body = get(server, f"/api/models/Org/Model-HF/tree/{info['sha']}?recursive=true&expand=false")
    tree = {e["path"]: e for e in json.loads(body)}
    assert tree["model.safetensors"]["lfs"]["oid"] == hashlib.sha256(BIG).hexdigest()
    assert tree["model.safetensors"]["size"] == len(BIG)
    blob = FILES["config.json"]
    assert tree["config.json"]["oid"] == hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
    assert tree["sub"]["type"] == "directory"
    status, headers, body = get(server, f"/Org/Model-HF/resolve/{info['sha']}/model.safetensors", method="HEAD")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == info["sha"]
    assert headers["ETag"].strip('"') == hashlib.sha256(BIG).hexdigest()
    assert headers["Content-Length"] == str(len(BIG))
    status, _, body = get(server, "/Org/Model-HF/resolve/main/sub/dir/notes.txt")
    assert (status, body) == (200, b"nested\n")


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/api/models/Org/Nope/revision/main", "RepoNotFound"),
        ("/api/models/Org/Model-MS/revision/main", "RepoNotFound"),
        ("/api/models/Org/Model-HF/revision/nope", "RevisionNotFound"),
        ("/Org/Model-HF/resolve/main/nope.json", "EntryNotFound"),
    ],
)
def test_huggingface_not_found_headers(server, path, code):
    for method in ("GET", "HEAD"):
        status, headers, _ = get(server, path, method=method)
        assert status == 404 and headers["X-Error-Code"] == code


def test_fault_drop_then_resume_is_logged(server):
    status, _, body = get(
        server, "/_admin/faults", method="POST",
        data=json.dumps({"kind": "drop", "file": "model.safetensors", "after_bytes": 5000}).encode(),
    )  # fmt: skip
    assert status == 200 and json.loads(body)[0]["kind"] == "drop"
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/Org/Model-HF/resolve/main/model.safetensors")
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead) as exc:
        resp.read()
    assert len(exc.value.partial) == 5000
    conn.close()
    status, _, body = get(server, "/Org/Model-HF/resolve/main/model.safetensors", headers={"Range": "bytes=5000-"})
    assert status == 206 and BIG[:5000] + body == BIG
    # The server logs a request once it has sent the body: the client can have it before
    # the log line is written, so wait for the resume's line.
    deadline = time.monotonic() + 10
    while True:
        entries = [json.loads(line) for line in server.log_path.read_text().splitlines()]
        mine = [e for e in entries if e["file"] == "model.safetensors" and e["repo"] == "Org/Model-HF"][-2:]
        if (mine and mine[-1]["range"] == "bytes=5000-") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [(e["bytes"], e["range"], bool(e["fault"])) for e in mine] == [
        (5000, None, True),
        (len(BIG) - 5000, "bytes=5000-", False),
    ]
    assert mine[0]["api"] == "huggingface" and mine[1]["client"] == "urllib"


def test_fault_corrupt_and_status_and_times(server):
    faults = [
        {"kind": "corrupt", "file": "model.safetensors", "hub": "modelscope"},
        {"kind": "status", "status": 503, "file": "config.json", "times": 2},
    ]
    get(server, "/_admin/faults", method="POST", data=json.dumps(faults).encode())
    url = "/api/v1/models/Org/Model-MS/repo?Revision=master&FilePath=model.safetensors"
    _, _, bad = get(server, url)
    assert len(bad) == len(BIG) and bad != BIG
    _, _, good = get(server, url)
    assert good == BIG  # times: 1 by default
    cfg = "/Org/Model-HF/resolve/main/config.json"
    assert [get(server, cfg)[0] for _ in range(3)] == [503, 503, 200]
    status, _, body = get(server, "/_admin/faults")
    assert [f["times"] for f in json.loads(body)] == [0, 0]


def test_fault_delay(server):
    get(server, "/_admin/faults", method="POST", data=json.dumps({"kind": "delay", "seconds": 0.3}).encode())
    import time

    t0 = time.monotonic()
    status, _, _ = get(server, "/api/models/Org/Model-HF/revision/main")
    assert status == 200 and time.monotonic() - t0 >= 0.3


def test_range_parser():
    assert hub.parse_range(None, 10) is None
    assert hub.parse_range("bytes=2-4", 10) == (2, 4)
    assert hub.parse_range("bytes=-3", 10) == (7, 9)
    assert hub.parse_range("bytes=8-100", 10) == (8, 9)
    assert hub.parse_range("bytes=10-", 10) == "unsatisfiable"
    assert hub.parse_range("bytes=0-1,4-5", 10) is None  # multi-range: whole file
