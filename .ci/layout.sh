#!/usr/bin/env bash
# Lay the checkout out as build/ansible_collections/gpuops/gpu for ansible-test, which must run
# from a path ending in ansible_collections/<namespace>/<name>. Copies exactly the files git
# would ship (tracked, plus untracked files that are not ignored), and nothing else.
# Untracked files are included so that work in progress is tested before it is committed.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
dest="$top/build/ansible_collections/gpuops/gpu"
rm -rf "$dest"
mkdir -p "$dest"
cd "$top"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | xargs -0 cp --parents -P -t "$dest"
# The integration targets drive the simulator of this checkout (its C library is built here).
cat > "$dest/tests/integration/integration_config.yml" <<YAML
---
setup_gpusim_cli: $top/tests/gpusim/gpusim
setup_gpusim_python: $top/.venv/bin/python
YAML
# ansible-test lists content with git; without a repository of its own here it would find the
# outer checkout, where build/ is ignored, and see no files at all.
cd "$dest"
git init -q
git add -A
echo "$dest"
