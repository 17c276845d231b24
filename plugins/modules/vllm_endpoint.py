#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: vllm_endpoint
short_description: Gate on a vLLM OpenAI-compatible endpoint answering correctly
description:
  - Waits until the endpoint is ready (C(/health) = 200; connection refused while the model loads is normal),
    bounded by O(timeout).
  - Then checks that C(/v1/models) with the key lists O(served_name), that C(/v1/models) without the key is
    rejected (401) when O(require_key), optionally one chat completion with a small C(max_tokens), and one
    streamed completion whose time to first token it measures.
  - Requests go to loopback without any proxy (the environment's C(HTTP_PROXY) is ignored unless
    O(use_proxy_env)); a proxy in the environment that would catch clients on the host is reported as a warning.
  - Each failure is classified (RV(kind)) with a message that says what to do. Read-only; runs in check mode.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  url:
    description: Base URL of the instance, without C(/v1).
    type: str
    default: http://127.0.0.1:8000
  served_name:
    description: The model name the instance must serve.
    type: str
    required: true
  api_key_file:
    description:
      - File on the host holding the key, read by the module (as root under become; the vllm_service role's key
        files are root's alone). The key itself is never an argument, so it never reaches a log of the module's
        arguments.
    type: path
  require_key:
    description: The instance must reject C(/v1/models) without a key (401).
    type: bool
    default: true
  chat:
    description: Send one chat completion.
    type: bool
    default: true
  stream:
    description: Send one streamed chat completion and measure the time to the first token.
    type: bool
    default: true
  max_tokens:
    description: C(max_tokens) of the test completions.
    type: int
    default: 8
  prompt:
    description: The test prompt.
    type: str
    default: Say hello.
  timeout:
    description: Seconds to wait for readiness.
    type: int
    default: 900
  interval:
    description: Seconds between readiness probes.
    type: float
    default: 2.0
  request_timeout:
    description: Seconds for one request once ready.
    type: int
    default: 120
  unit:
    description:
      - systemd unit of the instance; waiting stops early when it is C(failed) or C(inactive), or when it was
        restarted more than O(max_restarts) times while waiting (a crash loop).
    type: str
  max_restarts:
    description: Restarts of O(unit) tolerated while waiting for readiness.
    type: int
    default: 0
  use_proxy_env:
    description: Honour C(HTTP_PROXY)/C(NO_PROXY) of the module's environment (to reproduce what clients see).
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
  - rigops.fleet.attributes.read_only
"""

EXAMPLES = r"""
- name: Gate on the chat instance
  rigops.fleet.vllm_endpoint:
    url: http://127.0.0.1:8000
    served_name: qwen3.5-9b
    api_key_file: /etc/vllm/chat/api_key
    unit: vllm@chat.service
    timeout: 1800
  register: chat_gate

- name: Only the readiness and the model list
  rigops.fleet.vllm_endpoint:
    url: http://127.0.0.1:8001
    served_name: tiny
    require_key: false
    chat: false
    stream: false
"""

RETURN = r"""
url:
  description: The base URL checked.
  type: str
  returned: always
  sample: http://127.0.0.1:8000
ready_s:
  description: Seconds until C(/health) answered 200.
  type: float
  returned: success
  sample: 61.2
attempts:
  description: Readiness probes sent.
  type: int
  returned: success
  sample: 31
health:
  description: Status of C(/health).
  type: int
  returned: success
  sample: 200
served:
  description: Model ids C(/v1/models) lists (also on a served name mismatch).
  type: list
  elements: str
  returned: success or served_name_mismatch
  sample: [qwen3.5-9b]
models_without_key:
  description: Status of C(/v1/models) without a key (401 when a key is required).
  type: int
  returned: success
  sample: 401
chat_s:
  description: Seconds for the chat completion.
  type: float
  returned: success and chat
  sample: 0.41
chat_usage:
  description: The completion's C(usage) object.
  type: dict
  returned: success and chat
  sample: {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
ttft_s:
  description: Time to the first streamed token, in seconds.
  type: float
  returned: success and stream
  sample: 0.12
stream_chunks:
  description: Streamed chunks received.
  type: int
  returned: success and stream
  sample: 9
stream_s:
  description: Seconds for the whole streamed completion.
  type: float
  returned: success and stream
  sample: 0.35
kind:
  description:
    - Class of the failure, C(ok) on success; one of not_listening, not_running, engine_dead, key_mismatch,
      key_not_required, key_invalid, served_name_mismatch, proxy, error_body, timeout, http_error, usage.
  type: str
  returned: always
  sample: key_mismatch
step:
  description: Check that failed (key, health, models, models_nokey, chat, stream).
  type: str
  returned: failure
  sample: models
status:
  description: HTTP status of the failing answer, if there was one.
  type: int
  returned: failure
  sample: 401
body:
  description: Body of the failing answer (truncated).
  type: str
  returned: failure
  sample: '{"error":{"message":"Unauthorized"}}'
"""

# Ansible's module layout puts the documentation first, then the imports.
import os
import subprocess
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.vllm_endpoint import (
    GateFailure,
    UrllibTransport,
    gate,
    proxy_warning,
)


def _unit_state(module, unit):
    systemctl = module.get_bin_path("systemctl")
    if not unit or not systemctl:
        return None

    def state():
        proc = subprocess.run(
            [systemctl, "show", "--property=ActiveState,NRestarts", unit],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
        props = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        restarts = props.get("NRestarts", "0")
        return props.get("ActiveState", ""), int(restarts) if restarts.isdigit() else 0

    return state


def main():
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "default": "http://127.0.0.1:8000"},
            "served_name": {"type": "str", "required": True},
            "api_key_file": {"type": "path"},
            "require_key": {"type": "bool", "default": True},
            "chat": {"type": "bool", "default": True},
            "stream": {"type": "bool", "default": True},
            "max_tokens": {"type": "int", "default": 8, "no_log": False},  # a count, not a token
            "prompt": {"type": "str", "default": "Say hello."},
            "timeout": {"type": "int", "default": 900},
            "interval": {"type": "float", "default": 2.0},
            "request_timeout": {"type": "int", "default": 120},
            "unit": {"type": "str"},
            "max_restarts": {"type": "int", "default": 0},
            "use_proxy_env": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    base = p["url"].rstrip("/")
    key = None
    if p["api_key_file"]:
        try:
            with open(p["api_key_file"], "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            module.fail_json(
                msg=f"cannot read the key file {p['api_key_file']} ({exc.strerror}); rerun the vllm_service role",
                kind="key_mismatch",
                url=base,
            )
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            module.fail_json(
                msg=f"the key file {p['api_key_file']} is not UTF-8 text; rotate the key (vllm_service_rotate_keys)",
                kind="key_invalid",
                url=base,
            )
    if key:
        module.no_log_values.add(key)
    if p["require_key"] and not key:
        module.fail_json(msg="require_key is true but api_key_file gave no key", kind="usage", url=base)

    warning = proxy_warning(dict(os.environ), urlsplit(base).hostname or "")
    if warning:
        module.warn(warning)
    try:
        result = gate(
            UrllibTransport(use_proxy_env=p["use_proxy_env"]),
            base,
            p["served_name"],
            key=key,
            require_key=p["require_key"],
            chat=p["chat"],
            stream=p["stream"],
            max_tokens=p["max_tokens"],
            prompt=p["prompt"],
            timeout=p["timeout"],
            interval=p["interval"],
            request_timeout=p["request_timeout"],
            unit_state=_unit_state(module, p["unit"]),
            max_restarts=p["max_restarts"],
        )
    except GateFailure as exc:
        module.fail_json(
            msg=exc.msg,
            kind=exc.kind,
            step=exc.step,
            status=exc.status,
            body=exc.body,
            served=exc.served,
            url=base,
        )
    module.exit_json(changed=False, kind="ok", **result)


if __name__ == "__main__":
    main()
