# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What dpkg has installed and holds, read from ``dpkg-query --show --showformat DPKG_FORMAT`` (the roles' probes:
nvidia_driver_probe, vllm_runtime_check).

Host side: Python 3.8 and the standard library only.
"""

import re

# what dpkg-query prints for each package with DPKG_FORMAT
DPKG_FORMAT = "${Status}\t${Package}\t${Version}\n"


def parse_dpkg(text, package_regex):
    """dpkg-query's DPKG_FORMAT lines: the installed packages matching ``package_regex`` (name: version) and
    the names of every held package (selection "hold"), installed or not."""
    wanted = re.compile(package_regex)
    packages, holds = {}, []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        status, name, version = parts
        words = status.split()
        if words and words[0] == "hold":
            holds.append(name)
        if words and words[-1] == "installed" and wanted.match(name):
            packages[name] = version
    return packages, holds


def names_regex(names):
    """A regular expression for parse_dpkg that matches exactly ``names`` (none when there are none)."""
    return "^(" + "|".join(re.escape(n) for n in names) + ")$" if names else r"(?!)"
