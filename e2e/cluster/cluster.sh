#!/usr/bin/env bash
# A single-node Kubernetes cluster made of host processes, for the end-to-end tests.
#
#   cluster.sh up        build what is missing, start the cluster (idempotent), print the kubeconfig
#   cluster.sh down      stop everything and leave the machine as it was (processes by PID,
#                        iptables rules, interfaces, mounts, cgroups, sysctls)
#   cluster.sh status    show what runs; exit 0 only when the cluster is healthy
#   cluster.sh kubeconfig  print the kubeconfig path
#
# Layout: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (Debian's),
# kubelet and kube-proxy (iptables mode) run on the host; CoreDNS, metrics-server, kube-state-metrics and
# local-path-provisioner (dynamic hostPath PersistentVolumes, the default StorageClass
# `local-path`, volumes under $STATE_DIR/volumes) run as pods from locally built images. Pods use a bridge CNI network. See e2e/cluster/lib.sh for the
# network plan and ports, e2e/versions.env for the versions.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PKI=$STATE_DIR/pki
CONF=$STATE_DIR/conf
CNI_CONF_DIR=$STATE_DIR/cni/net.d
KUBELET_ROOT=$STATE_DIR/kubelet
MANIFESTS=$E2E_DIR/cluster/manifests
# The local-path-provisioner's volumes (hostPath directories).
VOLUME_DIR=$STATE_DIR/volumes
SYSCTL_SAVE=$STATE_DIR/sysctl.orig
# Sysctls this script or the kubelet and kube-proxy change; `down` restores the saved values.
SYSCTLS=(
  net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.ipv4.conf.all.route_localnet vm.overcommit_memory vm.panic_on_oom kernel.panic
  kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
)

kubectl_admin() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# ---------------------------------------------------------------- certificates and kubeconfigs

# new_ca NAME CN
new_ca() {
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 -subj "/CN=$2" \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature 2>/dev/null
}

# new_cert NAME CA SUBJECT USAGE [SANS]: USAGE is clientAuth, serverAuth or both
new_cert() {
  local name=$1 ca=$2 subject=$3 usage=$4 sans=${5:-}
  openssl req -new -nodes -newkey rsa:2048 -subj "$subject" \
    -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $sans ]] && echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -sha256 -days 365 -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -CAcreateserial -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# new_kubeconfig NAME CERT: a kubeconfig for the client certificate CERT
new_kubeconfig() {
  local file=$CONF/$1.kubeconfig cert=$2
  rm -f "$file"
  kubectl config --kubeconfig "$file" set-cluster "$NODE_NAME" --embed-certs \
    --certificate-authority "$PKI/ca.crt" --server "https://$NODE_IP:$APISERVER_PORT" >/dev/null
  kubectl config --kubeconfig "$file" set-credentials "$1" --embed-certs \
    --client-certificate "$PKI/$cert.crt" --client-key "$PKI/$cert.key" >/dev/null
  kubectl config --kubeconfig "$file" set-context "$NODE_NAME" --cluster "$NODE_NAME" --user "$1" >/dev/null
  kubectl config --kubeconfig "$file" use-context "$NODE_NAME" >/dev/null
}

make_pki() {
  [[ -f $PKI/.done ]] && return 0
  log "generating certificates and kubeconfigs"
  mkdir -p "$PKI" "$CONF"
  chmod 700 "$PKI"
  new_ca ca tidalmq-e2e-ca
  new_ca front-proxy-ca tidalmq-e2e-front-proxy-ca
  new_cert etcd-server ca /CN=etcd-server serverAuth,clientAuth "IP:127.0.0.1,DNS:localhost"
  new_cert apiserver-etcd-client ca /CN=kube-apiserver-etcd-client clientAuth
  new_cert apiserver ca /CN=kube-apiserver serverAuth \
    "IP:$KUBERNETES_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  new_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  new_cert front-proxy-client front-proxy-ca /CN=front-proxy-client clientAuth
  new_cert admin ca "/O=system:masters/CN=tidalmq-e2e-admin" clientAuth
  new_cert controller-manager ca /CN=system:kube-controller-manager clientAuth
  new_cert scheduler ca /CN=system:kube-scheduler clientAuth
  new_cert kube-proxy ca /CN=system:kube-proxy clientAuth
  new_cert kubelet-client ca "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  new_cert kubelet-serving ca "/O=system:nodes/CN=system:node:$NODE_NAME" serverAuth \
    "IP:$NODE_IP,DNS:$NODE_NAME"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  new_kubeconfig admin admin
  new_kubeconfig controller-manager controller-manager
  new_kubeconfig scheduler scheduler
  new_kubeconfig kube-proxy kube-proxy
  new_kubeconfig kubelet kubelet-client
  cp "$CONF/admin.kubeconfig" "$KUBECONFIG_FILE"
  touch "$PKI/.done"
}

# ---------------------------------------------------------------- host network and sysctls

save_sysctls() {
  [[ -f $SYSCTL_SAVE ]] && return 0
  local key
  for key in "${SYSCTLS[@]}"; do
    echo "$key=$(sysctl -n "$key" 2>/dev/null || echo)"
  done >"$SYSCTL_SAVE"
}

restore_sysctls() {
  [[ -f $SYSCTL_SAVE ]] || return 0
  local line
  while IFS= read -r line; do
    if [[ -n ${line#*=} ]]; then
      sysctl -q -w "$line" >/dev/null 2>&1 || log "could not restore $line"
    fi
  done <"$SYSCTL_SAVE"
  rm -f "$SYSCTL_SAVE"
}

setup_network() {
  save_sysctls
  sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
    net.bridge.bridge-nf-call-ip6tables=1
  # The node address, on an interface of its own (a veth pair: this kernel has no dummy
  # interfaces) so pods reach the apiserver through the Service VIP.
  if ! ip link show "$NODE_IFACE" >/dev/null 2>&1; then
    ip link add "$NODE_IFACE" type veth peer name "$NODE_IFACE-p"
    ip link set "$NODE_IFACE-p" up
    ip addr add "$NODE_IP/32" dev "$NODE_IFACE"
    ip link set "$NODE_IFACE" up
  fi
}

# Removes the iptables rules and chains of kube-proxy and the CNI plugins, and nothing else.
clean_iptables() {
  local ipt table chain rule
  for ipt in iptables ip6tables; do
    for table in filter nat mangle; do
      # Rules in any chain that jump to our chains, then our chains themselves.
      while IFS= read -r rule; do
        # shellcheck disable=SC2086
        $ipt -t "$table" ${rule/#-A/-D} 2>/dev/null || true
      done < <($ipt -t "$table" -S 2>/dev/null | grep -E '^-A ' | grep -E -- '-j (KUBE-|CNI-)|^-A (KUBE-|CNI-)' || true)
      while IFS= read -r chain; do
        $ipt -t "$table" -F "$chain" 2>/dev/null || true
      done < <($ipt -t "$table" -S 2>/dev/null | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p')
      while IFS= read -r chain; do
        $ipt -t "$table" -X "$chain" 2>/dev/null || true
      done < <($ipt -t "$table" -S 2>/dev/null | sed -n 's/^-N \(\(KUBE\|CNI\)-[^ ]*\)$/\1/p')
    done
  done
}

clean_network() {
  clean_iptables
  ip link del "$BRIDGE_IFACE" 2>/dev/null || true
  ip link del "$NODE_IFACE" 2>/dev/null || true
  # Conntrack entries of pod and service addresses, so a new cluster starts with none.
  conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true
  conntrack -D -d "$SERVICE_CIDR" >/dev/null 2>&1 || true
  restore_sysctls
}

# ---------------------------------------------------------------- components

start_etcd() {
  pid_alive etcd && return 0
  log "starting etcd $ETCD_VERSION"
  mkdir -p "$STATE_DIR/etcd"
  chmod 700 "$STATE_DIR/etcd"
  start_daemon etcd etcd \
    --name "$NODE_NAME" --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "https://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "$NODE_NAME=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT" \
    --cert-file "$PKI/etcd-server.crt" --key-file "$PKI/etcd-server.key" \
    --client-cert-auth --trusted-ca-file "$PKI/ca.crt" \
    --unsafe-no-fsync --snapshot-count 10000 --log-level warn
  wait_for etcd 60 curl -sf "http://127.0.0.1:$ETCD_METRICS_PORT/health"
}

start_apiserver() {
  pid_alive kube-apiserver && return 0
  log "starting kube-apiserver $KUBERNETES_VERSION"
  start_daemon kube-apiserver kube-apiserver \
    --advertise-address "$NODE_IP" --bind-address "$NODE_IP" --secure-port "$APISERVER_PORT" \
    --etcd-servers "https://127.0.0.1:$ETCD_CLIENT_PORT" --etcd-cafile "$PKI/ca.crt" \
    --etcd-certfile "$PKI/apiserver-etcd-client.crt" --etcd-keyfile "$PKI/apiserver-etcd-client.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --client-ca-file "$PKI/ca.crt" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --requestheader-group-headers X-Remote-Group --requestheader-username-headers X-Remote-User \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" \
    --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true \
    --profiling=false --v=1
  wait_for "kube-apiserver /readyz" 120 kubectl_admin get --raw /readyz
}

start_controller_manager() {
  pid_alive kube-controller-manager && return 0
  log "starting kube-controller-manager"
  local kc=$CONF/controller-manager.kubeconfig
  # Short HPA periods keep the autoscaling tests to a few minutes.
  start_daemon kube-controller-manager kube-controller-manager \
    --kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address 127.0.0.1 --leader-elect=false \
    --allocate-node-cidrs=true --cluster-cidr "$POD_CIDR" --node-cidr-mask-size 24 \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --use-service-account-credentials=true \
    --controllers '*,bootstrapsigner,tokencleaner' \
    --horizontal-pod-autoscaler-sync-period 5s \
    --horizontal-pod-autoscaler-downscale-stabilization 30s \
    --horizontal-pod-autoscaler-cpu-initialization-period 30s \
    --horizontal-pod-autoscaler-initial-readiness-delay 10s \
    --profiling=false --v=1
}

start_scheduler() {
  pid_alive kube-scheduler && return 0
  log "starting kube-scheduler"
  local kc=$CONF/scheduler.kubeconfig
  start_daemon kube-scheduler kube-scheduler \
    --kubeconfig "$kc" --authentication-kubeconfig "$kc" --authorization-kubeconfig "$kc" \
    --bind-address 127.0.0.1 --leader-elect=false --profiling=false --v=1
}

write_containerd_config() {
  mkdir -p "$CONF" "$CNI_CONF_DIR" "$CONTAINERD_ROOT" "$RUN_DIR/containerd" "$STATE_DIR/cni/ipam"
  cat >"$CONF/containerd.toml" <<EOF
version = 2
root = "$CONTAINERD_ROOT"
state = "$RUN_DIR/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[debug]
  address = "$RUN_DIR/containerd/debug.sock"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  # Lowering oom_score_adj needs CAP_SYS_RESOURCE, which processes here lack: clamp pods' scores
  # (the kubelet asks -998 for sandboxes) to containerd's own instead of failing every sandbox.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CNI_CONF_DIR"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
EOF
  # One node, one /24: the same range the controller-manager allocates to the first node.
  cat >"$CNI_CONF_DIR/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE_IFACE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR%.*.*}.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE_DIR/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

start_containerd() {
  pid_alive containerd && return 0
  log "starting containerd $(containerd --version | awk '{print $3}')"
  write_containerd_config
  start_daemon containerd containerd --config "$CONF/containerd.toml"
  wait_for containerd 60 ctr --address "$CONTAINERD_SOCK" version
}

write_kubelet_config() {
  cat >"$CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
cgroupRoot: /
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $STATE_DIR/pod-logs
failSwapOn: false
# Preloaded images can never be pulled again: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 5s
EOF
}

start_kubelet() {
  pid_alive kubelet && return 0
  log "starting kubelet"
  mkdir -p "$KUBELET_ROOT" "$STATE_DIR/pod-logs"
  write_kubelet_config
  start_daemon kubelet kubelet \
    --config "$CONF/kubelet.yaml" --kubeconfig "$CONF/kubelet.kubeconfig" \
    --root-dir "$KUBELET_ROOT" --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1
}

start_kube_proxy() {
  pid_alive kube-proxy && return 0
  log "starting kube-proxy (iptables mode)"
  cat >"$CONF/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $CONF/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$NODE_IP/32"]
conntrack:
  maxPerCore: 0
EOF
  start_daemon kube-proxy kube-proxy --config "$CONF/kube-proxy.yaml" --v=1
}

# apply_manifest FILE: applies a manifest with the @NAME@ placeholders filled in
apply_manifest() {
  sed -e "s#@COREDNS_IMAGE@#$COREDNS_IMAGE#g" \
    -e "s#@METRICS_SERVER_IMAGE@#$METRICS_SERVER_IMAGE#g" \
    -e "s#@KUBE_STATE_METRICS_IMAGE@#$KUBE_STATE_METRICS_IMAGE#g" \
    -e "s#@LOCAL_PATH_PROVISIONER_IMAGE@#$LOCAL_PATH_PROVISIONER_IMAGE#g" \
    -e "s#@BASE_IMAGE@#$BASE_IMAGE#g" -e "s#@VOLUME_DIR@#$VOLUME_DIR#g" \
    -e "s#@DNS_SERVICE_IP@#$DNS_SERVICE_IP#g" "$1" | kubectl_admin apply -f - >/dev/null
}

node_ready() {
  kubectl_admin get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

# shellcheck disable=SC2317  # called through wait_for
metrics_available() { kubectl_admin top nodes; }

install_addons() {
  log "installing CoreDNS, metrics-server, kube-state-metrics and local-path-provisioner (default StorageClass)"
  mkdir -p "$VOLUME_DIR"
  apply_manifest "$MANIFESTS/coredns.yaml"
  apply_manifest "$MANIFESTS/metrics-server.yaml"
  apply_manifest "$MANIFESTS/kube-state-metrics.yaml"
  apply_manifest "$MANIFESTS/local-path-provisioner.yaml"
  kubectl_admin -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
  kubectl_admin -n kube-system rollout status deployment/metrics-server --timeout=180s >/dev/null
  kubectl_admin -n kube-system rollout status deployment/kube-state-metrics --timeout=180s >/dev/null
  kubectl_admin -n local-path-storage rollout status deployment/local-path-provisioner \
    --timeout=180s >/dev/null
  wait_for "the metrics API (kubectl top nodes)" 180 metrics_available
}

healthy() {
  local name
  # A cluster started from another cache (another clone) runs other binaries and images.
  [[ $(cat "$STATE_DIR/cache-dir" 2>/dev/null) == "$CACHE_DIR" ]] || return 1
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy; do
    pid_alive "$name" || return 1
  done
  kubectl_admin get --raw /readyz >/dev/null 2>&1 && node_ready
}

# Builds the binaries and the images. The project images (downloads, apt, pip: mostly waiting on
# the network) are built while the Go builds keep both cores busy; on a warm cache both are no-ops.
build_everything() {
  local images_log=$CACHE_DIR/logs/images-project.log images_pid
  mkdir -p "$CACHE_DIR/logs"
  "$E2E_DIR/cluster/build-tools.sh" runc-nocap
  "$E2E_DIR/cluster/images.sh" project >"$images_log" 2>&1 &
  images_pid=$!
  if ! "$E2E_DIR/cluster/build-tools.sh" pause etcd kubernetes coredns metrics-server \
    kube-state-metrics local-path-provisioner minio helm; then
    wait "$images_pid" || true
    die "building the binaries failed"
  fi
  wait "$images_pid" || { tail -40 "$images_log" >&2; die "building the images failed, see $images_log"; }
  "$E2E_DIR/cluster/images.sh" build
}

cmd_up() {
  local start=$SECONDS
  [[ $EUID -eq 0 ]] || die "must run as root (starts containerd, kubelet, iptables)"
  if healthy; then
    # Reused (TIDALMQ_E2E_KEEP): bring the images up to date with the work tree.
    log "cluster already up; refreshing the images"
    build_everything
    "$E2E_DIR/cluster/images.sh" import
    "$E2E_DIR/cluster/images.sh" docker-stop
    # A cluster kept from before the provisioner or kube-state-metrics existed gets them too
    # (apply is idempotent).
    mkdir -p "$VOLUME_DIR"
    apply_manifest "$MANIFESTS/local-path-provisioner.yaml"
    apply_manifest "$MANIFESTS/kube-state-metrics.yaml"
    echo "$KUBECONFIG_FILE"
    return 0
  fi
  if [[ -d $STATE_DIR || -d $RUN_DIR ]]; then
    log "cleaning up a partial cluster first"
    cmd_down
  fi
  "$E2E_DIR/cluster/host-packages.sh"
  build_everything
  mkdir -p "$STATE_DIR" "$RUN_DIR"
  echo "$CACHE_DIR" >"$STATE_DIR/cache-dir"
  make_pki
  setup_network
  start_etcd
  start_apiserver
  start_controller_manager
  start_scheduler
  start_containerd
  "$E2E_DIR/cluster/images.sh" import
  "$E2E_DIR/cluster/images.sh" docker-stop
  start_kubelet
  start_kube_proxy
  wait_for "node $NODE_NAME Ready" 180 node_ready
  install_addons
  log "cluster up in $((SECONDS - start)) s; kubeconfig: $KUBECONFIG_FILE"
  echo "$KUBECONFIG_FILE"
}

# Stops every pod through the kubelet (so the CNI plugin releases addresses and network
# namespaces), with the controllers stopped first so nothing is recreated.
drain_pods() {
  pid_alive kube-apiserver && pid_alive kubelet || return 0
  log "deleting all pods"
  kubectl_admin delete pods --all --all-namespaces --grace-period=1 --wait=false >/dev/null 2>&1 || true
  local i
  for ((i = 0; i < 60; i++)); do
    [[ -z $(ctr_k8s tasks ls -q 2>/dev/null) ]] && return 0
    sleep 1
  done
  log "some containers still run after 60 s; killing them"
}

# Kills what containerd still runs, then the shims of this containerd (found by their socket).
kill_containers() {
  local id pid
  if pid_alive containerd; then
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
      ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 1
    for id in $(ctr_k8s tasks ls -q 2>/dev/null); do
      ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr_k8s containers ls -q 2>/dev/null); do
      ctr_k8s containers delete "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_daemon containerd 20
  for pid in $(pgrep -f "containerd-shim.* -address $CONTAINERD_SOCK" || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
}

unmount_state() {
  local target
  # Deepest first; lazily, so a busy mount still goes.
  while IFS= read -r target; do
    umount -l "$target" 2>/dev/null || true
  done < <(findmnt -rn -o TARGET | grep -E "^($STATE_DIR|$RUN_DIR|$CONTAINERD_ROOT)/" | sort -r)
}

# Network namespaces the CNI plugin left (their files are bind mounts under /run/netns).
clean_netns() {
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e $ns ]] || continue
    # Only namespaces whose bridge side was ours: they hold an interface in POD_CIDR.
    if ip netns exec "$(basename "$ns")" ip -4 addr 2>/dev/null | grep -q "inet ${POD_CIDR%.*.*}\."; then
      umount -l "$ns" 2>/dev/null || true
      rm -f "$ns"
    fi
  done
}

# Paths the kubelet and libcni use whatever their configuration: remove only what points into
# this cluster's state, and their directories only when that leaves them empty.
clean_host_dirs() {
  local link
  for link in /var/log/containers/*.log; do
    [[ -L $link && $(readlink "$link") == "$STATE_DIR"/* ]] && rm -f "$link"
  done
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/log/containers /var/lib/kubelet/device-plugins /var/lib/kubelet \
    /var/lib/cni/results /var/lib/cni 2>/dev/null || true
}

remove_cgroups() {
  local dir
  for dir in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $dir ]] || continue
    find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

cmd_down() {
  local owner
  owner=$(cat "$STATE_DIR/cache-dir" 2>/dev/null || true)
  if [[ -n $owner && $owner != "$CACHE_DIR" && -d $owner ]]; then
    log "the running cluster was started from the cache $owner: stopping it with that one"
    TIDALMQ_CACHE_DIR=$owner "$0" down
    return
  fi
  log "stopping the cluster"
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  drain_pods
  stop_daemon kubelet
  kill_containers
  if [[ -f $CONF/kube-proxy.yaml ]] && pid_alive kube-proxy; then
    stop_daemon kube-proxy
    kube-proxy --cleanup --config "$CONF/kube-proxy.yaml" >/dev/null 2>&1 || true
  fi
  stop_daemon kube-proxy
  stop_daemon kube-apiserver
  stop_daemon etcd
  "$E2E_DIR/cluster/images.sh" docker-stop
  stop_daemon dockerd 30  # one an older images.sh started on the cluster's own run directory
  clean_netns
  unmount_state
  clean_network
  remove_cgroups
  clean_host_dirs
  rm -rf "$STATE_DIR" "$RUN_DIR"
  log "cluster down"
}

cmd_status() {
  local name ok=0
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy; do
    if pid_alive "$name"; then
      printf '%-24s running (pid %s)\n' "$name" "$(cat "$PID_DIR/$name.pid")"
    else
      printf '%-24s stopped\n' "$name"
      ok=1
    fi
  done
  # The image builds' dockerd (images.sh) is the cache's, not part of the cluster.
  if PID_DIR=$DOCKER_RUN_DIR pid_alive dockerd; then
    printf '%-24s running (pid %s, builds images)\n' dockerd "$(cat "$DOCKER_RUN_DIR/dockerd.pid")"
  fi
  if ((ok == 0)) && healthy; then
    kubectl_admin get nodes -o wide
    kubectl_admin get pods -A
    echo "kubeconfig: $KUBECONFIG_FILE"
    return 0
  fi
  echo "cluster not healthy"
  return 1
}

main() {
  case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kubeconfig) echo "$KUBECONFIG_FILE" ;;
    *) echo "usage: $0 up|down|status|kubeconfig" >&2; exit 2 ;;
  esac
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
