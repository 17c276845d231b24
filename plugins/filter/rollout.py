# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's bookkeeping (playbooks/rollout.yml) as filters, run on the controller.

- ``slurped | rollout_configs``: the instances' config.toml files (the results of a slurp
  loop over instance names) parsed, each as the dict vllm_service's gate takes
  (``server``, ``model``, ``security``, ...);
- ``slurped | rollout_versions(current_target)``: what a host serves, as versions:
  ``{"runtime": <release of current>, "instances": {name: {"runtime", "commit", "revision",
  "config"}}}`` (``config``: sha256[:12] of the file);
- ``facts | rollout_result``: the host's result, the one fact the runner reads from the
  event stream (commands/rollout.py): status, versions before and after, seconds per stage, gate
  figures, rolled back or not, and why.

Statuses: ``unchanged`` (nothing to do), ``updated`` (switched and gated), ``rolled_back`` (the new
one failed its gate or a step after the switch; the old one is back and answered a completion),
``failed`` (failed before anything was switched: the old one serves as it did), ``rollback_failed``
(the old one could not be proven back: the host needs a person), ``check`` (a dry run).
"""

import hashlib
import posixpath
from base64 import b64decode
from collections.abc import Mapping

try:
    import tomllib
except ImportError:  # Python < 3.11 controllers
    import tomli as tomllib  # type: ignore[no-redef]

from ansible.errors import AnsibleFilterError
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain

OK_STATUSES = ("unchanged", "updated", "check")


def _files(slurped):
    """{name: text} of a slurp loop's results (item: the instance's name)."""
    out = {}
    for res in _plain(slurped or {}).get("results", []) if isinstance(slurped, Mapping) else _plain(slurped or []):
        if isinstance(res, dict) and res.get("content") is not None:
            out[str(res.get("item"))] = b64decode(res["content"]).decode("utf-8")
    return out


def rollout_configs(slurped):
    configs = []
    for name, text in sorted(_files(slurped).items()):
        try:
            configs.append(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise AnsibleFilterError(f"config.toml of {name} does not parse: {exc}") from exc
    return configs


def _release_of(python):
    """/opt/rigops/vllm/releases/<id>/venv/bin/python -> <id>."""
    path = str(python or "")
    if path.endswith("/venv/bin/python"):
        return posixpath.basename(path[: -len("/venv/bin/python")])
    return path or None


def rollout_versions(slurped, current_target=None):
    instances = {}
    for name, text in sorted(_files(slurped).items()):
        try:
            config = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            config = {}
        model = config.get("model") or {}
        instances[name] = {
            "runtime": _release_of((config.get("server") or {}).get("python")),
            "commit": model.get("commit") or None,
            "revision": model.get("revision") or None,
            "config": hashlib.sha256(text.encode()).hexdigest()[:12],
        }
    runtime = posixpath.basename(str(current_target)) if current_target else None
    return {"runtime": runtime, "instances": instances}


def stage_seconds(marks, end):
    """[[stage, t0], [stage, t1], ...] and the end time -> {stage: seconds} (a stage seen twice adds up)."""
    out = {}
    marks = [(str(m[0]), float(m[1])) for m in marks or [] if m and len(m) == 2]
    for index, (stage, start) in enumerate(marks):
        stop = marks[index + 1][1] if index + 1 < len(marks) else float(end)
        out[stage] = round(out.get(stage, 0.0) + max(0.0, stop - start), 1)
    return out


def gate_figures(summary):
    return {
        name: {k: v for k, v in (figures or {}).items() if k in ("ready_s", "chat_s", "ttft_s", "url", "served_name")}
        for name, figures in sorted((summary or {}).items())
        if not str(name).startswith("_")
    }


def rollout_result(facts):
    """The host's rollout result from what its tasks recorded (see playbooks/rollout.yml)."""
    f = _plain(facts or {})
    before, after = f.get("before") or {}, f.get("after") or {}
    failure = f.get("failure") or None
    switched, rolled_back = bool(f.get("switched")), bool(f.get("rolled_back"))
    if f.get("check_mode"):
        status = "check"
    elif failure is None:
        status = "unchanged" if before == after else "updated"
    elif f.get("rollback_error"):
        status = "rollback_failed"
    elif switched and rolled_back:
        status = "rolled_back"
    elif switched:
        status = "rollback_failed"
    else:
        status = "failed"
    reason = None
    if failure:
        reason = (
            f"{failure.get('stage', '?')}: {failure.get('task') or ''}: {' '.join(str(failure.get('msg', '')).split())}"
        )
        reason = reason[:600]
    if f.get("rollback_error"):
        reason = f"{reason}; rollback failed: {' '.join(str(f['rollback_error']).split())[:400]}"
    return {
        "host": f.get("host"),
        "status": status,
        "ok": status in OK_STATUSES,
        "batch": f.get("batch"),
        "canary": f.get("batch") == 1,
        "before": before,
        "after": after,
        "changed": before != after,
        "rolled_back": rolled_back,
        "switched": switched,
        "failed_stage": (failure or {}).get("stage"),
        "reason": reason,
        "stage_seconds": stage_seconds(f.get("marks"), f.get("end") or 0),
        "gate": gate_figures(f.get("gate")),
        "rollback_gate": gate_figures(f.get("rollback_gate")),
    }


class FilterModule:
    def filters(self):
        return {
            "rollout_configs": rollout_configs,
            "rollout_versions": rollout_versions,
            "rollout_result": rollout_result,
        }
