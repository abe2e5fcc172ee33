#!/usr/bin/env bash
# The simulator's containers are real LXC containers (Debian's lxc 5.0.2, the base of Proxmox VE 8):
# install lxc, debootstrap and a static busybox when they are missing (apt-get, as root), then build
# the Debian 12 rootfs with systemd as PID 1 that `gpusim ct create --systemd` containers boot from,
# once, into tests/gpusim/build/rootfs/debian-systemd (debootstrap from the Debian mirror apt uses).
#
#   tests/gpusim/setup-lxc.sh            install when missing + build the rootfs when missing
#   tests/gpusim/setup-lxc.sh --packages only the packages
#   tests/gpusim/setup-lxc.sh --rootfs   only the rootfs
#
# Idempotent: a second run does nothing. Called by `make sim` (so by `make test` and `make demo`) and,
# for the rootfs, by gpusimkit/rootfs.py when a systemd container is started before it exists.
# Fails loudly (exit 1, naming what is missing) where it cannot install: the tests never skip.
set -euo pipefail

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
ROOTFS=${GPUSIM_ROOTFS_DIR:-$here/build/rootfs}/debian-systemd
PACKAGES=(lxc debootstrap busybox-static)
# What the systemd rootfs holds besides debootstrap's minbase: systemd as PID 1, procps (ps), and the
# shared libraries a Python interpreter bound in from the host loads (ctypes, ssl, sqlite, compression).
INCLUDE=systemd,systemd-sysv,dbus,procps,libffi8,libssl3,libsqlite3-0,libbz2-1.0,liblzma5,zlib1g,python3

log() { echo "setup-lxc: $*" >&2; }

have_packages() {
  command -v lxc-start >/dev/null && command -v lxc-attach >/dev/null && command -v lxc-info >/dev/null \
    && command -v lxc-stop >/dev/null && command -v debootstrap >/dev/null \
    && { [ -x /bin/busybox ] || command -v busybox >/dev/null; }
}

install_packages() {
  if have_packages; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    log "lxc, debootstrap and busybox are missing and only root can install them:"
    log "  apt-get install --no-install-recommends ${PACKAGES[*]}"
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    log "lxc, debootstrap and busybox are missing and this machine has no apt-get (the simulator needs Debian's lxc 5)"
    exit 1
  fi
  local t0=$SECONDS
  log "installing ${PACKAGES[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  have_packages || { log "apt-get installed ${PACKAGES[*]} but lxc-start/debootstrap/busybox are still missing"; exit 1; }
  log "installed ${PACKAGES[*]} in $((SECONDS - t0)) s ($(lxc-start --version 2>/dev/null || echo '?'))"
}

# The first Debian mirror apt uses for this release (deb822 .sources or one-line .list files).
mirror() {
  local codename uri
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  uri=$(
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] && awk -v c="$codename" '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($(i+1) == c) print $i; break } }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] && awk -v c="$codename" '
        /^[[:space:]]*$/ { if (u != "" && s) print u; u = ""; s = 0; next }
        /^URIs:/ { u = $2 }
        /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == c) s = 1 }
        END { if (u != "" && s) print u }' "$f"
    done | grep -v security | head -n1
  )
  echo "${uri:-http://deb.debian.org/debian}"
}

build_rootfs() {
  if [ -f "$ROOTFS/.gpusim-complete" ]; then return 0; fi
  install_packages
  local codename url t0=$SECONDS tmp
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  url=$(mirror)
  mkdir -p "$(dirname "$ROOTFS")"
  # One builder at a time (parallel make, two test runs); the second finds it built.
  exec 9>"$(dirname "$ROOTFS")/.lock"
  flock 9
  if [ -f "$ROOTFS/.gpusim-complete" ]; then return 0; fi
  tmp="$ROOTFS.tmp.$$"
  rm -rf "$tmp" "$ROOTFS"
  log "building the Debian $codename rootfs with systemd (debootstrap --variant=minbase from $url) into $ROOTFS"
  if ! debootstrap --variant=minbase --include="$INCLUDE" "$codename" "$tmp" "$url" >"$tmp.log" 2>&1; then
    log "debootstrap failed; the last lines of $tmp.log:"
    tail -n 20 "$tmp.log" >&2
    rm -rf "$tmp"
    exit 1
  fi
  rm -f "$tmp.log"
  # A container of the simulator: no console getty, no network, nothing to wait for at boot.
  for unit in getty@tty1.service console-getty.service systemd-networkd-wait-online.service \
      systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service; do
    ln -sf /dev/null "$tmp/etc/systemd/system/$unit"
  done
  # The hostname is LXC's (lxc.uts.name, the config's hostname): systemd keeps it when there is no /etc/hostname.
  rm -f "$tmp/etc/hostname"
  rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
  echo "debian-$codename systemd rootfs, debootstrap from $url, $(date -u +%FT%TZ)" >"$tmp/.gpusim-complete"
  mv "$tmp" "$ROOTFS"
  log "built the rootfs in $((SECONDS - t0)) s ($(du -sh "$ROOTFS" | cut -f1))"
}

case "${1:-all}" in
  --packages) install_packages ;;
  --rootfs) build_rootfs ;;
  all) install_packages; build_rootfs ;;
  *) echo "usage: $0 [--packages|--rootfs]" >&2; exit 2 ;;
esac
