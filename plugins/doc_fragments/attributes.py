# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attributes every rigops module shares; their descriptions come from ansible.builtin."""

from __future__ import annotations


class ModuleDocFragment:
    # Every module: a POSIX host.
    DOCUMENTATION = r"""
attributes:
  platform:
    platforms: posix
"""

    # Modules that only read the host or ask an endpoint.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: Read-only; it runs the same in check mode.
  diff_mode:
    support: none
    details: It changes nothing, so there is nothing to show.
"""
