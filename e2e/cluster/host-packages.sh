#!/usr/bin/env bash
# Installs the Debian packages the end-to-end cluster needs (idempotent: a no-op when all are
# present). Runs as root; the only package source used is Debian's archive.
set -euo pipefail

PACKAGES=(
  containerd runc containernetworking-plugins   # container runtime and the bridge CNI plugins
  docker.io                                     # image builds (dockerd is started by images.sh)
  debootstrap                                   # the Debian base image
  iptables conntrack ethtool socat kmod iproute2 util-linux mount
  openssl ca-certificates                       # cluster certificates
  openjdk-17-jre-headless                       # spark-submit on the host (JVM client)
)

missing() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || echo "$pkg"
  done
}

[[ -z $(missing) ]] && exit 0
# One installer at a time on the machine (the background prebuild and cluster.sh may both get
# here); apt itself waits for a dpkg lock another program holds.
exec 9>/run/lock/tidalmq-host-packages.lock
flock 9
mapfile -t packages < <(missing)
if ((${#packages[@]})); then
  echo "[host-packages] installing: ${packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
