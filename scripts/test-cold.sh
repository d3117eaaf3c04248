#!/usr/bin/env bash
# Rehearses CI on a brand-new machine: runs .ci/run in a fresh clone of the
# committed HEAD with empty Go build and module caches and no per-machine
# test caches (the kube-apiserver binary), then removes them. System
# packages already installed stay installed: .ci/run installs what is
# missing, so remove one by hand to rehearse its install.
#
#   scripts/test-cold.sh            # or: make test-cold
#   KEEP=1 scripts/test-cold.sh     # keep the folder for a look afterwards
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=$(mktemp -d /var/tmp/weir-cold.XXXXXX)
cleanup() {
  if [[ -z ${KEEP:-} ]]; then
    # The module cache is read-only by design.
    chmod -R u+w "$work" 2>/dev/null || true
    rm -rf "$work"
  else
    echo "test-cold: kept $work"
  fi
}
trap cleanup EXIT

git clone -q "$repo" "$work/src"
export GOCACHE=$work/go-build GOMODCACHE=$work/go-mod GOPATH=$work/go XDG_CACHE_HOME=$work/cache
echo "test-cold: $(git -C "$work/src" log -1 --format='%h %s') in $work"
start=$(date +%s)
rc=0
(cd "$work/src" && bash .ci/run) || rc=$?
elapsed=$(($(date +%s) - start))
echo "test-cold: exit $rc after $((elapsed / 60))m$((elapsed % 60))s"
exit $rc
