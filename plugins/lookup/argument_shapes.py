# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
DOCUMENTATION = r"""
name: argument_shapes
author: rigops contributors (@rigops)
short_description: The role variables its argument spec accepts only by converting them
description:
  - Ansible validates a role's variables against its C(meta/argument_specs.yml) when the role starts, but it
    accepts a value it can convert and the role still sees the value as it was given. A string is split at its
    commas into a list, C(key=value) text is parsed into a mapping, any list or mapping passes as a string, and
    a null passes everything.
  - This lookup reads the same spec and returns one line for each variable (and each sub-option of a mapping or
    a list of mappings) whose value is not of the spec's kind. A list must be a list, a mapping a mapping, a
    string a string (a number or a boolean is refused and must be quoted); a null only where the spec's default
    is null, or, below the top level, for a sub-option that is not required. Integers, floats and booleans are
    left to Ansible's own check, which converts C(-e name=value) text sensibly.
  - Every line names the variable and says what it must be and what was given; the value of a C(no_log) option
    is never shown.
  - Only the variables that are defined are judged; the spec is read on the controller.
options:
  _terms:
    description: Folders of roles (C(role_path)), each with C(meta/argument_specs.yml).
    required: true
    type: list
    elements: path
  entry_point:
    description: The entry point of the spec whose options are judged.
    type: str
    default: main
"""

EXAMPLES = r"""
- name: Preflight | Variables are of their kinds and consistent
  ansible.builtin.assert:
    that: fleet_cache__refused | length == 0
    fail_msg: "{{ inventory_hostname }}: {{ fleet_cache__refused | join('; ') }}"
    quiet: true
  vars:
    fleet_cache__rules:
      - ok: "{{ fleet_cache_port | int in range(1, 65536) }}"
        msg: fleet_cache_port must be a TCP port from 1 to 65535; got {{ fleet_cache_port | to_json }}
    # the kinds first: a value of the wrong kind would make a rule fail to evaluate, not refuse it
    fleet_cache__shapes: "{{ query('rigops.fleet.argument_shapes', role_path) }}"
    fleet_cache__refused: >-
      {{ fleet_cache__shapes if fleet_cache__shapes | length > 0
         else fleet_cache__rules | rejectattr('ok') | map(attribute='msg') | list }}
"""

RETURN = r"""
_raw:
  description: One line per value that is not of its option's kind; empty when every value is.
  type: list
  elements: str
"""

import json
import os
from collections.abc import Mapping

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.rigops.fleet.plugins.plugin_utils.plain import plain

# What to write for "none" of a kind, in the message about a null.
EMPTY = {"list": "[]", "dict": "{}", "str": '""', "path": '""'}
KIND = {"list": "a list such as [a, b]", "dict": "a mapping such as {key: value}", "str": "a string",
        "path": "a string (a path)", "int": "a whole number", "float": "a number", "bool": "true or false",
        "raw": "a value"}  # fmt: skip


def _shown(value, secret):
    """The given value in a message: its kind, and the value itself unless it is a secret."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        kind = "the boolean"
    elif isinstance(value, (int, float)):
        kind = "the number"
    elif isinstance(value, str):
        kind = "the string"
    elif isinstance(value, Mapping):
        kind = "the mapping"
    elif isinstance(value, list):
        kind = "the list"
    else:
        kind = f"a {type(value).__name__}"
    if secret:
        return f"{kind} given (not shown: no_log)"
    text = json.dumps(value, default=str, ensure_ascii=False)
    return f"{kind} {text[:77] + '...' if len(text) > 80 else text}"


def _kind_problem(label, kind, value, secret):
    """A line when value is not of kind (list, dict, str, path); None when it is, or kind is another."""
    if kind == "list":
        ok = isinstance(value, list)
    elif kind == "dict":
        ok = isinstance(value, Mapping)
    elif kind in ("str", "path"):
        ok = isinstance(value, str)
    else:
        return None
    if ok:
        return None
    hint = ""
    if kind in ("str", "path") and isinstance(value, (bool, int, float)) and not secret:
        hint = f' (quote it: "{json.dumps(value)}")'
    elif kind == "list" and isinstance(value, str):
        hint = " (Ansible's own check would split the string at its commas; the role would not)"
    return f"{label} must be {KIND[kind]}, not {_shown(value, secret)}{hint}"


def shape_problems(options, values, prefix="", top=True):
    """Lines about the values that the argument spec `options` accepts only by converting them.

    options: the spec's options ({name: {type, elements, options, required, default, no_log}});
    values: the given values, by name (absent names are not judged). Below the top level (prefix
    like ``name[0].``) a null is allowed for a sub-option that is not required.
    """
    out = []
    for name, opt in (options or {}).items():
        if name not in values:
            continue
        value, label = values[name], prefix + name
        kind = opt.get("type", "str")
        secret = bool(opt.get("no_log"))
        if value is None:
            nullable = ("default" in opt and opt["default"] is None) if top else not opt.get("required")
            if not nullable:
                empty = f"; write {EMPTY[kind]} for none" if kind in EMPTY and top else ""
                what = KIND.get(kind, f"of type {kind}")
                out.append(f"{label} must be {what}, not null (a key without a value in YAML{empty})")
            continue
        problem = _kind_problem(label, kind, value, secret)
        if problem:
            out.append(problem)
            continue
        sub = opt.get("options")
        if kind == "dict" and sub:
            out += shape_problems(sub, value, f"{label}.", top=False)
        elif kind == "list":
            elements = opt.get("elements")
            for index, item in enumerate(value):
                problem = _kind_problem(f"{label}[{index}]", elements, item, secret)
                if problem:
                    out.append(problem)
                elif elements == "dict" and sub:
                    out += shape_problems(sub, item, f"{label}[{index}].", top=False)
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        entry_point = self.get_option("entry_point")
        variables = variables or {}
        out = []
        for role_path in terms:
            path = os.path.join(role_path, "meta", "argument_specs.yml")
            try:
                spec = self._loader.load_from_file(path) or {}
                options = spec["argument_specs"][entry_point].get("options") or {}
            except (KeyError, TypeError, AttributeError) as exc:
                raise AnsibleLookupError(f"argument_shapes: {path} has no entry point {entry_point!r}") from exc
            given = {name: variables[name] for name in options if name in variables}
            out += shape_problems(options, plain(self._templar.template(given)))
        return out
