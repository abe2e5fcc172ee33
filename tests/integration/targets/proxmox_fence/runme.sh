#!/usr/bin/env bash
# This target has the name of the role it tests. Run as a role target, ansible-test's play would
# ask for the role "proxmox_fence", and Ansible resolves that name to the collection's role
# gpuops.gpu.proxmox_fence (the play lives inside the collection), not to this directory.
# So a script runs the test play, which includes tasks/main.yml.
set -eux
export ANSIBLE_ROLES_PATH=..
ansible-playbook runme.yml -i ../../inventory -e @../../integration_config.yml "$@"
