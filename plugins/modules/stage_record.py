#!/usr/bin/python
# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r"""
---
module: stage_record
short_description: Record on the host that a stage of a job started, passed or failed
description:
  - Writes the stage's record, C(<dir>/<stage>.json), atomically (mode 0644), making its folder (0755) when it
    is missing. C(started) holds the time; C(passed) adds the stage's seconds and summary; C(failed) the
    task that failed. playbooks/report.yml reads these records; a stage counts as passed only when its record
    says so, so a run that dies half-way leaves C(started) behind.
  - C(started) takes every stage a run selects at once (O(stages)), at its start; each stage then records
    that it passed or failed.
  - Returns the stages and the controller's clock it was given, for the playbook to time the next stage
    (C(register)), and the run's stage results with this stage's added (RV(stage_results)), in one call per
    stage boundary.
  - The record is the run's bookkeeping, rewritten by every run, so the module never reports a change.
  - Logic in plugins/module_utils/stage_record.py.
version_added: "0.1.0"
author: rigops contributors (@rigops)
options:
  dir:
    description: The folder of the records (C(rigops_stage_record_dir)).
    type: path
    default: /var/lib/rigops/stages
  stage:
    description: The stage's name (one of O(stage) and O(stages)).
    type: str
  stages:
    description: The stages that start (C(started) only; one of O(stage) and O(stages)).
    type: list
    elements: str
  status:
    description: What to record.
    type: str
    required: true
    choices: [started, passed, failed]
  clock:
    description: The controller's time now (seconds since the epoch), returned as given.
    type: float
  seconds:
    description: How long the stage took (C(passed)).
    type: float
  summary:
    description: The figures the stage's role published for the report (C(passed)).
    type: dict
    default: {}
  task:
    description: The task that failed (C(failed)).
    type: str
  read:
    description:
      - Stages whose records to return (RV(records)) as they were before this call wrote (what the last runs
        recorded), for the report.
    type: list
    elements: str
    default: []
  stage_results:
    description:
      - The run's stage results so far (stage to status, check mode, seconds; a failed one's task and message),
        returned with this stage's added (C(passed) and C(failed)). Not named C(results), which Ansible keeps
        for a loop's results and renames in a module's answer.
    type: dict
    default: {}
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - rigops.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Returns the record it would write, writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Preflight | The stages this run selects start
  rigops.fleet.stage_record:
    dir: /var/lib/rigops/stages
    stages: [driver, topology]
    status: started
    clock: "{{ now().timestamp() }}"
  register: rigops_stage_started

- name: Stage | Record that it passed, with its figures
  rigops.fleet.stage_record:
    dir: /var/lib/rigops/stages
    stage: driver
    status: passed
    clock: "{{ now().timestamp() }}"
    seconds: 20.9
    summary: {version: "595.45.04", gpu_count: 8}
    stage_results: "{{ rigops_stage_done.stage_results | default({}) }}"
  register: rigops_stage_done
"""

RETURN = r"""
dir:
  description: The folder of the records.
  returned: always
  type: str
  sample: /var/lib/rigops/stages
stages:
  description: The stages recorded (O(stages), or O(stage) alone).
  returned: always
  type: list
  elements: str
  sample: [driver, topology]
clock:
  description: The clock given, or the host's time when none was.
  returned: always
  type: float
  sample: 1796000000.25
stage_results:
  description: The run's stage results given, with this stage's added when it passed or failed.
  returned: always
  type: dict
  sample: {"driver": {"status": "passed", "check_mode": false, "seconds": 20.9}}
records:
  description: The records of O(read) as they were before this call wrote, by stage (a stage never recorded is absent).
  returned: always
  type: dict
  sample: {"driver": {"stage": "driver", "status": "passed", "time": "2026-12-05T21:00:00.123456+00:00"}}
record:
  description: What the record file holds (or would, in check mode); of the first stage when there are several.
  returned: always
  type: dict
  sample: {"stage": "driver", "status": "started", "time": "2026-12-05T21:00:00.123456+00:00"}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.rigops.fleet.plugins.module_utils.stage_record import (
    read_records,
    stage_record,
    stage_results,
    write_record,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "default": "/var/lib/rigops/stages"},
            "stage": {"type": "str"},
            "stages": {"type": "list", "elements": "str"},
            "status": {"type": "str", "required": True, "choices": ["started", "passed", "failed"]},
            "clock": {"type": "float"},
            "seconds": {"type": "float"},
            "summary": {"type": "dict", "default": {}},
            "task": {"type": "str"},
            "stage_results": {"type": "dict", "default": {}},
            "read": {"type": "list", "elements": "str", "default": []},
        },
        required_one_of=[["stage", "stages"]],
        mutually_exclusive=[["stage", "stages"]],
        supports_check_mode=True,
    )
    p = module.params
    clock = p["clock"] if p["clock"] is not None else time.time()
    stages = p["stages"] if p["stages"] is not None else [p["stage"]]
    if len(stages) != 1 and p["status"] != "started":
        module.fail_json(msg=f"stage_record: only a start takes several stages; {p['status']} takes one")
    records = [
        stage_record(stage, p["status"], seconds=p["seconds"], summary=p["summary"], task=p["task"]) for stage in stages
    ]
    results = p["stage_results"]
    for record in records:
        results = stage_results(results, record, module.check_mode)
    first = records[0] if records else {}
    before = read_records(p["dir"], p["read"])
    done = {
        "dir": p["dir"], "stages": stages, "clock": clock, "record": first, "stage_results": results, "records": before,
    }  # fmt: skip
    for record in records:
        path = os.path.join(p["dir"], f"{record['stage']}.json")
        try:
            write_record(path, record, dry_run=module.check_mode)
        except OSError as exc:
            module.fail_json(msg=f"stage_record: {path}: {exc}", **done)
    module.exit_json(changed=False, **done)


if __name__ == "__main__":
    main()
