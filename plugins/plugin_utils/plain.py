# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's data as plain Python data, and bad input as a named error, for the collection's filters.

Controller side only.

Ansible hands a filter its own container and scalar types (lazy, tagged subclasses of dict, list,
str, ...). The logic in plugins/module_utils takes plain data: what JSON, TOML or a comparison with
``==`` expects, and what a module gets on a host.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def plain(value):
    """``value`` as plain dict, list, str, int, float, bool or None, all the way down.

    Keys that are strings become ``str``; other keys (integers) stay. A tuple becomes a list. What is
    none of these is returned as it is, for the caller's own check to name.
    """
    if isinstance(value, Mapping):
        return {(str(k) if isinstance(k, str) else k): plain(value[k]) for k in value}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    for kind in (bool, int, float, str):  # bool before int
        if isinstance(value, kind):
            return kind(value)
    return value


def filter_errors(fn):
    """``fn`` as a filter whose bad input (KeyError, TypeError, ValueError) fails the task by name."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (KeyError, TypeError, ValueError) as exc:
            raise AnsibleFilterError(f"{fn.__name__}: {exc}") from exc

    wrapped.__name__ = fn.__name__
    return wrapped
