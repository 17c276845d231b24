#!/usr/bin/env bash
# The suite's time on a fresh machine, as near as this machine allows: the README's figure for
# "50 minutes on a fresh machine".
#
#   lab/fresh_machine_test.sh [WORKDIR]       WORKDIR: default /var/tmp/rigops-fresh (emptied first)
#
# It runs `CI=true bash .ci/run` (the README's test command) on a clean clone of this checkout's
# HEAD with an empty pip cache (PIP_CACHE_DIR) and an empty RIGOPS_CACHE under WORKDIR, after
# removing every sandbox image, stage snapshot and rigops-* container from podman's store. So the
# host image, the wheelhouse, the runtime venvs and stage snapshot, the tiny model and the stand-in
# driver repository are all built again. What stays: the packages apt installed, and pip's own
# configuration (`pip config list`: a machine may point pip at local wheel folders).
#
# Destructive for the warm caches of podman's store (the next `./rigops test` finds the images this
# run built, with the same recipes); ~/.cache/rigops is not touched. At the end the service
# containers (rigops-repo, rigops-hub, rigops-wheels), which serve WORKDIR's cache, are removed:
# the next run makes them again from the default cache. The last lines are the runner's total and
# the command's wall time.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-/var/tmp/rigops-fresh}"
export CONTAINERS_CONF="$root/lab/sandbox/podman/containers.conf"

rm -rf "$work" && mkdir -p "$work/pip" "$work/cache" || exit 1
podman ps -a --format '{{.Names}}' | grep '^rigops-' | xargs -r podman rm -f -t 0 >/dev/null
podman images --format '{{.Repository}}:{{.Tag}}' | grep '/rigops-' | xargs -r podman rmi -f >/dev/null
git clone -q "$root" "$work/clone" || exit 1
cd "$work/clone" || exit 1
start=$(date +%s)
PIP_CACHE_DIR="$work/pip" RIGOPS_CACHE="$work/cache" CI=true bash .ci/run
rc=$?
wall=$(($(date +%s) - start))
podman rm -f -t 0 rigops-repo rigops-hub rigops-wheels >/dev/null 2>&1
echo "fresh machine: CI=true bash .ci/run exited $rc after ${wall}s ($((wall / 60)) min $((wall % 60)) s)"
exit "$rc"
