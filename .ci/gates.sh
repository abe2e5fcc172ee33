#!/usr/bin/env bash
# make test's gates: `.ci/gates.sh "TRACK" ["TRACK" ...]`, where a TRACK is gates run one after the other and the
# tracks run side by side. Side by side only gates that are independent and mostly use one core each (sanity:
# ansible-test, pip, pylint; lint; packaging: ansible-galaxy, ansible-doc; units: pip, then its pytest on two), never
# the gates that time real processes (simtests, integration, molecule, bench-smoke). sanity and units are both
# ansible-test in build/ansible_collections: each keeps to its own venvs (~/.ansible/test/venv,
# tests/output/.tmp/delegation) and temporary directories, and tests/output is ignored by the sanity tests. Each line of a track is printed as it
# comes, prefixed with [track's first gate]; `=== gate ok: NAME (N s)` and `=== gate FAILED: NAME` as before.
# Each gate is `make -o layout -o sim -o lxc GATE`: make test laid out and built these once before the first gate
# (layout.sh empties build/ansible_collections, which a gate beside it may be reading). Exit 1 if a gate failed.
set -uo pipefail
MAKE=${MAKE:-make}

track() {
  for gate in $1; do
    echo "=== gate: $gate"
    t0=$(date +%s)
    "$MAKE" --no-print-directory -o layout -o sim -o lxc "$gate" || { echo "=== gate FAILED: $gate"; return 1; }
    echo "=== gate ok: $gate ($(( $(date +%s) - t0 )) s)"
  done
}

if [ $# -eq 1 ]; then
  track "$1"
  exit
fi
pids=()
for t in "$@"; do
  name=${t%% *}
  ( track "$t" 2>&1 | sed -u "s/^/[$name] /" ) &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || rc=1
done
exit $rc
