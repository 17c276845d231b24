# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The jetson_platform role's decisions as filters, run on the controller.

- ``merged | rigops.fleet.jetson_budget(os_reserve)``: the shares of the board's unified memory the
  instances (merged by rigops.fleet.vllm_instances) promise, against the OS reserve
  (jetson_platform.memory_budget);
- ``facts | rigops.fleet.jetson_judge(boards, flavour, build, accept_cpu, host)``: board, JetPack and the
  runtime build the inventory chose: {problems, table, build, expects};
- ``name | rigops.fleet.jetson_power_mode(modes)``: {id, name} of a mode of the board, or {error};
- ``facts | rigops.fleet.jetson_swap(want_gb, ram_below_gb, path)``: the swap decision;
- ``stderr | rigops.fleet.jetson_swapon_failure(fstype)``: why swapon refused the file.

The logic is plugins/module_utils/jetson_platform.py (also run on hosts by the modules).
"""

from ansible_collections.rigops.fleet.plugins.module_utils import jetson_platform as jetson
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain as _plain


def jetson_budget(merged, os_reserve=0.2):
    return jetson.memory_budget(_plain(merged or []), float(os_reserve))


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
