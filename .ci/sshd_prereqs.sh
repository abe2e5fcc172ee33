#!/usr/bin/env bash
# What the real-SSH tests (tests/functional/test_ssh_become.py) need on this machine: Debian's
# openssh-server (sshd, ssh-keygen), sudo, and useradd/userdel. Installed with apt-get when missing;
# nothing is done when they are all there (idempotent). The tests start their own sshd on a loopback
# address with its own config, host keys and user, and remove all of it afterwards: this script
# starts no service (on a machine with an init, apt's postinst may start the system's ssh service).
set -euo pipefail
# sshd, visudo, useradd live in sbin, which a plain user's PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

have() { command -v "$1" >/dev/null 2>&1; }
missing=()
if [ ! -x /usr/sbin/sshd ] || ! have ssh-keygen; then missing+=(openssh-server); fi
if ! have ssh; then missing+=(openssh-client); fi
if ! have sudo || ! have visudo; then missing+=(sudo); fi
if ! have useradd || ! have userdel; then missing+=(passwd); fi
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "sshd_prereqs: missing ${missing[*]}; install them as root (apt-get install ${missing[*]})" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "sshd_prereqs: missing ${missing[*]} and no apt-get here: install them with this system's package manager" >&2
  exit 1
fi
echo "sshd_prereqs: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -q --no-install-recommends "${missing[@]}"; }
# A machine whose package lists are stale or absent: update once, then install again.
apt_install || { apt-get update -q && apt_install; }
