#!/usr/bin/env bash
# A kind cluster from the offline node image, checked and deleted, each step timed; no pytest,
# no project image. What it shows: the node image boots a multi-node cluster
# (kind-config.yaml: 1 control plane + 3 workers), every node turns Ready (so the pod network
# daemon and kube-proxy run on every node), the scheduler places pods on every worker, and a
# claim of the default StorageClass (the node image's local-path-provisioner) is provisioned.
#
#   kind-check.sh          build what is missing (cached), create, check, delete
#   kind-check.sh --keep   the same, but leave the cluster running (delete it with
#                          `kind delete cluster --name tidalmq-kind-check` against kind's dockerd)
#
# The check's workload: a Deployment of one replica per worker, each a pause container (the
# node image holds kind's sandbox image already, so nothing is pulled), with a required pod
# anti-affinity on the node name: the scheduler must put exactly one on each worker.
# Prints one `step <name> <seconds>` line per step and a summary line at the end.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

CLUSTER=tidalmq-kind-check
KEEP=0
[[ ${1:-} == --keep ]] && KEEP=1

export DOCKER_HOST=unix://$KIND_DOCKER_SOCK
KUBECONFIG_CHECK=$CACHE_DIR/logs/kind-check.kubeconfig
kind() { "$KIND_BIN/kind" "$@"; }
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_CHECK" "$@"; }

declare -a STEPS=()
step_start=0
begin() { step_start=$SECONDS; log "$1"; }
end() {
  STEPS+=("$1 $((SECONDS - step_start))")
  echo "step $1 $((SECONDS - step_start))"
}

# shellcheck disable=SC2317  # runs from the EXIT trap
cleanup() {
  if ((KEEP == 0)); then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
}

main() {
  mkdir -p "$CACHE_DIR/logs"
  begin "tools (build-tools.sh: kind kubernetes kubeadm crictl coredns-kubeadm; cached)"
  "$E2E_DIR/cluster/build-tools.sh" kind kubernetes kubeadm crictl coredns-kubeadm
  end tools
  begin "kind's dockerd"
  "$E2E_DIR/cluster/kind.sh" docker
  end docker
  begin "node image $KIND_NODE_IMAGE (cached)"
  "$E2E_DIR/cluster/kind.sh" node-image
  end node-image

  # A cluster left over from an interrupted run would make `create` fail.
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  trap cleanup EXIT
  begin "kind create cluster --name $CLUSTER (1 control plane + 3 workers)"
  kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" \
    --config "$E2E_DIR/cluster/kind-config.yaml" --kubeconfig "$KUBECONFIG_CHECK" \
    --retain >"$CACHE_DIR/logs/kind-check-create.log" 2>&1 \
    || die "kind create cluster failed, see $CACHE_DIR/logs/kind-check-create.log"
  end create

  begin "every node Ready"
  kubectl wait --for=condition=Ready nodes --all --timeout=300s >/dev/null
  end nodes-ready
  local workers
  workers=$(kubectl get nodes -l '!node-role.kubernetes.io/control-plane' \
    -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
  (($(wc -l <<<"$workers") == 3)) || die "expected 3 workers, found: $workers"

  local pause_image
  pause_image=$(sed -n 's/^ *sandbox_image = "\(.*\)"/\1/p' "$KIND_SRC/images/base/files/etc/containerd/config.toml")
  begin "one pod on each worker (required anti-affinity)"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: one-per-worker
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels: {app: one-per-worker}
  template:
    metadata:
      labels: {app: one-per-worker}
    spec:
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - labelSelector:
                matchLabels: {app: one-per-worker}
              topologyKey: kubernetes.io/hostname
      containers:
        - name: pause
          image: $pause_image
          imagePullPolicy: Never
EOF
  kubectl rollout status deployment/one-per-worker --timeout=300s >/dev/null
  local placed
  placed=$(kubectl get pods -l app=one-per-worker --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort)
  [[ $placed == "$workers" ]] || die "pods Running on [$placed], workers are [$workers]"
  end pods-on-workers

  begin "kube-system pods Ready (CoreDNS, kube-proxy, the pod network daemon)"
  kubectl wait --for=condition=Ready pods --all -n kube-system --timeout=300s >/dev/null
  end kube-system-ready

  begin "a claim of the default StorageClass (local-path-provisioner) bound and mounted"
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: check-claim
  namespace: default
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 64Mi}
---
apiVersion: v1
kind: Pod
metadata:
  name: check-claim
  namespace: default
spec:
  containers:
    - name: pause
      image: $pause_image
      imagePullPolicy: Never
      volumeMounts:
        - {name: data, mountPath: /data}
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: check-claim}
EOF
  kubectl wait --for=condition=Ready pod/check-claim --timeout=300s >/dev/null
  [[ $(kubectl get pvc check-claim -o jsonpath='{.status.phase}') == Bound ]] \
    || die "the claim is not Bound"
  # Its class: kind falls back to a host-path class `standard` without default-storage.yaml, and
  # kind's controller-manager provisions that one too.
  local class
  class=$(kubectl get pvc check-claim -o jsonpath='{.spec.storageClassName}')
  [[ $class == local-path ]] || die "the claim got the default class '$class', not local-path"
  end volume

  if ((KEEP == 0)); then
    trap - EXIT
    begin "kind delete cluster"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1
    end delete
  fi
  echo "summary ${STEPS[*]}"
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
