"""nvidia-persistenced stand-in.

Command line as the real daemon: ``[--user USER] [--group GROUP] [--persistence-mode |
--no-persistence-mode] [--verbose] [-f|--foreground] [--nvidia-cfg-path PATH]``. By default
it forks, writes ``/run/nvidia-persistenced/nvidia-persistenced.pid`` and returns (for
``Type=forking`` units); ``-f`` stays in the foreground (``Type=simple``). While it runs,
every GPU reads persistence ``Enabled`` (``Disabled`` with ``--no-persistence-mode``
until ``nvidia-smi -pm 1``). SIGTERM/SIGINT stop it and release the GPUs.
Privileges are not dropped for ``--user`` (the user only owns the PID directory).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time

from . import kmod, paths, persistence
from .profile import load_or_none

USAGE = "Usage: nvidia-persistenced [options]\nTry `nvidia-persistenced --help' for more information.\n"


def _log(msg: str, verbose: bool) -> None:
    if verbose:
        sys.stderr.write(f"nvidia-persistenced[{os.getpid()}]: {msg}\n")
        sys.stderr.flush()


def parse(argv: list[str]) -> dict:
    opts = {"user": None, "persistence": True, "verbose": False, "foreground": False}
    i = 0
    while i < len(argv):
        a = argv[i]
        key, _, val = a.partition("=")
        if key in ("-u", "--user", "-g", "--group", "--nvidia-cfg-path"):
            if not val:
                if i + 1 >= len(argv):
                    raise SystemExit(f"nvidia-persistenced: option '{a}' requires an argument\n{USAGE}")
                val = argv[i + 1]
                i += 1
            if key in ("-u", "--user"):
                opts["user"] = val
        elif a == "--persistence-mode":
            opts["persistence"] = True
        elif a == "--no-persistence-mode":
            opts["persistence"] = False
        elif a in ("-V", "--verbose"):
            opts["verbose"] = True
        elif a in ("-f", "--foreground"):
            opts["foreground"] = True
        elif a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        elif a in ("-v", "--version"):
            sys.stdout.write("nvidia-persistenced:  version 595.45.04\n")
            raise SystemExit(0)
        else:
            raise SystemExit(f"nvidia-persistenced: Unrecognized option '{a}'\n{USAGE}")
        i += 1
    return opts


def _pid_dir(user: str | None) -> None:
    d = paths.p(paths.PERSISTENCED_DIR)
    os.makedirs(d, exist_ok=True)
    if user and os.geteuid() == 0 and paths.root() == "/":
        try:
            import pwd

            pw = pwd.getpwnam(user)
            os.chown(d, pw.pw_uid, pw.pw_gid)
        except (KeyError, OSError):
            pass


def _announce(pid: int, persistence_mode: bool) -> None:
    """The PID file and the GPUs taken, once: nvidia-smi may read them at any moment, so the
    PID file is replaced whole (a reader never sees it empty)."""
    real = paths.p(paths.PERSISTENCED_PID)
    with open(real + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(f"{pid}\n")
    os.replace(real + ".tmp", real)
    persistence.write_daemon_state(pid, persistence_mode)


def _serve(opts: dict) -> int:
    stop: list[int] = []

    def handler(signum, _frame):
        stop.append(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    pid = os.getpid()
    if opts["foreground"]:
        _announce(pid, opts["persistence"])
    prof = load_or_none()
    _log(f"Started ({pid})", opts["verbose"])
    for g in prof.gpus if prof else []:
        _log(f"device {g.bdf} - registered", opts["verbose"])
        if opts["persistence"]:
            _log(f"device {g.bdf} - persistence mode enabled.", opts["verbose"])
    while not stop:
        time.sleep(0.5)
    _log(f"Received signal {stop[0]}", opts["verbose"])
    persistence.clear_daemon_state()
    for path in (paths.PERSISTENCED_PID,):
        try:
            os.unlink(paths.p(path))
        except FileNotFoundError:
            pass
    _log(f"Shutdown ({pid})", opts["verbose"])
    return 0


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code)
            return 1
        return int(e.code or 0)
    if paths.euid() != 0:
        sys.stderr.write("nvidia-persistenced failed to initialize. Check syslog for more details.\n")
        return 1
    if kmod.persistenced_pid():
        sys.stderr.write("nvidia-persistenced failed to initialize. Check syslog for more details.\n")
        _log("An instance of this daemon is already running", True)
        return 1
    prof = load_or_none()
    if prof is None or prof.jetson or not kmod.autoload_nvidia(prof):
        _log("Failed to open the NVIDIA driver (is it loaded?)", True)
        sys.stderr.write("nvidia-persistenced failed to initialize. Check syslog for more details.\n")
        return 1
    _pid_dir(opts["user"])
    if opts["foreground"]:
        return _serve(opts)
    # classic double fork; the parent returns once the PID file is written (Type=forking)
    r, w = os.pipe()
    if os.fork() > 0:
        os.close(w)
        os.read(r, 1)
        return 0
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    # the real daemon logs to syslog: keep stderr only when it is journald's stream socket
    if not (opts["verbose"] and stat.S_ISSOCK(os.fstat(2).st_mode)):
        os.dup2(devnull, 2)
    _announce(os.getpid(), opts["persistence"])
    os.write(w, b"1")
    os.close(w)
    os._exit(_serve(opts))
