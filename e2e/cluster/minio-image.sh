#!/usr/bin/env bash
# Builds the MinIO image the chart's in-cluster object store uses on the e2e cluster, and loads it
# into the cluster's containerd (a companion of images.sh, which it calls for the Docker daemon
# and the base image).
#
#   minio-image.sh build     build MinIO (Go module, cached) and the image; print its reference
#   minio-image.sh import    also copy it into the cluster's containerd (k8s.io namespace)
#   minio-image.sh ref       print the image reference only
#
# Install the chart with it:
#   --set inClusterObjectStore.enabled=true \
#   --set inClusterObjectStore.image.repository=tidalmq.local/minio \
#   --set inClusterObjectStore.image.tag=<the tag printed by `minio-image.sh ref`>
# shellcheck disable=SC2317  # the cmd_* functions run through with_lock
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# MINIO_VERSION: lib.sh (the version tests/support/s3_server.py pins)
[[ -n $MINIO_VERSION ]] || die "MINIO_VERSION not found in tests/support/s3_server.py"
MINIO_IMAGE=$IMAGE_REGISTRY/minio:$MINIO_VERSION
DOCKER_HOST_URL=${TIDALMQ_E2E_DOCKER_HOST:-unix://$DOCKER_SOCK}
docker_cli() { DOCKER_BUILDKIT=0 docker --host "$DOCKER_HOST_URL" "$@"; }

cmd_build() {
  local binary=$CACHE_DIR/bin/minio-$MINIO_VERSION ctx=$CACHE_DIR/images/ctx-minio base=$BASE_IMAGE
  [[ -x $binary ]] || die "no MinIO binary at '$binary'"
  if [[ -n ${TIDALMQ_E2E_PUBLIC_BASE:-} ]]; then
    base=debian:$DEBIAN_SUITE-slim
  elif [[ -z ${TIDALMQ_E2E_DOCKER_HOST:-} ]]; then
    "$E2E_DIR/cluster/images.sh" base >&2  # the e2e dockerd and the debootstrap base image
  fi
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$E2E_DIR/images/minio/Dockerfile" "$ctx/"
  cp "$binary" "$ctx/minio"
  log "building $MINIO_IMAGE"
  docker_cli build -q --build-arg "BASE_IMAGE=$base" -t "$MINIO_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "$MINIO_IMAGE"
}

cmd_import() {
  cmd_build >/dev/null
  log "importing $MINIO_IMAGE into containerd"
  docker_cli save "$MINIO_IMAGE" | ctr_k8s images import - >/dev/null
  echo "$MINIO_IMAGE"
}

# MinIO first (under its own lock), then the image under the images lock of images.sh, so the
# e2e dockerd is not stopped while this builds with it.
case "${1:-}" in
  build) "$E2E_DIR/cluster/build-tools.sh" minio >&2; with_lock images cmd_build ;;
  import) "$E2E_DIR/cluster/build-tools.sh" minio >&2; with_lock images cmd_import ;;
  ref) echo "$MINIO_IMAGE" ;;
  *) echo "usage: $0 build|import|ref" >&2; exit 2 ;;
esac
