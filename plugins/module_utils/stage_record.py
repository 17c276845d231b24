# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A job's stage record on the host (<rigops_stage_record_dir>/<stage>.json): that the stage
started, passed (with its figures) or failed (with the task that failed). playbooks/report.yml reads
them (plugins/filter/report.py): a stage counts as passed only when its record says so.

Host side: Python 3.8 and the standard library only.
"""

import datetime
import json
import os

from ansible_collections.rigops.fleet.plugins.module_utils.state_file import load_json, write_atomic

STATUSES = ("started", "passed", "failed")


def stage_record(stage, status, seconds=None, summary=None, task=None, now=None):
    """The record of ``stage`` in ``status``: started has the time only; passed adds the stage's seconds
    and summary; failed the task that failed."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {status!r}")
    when = now or datetime.datetime.now(datetime.timezone.utc)
    record = {"stage": stage, "status": status, "time": when.isoformat()}
    if status == "passed":
        record.update(seconds=seconds, summary=summary or {})
    elif status == "failed":
        record["task"] = task or ""
    return record


def stage_results(results, record, check_mode):
    """The run's stage results (``results``: stage to its result) with ``record``'s stage added once it passed
    or failed: its status, whether the run was a check, its seconds (passed) or its task (failed). A start
    adds nothing."""
    if record["status"] == "started":
        return dict(results or {})
    result = {"status": record["status"], "check_mode": bool(check_mode)}
    if record["status"] == "passed":
        result["seconds"] = record["seconds"]
    else:
        result["task"] = record["task"]
    return {**(results or {}), record["stage"]: result}


def record_text(record):
    """The file's text: what Ansible's to_nice_json writes (sorted keys, four spaces), and a newline."""
    return json.dumps(record, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def write_record(path, record, dry_run=False):
    """Write ``record`` to ``path`` (its folder made, root's, 0755, when missing), atomically, 0644."""
    if dry_run:
        return
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, mode=0o755)
    write_atomic(path, record_text(record), mode=0o644)


def read_records(folder, stages):
    """The records of ``stages`` in ``folder``, by stage; a stage without a record, or with one that is not JSON
    (a disk that filled half-way), is left out: the report says it never ran."""
    records = {}
    for stage in stages:
        try:
            record = load_json(os.path.join(folder, f"{stage}.json"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records[stage] = record
    return records
