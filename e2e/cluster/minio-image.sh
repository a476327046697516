#!/usr/bin/env bash
# Builds the MinIO image the chart's in-cluster object store uses on the e2e cluster, and loads it
# into the cluster's containerd (a companion of images.sh, which it calls for the Docker daemon
# and the base image; images.sh itself is unchanged).
#
#   minio-image.sh build     build MinIO (Go module, cached) and the image; print its reference
#   minio-image.sh import    also copy it into the cluster's containerd (k8s.io namespace)
#   minio-image.sh ref       print the image reference only
#
# Install the chart with it:
#   --set inClusterObjectStore.enabled=true \
#   --set inClusterObjectStore.image.repository=tidalmq.local/minio \
#   --set inClusterObjectStore.image.tag=<the tag printed by `minio-image.sh ref`>
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# The version tests/support/s3_server.py pins (one place): v0.0.0-<date>-<commit>.
MINIO_VERSION=$(sed -n 's/^MINIO_VERSION = "\(.*\)".*/\1/p' "$REPO_DIR/tests/support/s3_server.py")
[[ -n $MINIO_VERSION ]] || die "MINIO_VERSION not found in tests/support/s3_server.py"
MINIO_IMAGE=$IMAGE_REGISTRY/minio:$MINIO_VERSION
DOCKER_HOST_URL=${TIDALMQ_E2E_DOCKER_HOST:-unix://$DOCKER_SOCK}
docker_cli() { DOCKER_BUILDKIT=0 docker --host "$DOCKER_HOST_URL" "$@"; }

minio_binary() {
  local py=$REPO_DIR/.venv/bin/python
  [[ -x $py ]] || py=python3
  (cd "$REPO_DIR" && TIDALMQ_CACHE_DIR=$CACHE_DIR "$py" -c \
    'from tests.support.s3_server import build_minio; print(build_minio())')
}

cmd_build() {
  local binary ctx=$CACHE_DIR/images/ctx-minio base=$BASE_IMAGE
  binary=$(minio_binary | tail -1)
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

case "${1:-}" in
  build) cmd_build ;;
  import) cmd_import ;;
  ref) echo "$MINIO_IMAGE" ;;
  *) echo "usage: $0 build|import|ref" >&2; exit 2 ;;
esac
