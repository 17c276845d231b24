#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: model_weights
short_description: Stage one model's weights from a hub, verified, resumable, with a marker
description:
  - O(source=hub) resolves O(revision) (branch, tag or commit) to a commit through the hub's API, lists the
    repository's files (size, sha256 or git blob id), and stages them in C(<root>/<hub>/<org>/<name>/<commit>).
  - Downloads go through the real client (C(modelscope) or C(huggingface_hub)) run by O(python), into a
    C(<commit>.partial) sibling that is kept between attempts and runs, so an interrupted download resumes.
    Only after every file is proven (size, sha256 or git blob id, whole safetensors shards, every shard named in
    the index present) is the marker written and the folder renamed into place: never a silent partial model.
  - A staged model with a matching marker is checked by sizes only (sha256 with O(verify_sha256)) and nothing is
    downloaded. A file that fails the check is fetched again.
  - O(source=adopt) takes files another host verified (copied into the C(.partial) folder by the role) and proves
    them against that host's marker (O(expected)) before the rename: no hub contact.
  - O(source=local) checks a model folder already on the host (config.json, every shard of the index whole).
  - O(state=checked) only reports (commit, staged or not, bytes still needed, free space, custom code).
version_added: "0.1.0"
author: rigops contributors
options:
  state:
    description: C(present) stages the model; C(checked) reports and changes nothing.
    type: str
    choices: [present, checked]
    default: present
  source:
    description: Where the files come from.
    type: str
    choices: [hub, adopt, local]
    default: hub
  hub:
    description: The hub (source hub and adopt).
    type: str
    choices: [modelscope, huggingface]
  id:
    description: The hub's repository id (C(Org/Name)); ids differ between ModelScope and Hugging Face.
    type: str
  revision:
    description: Branch, tag or commit.
    type: str
    default: ""
  endpoint:
    description: Base URL of the hub's API.
    type: str
    default: ""
  token:
    description: Hub token; given to the client by environment only.
    type: str
    default: ""
  root:
    description: Root of the staged models.
    type: path
    default: /srv/rigops/models
  path:
    description: The model folder (source local).
    type: path
  python:
    description: Interpreter that has the hub clients (the vLLM runtime's venv).
    type: path
    default: /opt/rigops/vllm/current/venv/bin/python
  label:
    description: The instance's C(model.source) recorded in the marker (C(controller) for a fan-out download).
    type: str
    default: ""
  expected:
    description: Source adopt, the verifying host's result (C(commit), C(files), C(revision), C(trust_remote_code)).
    type: dict
    default: {}
  owner:
    description: Owner of the staged files.
    type: str
    default: root
  group:
    description: Group of the staged files (the service group reads them).
    type: str
    default: root
  dir_mode:
    description: Mode of the staged folders.
    type: str
    default: "0750"
  file_mode:
    description: Mode of the staged files.
    type: str
    default: "0640"
  verify_sha256:
    description: Hash every file of an already staged model, not only compare sizes.
    type: bool
    default: false
  attempts:
    description: Client runs before giving up (a rerun resumes what the last one left).
    type: int
    default: 3
  workers:
    description: Parallel downloads of one client run.
    type: int
    default: 4
  timeout:
    description: Seconds for each hub API call.
    type: int
    default: 30
  disk_margin_ratio:
    description: Free space needed beyond the missing bytes, as a ratio of them.
    type: float
    default: 0.1
  disk_margin_bytes:
    description: Free space needed beyond the missing bytes and the ratio.
    type: int
    default: 1073741824
attributes:
  check_mode:
    support: full
    description: Lists and verifies, downloads and writes nothing.
"""

EXAMPLES = r"""
- name: Stage a ModelScope model
  model_weights:
    hub: modelscope
    id: Qwen/Qwen3.5-9B
    revision: master
    endpoint: https://www.modelscope.cn
    group: vllm
  no_log: true
"""

RETURN = r"""
path:
  description: The staged model folder (what vLLM loads).
  returned: success
  type: str
  sample: /srv/rigops/models/modelscope/Qwen/Qwen3.5-9B/046faecc3573390176703f4b4dece37da6d49a82
commit:
  description: The commit the revision resolved to.
  returned: success
  type: str
  sample: 046faecc3573390176703f4b4dece37da6d49a82
staged:
  description: Whether a verified copy with a matching marker is in place (after the run).
  returned: always
  type: bool
  sample: true
files:
  description: The verified files, with size and sha256.
  returned: success
  type: list
  sample: [{path: config.json, size: 579, sha256: b4e2d003...}]
downloaded:
  description: Files a client was asked for during this run.
  returned: success
  type: list
  sample: [model-00001-of-00003.safetensors]
bytes_needed:
  description: Bytes still missing before the run.
  returned: success
  type: int
  sample: 2272000
free_bytes:
  description: Free bytes under the root's filesystem.
  returned: success
  type: int
  sample: 50000000000
trust_remote_code:
  description: The repository ships custom code (C(auto_map) in config.json, or *.py files).
  returned: success
  type: bool
  sample: false
remote_code:
  description: What made trust_remote_code true.
  returned: success
  type: dict
  sample: {python_files: [], auto_map: []}
"""

# Ansible's module layout puts the documentation first, then the imports.
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.model_weights import (  # noqa: E402
    COMMIT_RE,
    FETCH_SCRIPT,
    MARKER,
    HubError,
    api_urls,
    bytes_needed,
    disk_problem,
    fetch_env,
    hf_commit,
    hf_files,
    hub_error,
    index_problems,
    last_error,
    make_marker,
    marker_files,
    marker_problem,
    model_dir,
    ms_commit,
    ms_files,
    problems_text,
    remote_code,
    safetensors_problem,
    verify_files,
)
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402


def get_json(module, url, token):
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    p = module.params
    try:
        resp = open_url(url, headers=headers, timeout=p["timeout"], http_agent="rigops-model-weights")
        return json.loads(resp.read())
    except HTTPError as exc:
        body = exc.read().decode("utf-8", "replace") if hasattr(exc, "read") else ""
        module.fail_json(
            msg=hub_error(p["hub"], p["id"], p["revision"], exc.code, body, dict(exc.headers or {})), url=url
        )
    except (URLError, OSError, ValueError) as exc:
        module.fail_json(msg=f"{p['hub']}: cannot reach {url} ({exc}); check model_weights_{p['hub']}_endpoint")


def listing(module):
    """(commit, files) of the revision, from the hub's API."""
    p = module.params
    urls = api_urls(p["hub"], p["endpoint"], p["id"], p["revision"])
    try:
        if p["hub"] == "modelscope":
            commit = p["revision"] if COMMIT_RE.match(p["revision"]) else ""
            files = ms_files(get_json(module, urls["files"], p["token"]))
            if not commit:
                commit = ms_commit(get_json(module, urls["revisions"], p["token"]), p["revision"])
            if not commit:
                module.fail_json(
                    msg=f"modelscope: revision {p['revision']!r} of {p['id']} is neither a branch, a tag nor a commit"
                )
        else:
            commit = hf_commit(get_json(module, urls["revision"], p["token"]))
            files = hf_files(get_json(module, urls["tree"].format(commit=commit), p["token"]))
    except (HubError, KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg=f"{p['hub']}: unexpected listing for {p['id']}@{p['revision']}: {exc}")
    if not files:
        module.fail_json(msg=f"{p['hub']}: {p['id']}@{p['revision']} lists no files")
    return commit, files


def read_marker(directory):
    try:
        with open(os.path.join(directory, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_json_in(directory):
    def read(rel):
        with open(os.path.join(directory, rel)) as f:
            return json.load(f)

    return read


def free_bytes(path):
    while not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fix_modes(module, directory, files):
    p = module.params
    dmode, fmode = int(p["dir_mode"], 8), int(p["file_mode"], 8)
    keep = {f["path"] for f in files} | {MARKER}
    # anything a client left behind (.cache/, temp folders) is not part of the model
    for base, dirs, names in os.walk(directory, topdown=False):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), directory)
            if rel not in keep:
                os.unlink(os.path.join(base, name))
        for name in dirs:
            full = os.path.join(base, name)
            if not os.listdir(full):
                os.rmdir(full)
    for base, dirs, names in os.walk(directory):
        for name in dirs + [None]:
            full = base if name is None else os.path.join(base, name)
            module.set_owner_if_different(full, p["owner"], False)
            module.set_group_if_different(full, p["group"], False)
            os.chmod(full, dmode)
        for name in names:
            full = os.path.join(base, name)
            module.set_owner_if_different(full, p["owner"], False)
            module.set_group_if_different(full, p["group"], False)
            os.chmod(full, fmode)


def ensure_parents(module, path):
    """Create <root>/<hub>/<org>/<name> with the folder mode and group (never the model's final folder)."""
    p = module.params
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        os.mkdir(d)
        module.set_owner_if_different(d, p["owner"], False)
        module.set_group_if_different(d, p["group"], False)
        os.chmod(d, int(p["dir_mode"], 8))


def fetch(module, partial, commit, wanted):
    """Run the real client once for `wanted` files; (ok, message)."""
    p = module.params
    args = {
        "hub": p["hub"],
        "id": p["id"],
        "commit": commit,
        "dir": partial,
        "files": wanted,
        "endpoint": p["endpoint"],
        "workers": p["workers"],
    }
    env = dict(os.environ)
    env.update(fetch_env(p["hub"], p["token"], os.path.join(p["root"], ".client-cache")))
    rc, out, err = module.run_command(
        [p["python"], "-c", FETCH_SCRIPT, json.dumps(args)], environ_update=env, check_rc=False
    )
    return rc == 0, last_error(err or out)


def stage(module, final, commit, files, result):
    """Download into <final>.partial until every file is proven, then marker + rename."""
    p = module.params
    partial = final + ".partial"
    if os.path.isdir(final) and not os.path.isdir(partial):
        # a staged copy that failed its check: keep its good files, fetch the rest
        os.rename(final, partial)
    elif os.path.isdir(final):
        shutil.rmtree(final)
    ensure_parents(module, os.path.dirname(final))
    if not os.path.isdir(partial):
        os.mkdir(partial, 0o700)
    downloaded, errors = set(), []
    check = verify_files(partial, files, full=True)
    for _attempt in range(max(1, p["attempts"])):
        for rel in check["bad"]:
            os.unlink(os.path.join(partial, rel))
        wanted = sorted(set(check["missing"]) | set(check["bad"]))
        if not wanted:
            break
        downloaded.update(wanted)
        ok, why = fetch(module, partial, commit, wanted)
        if not ok:
            errors.append(why)
        check = verify_files(partial, files, full=True)
    result["downloaded"] = sorted(downloaded)
    if not check["ok"]:
        module.fail_json(
            msg=(
                f"{p['hub']}: {p['id']}@{commit} is incomplete after {p['attempts']} attempts: "
                + problems_text(check)
                + (f". Last client error: {errors[-1]}" if errors else "")
                + f". The partial download stays in {partial} and a rerun resumes it; no marker was written."
            ),
            **result,
        )
    return partial, check["digests"]


def finish(module, partial, final, model, commit, files, digests, result):
    problems = index_problems(files, read_json_in(partial))
    if problems:
        module.fail_json(msg=f"{model['id']}@{commit}: incomplete sharded model: " + "; ".join(problems), **result)
    config = {}
    if os.path.isfile(os.path.join(partial, "config.json")):
        config = read_json_in(partial)("config.json")
    trust = remote_code(files, config)
    marker = make_marker(model, commit, files, digests, trust)
    fix_modes(module, partial, files)
    tmp = os.path.join(partial, MARKER)
    with open(tmp, "w") as f:
        json.dump(marker, f, indent=1, sort_keys=True)
    module.set_owner_if_different(tmp, module.params["owner"], False)
    module.set_group_if_different(tmp, module.params["group"], False)
    os.chmod(tmp, int(module.params["file_mode"], 8))
    os.rename(partial, final)
    result.update(changed=True, staged=True, files=marker["files"], **trust)
    result["remote_code"] = {"python_files": trust["python_files"], "auto_map": trust["auto_map"]}


def run_local(module, result):
    path = module.params["path"]
    if not os.path.isfile(os.path.join(path, "config.json")):
        module.fail_json(msg=f"local model {path}: no config.json there; set model.path to a model folder")
    files = []
    for base, _dirs, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), path)
            if not rel.startswith("."):
                files.append({"path": rel, "size": os.path.getsize(os.path.join(base, name))})
    problems = index_problems(files, read_json_in(path))
    problems += [
        f"{f['path']}: {why}"
        for f in files
        if f["path"].endswith(".safetensors") and (why := safetensors_problem(os.path.join(path, f["path"])))
    ]
    if problems:
        module.fail_json(msg=f"local model {path} is incomplete: " + "; ".join(problems), **result)
    trust = remote_code(files, read_json_in(path)("config.json"))
    result.update(path=path, commit="", staged=True, files=sorted(files, key=lambda f: f["path"]), **trust)
    result["remote_code"] = {"python_files": trust["python_files"], "auto_map": trust["auto_map"]}
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["present", "checked"], "default": "present"},
            "source": {"type": "str", "choices": ["hub", "adopt", "local"], "default": "hub"},
            "hub": {"type": "str", "choices": ["modelscope", "huggingface"]},
            "id": {"type": "str"},
            "revision": {"type": "str", "default": ""},
            "endpoint": {"type": "str", "default": ""},
            "token": {"type": "str", "default": "", "no_log": True},
            "root": {"type": "path", "default": "/srv/rigops/models"},
            "path": {"type": "path"},
            "python": {"type": "path", "default": "/opt/rigops/vllm/current/venv/bin/python"},
            "expected": {"type": "dict", "default": {}},
            "label": {"type": "str", "default": ""},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "dir_mode": {"type": "str", "default": "0750"},
            "file_mode": {"type": "str", "default": "0640"},
            "verify_sha256": {"type": "bool", "default": False},
            "attempts": {"type": "int", "default": 3},
            "workers": {"type": "int", "default": 4},
            "timeout": {"type": "int", "default": 30},
            "disk_margin_ratio": {"type": "float", "default": 0.1},
            "disk_margin_bytes": {"type": "int", "default": 1073741824},
        },
        required_if=[
            ("source", "hub", ["hub", "id"]),
            ("source", "adopt", ["hub", "id"]),
            ("source", "local", ["path"]),
        ],
        supports_check_mode=True,
    )
    p = module.params
    result = {"changed": False, "staged": False, "downloaded": [], "bytes_needed": 0}
    if p["source"] == "local":
        run_local(module, result)
    if not p["revision"]:
        p["revision"] = "master" if p["hub"] == "modelscope" else "main"

    if p["source"] == "adopt":
        if not p["expected"].get("commit"):
            module.fail_json(msg=f"{p['id']}: source adopt needs expected (the cache host's result with commit/files)")
        commit, files = p["expected"]["commit"], marker_files(p["expected"])
    else:
        commit, files = listing(module)
    final = model_dir(p["root"], p["hub"], p["id"], commit)
    result.update(path=final, commit=commit)
    marker = read_marker(final)
    problem = marker_problem(marker, p["hub"], p["id"], commit, files)
    if not problem:
        check = verify_files(final, files, full=p["verify_sha256"])
        if not check["ok"]:
            problem = problems_text(check)
    partial = final + ".partial"
    where = partial if os.path.isdir(partial) else final
    result["bytes_needed"] = 0 if not problem else bytes_needed(where, files)
    result["free_bytes"] = free_bytes(p["root"])
    result["files"] = marker["files"] if marker and not problem else files
    if not problem:
        result.update(staged=True, trust_remote_code=bool(marker.get("trust_remote_code")))
        result["remote_code"] = remote_code(
            files, read_json_in(final)("config.json") if os.path.isfile(os.path.join(final, "config.json")) else {}
        )
        module.exit_json(**result)
    result["reason"] = problem
    pre = remote_code(files, None)
    result.update(trust_remote_code=pre["trust_remote_code"], remote_code=pre)
    if p["state"] == "checked" or module.check_mode:
        result["changed"] = p["state"] == "present"
        module.exit_json(**result)

    model = {"id": p["id"], "hub": p["hub"], "source": p["label"] or p["hub"], "revision": p["revision"]}
    if p["source"] == "adopt":
        model["source"] = "controller"
        model["revision"] = p["expected"].get("revision", p["revision"])
        if not os.path.isdir(partial):
            module.fail_json(msg=f"{partial}: nothing copied from the cache host to adopt", **result)
        check = verify_files(partial, files, full=True)
        if not check["ok"]:
            module.fail_json(
                msg=f"{p['id']}@{commit}: files copied from the cache host do not match its verified list: "
                + problems_text(check),
                **result,
            )
        if os.path.isdir(final):
            shutil.rmtree(final)
        finish(module, partial, final, model, commit, files, check["digests"], result)
        module.exit_json(**result)

    why = disk_problem(
        result["bytes_needed"], result["free_bytes"], p["disk_margin_ratio"], p["disk_margin_bytes"], p["root"]
    )
    if why:
        module.fail_json(msg=why, **result)
    partial, digests = stage(module, final, commit, files, result)
    finish(module, partial, final, model, commit, files, digests, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
