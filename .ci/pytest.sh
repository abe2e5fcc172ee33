#!/usr/bin/env bash
# Run pytest and treat exit code 5 (no tests collected) as success: a gate with no tests yet
# must not fail the build, but every other failure must.
set -u
"$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest: no tests collected (exit 5), treated as success"
  exit 0
fi
exit "$rc"
