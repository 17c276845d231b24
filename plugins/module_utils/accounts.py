# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The service accounts a role keeps, judged against the host's user and group databases: which groups are
missing and which users are missing or differ (primary group, shell, home), so that the role's user and group
tasks run only for those. A probe module of the role reads them with the rest of the host (one module start
instead of one per account on every run).

Host side: Python 3.8 and the standard library only.
"""

import grp
import pwd


def accounts_to_fix(users, groups):
    """{"users": [...], "groups": [...]}: of ``groups`` (names), those missing; of ``users`` (mappings with name,
    group, shell and home), those missing or whose primary group, shell or home differ."""
    missing_groups = []
    for name in groups or []:
        try:
            grp.getgrnam(name)
        except KeyError:
            missing_groups.append(name)
    fix_users = []
    for user in users or []:
        try:
            entry = pwd.getpwnam(user["name"])
            gid = grp.getgrnam(user["group"]).gr_gid
        except KeyError:
            fix_users.append(user["name"])
            continue
        if (entry.pw_gid, entry.pw_shell, entry.pw_dir) != (gid, user["shell"], user["home"]):
            fix_users.append(user["name"])
    return {"users": fix_users, "groups": missing_groups}
