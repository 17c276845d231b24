# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Ansible's data as plain Python data, for the collection's filters (controller side only).

Ansible hands a filter its own container and scalar types (lazy, tagged subclasses of dict, list,
str, ...). The logic in plugins/module_utils takes plain data: what JSON, TOML or a comparison with
``==`` expects, and what a module gets on a host.
"""

from __future__ import annotations

from collections.abc import Mapping


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
