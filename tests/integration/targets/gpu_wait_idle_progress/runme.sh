#!/usr/bin/env bash
# The progress lines of gpu_wait_idle's action plugin must appear in ansible-playbook's output at
# default verbosity: run a wait that lasts longer than one slice (10 s) and look for them.
set -eux
export ANSIBLE_ROLES_PATH=..
out=$(mktemp)
trap 'rm -f "$out"' EXIT
ansible-playbook progress.yml -i ../../inventory -e @../../integration_config.yml "$@" | tee "$out"
grep -E '^\[testhost\] gpu_wait_idle: 7/8 GPUs idle; waiting on GPU 0 \(2048 MiB, pid [0-9]+ python\) - 1[0-9] s of 60 s$' "$out"
