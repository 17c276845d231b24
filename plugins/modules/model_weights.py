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
    the index present) is the marker written and the folder renamed into place, so a partial model is never
    left looking complete.
  - A staged model with a matching marker is checked by sizes only (sha256 with O(verify_sha256)) and nothing is
    downloaded. A file that fails the check is fetched again.
  - O(source=adopt) takes files another host verified (copied into the C(.partial) folder by the role) and proves
    them against that host's marker (O(expected)) before the rename, without contacting the hub.
  - O(source=fleet_cache) pulls the files from the site's fleet cache (role C(fleet_cache)) over HTTP(S),
    O(workers) at a time, each resumed from what an earlier attempt left (HTTP ranges), into the same
    C(<commit>.partial) folder, proven against the cache's listing (C(<cache_url>/index.json) with the commit,
    sizes and sha256) before the marker and the rename. A cache that does not answer fails the task and changes
    nothing, unless O(fallback_to_hub) is set, and then the model comes from the hub as with O(source=hub).
  - O(source=local) checks a model folder already on the host (config.json, every shard of the index whole).
  - O(state=checked) only reports (commit, staged or not, bytes still needed, free space, custom code).
  - The hub's answers are checked before anything is written, and a violation fails the task with the hub, the
    model id and the offending value. The commit must be 40 lowercase hex digits. Every listed file path must be
    relative and stay inside the model's folder as listed (no C(..) or C(.) or empty segments, no backslash, NUL
    or control character). Symbolic links inside a model folder are never followed.
  - The logic lives in the module_utils C(model_weights) (staging I/O) and C(model_weights_plan) (plan, listings,
    checks, verification).
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  state:
    description: C(present) stages the model; C(checked) reports and changes nothing.
    type: str
    choices: [present, checked]
    default: present
  source:
    description: Where the files come from.
    type: str
    choices: [hub, adopt, fleet_cache, local]
    default: hub
  hub:
    description: The hub (sources hub, adopt and fleet_cache).
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
    description:
      - Base URL of the hub's API; empty for the hub's public one (C(https://www.modelscope.cn),
        C(https://huggingface.co)).
      - A plain C(http://) endpoint (a mirror) is refused unless O(allow_http) is set; so is an answer redirected
        to one.
    type: str
    default: ""
  allow_http:
    description:
      - Allow a plain C(http://) O(endpoint), e.g. a trusted mirror on a private network. File lists and weights
        then travel unauthenticated; the sha256 of every file is still checked against the listing.
    type: bool
    default: false
  token:
    description: Hub token; given to the client by environment only.
    type: str
    default: ""
  cache_url:
    description: Base URL of the fleet cache (source fleet_cache), e.g. C(https://cache-a.site:8443).
    type: str
    default: ""
  cache_token:
    description: Token the fleet cache asks for (source fleet_cache), sent as a bearer token; empty for none.
    type: str
    default: ""
  peers:
    description:
      - Source fleet_cache, hosts of earlier batches that serve their verified copies (role model_weights,
        C(model_weights_peers)); each with C(url) (its base URL, the cache's layout) and C(models) (the
        C(<hub>/<id>@<commit>) it serves). The files are spread over the cache and the peers that serve the model;
        a peer gets the cache's token, and every file from a peer is checked against the sha256 of the cache's
        listing before it is used. A file a peer refuses, cuts or sends wrong is taken from the cache.
      - The listing always comes from the cache.
    type: list
    elements: dict
    default: []
  peer_seed:
    description: Source fleet_cache with O(peers), where in the list of sources this host starts (its place in the
      play), so that the hosts of one batch start on different ones.
    type: int
    default: 0
  fallback_to_hub:
    description: Source fleet_cache, when the cache does not answer, download from the hub (O(endpoint)) instead.
    type: bool
    default: false
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
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Lists and verifies, downloads and writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Stage a ModelScope model
  rigops.fleet.model_weights:
    hub: modelscope
    id: Qwen/Qwen3.5-9B
    revision: master
    endpoint: https://www.modelscope.cn
    group: vllm
  no_log: true

- name: Stage a Hugging Face model from a plain-http mirror on the rigs' private network
  rigops.fleet.model_weights:
    hub: huggingface
    id: Qwen/Qwen3.5-9B-Instruct
    revision: v1.0.0
    endpoint: http://hub-mirror.internal:8090
    allow_http: true
    group: vllm

- name: Pull a model from the site's fleet cache, in parallel, verified against the cache's listing
  rigops.fleet.model_weights:
    source: fleet_cache
    hub: huggingface
    id: Qwen/Qwen3.5-9B-Instruct
    revision: v1.0.0
    cache_url: https://cache-a.site-a.internal
    cache_token: "{{ vault_fleet_cache_token }}"
    workers: 8
    group: vllm

- name: List and verify only (no download, nothing written)
  rigops.fleet.model_weights:
    state: checked
    hub: modelscope
    id: Qwen/Qwen3.5-9B
    endpoint: https://www.modelscope.cn
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
fallback:
  description: Source fleet_cache, why the cache was not used (the model came from the hub, O(fallback_to_hub)).
  returned: when the cache did not answer and O(fallback_to_hub) is set
  type: str
  sample: "fleet cache (http://cache-a:8081): cannot reach http://cache-a:8081/index.json (Connection refused)"
peers:
  description: Source fleet_cache with O(peers) that serve the model, what they sent and what was refused.
  returned: when files were pulled and a peer served the model
  type: dict
  sample:
    peers: [https://rig-07.site-a.internal:8082]
    from_peers: {https://rig-07.site-a.internal:8082: [model-00001-of-00003.safetensors]}
    peer_bytes: 1048576
    refused: [{peer: https://rig-07.site-a.internal:8082, path: config.json, why: "...: HTTP 409"}]
reason:
  description: Why the model is not staged yet (no marker, a file missing or wrong, ...).
  returned: when a source hub or adopt model is not staged before the run
  type: str
  sample: no marker
"""

# Ansible's module layout puts the documentation first, then the imports.
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.model_weights import StageError, client_fetch, stage_model


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["present", "checked"], "default": "present"},
            "source": {"type": "str", "choices": ["hub", "adopt", "fleet_cache", "local"], "default": "hub"},
            "hub": {"type": "str", "choices": ["modelscope", "huggingface"]},
            "id": {"type": "str"},
            "revision": {"type": "str", "default": ""},
            "endpoint": {"type": "str", "default": ""},
            "allow_http": {"type": "bool", "default": False},
            "token": {"type": "str", "default": "", "no_log": True},
            "cache_url": {"type": "str", "default": ""},
            "cache_token": {"type": "str", "default": "", "no_log": True},
            "peers": {"type": "list", "elements": "dict", "default": []},
            "peer_seed": {"type": "int", "default": 0},
            "fallback_to_hub": {"type": "bool", "default": False},
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
            ("source", "fleet_cache", ["hub", "id", "cache_url"]),
            ("source", "local", ["path"]),
        ],
        supports_check_mode=True,
    )
    try:
        result = stage_model(
            module.params, check_mode=module.check_mode, fetch=client_fetch(module.run_command, module.params)
        )
    except StageError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
