#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: llm_gateway_gate
short_description: Gate on the LLM gateway answering every routed model correctly
description:
  - Waits until C(/healthz) of the gateway names O(config_id), so that the checks below judge the config just
    reloaded, bounded by O(timeout).
  - Then, as a client would (HTTPS, the gateway's certificate checked against O(server_name)), checks that
    C(/v1/models) answers 401 without a key and with a wrong one, that the paths vLLM leaves unguarded
    (C(/metrics), C(/tokenize), C(/health), ...) answer 404, that C(/v1/models) with the key lists every name,
    and that every name of O(names) whose C(gate) is true answers a chat completion with C(choices); one name
    (O(stream_name)) is also streamed and its first token timed.
  - The key is read from O(key_file) on the gateway host, never passed as an argument.
  - Every check runs; the module fails with all the findings. Read-only; runs in check mode.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  port:
    description: The gateway's port on the host.
    type: int
    required: true
  address:
    description: The address the checks connect to.
    type: str
    default: 127.0.0.1
  server_name:
    description: The name the certificate must be valid for (and the SNI sent); empty takes O(address).
    type: str
    default: ""
  ca_file:
    description:
      - CA bundle the gateway's certificate is checked against (the gateway's own CA, C(tls/ca.pem), when the role
        made it).
    type: path
  validate_certs:
    description: Check the certificate at all.
    type: bool
    default: true
  key_file:
    description: File on the gateway host holding a client key allowed every name (the role's health client).
    type: path
    required: true
  config_id:
    description: The id the config just written carries (C(/healthz) names it once it is in service); empty skips.
    type: str
    default: ""
  names:
    description: The names to check, each C(name), C(gate) (bool; false skips the chat) and C(why).
    type: list
    elements: dict
    required: true
  stream_name:
    description: A name whose chat is also streamed (its first token timed); empty for none.
    type: str
    default: ""
  max_tokens:
    description: C(max_tokens) of each chat completion.
    type: int
    default: 1
  timeout:
    description: Seconds to wait for C(/healthz) to name O(config_id).
    type: int
    default: 60
  request_timeout:
    description: Seconds for one request.
    type: int
    default: 120
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
"""

EXAMPLES = r"""
- name: Gate on every routed model through the gateway
  rigops.fleet.llm_gateway_gate:
    port: 8443
    ca_file: /etc/rigops-llm-gateway/tls/ca.pem
    key_file: /etc/rigops-llm-gateway/health_key
    config_id: 3f0c5e2a9b1d4c7e
    names:
      - {name: qwen2.5-72b-instruct, gate: true, why: ""}
      - {name: chat, gate: true, why: ""}
    stream_name: chat
"""

RETURN = r"""
answered:
  description: Per name that answered, the seconds of its chat, the model that answered it, and for the streamed one
    the seconds to its first chunk.
  type: dict
  returned: always
  sample: {chat: {chat_s: 0.41, answered_by: qwen2.5-72b-instruct, ttft_s: 0.22}}
skipped:
  description: Names not sent a chat, and why (every upstream unreachable from the gateway).
  type: dict
  returned: always
  sample: {coder: "unreachable: h100-01/coder"}
failures:
  description: Every finding, each a C(kind) (not_reloaded, not_listening, key_not_required, exposed, models, chat,
    stream) and a C(msg).
  type: list
  elements: dict
  returned: always
  sample: [{kind: chat, msg: "chat: chat completion: HTTP 502: no upstream of chat answered"}]
listed:
  description: The names C(/v1/models) listed for the health key.
  type: list
  elements: str
  returned: when the gateway answered
  sample: [chat, qwen2.5-72b-instruct]
reload_s:
  description: Seconds until C(/healthz) named the config.
  type: float
  returned: when the gateway answered
  sample: 0.21
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.llm_gateway import Client, gate


def main():
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "address": {"type": "str", "default": "127.0.0.1"},
            "server_name": {"type": "str", "default": ""},
            "ca_file": {"type": "path"},
            "validate_certs": {"type": "bool", "default": True},
            "key_file": {"type": "path", "required": True},
            "config_id": {"type": "str", "default": ""},
            "names": {"type": "list", "elements": "dict", "required": True},
            "stream_name": {"type": "str", "default": ""},
            "max_tokens": {"type": "int", "default": 1, "no_log": False},  # a count, not a token
            "timeout": {"type": "int", "default": 60},
            "request_timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["key_file"], encoding="utf-8") as fh:
            key = fh.read().strip()
    except OSError as exc:
        module.fail_json(msg=f"cannot read the gate's key file {p['key_file']}: {exc.strerror}")
    client = Client(
        p["address"],
        p["port"],
        server_name=p["server_name"] or p["address"],
        ca_file=p["ca_file"],
        verify=p["validate_certs"],
        timeout=p["request_timeout"],
    )
    out = gate(
        client,
        key,
        p["names"],
        config_id=p["config_id"],
        stream_name=p["stream_name"],
        max_tokens=p["max_tokens"],
        timeout=p["timeout"],
    )
    out.setdefault("listed", [])
    if out["failures"]:
        module.fail_json(
            msg="the gateway failed its gate:\n" + "\n".join(f"- {f['kind']}: {f['msg']}" for f in out["failures"]),
            **out,
        )
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
