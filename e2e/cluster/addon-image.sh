#!/usr/bin/env bash
# Builds the images of the add-ons the end-to-end tests install next to TidalMQ, and loads them
# into the cluster's containerd (a companion of images.sh, which it calls for the Docker daemon
# and the base image):
#
#   minio        MinIO for the chart's in-cluster object store; the binary is the one the
#                integration tests build from MinIO's Go module at a pinned version
#   prometheus   Debian's Prometheus package, scraping the pods the chart annotates (the planner
#                reads its traffic history)
#
#   addon-image.sh ADDON build     build it (MinIO: the Go module too, cached); print its reference
#   addon-image.sh ADDON import    also copy it into the cluster's containerd (k8s.io namespace)
#   addon-image.sh ADDON ref       print the image reference only
#
# The MinIO image is also built by `images.sh build` (and so by `cluster.sh up`) under the same
# name, which is the chart's default inClusterObjectStore.image: `--set
# inClusterObjectStore.enabled=true` is all the chart needs on the e2e cluster.
# shellcheck disable=SC2317  # the cmd_* functions run through with_lock
set -euo pipefail
source "$(dirname "$0")/lib.sh"

ADDON=${1:-}
case "$ADDON" in
  minio)
    # MINIO_VERSION: lib.sh (the version tests/support/s3_server.py pins)
    [[ -n $MINIO_VERSION ]] || die "MINIO_VERSION not found in tests/support/s3_server.py"
    IMAGE=$IMAGE_REGISTRY/minio:$MINIO_VERSION ;;
  prometheus) IMAGE=$IMAGE_REGISTRY/prometheus:$DEBIAN_SUITE ;;
  *) echo "usage: $0 minio|prometheus build|import|ref" >&2; exit 2 ;;
esac
DOCKER_HOST_URL=${TIDALMQ_E2E_DOCKER_HOST:-unix://$DOCKER_SOCK}
docker_cli() { DOCKER_BUILDKIT=0 docker --host "$DOCKER_HOST_URL" "$@"; }

cmd_build() {
  local ctx=$CACHE_DIR/images/ctx-$ADDON base=$BASE_IMAGE
  if [[ -n ${TIDALMQ_E2E_PUBLIC_BASE:-} ]]; then
    base=debian:$DEBIAN_SUITE-slim
  elif [[ -z ${TIDALMQ_E2E_DOCKER_HOST:-} ]]; then
    "$E2E_DIR/cluster/images.sh" base >&2  # the e2e dockerd and the debootstrap base image
  fi
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$E2E_DIR/images/$ADDON/Dockerfile" "$ctx/"
  if [[ $ADDON == minio ]]; then
    local binary=$CACHE_DIR/bin/minio-$MINIO_VERSION
    [[ -x $binary ]] || die "no MinIO binary at '$binary'"
    cp "$binary" "$ctx/minio"
  fi
  log "building $IMAGE"
  # host network: the e2e dockerd has no bridge (images.sh), and Prometheus comes from apt
  docker_cli build --network host -q --build-arg "BASE_IMAGE=$base" -t "$IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "$IMAGE"
}

cmd_import() {
  cmd_build >/dev/null
  log "importing $IMAGE into containerd"
  docker_cli save "$IMAGE" | ctr_k8s images import - >/dev/null
  echo "$IMAGE"
}

# MinIO first (under its own lock), then the image under the images lock of images.sh, so the
# e2e dockerd is not stopped while this builds with it.
build_binary() { [[ $ADDON != minio ]] || "$E2E_DIR/cluster/build-tools.sh" minio >&2; }
case "${2:-}" in
  build) build_binary; with_lock images cmd_build ;;
  import) build_binary; with_lock images cmd_import ;;
  ref) echo "$IMAGE" ;;
  *) echo "usage: $0 minio|prometheus build|import|ref" >&2; exit 2 ;;
esac
