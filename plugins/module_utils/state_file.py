# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""JSON state files of the services the collection puts on hosts (the GPU health sentinel, the gateway's
health feed): read one, write one so that a reader never sees half of it.

Host side: Python 3.8 and the standard library only.
"""

import json
import os
import tempfile


def load_json(path, default=None):
    """The JSON document at ``path``; ``default`` when the file is absent."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return default


def write_atomic(path, text, mode=0o644):
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader never sees half of it."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
