# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first line of a command that prints until it is stopped (tegrastats), for the module jetson_tegrastats.

AnsibleModule.run_command waits for the command to exit, which tegrastats never does (it has no count
option): this reads its output as it comes, and stops it after the first line or at the deadline.

Runs on the hosts: Python 3.8 syntax, standard library only.
"""

import os
import select
import subprocess
import time


def first_line(argv, timeout):
    """The first non-empty line the command prints, then the command is stopped. (line, error)."""
    env = dict(os.environ, LC_ALL="C")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, close_fds=True)
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        while time.monotonic() < deadline:
            ready, _writable, _errors = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = proc.stdout.read1(4096) if hasattr(proc.stdout, "read1") else proc.stdout.readline()
            if not chunk:
                break
            buf += chunk
            lines = [ln for ln in buf.split(b"\n")[:-1] if ln.strip()]
            if lines:
                return lines[0].decode("utf-8", "replace"), None
        err = b""
        try:
            proc.wait(timeout=2)  # it closed its output: it is exiting
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is not None:
            err = proc.stderr.read() or b""
        return None, (err.decode("utf-8", "replace").strip() or f"no line within {timeout}s")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
