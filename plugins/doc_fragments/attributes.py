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

    # Probes that judge the service accounts a role keeps (plugins/module_utils/accounts.py).
    ACCOUNTS = r"""
options:
  accounts:
    description:
      - The service accounts the role keeps, C(users) (each with C(name), C(group), C(shell), C(home)) and
        C(groups) (names); those missing or differing are returned (RV(accounts_to_fix)), for the role's user and
        group tasks to run only for them.
    type: dict
    default: {}
"""
