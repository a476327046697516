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

exec "$(dirname "$0")/../../.ci/apt-install" "${PACKAGES[@]}"
