#!/usr/bin/env bash
# Builds the end-to-end images with Docker and loads them into the cluster's containerd.
#
#   images.sh build             start the e2e dockerd if needed, build every image (Docker's
#                               layer cache makes an unchanged rebuild cost seconds)
#   images.sh build-kind        for kind: the broker and Spark images, metrics-server and
#                               kube-state-metrics, with the Docker of TIDALMQ_E2E_DOCKER_HOST
#                               (kind.sh's own dockerd, or a laptop's with
#                               TIDALMQ_E2E_PUBLIC_BASE=1: FROM public Debian)
#   images.sh base              only the debootstrap base image
#   images.sh project           the base, broker and Spark images (no Kubernetes binaries
#                               needed, so it can run while build-tools.sh compiles)
#   images.sh import            copy every image whose ID changed into containerd (k8s.io)
#   images.sh kind-node FILE    the images a kind node starts with (kubeadm's control plane
#                               under the names kubeadm expects, kind's sandbox image, the pod
#                               network daemon, local-path-provisioner and its helper pods'
#                               base image), saved to FILE for kind.sh's node image
#   images.sh list              print the image references, one a line
#   images.sh docker-stop       stop the dockerd this script started
#
# Images (explicit tags, never pulled): the debootstrap base, pause, CoreDNS, metrics-server,
# kube-state-metrics (the HPA series the chart's dashboards and alerts read),
# prometheus-adapter (the chart's metrics adapter), local-path-provisioner (the cluster's default
# StorageClass), the TidalMQ broker/operator image (broker_image/Dockerfile), the Spark image
# (spark/Dockerfile) and MinIO (e2e/images/minio, the chart's in-cluster object store), the last
# three FROM the debootstrap base, and these four named as the Helm chart's defaults name them
# (lib.sh), so the chart installs with no image value.
#
# TIDALMQ_E2E_DOCKER_HOST=unix:///var/run/docker.sock builds with an existing Docker daemon
# instead (e.g. for kind on a laptop); the default starts Debian's dockerd on a socket of this
# cache directory's own (lib.sh: DOCKER_RUN_DIR), with its data in the cache.
#
# Every command but `list` runs under the cache's `images` lock (with TIDALMQ_E2E_DOCKER_HOST, a
# lock of that dockerd's own), so the background prebuild (.ci/prebuild), cluster.sh and
# addon-image.sh never build at the same time or stop the dockerd another one builds with.
# shellcheck disable=SC2317  # the cmd_* functions run through with_lock
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# dockerd's PID file and log (lib.sh's start_daemon/stop_daemon)
PID_DIR=$DOCKER_RUN_DIR
LOG_DIR=$CACHE_DIR/logs

IMAGES_DIR=$CACHE_DIR/images
DOCKER_HOST_URL=${TIDALMQ_E2E_DOCKER_HOST:-unix://$DOCKER_SOCK}
if [[ -n ${TIDALMQ_E2E_DOCKER_HOST:-} ]]; then
  docker_cli() { DOCKER_BUILDKIT=0 docker --host "$DOCKER_HOST_URL" "$@"; }
else
  docker_cli() { DOCKER_BUILDKIT=0 /usr/bin/docker --host "$DOCKER_HOST_URL" "$@"; }
fi
# The project images' base: the debootstrap-built one, or public Debian for kind on a laptop.
if [[ -n ${TIDALMQ_E2E_PUBLIC_BASE:-} ]]; then
  PROJECT_BASE_IMAGE=debian:$DEBIAN_SUITE-slim
else
  PROJECT_BASE_IMAGE=$BASE_IMAGE
fi

all_images() {
  printf '%s\n' "$BASE_IMAGE" "$PAUSE_IMAGE" "$COREDNS_IMAGE" "$METRICS_SERVER_IMAGE" \
    "$KUBE_STATE_METRICS_IMAGE" "$LOCAL_PATH_PROVISIONER_IMAGE" "$BROKER_IMAGE" "$SPARK_IMAGE" "$MINIO_IMAGE" \
    "$PROMETHEUS_ADAPTER_IMAGE"
}

start_dockerd() {
  [[ -n ${TIDALMQ_E2E_DOCKER_HOST:-} ]] && return 0
  if docker_cli version >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p "$CACHE_DIR/docker" "$DOCKER_RUN_DIR/exec"
  log "starting dockerd on $DOCKER_SOCK"
  # No bridge and no iptables rules: builds use the host network, and Docker's FORWARD policy
  # would otherwise drop the cluster's pod traffic.
  start_daemon dockerd dockerd \
    --host "unix://$DOCKER_SOCK" \
    --data-root "$CACHE_DIR/docker" \
    --exec-root "$DOCKER_RUN_DIR/exec" \
    --pidfile "$DOCKER_RUN_DIR/exec/dockerd.pid" \
    --bridge none --iptables=false --ip-forward=false --ip-masq=false \
    --storage-driver overlay2 \
    --add-runtime "runc-nocap=$RUNC_NOCAP" --default-runtime runc-nocap
  wait_for dockerd 60 docker_cli version
}

stop_dockerd() {
  stop_daemon dockerd 30
}

# has_image REF: the Docker daemon has this tag
has_image() { docker_cli image inspect "$1" >/dev/null 2>&1; }

build_base() {
  has_image "$BASE_IMAGE" && return 0
  local tarball=$IMAGES_DIR/debian-$DEBIAN_SUITE-minbase.tar
  if [[ ! -f $tarball ]]; then
    local root=$IMAGES_DIR/rootfs-$DEBIAN_SUITE
    rm -rf "$root"
    mkdir -p "$root"
    log "debootstrap $DEBIAN_SUITE (minbase)"
    debootstrap --variant=minbase "$DEBIAN_SUITE" "$root" http://deb.debian.org/debian >"$IMAGES_DIR/debootstrap.log" 2>&1 \
      || die "debootstrap failed, see $IMAGES_DIR/debootstrap.log"
    cat >"$root/etc/apt/sources.list" <<EOF
deb http://deb.debian.org/debian $DEBIAN_SUITE main
deb http://deb.debian.org/debian $DEBIAN_SUITE-updates main
deb http://deb.debian.org/debian-security $DEBIAN_SUITE-security main
EOF
    # Like Debian's own images: no recommends, no docs, no caches.
    printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$root/etc/apt/apt.conf.d/90tidalmq"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  log "importing the base image $BASE_IMAGE"
  docker_cli import --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tarball" "$BASE_IMAGE" >/dev/null
}

# build_static NAME REF BINARY: a FROM-scratch image around one static binary (images/NAME)
build_static() { build_command_image "$2" "$1" "$3"; }

# build_command_image REF DOCKERFILE_DIR BINARY [BUILD_ARG...]: images/DOCKERFILE_DIR around one
# binary (its context: that Dockerfile and the binary)
build_command_image() {
  local ref=$1 dir=$2 binary=$3 ctx=$CTX_PREFIX$2
  shift 3
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$E2E_DIR/images/$dir/Dockerfile" "$binary" "$ctx/"
  docker_cli build -q "$@" -t "$ref" "$ctx" >/dev/null
}

# project_context DIR: the files the project's Dockerfiles copy, plus the host's CA bundle
project_context() {
  local ctx=$1 ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
  rm -rf "$ctx"
  mkdir -p "$ctx"
  (cd "$REPO_DIR" && tar --exclude=__pycache__ -cf - pyproject.toml README.md broker_image operator/src spark) \
    | tar -C "$ctx" -xf -
  [[ -f $ca ]] && cp "$ca" "$ctx/.build-ca.pem"
  return 0
}

# pyspark's PyPI release is a 400 MB sdist: build its wheel once on the host and keep it.
pyspark_wheel() {
  local dir=$CACHE_DIR/wheels
  if ! ls "$dir"/pyspark-"$PYSPARK_VERSION"-*.whl >/dev/null 2>&1; then
    log "building the pyspark $PYSPARK_VERSION wheel"
    local py=$REPO_DIR/.venv/bin/python
    [[ -x $py ]] || py=python3
    "$py" -m pip wheel -q --no-deps -w "$dir" "pyspark==$PYSPARK_VERSION"
  fi
  # shellcheck disable=SC2012  # names of our own making
  ls "$dir"/pyspark-"$PYSPARK_VERSION"-*.whl | head -1
}

# build_with_builder REF DOCKERFILE CONTEXT [BUILD_ARG...]: a two-stage project image, its
# builder stage tagged REF's name + "-builder" first. The legacy builder keeps a build's cache in
# the images' parent chains only, and the builder stage's images are untagged: the prune below
# removed them after every build, so each build (four per CI run: prebuild twice, cluster.sh
# twice) ran apt-get and pip install again, 1-4 min an image. Tagged, the stage is cached.
build_with_builder() {
  local ref=$1 dockerfile=$2 ctx=$3
  shift 3
  docker_cli build --network host -q -f "$dockerfile" --target builder "$@" \
    -t "${ref%:*}-builder:${ref##*:}" "$ctx" >/dev/null
  docker_cli build --network host -q -f "$dockerfile" "$@" -t "$ref" "$ctx" >/dev/null
}

build_project_images() {
  local ctx=${CTX_PREFIX}project
  project_context "$ctx"
  log "building $BROKER_IMAGE"
  build_with_builder "$BROKER_IMAGE" "$ctx/broker_image/Dockerfile" "$ctx" \
    --build-arg "BASE_IMAGE=$PROJECT_BASE_IMAGE"
  cp "$(pyspark_wheel)" "$ctx/"
  log "building $SPARK_IMAGE"
  build_with_builder "$SPARK_IMAGE" "$ctx/spark/Dockerfile" "$ctx" \
    --build-arg "BASE_IMAGE=$PROJECT_BASE_IMAGE" --build-arg "PYSPARK_VERSION=$PYSPARK_VERSION"
  # The tags moved to the new builds: the images they named before are dangling now. Each
  # rebuild of a changed tree left ~4.5 GB of them behind (89 images, 33 GB after a day of CI
  # runs, and a full disk); the build cache is in the tagged images' (and builder stages')
  # parent chains and is kept.
  docker_cli image prune -f >/dev/null
}

# MinIO (the chart's in-cluster object store): the binary the integration tests use, on the base.
build_minio_image() {
  local ctx=${CTX_PREFIX}minio
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp "$E2E_DIR/images/minio/Dockerfile" "$ctx/"
  cp "$CACHE_DIR/bin/minio-$MINIO_VERSION" "$ctx/minio"
  log "building $MINIO_IMAGE"
  docker_cli build -q --build-arg "BASE_IMAGE=$PROJECT_BASE_IMAGE" -t "$MINIO_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

cmd_build() {
  "$E2E_DIR/cluster/build-tools.sh" pause runc-nocap coredns metrics-server kube-state-metrics \
    local-path-provisioner minio prometheus-adapter
  mkdir -p "$IMAGES_DIR"
  start_dockerd
  build_base
  build_static pause "$PAUSE_IMAGE" "$CACHE_DIR/bin/pause-$PAUSE_VERSION/pause"
  build_static coredns "$COREDNS_IMAGE" "$CACHE_DIR/bin/coredns-$COREDNS_VERSION/coredns"
  build_static metrics-server "$METRICS_SERVER_IMAGE" "$CACHE_DIR/bin/metrics-server-$METRICS_SERVER_VERSION/metrics-server"
  build_static kube-state-metrics "$KUBE_STATE_METRICS_IMAGE" "$CACHE_DIR/bin/kube-state-metrics-$KUBE_STATE_METRICS_VERSION/kube-state-metrics"
  build_static local-path-provisioner "$LOCAL_PATH_PROVISIONER_IMAGE" "$LOCAL_PATH_PROVISIONER_BIN/local-path-provisioner"
  build_static prometheus-adapter "$PROMETHEUS_ADAPTER_IMAGE" "$PROMETHEUS_ADAPTER_BIN/adapter"
  build_minio_image
  build_project_images
  log "images built"
}

cmd_base() {
  "$E2E_DIR/cluster/build-tools.sh" runc-nocap
  mkdir -p "$IMAGES_DIR"
  start_dockerd
  build_base
}

cmd_project() {
  cmd_base
  build_project_images
  log "project images built"
}

cmd_build_kind() {
  "$E2E_DIR/cluster/build-tools.sh" metrics-server kube-state-metrics prometheus-adapter
  mkdir -p "$IMAGES_DIR"
  # kind's own dockerd (kind.sh): the project images FROM the debootstrap base, as here.
  [[ $PROJECT_BASE_IMAGE != "$BASE_IMAGE" ]] || build_base
  build_static metrics-server "$METRICS_SERVER_IMAGE" "$CACHE_DIR/bin/metrics-server-$METRICS_SERVER_VERSION/metrics-server"
  build_static kube-state-metrics "$KUBE_STATE_METRICS_IMAGE" "$CACHE_DIR/bin/kube-state-metrics-$KUBE_STATE_METRICS_VERSION/kube-state-metrics"
  build_static prometheus-adapter "$PROMETHEUS_ADAPTER_IMAGE" "$PROMETHEUS_ADAPTER_BIN/adapter"
  build_project_images
}

# The images `kubeadm config images list` names, plus kind's sandbox image, each built from the
# project's binaries: the control plane FROM scratch, kube-proxy on the node-tools image.
kind_node_image_refs() {
  "$KUBEADM_BIN/kubeadm" config images list --kubernetes-version "$KUBERNETES_VERSION"
  sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$KIND_SRC/images/base/files/etc/containerd/config.toml"
}

cmd_kind_node() {
  local file=$1 ref name refs=() ctx=${CTX_PREFIX}kind-cni
  [[ -n $file ]] || die "usage: images.sh kind-node FILE"
  "$E2E_DIR/cluster/build-tools.sh" pause kubernetes etcd coredns-kubeadm kubeadm kind local-path-provisioner
  mkdir -p "$IMAGES_DIR"
  start_dockerd
  build_base
  log "building $KIND_NODE_TOOLS_IMAGE"
  docker_cli build --network host -q --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -t "$KIND_NODE_TOOLS_IMAGE" "$E2E_DIR/images/kind-node-tools" >/dev/null
  while read -r ref; do
    name=${ref##*/}
    name=${name%%:*}
    log "building $ref"
    case $name in
      kube-apiserver | kube-controller-manager | kube-scheduler)
        build_command_image "$ref" kube-control-plane "$K8S_BIN/$name" --build-arg "COMMAND=$name" ;;
      etcd) build_command_image "$ref" kube-control-plane "$ETCD_BIN/etcd" --build-arg COMMAND=etcd ;;
      kube-proxy)
        build_command_image "$ref" kube-proxy "$K8S_BIN/kube-proxy" \
          --build-arg "NODE_TOOLS_IMAGE=$KIND_NODE_TOOLS_IMAGE" ;;
      coredns) build_command_image "$ref" coredns "$CACHE_DIR/bin/coredns-kubeadm-$COREDNS_VERSION/coredns" ;;
      pause) build_command_image "$ref" pause "$CACHE_DIR/bin/pause-$PAUSE_VERSION/pause" ;;
      *) die "no build for kubeadm's image $ref" ;;
    esac
    refs+=("$ref")
  done < <(kind_node_image_refs | sort -u)
  log "building $KIND_CNI_IMAGE"
  rm -rf "$ctx"
  cp -r "$E2E_DIR/images/kind-cni" "$ctx"
  docker_cli build -q --build-arg "NODE_TOOLS_IMAGE=$KIND_NODE_TOOLS_IMAGE" -t "$KIND_CNI_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
  refs+=("$KIND_CNI_IMAGE")
  # The node's default StorageClass (kind.sh: default-storage.yaml) and its helper pods' image.
  build_static local-path-provisioner "$LOCAL_PATH_PROVISIONER_IMAGE" "$LOCAL_PATH_PROVISIONER_BIN/local-path-provisioner"
  refs+=("$LOCAL_PATH_PROVISIONER_IMAGE" "$BASE_IMAGE")
  log "saving ${#refs[@]} images to $file"
  docker_cli save "${refs[@]}" -o "$file"
}

# Imports each image into containerd unless containerd already has that exact image ID.
cmd_import() {
  local ref id stamp dir=$IMAGES_DIR/imported
  mkdir -p "$dir"
  while read -r ref; do
    id=$(docker_cli image inspect -f '{{.Id}}' "$ref")
    stamp=$dir/$(echo "$ref" | tr '/:' '__')
    if [[ -f $stamp && $(cat "$stamp") == "$id" ]] && ctr_k8s images ls -q "name==$ref" | grep -q .; then
      continue
    fi
    log "importing $ref into containerd"
    docker_cli save "$ref" | ctr_k8s images import - >/dev/null
    echo "$id" >"$stamp"
  done < <(all_images)
}

# The lock guards the dockerd the images are built with: the default one, or another one's own.
IMAGES_LOCK=images
[[ -z ${TIDALMQ_E2E_DOCKER_HOST:-} ]] || IMAGES_LOCK=images-$(sha256sum <<<"$DOCKER_HOST_URL" | cut -c1-8)
# Build contexts are per dockerd too: two dockerds' builds hold different locks and may run at
# once (kind.sh node-image and images.sh build both build pause, CoreDNS and
# local-path-provisioner images), so they must not share a context directory.
CTX_PREFIX=$IMAGES_DIR/ctx-
[[ $IMAGES_LOCK == images ]] || CTX_PREFIX=$IMAGES_DIR/ctx-${IMAGES_LOCK#images-}-

main() {
  case "${1:-}" in
    build) with_lock "$IMAGES_LOCK" cmd_build ;;
    build-kind) with_lock "$IMAGES_LOCK" cmd_build_kind ;;
    base) with_lock "$IMAGES_LOCK" cmd_base ;;
    project) with_lock "$IMAGES_LOCK" cmd_project ;;
    import) with_lock "$IMAGES_LOCK" cmd_import ;;
    kind-node) with_lock "$IMAGES_LOCK" cmd_kind_node "${2:-}" ;;
    list) all_images ;;
    docker-stop) with_lock "$IMAGES_LOCK" stop_dockerd ;;
    *) echo "usage: $0 build|build-kind|base|project|import|kind-node FILE|list|docker-stop" >&2; exit 2 ;;
  esac
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
