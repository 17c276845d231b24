# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The files, folders and absences a role keeps on a host, judged and put right in one pass: for each entry,
what differs (missing, content, owner, group, mode, present where it should be absent) and, unless it is a
check, the change that mends it. A text file is written through a temporary file in its folder, with its owner
and mode set before the rename, so a reader never sees half of it or a moment of wrong mode.

Ansible's file, copy and template modules do this one path per task; a no-op run of a role with many paths
then pays one module start per path (the fleet-scale issue: a stage's state judged by one module).

Host side: Python 3.8 and the standard library only.
"""

import grp
import os
import pwd
import re
import shlex
import stat
import subprocess
import tempfile

STATES = ("file", "directory", "absent")
MODE = re.compile(r"^0?[0-7]{3}$")


class HostFilesError(Exception):
    """An entry that cannot be judged or applied: the message names the entry and its field."""


def _where(index, entry):
    path = entry.get("path") if isinstance(entry, dict) else None
    return f"files[{index}]" + (f" ({path})" if path else "")


def normalise(entries):
    """The entries checked and completed (state, owner, group, mode as an int), or HostFilesError naming
    every entry and field that is wrong, with what is allowed."""
    errors, out = [], []
    for index, entry in enumerate(entries or []):
        where = _where(index, entry)
        if not isinstance(entry, dict):
            errors.append(f"{where}: must be a mapping with path and state; got {entry!r}")
            continue
        unknown = sorted(set(entry) - {"path", "state", "content", "owner", "group", "mode", "validate"})
        if unknown:
            errors.append(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: path, state, content, owner, "
                          "group, mode, validate)")  # fmt: skip
        path = entry.get("path")
        state = entry.get("state") or "file"
        if not isinstance(path, str) or not os.path.isabs(path) or path != os.path.normpath(path):
            errors.append(f"{where}: path must be an absolute, normalised path; got {path!r}")
        if state not in STATES:
            errors.append(f"{where}: state must be one of {', '.join(STATES)}; got {state!r}")
            continue
        mode = entry.get("mode")
        if state != "absent":
            if not isinstance(mode, str) or not MODE.match(mode):
                errors.append(f"{where}: mode must be an octal string such as '0644'; got {mode!r}")
            for field in ("owner", "group"):
                value = entry.get(field) or "root"
                if not isinstance(value, str):
                    errors.append(f"{where}: {field} must be a name; got {value!r}")
        content = entry.get("content")
        if state == "file" and not isinstance(content, str):
            errors.append(f"{where}: a file needs its content as text; got {type(content).__name__}")
        if state != "file" and content is not None:
            errors.append(f"{where}: content is for state file only (state is {state})")
        validate = entry.get("validate")
        if validate is not None and (state != "file" or not isinstance(validate, str) or "%s" not in validate):
            errors.append(f"{where}: validate must be a command with %s, for a file; got {validate!r}")
        out.append({
            "path": path, "state": state, "content": content, "validate": validate,
            "owner": entry.get("owner") or "root", "group": entry.get("group") or "root",
            "mode": int(mode, 8) if isinstance(mode, str) and MODE.match(mode) else None,
        })  # fmt: skip
    paths = [e["path"] for e in out]
    twice = sorted({p for p in paths if paths.count(p) > 1 and isinstance(p, str)})
    if twice:
        errors.append(f"each path once; given more than once: {', '.join(twice)}")
    if errors:
        raise HostFilesError("; ".join(errors))
    return out


def _ids(entry):
    try:
        uid = pwd.getpwnam(entry["owner"]).pw_uid
    except KeyError:
        raise HostFilesError(f"{entry['path']}: owner {entry['owner']!r} is not a user on this host") from None
    try:
        gid = grp.getgrnam(entry["group"]).gr_gid
    except KeyError:
        raise HostFilesError(f"{entry['path']}: group {entry['group']!r} is not a group on this host") from None
    return uid, gid


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", errors="surrogateescape")
    except OSError:
        return None


def differences(entry):
    """What differs between ``entry`` (normalised) and the host: [] when the host is as wanted; else names
    of what differs (absent, content, owner, group, mode, present). HostFilesError when the path holds
    something of another kind (a folder where a file should be): that is not mended by replacing it."""
    path, state = entry["path"], entry["state"]
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return [] if state == "absent" else ["absent"]
    if state == "absent":
        if stat.S_ISDIR(found.st_mode):
            raise HostFilesError(f"{path}: should be absent but is a folder (not removed: remove it by hand)")
        return ["present"]
    want_dir = state == "directory"
    if stat.S_ISDIR(found.st_mode) != want_dir or (not want_dir and not stat.S_ISREG(found.st_mode)):
        kind = "a folder" if stat.S_ISDIR(found.st_mode) else "not a plain file"
        raise HostFilesError(f"{path}: should be a {'folder' if want_dir else 'file'} but is {kind}")
    uid, gid = _ids(entry)
    diff = []
    if not want_dir and _read(path) != entry["content"]:
        diff.append("content")
    if found.st_uid != uid:
        diff.append("owner")
    if found.st_gid != gid:
        diff.append("group")
    if stat.S_IMODE(found.st_mode) != entry["mode"]:
        diff.append("mode")
    return diff


def _validate(command, tmp):
    argv = [tmp if part == "%s" else part.replace("%s", tmp) for part in shlex.split(command)]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        out = proc.stdout.decode("utf-8", errors="replace").strip()
        raise HostFilesError(f"validation failed ({command}, exit {proc.returncode}): {out}")


def _write(entry, uid, gid):
    folder = os.path.dirname(entry["path"])
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rigops-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(entry["content"].encode("utf-8", errors="surrogateescape"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chown(tmp, uid, gid)
        os.chmod(tmp, entry["mode"])
        if entry["validate"]:
            _validate(entry["validate"], tmp)
        os.replace(tmp, entry["path"])
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def apply(entry, diff):
    """Mend what ``differences`` found (``diff``): write, make, chown/chmod or remove."""
    path = entry["path"]
    if not diff:
        return
    if entry["state"] == "absent":
        os.unlink(path)
        return
    uid, gid = _ids(entry)
    if entry["state"] == "directory":
        # each missing folder on the way gets the entry's owner and mode, as the file module does
        missing, folder = [], path
        while not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for folder in reversed(missing):
            os.mkdir(folder, entry["mode"])
            os.chown(folder, uid, gid)
            os.chmod(folder, entry["mode"])  # mkdir's mode passes through the umask
        os.chown(path, uid, gid)
        os.chmod(path, entry["mode"])
        return
    if "absent" in diff or "content" in diff:
        _write(entry, uid, gid)
        return
    os.chown(path, uid, gid)
    os.chmod(path, entry["mode"])


def converge(entries, check_mode=False):
    """Judge every entry in order and (unless ``check_mode``) mend each at once, so a folder exists before
    the files in it. Returns {path: what differed} for the paths that changed or would, and the diffs
    (before and after of each changed file's text) for Ansible's --diff."""
    changed, diffs = {}, []
    for entry in normalise(entries):
        diff = differences(entry)
        if not diff:
            continue
        changed[entry["path"]] = diff
        if entry["state"] == "file" and ("content" in diff or "absent" in diff):
            before = "" if "absent" in diff else _read(entry["path"])
            diffs.append({"before_header": entry["path"], "after_header": entry["path"],
                          "before": before, "after": entry["content"]})  # fmt: skip
        elif entry["state"] == "absent":
            diffs.append({"before_header": entry["path"], "after_header": entry["path"],
                          "before": _read(entry["path"]) or "", "after": ""})  # fmt: skip
        if not check_mode:
            apply(entry, diff)
    return changed, diffs
