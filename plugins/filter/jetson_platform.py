# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The jetson_platform role's decisions as filters, run on the controller.

- ``instances | jetson_budget(instance_defaults, os_reserve)``: the instances' shares of the
  board's unified memory against the OS reserve (jetson_platform.memory_budget), each instance merged
  with the contract's defaults and vllm_service_instance_defaults first (instance_schema);
- ``facts | jetson_judge(boards, flavour, build, accept_cpu, host)``: board, JetPack and the
  runtime build the inventory chose: {problems, table, build, expects};
- ``name | jetson_power_mode(modes)``: {id, name} of a mode of the board, or {error};
- ``facts | jetson_swap(want_gb, ram_below_gb, path)``: the swap decision;
- ``stderr | jetson_swapon_failure(fstype)``: why swapon refused the file.

The logic is plugins/module_utils/jetson_platform.py (also run on hosts by the modules).
"""

from ansible_collections.rigops.fleet.plugins.module_utils import jetson_platform as jetson
from ansible_collections.rigops.fleet.plugins.module_utils import vllm_instances as schema
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain


def jetson_budget(instances, instance_defaults=None, os_reserve=0.2):
    base = schema._merge(schema.defaults(), _plain(instance_defaults or {}))
    merged = [schema._merge(base, inst) for inst in _plain(instances or []) if isinstance(inst, dict)]
    return jetson.memory_budget(merged, float(os_reserve))


def jetson_judge(facts, boards, flavour, build="", accept_cpu=True, host=""):
    facts = _plain(facts or {})
    boards = _plain(boards)
    verdict = jetson.judge_platform(
        facts.get("board"),
        facts.get("release"),
        str(flavour),
        str(build or ""),
        boards,
        facts.get("python"),
        bool(accept_cpu),
    )
    verdict["table"] = (
        jetson.render_table(str(host), facts.get("board"), verdict["problems"], boards) if verdict["problems"] else ""
    )
    return verdict


def jetson_power_mode(name, modes):
    try:
        mode_id, canonical = jetson.resolve_power_mode(str(name), _plain(modes or {}))
    except ValueError as exc:
        return {"error": str(exc)}
    return {"id": mode_id, "name": canonical}


def jetson_swap(facts, want_gb, ram_below_gb, path):
    facts = _plain(facts or {})
    swap_file = facts.get("swap_file") or {}
    return jetson.swap_decision(
        facts.get("mem_total_mb"),
        facts.get("swaps") or [],
        int(want_gb),
        int(ram_below_gb),
        str(path),
        swap_file.get("bytes"),
        bool(swap_file.get("signature")),
    )


def jetson_swapon_failure(stderr, fstype=None):
    return jetson.explain_swapon_failure(str(stderr or ""), str(fstype) if fstype else None)


class FilterModule:
    def filters(self):
        return {
            "jetson_budget": jetson_budget,
            "jetson_judge": jetson_judge,
            "jetson_power_mode": jetson_power_mode,
            "jetson_swap": jetson_swap,
            "jetson_swapon_failure": jetson_swapon_failure,
        }
