#!/usr/bin/env bash
# Print what `make test` may not change in HOME: the names at its top level, and everything under
# ~/.ansible and ~/.cache except pip's cache (the one thing make test may write there).
# A HOME without these directories (a fresh machine) is listed as empty, never an error.
set -u
home=${1:-$HOME}
{
  find "$home" -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null || true
  for d in "$home/.ansible" "$home/.cache"; do
    [ -d "$d" ] || continue
    find "$d" -maxdepth 4 -path "$home/.cache/pip" -prune -o -printf '%p %T@\n' 2>/dev/null || true
  done
} | LC_ALL=C sort
