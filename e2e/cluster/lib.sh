# Shared settings of the end-to-end cluster scripts (sourced, not run).
# shellcheck disable=SC2034  # the settings are used by the scripts that source this file
# shellcheck shell=bash

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_DIR=$(cd "$E2E_DIR/.." && pwd)
# shellcheck source=../versions.env
source "$E2E_DIR/versions.env"

CACHE_DIR=${TIDALMQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tidalmq}
# Cluster data (certificates, etcd, kubelet, logs): removed by `down`.
STATE_DIR=${TIDALMQ_E2E_STATE_DIR:-/var/lib/tidalmq-e2e}
# Sockets and PID files.
RUN_DIR=${TIDALMQ_E2E_RUN_DIR:-/run/tidalmq-e2e}
# containerd's image store survives `down` (images are rebuilt only when their input changes).
CONTAINERD_ROOT=$CACHE_DIR/containerd
CONTAINERD_SOCK=$RUN_DIR/containerd/containerd.sock
# The dockerd that builds the images belongs to the cache, not to the cluster: its socket and
# state are per cache directory, so a background build (.ci/prebuild) never meets a running
# cluster's files, or another clone's dockerd.
DOCKER_RUN_DIR=/run/tidalmq-docker-$(printf %s "$CACHE_DIR" | sha256sum | cut -c1-8)
DOCKER_SOCK=$DOCKER_RUN_DIR/docker.sock
KUBECONFIG_FILE=$STATE_DIR/admin.kubeconfig
# kind's own dockerd (kind.sh): its default runtime is runc-nocap, which kind's `docker exec
# --privileged` needs; separate from the image builds' dockerd, whose stop must not stop a cluster.
KIND_DOCKER_RUN_DIR=/run/tidalmq-kind-docker-$(printf %s "$CACHE_DIR" | sha256sum | cut -c1-8)
KIND_DOCKER_SOCK=$KIND_DOCKER_RUN_DIR/docker.sock

K8S_BIN=$CACHE_DIR/bin/kubernetes-$KUBERNETES_VERSION
ETCD_BIN=$CACHE_DIR/bin/etcd-$ETCD_VERSION
HELM_BIN=$CACHE_DIR/bin/helm-$HELM_VERSION
KIND_BIN=$CACHE_DIR/bin/kind-$KIND_VERSION
LOCAL_PATH_PROVISIONER_BIN=$CACHE_DIR/bin/local-path-provisioner-$LOCAL_PATH_PROVISIONER_VERSION
KUBEADM_BIN=$CACHE_DIR/bin/kubeadm-$KUBERNETES_VERSION
CRICTL_BIN=$CACHE_DIR/bin/crictl-$CRI_TOOLS_VERSION
# The Docker runtime wrapper (e2e/images/runc-nocap): its version is its source's hash.
RUNC_NOCAP_VERSION=$(cat "$E2E_DIR/images/runc-nocap/"*.go | sha256sum | cut -c1-12)
RUNC_NOCAP=$CACHE_DIR/bin/runc-nocap-$RUNC_NOCAP_VERSION/runc-nocap
# The MinIO version tests/support/s3_server.py pins (one place): v0.0.0-<date>-<commit>.
MINIO_VERSION=$(sed -n 's/^MINIO_VERSION = "\(.*\)".*/\1/p' "$REPO_DIR/tests/support/s3_server.py")

# Network plan: chosen to avoid Docker's 172.17.0.0/16 and the host's resolver.
NODE_NAME=tidalmq-e2e
NODE_IP=10.213.0.1            # on its own interface, reachable from pods and the host
NODE_IFACE=tidalmq-node
BRIDGE_IFACE=tidalmq-br0
CNI_NETWORK=tidalmq-e2e
POD_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
# Loopback/node ports, away from the defaults (etcd 2379, apiserver 6443) and the brokers' 9092+.
ETCD_CLIENT_PORT=12379
ETCD_PEER_PORT=12380
ETCD_METRICS_PORT=12381
APISERVER_PORT=16443

# Image names: always explicit tags, never pulled.
IMAGE_REGISTRY=tidalmq.local
PAUSE_IMAGE=$IMAGE_REGISTRY/pause:$PAUSE_VERSION
COREDNS_IMAGE=$IMAGE_REGISTRY/coredns:$COREDNS_VERSION
METRICS_SERVER_IMAGE=$IMAGE_REGISTRY/metrics-server:$METRICS_SERVER_VERSION
KUBE_STATE_METRICS_IMAGE=$IMAGE_REGISTRY/kube-state-metrics:$KUBE_STATE_METRICS_VERSION
# The chart's metricsAdapter.image default (a chart test checks the two agree).
PROMETHEUS_ADAPTER_IMAGE=$IMAGE_REGISTRY/prometheus-adapter:$PROMETHEUS_ADAPTER_VERSION
PROMETHEUS_ADAPTER_BIN=$CACHE_DIR/bin/prometheus-adapter-$PROMETHEUS_ADAPTER_VERSION
BASE_IMAGE=$IMAGE_REGISTRY/debian:$DEBIAN_SUITE
LOCAL_PATH_PROVISIONER_IMAGE=$IMAGE_REGISTRY/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION
# The images the Helm chart uses by default (charts/tidalmq/values.yaml), under those very names,
# so that the chart installs on the e2e cluster offline with no image value: the TidalMQ and
# Spark images tagged with the chart's appVersion, and MinIO (inClusterObjectStore) with the
# version of the binary inside. A chart test checks the two agree.
CHART_APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$REPO_DIR/charts/tidalmq/Chart.yaml")
BROKER_IMAGE=$IMAGE_REGISTRY/tidalmq:$CHART_APP_VERSION
SPARK_IMAGE=$IMAGE_REGISTRY/spark:$CHART_APP_VERSION
MINIO_IMAGE=$IMAGE_REGISTRY/minio:$MINIO_VERSION
# The kind node image (kind.sh) is named after everything that goes into it, so a change to any
# of those builds a new one and an unchanged tree reuses it.
KIND_NODE_INPUTS=$(cat "$E2E_DIR/versions.env" "$E2E_DIR/cluster/kind.sh" "$E2E_DIR/cluster/images.sh" \
  "$E2E_DIR/cluster/manifests/kind-cni.yaml" "$E2E_DIR/cluster/manifests/local-path-provisioner.yaml" \
  "$E2E_DIR"/images/kind-*/* "$E2E_DIR"/images/kube-*/* "$E2E_DIR"/images/local-path-provisioner/* \
  | sha256sum | cut -c1-12)
KIND_NODE_IMAGE=$IMAGE_REGISTRY/kind-node:$KUBERNETES_VERSION-$KIND_NODE_INPUTS
# What kube-proxy and the pod network daemon run on (images/kind-node-tools), and that daemon.
KIND_NODE_TOOLS_IMAGE=$IMAGE_REGISTRY/kind-node-tools:$DEBIAN_SUITE
KIND_CNI_IMAGE=$IMAGE_REGISTRY/kind-cni:$(cat "$E2E_DIR"/images/kind-cni/* | sha256sum | cut -c1-12)
# kind's module (its node image files: images/base/files), downloaded by build-tools.sh kind.
KIND_SRC=$CACHE_DIR/go/mod/sigs.k8s.io/kind@$KIND_VERSION

export PATH=$K8S_BIN:$ETCD_BIN:$HELM_BIN:$PATH

log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
docker_e2e() { /usr/bin/docker --host "unix://$DOCKER_SOCK" "$@"; }

# Where daemons keep their PID files and logs: the cluster's by default; images.sh points them at
# its dockerd's own directories.
PID_DIR=$RUN_DIR
LOG_DIR=$STATE_DIR/logs

# pid_alive NAME: the process recorded in $PID_DIR/NAME.pid is running
pid_alive() {
  local file=$PID_DIR/$1.pid
  [[ -f $file ]] && kill -0 "$(cat "$file")" 2>/dev/null
}

# start_daemon NAME CMD...: runs CMD in the background, logs to $LOG_DIR/NAME.log. The daemon
# inherits no open file but its standard ones, so it never holds a lock of with_lock.
start_daemon() {
  local name=$1
  shift
  if pid_alive "$name"; then
    return 0
  fi
  mkdir -p "$LOG_DIR" "$PID_DIR"
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      ((fd > 2)) && eval "exec $fd>&-" 2>/dev/null
    done
    exec setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$PID_DIR/$name.pid"
}

# stop_daemon NAME [TIMEOUT]: SIGTERM the recorded PID, SIGKILL after TIMEOUT seconds
stop_daemon() {
  local name=$1 timeout=${2:-20} file=$PID_DIR/$1.pid pid i
  [[ -f $file ]] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

# wait_for DESCRIPTION TIMEOUT CMD...: retries CMD every second until it succeeds
wait_for() {
  local what=$1 timeout=$2 i
  shift 2
  for ((i = 0; i < timeout; i++)); do
    if "$@" >/dev/null 2>&1; then
      return 0
    fi
    sleep 1
  done
  die "timed out after ${timeout}s waiting for $what"
}

# with_lock NAME CMD...: runs CMD holding the cache's lock NAME ($CACHE_DIR/locks/NAME.lock), so
# concurrent runs (the background prebuild, a test fixture, cluster.sh) wait for each other
# instead of building the same thing twice. Re-entrant: a nested script run under CMD sees the
# lock in TIDALMQ_LOCKS_HELD and does not wait for itself. If CMD fails, the script exits
# (set -e) and the lock goes with the process.
with_lock() {
  local name=$1 fd
  shift
  if [[ " ${TIDALMQ_LOCKS_HELD:-} " == *" $name "* ]]; then
    "$@"
    return
  fi
  mkdir -p "$CACHE_DIR/locks"
  exec {fd}>>"$CACHE_DIR/locks/$name.lock"
  if ! flock -n "$fd"; then
    log "waiting for $name (another process holds $CACHE_DIR/locks/$name.lock)"
    flock "$fd"
  fi
  TIDALMQ_LOCKS_HELD="${TIDALMQ_LOCKS_HELD:-} $name" "$@"
  exec {fd}>&-
}
