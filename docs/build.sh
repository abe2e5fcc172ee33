#!/usr/bin/env bash
# Build the HTML documentation of gpuops.gpu (modules, filter, roles) with antsibull-docs and Sphinx,
# from the collection as a user gets it.
#
#   docs/build.sh [--offline] [DEST]        DEST defaults to build/docs; open DEST/index.html
#
# From a checkout: builds the tarball from the files git would ship, installs it into a temporary
# collections path and documents that. From an installed collection (.../ansible_collections/
# gpuops/gpu/docs/build.sh): documents the installed collection.
#
# Needs on PATH: ansible-galaxy (ansible-core), antsibull-docs, sphinx-build, and the Python
# packages ansible-pygments and (optional) sphinx-ansible-theme - `make venv` has all but the theme;
# without the theme the site uses Sphinx's alabaster theme (SPHINX_THEME=... picks another one).
#
# Warnings are errors. References into the Ansible docsite (ansible.builtin modules, "Common return
# values", ...) resolve through intersphinx, which downloads docs.ansible.com's inventory; with
# --offline that is skipped, and those references - only those - are listed instead of failing.
set -euo pipefail

offline=0
if [ "${1:-}" = "--offline" ]; then offline=1; shift; fi
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${1:-$top/build/docs}
case $dest in /*) ;; *) dest=$PWD/$dest ;; esac

for t in ansible-galaxy antsibull-docs sphinx-build; do
  command -v "$t" >/dev/null || { echo "docs/build.sh: $t not found on PATH (activate .venv: make venv)" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the collection, installed -------------------------------------------------------------------
if [ -f "$top/MANIFEST.json" ] && [ "$(basename "$(dirname "$(dirname "$top")")")" = ansible_collections ]; then
  collections=$(dirname "$(dirname "$(dirname "$top")")")
else
  mkdir -p "$work/src" "$work/dist" "$work/collections"
  if git -C "$top" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$top" && git ls-files -z --cached --others --exclude-standard \
      | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
      | xargs -0 cp --parents -P -t "$work/src")
  else
    cp -a "$top/." "$work/src"   # galaxy.yml's build_ignore keeps build outputs out of the tarball
  fi
  collections=$work/collections
fi
# Only that collections path: not ~/.ansible/collections, not an ansible_collections on sys.path.
export ANSIBLE_COLLECTIONS_PATH=$collections ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false ANSIBLE_NOCOLOR=1
if [ "$collections" = "$work/collections" ]; then
  ansible-galaxy collection build --output-path "$work/dist" "$work/src" >/dev/null
  ansible-galaxy collection install --force -p "$collections" "$work"/dist/gpuops-gpu-*.tar.gz >/dev/null
fi

# --- a Sphinx site for it -------------------------------------------------------------------------
theme=${SPHINX_THEME:-}
if [ -z "$theme" ]; then
  py=$(dirname "$(command -v antsibull-docs)")/python
  if [ -x "$py" ] && "$py" -c 'import sphinx_ansible_theme' 2>/dev/null; then theme=sphinx_ansible_theme; else theme=alabaster; fi
fi
site=$work/site
mkdir -m 700 "$site"
cd "$work"
antsibull-docs sphinx-init --use-current --squash-hierarchy --fail-on-error --sphinx-theme "$theme" \
  --project gpuops.gpu --title "gpuops.gpu" --dest-dir "$site" gpuops.gpu >/dev/null
cd "$site"
chmod og-w rst  # antsibull-docs wants it writable only by its owner
antsibull-docs --config-file antsibull-docs.cfg collection --cleanup everything --use-current \
  --squash-hierarchy --fail-on-error --dest-dir rst gpuops.gpu

if [ "$offline" = 1 ]; then
  printf '\n# docs/build.sh --offline: no intersphinx inventories (docs.ansible.com)\nintersphinx_mapping = {}\n' >> conf.py
  rc=0
  sphinx-build -M html rst build -c . -q --keep-going -w "$work/warnings.txt" 2>"$work/sphinx.err" || rc=$?
  if [ "$rc" != 0 ]; then cat "$work/sphinx.err" >&2; echo "docs/build.sh: sphinx-build exited $rc" >&2; exit 1; fi
  # The only warnings allowed offline: references to labels of the Ansible docsite.
  external="undefined label: '(ansible_configuration_settings|common_return_values|action_plugins|ansible_collections\.ansible\.builtin\.[a-z0-9_]+)'"
  if grep -v -E "$external" "$work/warnings.txt" | grep -q .; then
    echo "docs/build.sh: Sphinx warnings:" >&2
    grep -v -E "$external" "$work/warnings.txt" >&2
    exit 1
  fi
  grep -E "$external" "$work/warnings.txt" | sed 's/^/not checked offline (Ansible docsite reference): /' || true
  [ -f build/html/index.html ] || { echo "docs/build.sh: Sphinx wrote no build/html/index.html" >&2; exit 1; }
else
  sphinx-build -M html rst build -c . -q -W --keep-going
fi

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -a build/html "$dest"
echo "docs/build.sh: $dest/index.html (theme $theme)"
