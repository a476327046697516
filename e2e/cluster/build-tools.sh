#!/usr/bin/env bash
# Builds the end-to-end cluster's binaries from the Go module proxy at the versions pinned in
# e2e/versions.env: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
# kubectl (one wrapper module, one `go build`), etcd 3.5, CoreDNS, metrics-server, helm, kind and
# the project's pause program and Docker runtime wrapper.
#
# Everything lands under ${TIDALMQ_CACHE_DIR:-<repo>/.cache}: go/mod (GOMODCACHE), go/build
# (GOCACHE), src/ (wrapper modules) and bin/<tool>-<version>/ (results, each with a .done stamp),
# so a second run only checks the stamps and costs seconds.
#
# Usage: e2e/cluster/build-tools.sh [tool...]   (default: all; prints the bin directory of each)
set -euo pipefail

E2E_DIR=$(cd "$(dirname "$0")/.." && pwd)
REPO_DIR=$(cd "$E2E_DIR/.." && pwd)
# shellcheck source=../versions.env
source "$E2E_DIR/versions.env"

CACHE_DIR=${TIDALMQ_CACHE_DIR:-$REPO_DIR/.cache}
export GOMODCACHE=$CACHE_DIR/go/mod
export GOCACHE=$CACHE_DIR/go/build
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off
export GOPATH=$CACHE_DIR/go/path

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# bin_dir NAME VERSION -> the cache directory holding that tool's binaries
bin_dir() { echo "$CACHE_DIR/bin/$1-$2"; }

# is_built NAME VERSION: true when a previous run completed this tool (stamp written last)
is_built() { [[ -f "$(bin_dir "$1" "$2")/.done" ]]; }

mark_built() { date -u +%FT%TZ >"$(bin_dir "$1" "$2")/.done"; }

# module_time MODULE@VERSION -> the module's commit time, used as a reproducible build date
module_time() { go list -m -json "$1" | sed -n 's/.*"Time": "\(.*\)".*/\1/p'; }

build_kubernetes() {
  local name=kubernetes version=$KUBERNETES_VERSION
  is_built $name "$version" && return 0
  local src=$CACHE_DIR/src/k8s-wrapper-$version out
  out=$(bin_dir $name "$version")
  mkdir -p "$src" "$out"
  log "kubernetes $version: resolving the staging modules"
  # k8s.io/kubernetes replaces its staging modules with ./staging/src/...; a wrapper module must
  # replace each with the published module of the same patch instead.
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module tidalmq.local/e2e/kubernetes-tools"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    grep -E '=> \./staging/src/' "$gomod" | awk -v v="$KUBERNETES_STAGING_VERSION" \
      '{ print "replace " $1 " => " $1 " " v }'
  } >"$src/go.mod"
  local date major minor ldflags="-s -w" pkg
  date=$(cd "$src" && module_time "k8s.io/kubernetes@$version")
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  log "kubernetes $version: go build (cold: tens of minutes on 2 cores)"
  (cd "$src" && go build -trimpath -ldflags "$ldflags" -o "$out/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy \
    k8s.io/kubernetes/cmd/kubectl)
  mark_built $name "$version"
}

build_etcd() {
  local name=etcd version=$ETCD_VERSION
  is_built $name "$version" && return 0
  local src=$CACHE_DIR/src/etcd-wrapper-$version out
  out=$(bin_dir $name "$version")
  mkdir -p "$src" "$out"
  # etcd's server module replaces its sibling modules with relative paths, so `go install` refuses
  # it; a wrapper module requiring it resolves the siblings at their published versions.
  printf 'module tidalmq.local/e2e/etcd-tools\n\ngo 1.23\n' >"$src/go.mod"
  log "etcd $version: go build"
  (cd "$src" && go get "go.etcd.io/etcd/server/v3@$version" "go.etcd.io/etcd/etcdutl/v3@$version" \
    && go build -trimpath -o "$out/" \
      -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$version" \
      go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdutl/v3)
  mv "$out/v3" "$out/etcd" 2>/dev/null || true
  [[ -x "$out/etcd" ]] || mv "$out/server" "$out/etcd"
  mark_built $name "$version"
}

# go_install NAME VERSION PACKAGE@VERSION [LDFLAGS]: for modules without replace directives
go_install() {
  local name=$1 version=$2 target=$3 ldflags=${4:-}
  is_built "$name" "$version" && return 0
  local out
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "$name $version: go install $target"
  GOBIN=$out go install -trimpath -ldflags "-s -w $ldflags" "$target"
  mark_built "$name" "$version"
}

build_coredns() {
  go_install coredns "$COREDNS_VERSION" "github.com/coredns/coredns@$COREDNS_VERSION" \
    "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
}

build_metrics_server() {
  is_built metrics-server "$METRICS_SERVER_VERSION" && return 0
  local module=sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION sum
  sum=$(cd "$CACHE_DIR" && GONOSUMDB=sigs.k8s.io/metrics-server go mod download -json "$module" \
    | sed -n 's/.*"Sum": "\(.*\)".*/\1/p')
  [[ $sum == "$METRICS_SERVER_MODULE_SUM" ]] \
    || { log "$module has hash '$sum', expected $METRICS_SERVER_MODULE_SUM"; exit 1; }
  GONOSUMDB=sigs.k8s.io/metrics-server go_install metrics-server "$METRICS_SERVER_VERSION" \
    "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION" \
    "-X sigs.k8s.io/metrics-server/pkg/version.gitVersion=$METRICS_SERVER_VERSION"
}

build_helm() {
  go_install helm "$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

build_kind() {
  go_install kind "$KIND_VERSION" "sigs.k8s.io/kind@$KIND_VERSION"
}

build_pause() {
  local name=pause version=$PAUSE_VERSION
  is_built $name "$version" && return 0
  local out
  out=$(bin_dir $name "$version")
  mkdir -p "$out"
  log "pause $version: go build"
  (cd "$E2E_DIR/images/pause" && go build -trimpath -ldflags "-s -w" -o "$out/pause" .)
  mark_built $name "$version"
}

# The Docker runtime wrapper (see e2e/images/runc-nocap); its version is its source's hash.
build_runc_nocap() {
  local name=runc-nocap version out
  version=$(cat "$E2E_DIR/images/runc-nocap/"*.go | sha256sum | cut -c1-12)
  is_built $name "$version" && return 0
  out=$(bin_dir $name "$version")
  mkdir -p "$out"
  log "runc-nocap $version: go build"
  (cd "$E2E_DIR/images/runc-nocap" && go build -trimpath -ldflags "-s -w" -o "$out/runc-nocap" .)
  mark_built $name "$version"
}

main() {
  local tools=("$@") tool start=$SECONDS
  ((${#tools[@]})) || tools=(pause runc-nocap etcd kubernetes coredns metrics-server helm kind)
  for tool in "${tools[@]}"; do
    "build_${tool//-/_}"
  done
  log "done in $((SECONDS - start)) s (cache: $CACHE_DIR)"
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
