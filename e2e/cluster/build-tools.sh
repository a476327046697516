#!/usr/bin/env bash
# Builds the binaries the tests need from the Go module proxy, at the versions pinned in
# e2e/versions.env (MinIO: tests/support/s3_server.py):
#
#   kubernetes      kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
#                   kubectl (one `go build`)
#   etcd            etcd 3.5 (the server only)
#   helm            helm 3
#   metrics-server  metrics-server
#   coredns         CoreDNS with only the plugins the cluster's Corefile uses
#   minio           the MinIO server of the integration tests
#   prometheus-adapter  the custom metrics adapter of the chart's bytes-in autoscaling
#   kube-state-metrics  the HPA series the chart's HPA alert reads (its integration test)
#   local-path-provisioner  rancher's dynamic hostPath provisioner (the e2e cluster's default
#                   StorageClass)
#   kind, pause, runc-nocap  kind (for a laptop), the project's pause program and Docker runtime
#                   wrapper
#
# kubernetes, etcd, helm and metrics-server come from ONE wrapper module (src/k8s-tools-*) whose
# go.mod pins every module of Kubernetes' own module graph at the version Kubernetes requires.
# The Kubernetes binaries are so built from exactly the dependencies Kubernetes was released with
# (as before), the other three are built against them (Kubernetes' graph holds etcd's server
# module at ETCD_VERSION; helm and metrics-server are on the same Kubernetes minor), and the
# packages they share (client-go, apiserver, apimachinery, grpc, otel, ...: nearly all of
# metrics-server, most of helm and etcd) compile once into the shared GOCACHE, whichever tool is
# built first. Each tool is still its own `go build`, so a test that needs only helm gets it
# without waiting for Kubernetes.
#
# Everything lands under ${TIDALMQ_CACHE_DIR:-~/.cache/tidalmq}: go/mod (GOMODCACHE), go/build
# (GOCACHE), src/ (wrapper modules) and bin/<tool>-<version>/ (results, each with a .done stamp
# written last; MinIO: the file bin/minio-<version>), so a second run only checks the stamps.
#
# Concurrent runs are safe: each tool builds under its lock ($CACHE_DIR/locks/tool-<name>.lock),
# so the background prebuild (.ci/prebuild), a test fixture and cluster.sh wait for each other
# and never build a tool twice.
#
# Usage: e2e/cluster/build-tools.sh [tool...]   (default: the cluster's tools and kind)
# shellcheck disable=SC2317  # the build_* functions are called indirectly, by tool name
set -euo pipefail
source "$(dirname "$0")/lib.sh"

export GOMODCACHE=$CACHE_DIR/go/mod
export GOCACHE=$CACHE_DIR/go/build
# -buildvcs=false: the project's own programs build the same from a clone, a worktree or a tarball.
export GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 GOWORK=off
export GOPATH=$CACHE_DIR/go/path

# bin_dir NAME VERSION -> the cache directory holding that tool's binaries
bin_dir() { echo "$CACHE_DIR/bin/$1-$2"; }

# is_built NAME VERSION: true when a previous run completed this tool (stamp written last)
is_built() { [[ -f "$(bin_dir "$1" "$2")/.done" ]]; }

mark_built() { date -u +%FT%TZ >"$(bin_dir "$1" "$2")/.done"; }

# module_time MODULE@VERSION -> the module's commit time, used as a reproducible build date
module_time() { go list -m -json "$1" | sed -n 's/.*"Time": "\(.*\)".*/\1/p'; }

# ---------------------------------------------------------------- the Kubernetes tools module

K8S_TOOLS_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# The module's directory is named after everything that goes into its go.mod, so a version bump
# resolves a new one (and never reuses a stale go.sum).
K8S_TOOLS_SRC=$CACHE_DIR/src/k8s-tools-$(printf '%s\n' 3 "$KUBERNETES_VERSION" \
  "$KUBERNETES_STAGING_VERSION" "$ETCD_VERSION" "$HELM_VERSION" "$METRICS_SERVER_VERSION" \
  | sha256sum | cut -c1-12)

# k8s_tools_module: writes and resolves the wrapper module once (under its own lock).
k8s_tools_module() {
  [[ -f $K8S_TOOLS_SRC/.ready ]] && return 0
  with_lock src-k8s-tools resolve_k8s_tools_module
}

resolve_k8s_tools_module() {
  [[ -f $K8S_TOOLS_SRC/.ready ]] && return 0
  local tmp=$K8S_TOOLS_SRC.tmp gomod replaces pins cmd sum
  rm -rf "$tmp"
  mkdir -p "$tmp/graph"
  log "k8s-tools module: resolving Kubernetes $KUBERNETES_VERSION's module graph"
  # k8s.io/kubernetes replaces its staging modules with ./staging/src/...; a wrapper module must
  # replace each with the published module of the same patch instead.
  gomod=$(cd "$tmp/graph" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  replaces=$(grep -E '=> \./staging/src/' "$gomod" \
    | awk -v v="$KUBERNETES_STAGING_VERSION" '{ print "replace " $1 " => " $1 " " v }')
  printf 'module tidalmq.local/e2e/kubernetes-graph\n\ngo 1.24\n\nrequire k8s.io/kubernetes %s\n\n%s\n' \
    "$KUBERNETES_VERSION" "$replaces" >"$tmp/graph/go.mod"
  # Every module of that graph at the version Kubernetes selects (the staging ones are replaced).
  pins=$(cd "$tmp/graph" && go list -m -f '{{if not (or .Main .Replace)}}{{.Path}} {{.Version}}{{end}}' all)
  grep -qx "go.etcd.io/etcd/server/v3 $ETCD_VERSION" <<<"$pins" \
    || die "ETCD_VERSION=$ETCD_VERSION is not the etcd of Kubernetes $KUBERNETES_VERSION's module graph ($(grep '^go.etcd.io/etcd/server/v3 ' <<<"$pins" || echo none)); set it to that one"
  # The module proxy's checksum database has no entry for metrics-server v0.8.0: check the
  # module against the hash recorded in versions.env instead.
  sum=$(cd "$tmp/graph" && GONOSUMDB=sigs.k8s.io/metrics-server go mod download -json \
    "sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION" | sed -n 's/.*"Sum": "\(.*\)".*/\1/p')
  [[ $sum == "$METRICS_SERVER_MODULE_SUM" ]] \
    || die "sigs.k8s.io/metrics-server@$METRICS_SERVER_VERSION has hash '$sum', expected $METRICS_SERVER_MODULE_SUM"
  {
    printf 'module tidalmq.local/e2e/k8s-tools\n\ngo 1.24\n\n'
    echo "require ("
    echo "	k8s.io/kubernetes $KUBERNETES_VERSION"
    echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo "	helm.sh/helm/v3 $HELM_VERSION"
    echo "	sigs.k8s.io/metrics-server $METRICS_SERVER_VERSION"
    echo ")"
    echo
    for cmd in "${K8S_TOOLS_CMDS[@]}" kubeadm; do
      echo "tool k8s.io/kubernetes/cmd/$cmd"
    done
    echo "tool go.etcd.io/etcd/server/v3"
    echo "tool helm.sh/helm/v3/cmd/helm"
    echo "tool sigs.k8s.io/metrics-server/cmd/metrics-server"
    echo
    echo "$replaces"
    awk '$1 != "helm.sh/helm/v3" && $1 != "sigs.k8s.io/metrics-server" \
      { print "replace " $1 " => " $1 " " $2 }' <<<"$pins"
  } >"$tmp/go.mod"
  rm -rf "$tmp/graph"
  log "k8s-tools module: downloading the modules of kubernetes, etcd, helm and metrics-server"
  (cd "$tmp" && GONOSUMDB=sigs.k8s.io/metrics-server go mod tidy)
  rm -rf "$K8S_TOOLS_SRC"
  mv "$tmp" "$K8S_TOOLS_SRC"
  touch "$K8S_TOOLS_SRC/.ready"
}

# k8s_tools_build OUT LDFLAGS PACKAGE...: one `go build` in the Kubernetes tools module (its
# go.mod is complete: -mod=readonly, so builds of different tools can run side by side)
k8s_tools_build() {
  local out=$1 ldflags=$2
  shift 2
  k8s_tools_module
  (cd "$K8S_TOOLS_SRC" && go build -mod=readonly -trimpath -ldflags "-s -w $ldflags" -o "$out" "$@")
}

# kubernetes_ldflags VERSION -> the -X flags that make a Kubernetes binary report VERSION (kubeadm
# picks its control-plane image tags from it)
kubernetes_ldflags() {
  local version=$1 date major minor pkg ldflags=""
  date=$(cd "$K8S_TOOLS_SRC" && module_time "k8s.io/kubernetes@$version")
  major=${version#v}; major=${major%%.*}
  minor=${version#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$ldflags"
}

build_kubernetes() {
  local name=kubernetes version=$KUBERNETES_VERSION
  is_built "$name" "$version" && return 0
  local out cmd pkgs=()
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  k8s_tools_module
  for cmd in "${K8S_TOOLS_CMDS[@]}"; do
    pkgs+=("k8s.io/kubernetes/cmd/$cmd")
  done
  log "kubernetes $version: go build (cold: the longest build, 10-20 min on 2 cores)"
  k8s_tools_build "$out/" "$(kubernetes_ldflags "$version")" "${pkgs[@]}"
  mark_built "$name" "$version"
}

# kubeadm (only the kind node image needs it): same module and version flags as the others.
build_kubeadm() {
  local name=kubeadm version=$KUBERNETES_VERSION out
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  k8s_tools_module
  log "kubeadm $version: go build"
  k8s_tools_build "$out/kubeadm" "$(kubernetes_ldflags "$version")" k8s.io/kubernetes/cmd/kubeadm
  mark_built "$name" "$version"
}

build_etcd() {
  local name=etcd version=$ETCD_VERSION out
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "etcd $version: go build"
  k8s_tools_build "$out/etcd" "-X go.etcd.io/etcd/api/v3/version.GitSHA=$version" \
    go.etcd.io/etcd/server/v3
  mark_built "$name" "$version"
}

build_helm() {
  local name=helm version=$HELM_VERSION out
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "helm $version: go build"
  k8s_tools_build "$out/helm" \
    "-X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    helm.sh/helm/v3/cmd/helm
  mark_built "$name" "$version"
}

build_metrics_server() {
  local name=metrics-server version=$METRICS_SERVER_VERSION out
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "metrics-server $version: go build"
  k8s_tools_build "$out/metrics-server" \
    "-X sigs.k8s.io/metrics-server/pkg/version.gitVersion=$version" \
    sigs.k8s.io/metrics-server/cmd/metrics-server
  mark_built "$name" "$version"
}

# ---------------------------------------------------------------- CoreDNS, MinIO and the rest

# corefile_plugins FILE: the plugins a Corefile in FILE uses: the first word of each line one
# level inside the server block that follows a `Corefile: |` line (a ConfigMap in YAML, or
# kubeadm's Go template of one; template actions like `{{- if ... }}` are not plugins).
corefile_plugins() {
  awk '/Corefile: \|/ { inside = 1; next }
    inside && /^[^ ]/ { exit }
    inside {
      line = $0; sub(/#.*/, "", line)
      if (split(line, word, " ") && depth == 1 && word[1] ~ /^[a-z]/) print word[1]
      depth += gsub(/\{/, "{", line) - gsub(/\}/, "}", line)
    }' "$1" | sort -u
}

# The Corefile kubeadm installs on a kind cluster (its CoreDNS addon's template).
kubeadm_corefile_source() {
  echo "$GOMODCACHE/k8s.io/kubernetes@$KUBERNETES_VERSION/cmd/kubeadm/app/phases/addons/dns/manifests.go"
}

# CoreDNS' own main imports all of its ~60 plugins (cloud DNS SDKs, tracing, etcd, ...); a small
# main of ours imports only those a Corefile uses. The plugins CoreDNS lists but this binary
# lacks are simply not registered (the Corefile may not use them); the directive order is still
# CoreDNS' own. CoreDNS v1.12 is on Kubernetes 0.34 and etcd 3.6, so it keeps a module of its own.
# coredns_build NAME PLUGINS: bin/NAME-$COREDNS_VERSION/coredns with those plugins
coredns_build() {
  local name=$1 plugins=$2 version=$COREDNS_VERSION out src plugin package
  out=$(bin_dir "$name" "$version")
  # The stamp records the plugins: a Corefile that uses another one rebuilds it.
  [[ -f $out/.done && $(sed -n 's/^plugins: //p' "$out/.done") == "$plugins" ]] && return 0
  src=$CACHE_DIR/src/coredns-$version-$(sha256sum <<<"$plugins" | cut -c1-8)
  mkdir -p "$out" "$src"
  # A directive's package is named in CoreDNS' plugin.cfg (`prometheus:metrics`).
  local cfg
  cfg=$(cd "$src" && go mod download -json "github.com/coredns/coredns@$version" \
    | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')/plugin.cfg
  [[ -f $cfg ]] || die "CoreDNS $version's plugin.cfg not found"
  {
    echo "// CoreDNS with the plugins of one Corefile only (build-tools.sh)."
    echo "package main"
    echo
    echo "import ("
    echo "	\"github.com/coredns/coredns/coremain\""
    for plugin in $plugins; do
      package=$(awk -F: -v name="$plugin" '$1 == name { print $2 }' "$cfg")
      [[ -n $package ]] || die "CoreDNS $version has no plugin '$plugin'"
      [[ $package == */* ]] || package=github.com/coredns/coredns/plugin/$package
      echo "	_ \"$package\""
    done
    echo ")"
    echo
    echo "func main() { coremain.Run() }"
  } >"$src/main.go"
  printf 'module tidalmq.local/e2e/coredns\n\ngo 1.24\n\nrequire github.com/coredns/coredns %s\n' \
    "$version" >"$src/go.mod"
  log "$name $version: go build (plugins: $plugins)"
  (cd "$src" && go mod tidy && go build -mod=readonly -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$version" -o "$out/coredns" .)
  printf 'built: %s\nplugins: %s\n' "$(date -u +%FT%TZ)" "$plugins" >"$out/.done"
}

# The host-process cluster's CoreDNS: the plugins of manifests/coredns.yaml.
build_coredns() {
  coredns_build coredns "$(corefile_plugins "$E2E_DIR/cluster/manifests/coredns.yaml" | tr '\n' ' ')"
}

# The kind cluster's CoreDNS: the plugins of kubeadm's Corefile (it adds `prometheus`). A tool of
# its own, so the host-process cluster's binary (and CI's cache of it) stays as it is.
build_coredns_kubeadm() {
  local corefile
  k8s_tools_module # downloads k8s.io/kubernetes, which holds kubeadm's Corefile
  corefile=$(kubeadm_corefile_source)
  [[ -f $corefile ]] || die "kubeadm's Corefile template not found at $corefile"
  coredns_build coredns-kubeadm "$(corefile_plugins "$corefile" | tr '\n' ' ')"
}

# MinIO: the file bin/minio-<version> (where tests/support/s3_server.py looks), moved into place
# whole, so it exists only once complete.
build_minio() {
  local target=$CACHE_DIR/bin/minio-$MINIO_VERSION tmp
  [[ -n $MINIO_VERSION ]] || die "MINIO_VERSION not found in tests/support/s3_server.py"
  [[ -x $target ]] && return 0
  mkdir -p "$CACHE_DIR/bin"
  rm -rf "$CACHE_DIR/bin"/.minio-build.*
  tmp=$(mktemp -d "$CACHE_DIR/bin/.minio-build.XXXXXX")
  log "minio $MINIO_VERSION: go install github.com/minio/minio@$MINIO_VERSION"
  (cd "$tmp" && GOBIN=$tmp go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION")
  mv "$tmp/minio" "$target"
  rm -rf "$tmp"
}

# go_install NAME VERSION PACKAGE@VERSION [LDFLAGS]: for modules without replace directives
go_install() {
  local name=$1 version=$2 target=$3 ldflags=${4:-}
  is_built "$name" "$version" && return 0
  local out
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "$name $version: go install $target"
  (cd "$out" && GOBIN=$out go install -trimpath -ldflags "-s -w $ldflags" "$target")
  mark_built "$name" "$version"
}

# No replace directives in its go.mod: `go install module@version` builds it as released.
build_local_path_provisioner() {
  go_install local-path-provisioner "$LOCAL_PATH_PROVISIONER_VERSION" \
    "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION" \
    "-X main.VERSION=$LOCAL_PATH_PROVISIONER_VERSION"
}

# The adapter's module pins its own Kubernetes (0.30), apart from the k8s-tools module (the
# cluster's minor). It has no replace directives, so a wrapper module that requires only it
# selects exactly the module graph it was released with. (`go install module@version` would do
# the same, but it also asks the proxy for the module's version list, which the proxy refuses
# for this module; the version itself is served.)
build_prometheus_adapter() {
  local name=prometheus-adapter version=$PROMETHEUS_ADAPTER_VERSION out src
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  src=$CACHE_DIR/src/prometheus-adapter-$version
  mkdir -p "$out" "$src"
  printf 'module tidalmq.local/e2e/prometheus-adapter\n\ngo 1.24\n\nrequire sigs.k8s.io/prometheus-adapter %s\n\ntool sigs.k8s.io/prometheus-adapter/cmd/adapter\n' \
    "$version" >"$src/go.mod"
  log "prometheus-adapter $version: go build"
  (cd "$src" && go mod tidy && go build -mod=readonly -trimpath -ldflags "-s -w" \
    -o "$out/adapter" sigs.k8s.io/prometheus-adapter/cmd/adapter)
  mark_built "$name" "$version"
}

# kube-state-metrics pins its own Kubernetes (0.32) and has no replace directives: a wrapper
# module that requires only it selects the module graph it was released with (as the adapter's).
# The checksum database here has no entry for the module, nor for some of its dependencies
# (k8s.io/sample-controller v0.32.6). So the module is checked against the hash in versions.env
# and its dependencies against its own go.sum (inside the module checked), which the wrapper
# starts from: the checksum database is asked only about a module missing there, and refuses it.
build_kube_state_metrics() {
  local name=kube-state-metrics version=$KUBE_STATE_METRICS_VERSION out src info dir gomodsum date
  local module=k8s.io/kube-state-metrics/v2 common=github.com/prometheus/common/version
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  src=$CACHE_DIR/src/kube-state-metrics-$version
  rm -rf "$src"
  mkdir -p "$out" "$src"
  printf 'module tidalmq.local/e2e/kube-state-metrics\n\ngo 1.24\n\nrequire %s %s\n\ntool %s\n' \
    "$module" "$version" "$module" >"$src/go.mod"
  info=$(cd "$src" && GONOSUMDB=k8s.io/kube-state-metrics go mod download -json "$module@$version")
  [[ $(sed -n 's/.*"Sum": "\(.*\)".*/\1/p' <<<"$info") == "$KUBE_STATE_METRICS_MODULE_SUM" ]] \
    || die "$module@$version: its hash is not $KUBE_STATE_METRICS_MODULE_SUM: $info"
  dir=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$info")
  gomodsum=$(sed -n 's/.*"GoModSum": "\(.*\)".*/\1/p' <<<"$info")
  # the go.mod the module graph is read from is the one inside the checked module
  cmp -s "$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$info")" "$dir/go.mod" \
    || die "$module@$version: its go.mod differs from the one in its checked zip"
  {
    cat "$dir/go.sum"
    echo "$module $version $KUBE_STATE_METRICS_MODULE_SUM"
    echo "$module $version/go.mod $gomodsum"
  } >"$src/go.sum"
  date=$(cd "$src" && module_time "$module@$version")
  log "kube-state-metrics $version: go build"
  # the version flags of its Makefile (prometheus/common's version package)
  (cd "$src" && go mod tidy && go build -mod=readonly -trimpath -o "$out/kube-state-metrics" \
    -ldflags "-s -w -X $common.Version=$version -X $common.BuildDate=$date" "$module")
  mark_built "$name" "$version"
}

build_kind() {
  go_install kind "$KIND_VERSION" "sigs.k8s.io/kind@$KIND_VERSION"
}

# crictl, in the kind node image (`kind load` lists the node's images with it).
build_crictl() {
  go_install crictl "$CRI_TOOLS_VERSION" "sigs.k8s.io/cri-tools/cmd/crictl@$CRI_TOOLS_VERSION" \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION"
}

build_pause() {
  local name=pause version=$PAUSE_VERSION
  is_built "$name" "$version" && return 0
  local out
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "pause $version: go build"
  (cd "$E2E_DIR/images/pause" && go build -trimpath -ldflags "-s -w" -o "$out/pause" .)
  mark_built "$name" "$version"
}

# The Docker runtime wrapper (see e2e/images/runc-nocap); its version is its source's hash.
build_runc_nocap() {
  local name=runc-nocap version=$RUNC_NOCAP_VERSION out
  is_built "$name" "$version" && return 0
  out=$(bin_dir "$name" "$version")
  mkdir -p "$out"
  log "runc-nocap $version: go build"
  (cd "$E2E_DIR/images/runc-nocap" && go build -trimpath -ldflags "-s -w" -o "$out/runc-nocap" .)
  mark_built "$name" "$version"
}

# build TOOL: builds one tool under its lock, logging how long it took when it did build
build() {
  local tool=$1 start=$SECONDS
  declare -F "build_${tool//-/_}" >/dev/null || die "unknown tool '$tool'"
  with_lock "tool-$tool" "build_${tool//-/_}"
  ((SECONDS - start < 2)) || log "$tool: ready after $((SECONDS - start)) s"
}

main() {
  local tools=("$@") tool start=$SECONDS
  ((${#tools[@]})) || tools=(pause runc-nocap etcd kubernetes coredns metrics-server local-path-provisioner helm kind)
  for tool in "${tools[@]}"; do
    build "$tool"
  done
  log "done in $((SECONDS - start)) s (cache: $CACHE_DIR)"
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
