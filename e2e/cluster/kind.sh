#!/usr/bin/env bash
# kind without a registry (--e2e-cluster=kind on a machine with no registry access): kind's own
# dockerd and a kind node image built from Debian packages and the project's Go builds.
#
#   kind.sh docker        start kind's dockerd (lib.sh: KIND_DOCKER_SOCK) if it is not running
#   kind.sh node-image    build $KIND_NODE_IMAGE into it, unless it is there already
#   kind.sh rootfs        only the node's debootstrap tarball (cached; node-image builds it too)
#   kind.sh docker-stop   stop kind's dockerd (its clusters' node containers stop with it)
#
# Why not `kind build node-image`: it fetches the control-plane images, CoreDNS, kindnetd and the
# storage provisioner from registries. This script builds the same image directly:
#  1. a debootstrap rootfs with the packages kind's base image installs (containerd, runc and the
#     CNI plugins from Debian), cached as a tarball;
#  2. kind's own images/base/files from the kind Go module (systemd units, /kind/bin, the
#     entrypoint, containerd's config), with two changes this machine needs: containerd's unit
#     asks for no resource limits (a node container may not raise them: it failed on
#     LimitNOFILE=infinity and OOMScoreAdjust=-999) and containerd restricts pods' OOM scores;
#  3. kubelet, kubeadm, kubectl and crictl, /kind/version, /kind/manifests/default-cni.yaml (the
#     project's pod network daemon: kindnetd is not on the Go module proxy) and
#     /kind/manifests/default-storage.yaml (local-path-provisioner, as the host-process cluster);
#  4. the images kubeadm expects (images.sh kind-node), imported into the node's containerd, and
#     Docker's metadata kind relies on (ENTRYPOINT, STOPSIGNAL SIGRTMIN+3, container=docker).
#
# kind's dockerd uses runc-nocap (e2e/images/runc-nocap) as its default runtime: this machine's
# processes lack CAP_SYS_RESOURCE, which every privileged container and every `docker exec
# --privileged` asks for, and kind runs everything through those. It has no docker0 bridge and
# no iptables rules (like the image builds' dockerd); kind's own `kind` network works without.
# shellcheck disable=SC2317  # the cmd_* functions run through with_lock
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PID_DIR=$KIND_DOCKER_RUN_DIR
LOG_DIR=$CACHE_DIR/logs
IMAGES_DIR=$CACHE_DIR/images
KIND_DATA_ROOT=$CACHE_DIR/kind-docker

kind_docker() { /usr/bin/docker --host "unix://$KIND_DOCKER_SOCK" "$@"; }

# The packages of kind's base image (images/base/Dockerfile), Debian's containerd, runc and CNI
# plugins in place of kind's own builds, and what systemd needs to boot in a container. Not
# fuse-overlayfs, nfs-common, open-iscsi: rootless and storage drivers the tests do not use.
NODE_PACKAGES=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins,socat

cmd_docker() {
  if kind_docker version >/dev/null 2>&1; then
    return 0
  fi
  "$E2E_DIR/cluster/build-tools.sh" runc-nocap
  mkdir -p "$KIND_DATA_ROOT" "$KIND_DOCKER_RUN_DIR/exec"
  # Docker creates an empty /lib/modules if it is missing (kind mounts it read-only).
  log "starting kind's dockerd on $KIND_DOCKER_SOCK"
  start_daemon kind-dockerd dockerd \
    --host "unix://$KIND_DOCKER_SOCK" \
    --data-root "$KIND_DATA_ROOT" \
    --exec-root "$KIND_DOCKER_RUN_DIR/exec" \
    --pidfile "$KIND_DOCKER_RUN_DIR/exec/dockerd.pid" \
    --bridge none --iptables=false --ip-forward=false --ip-masq=false \
    --storage-driver overlay2 \
    --add-runtime "runc-nocap=$RUNC_NOCAP" --default-runtime runc-nocap
  wait_for "kind's dockerd" 60 kind_docker version
}

cmd_docker_stop() {
  stop_daemon kind-dockerd 60
}

# node_rootfs -> the debootstrap tarball of the node's packages (built once per package list)
node_rootfs() {
  local tarball root
  tarball=$IMAGES_DIR/kind-node-rootfs-$DEBIAN_SUITE-$(sha256sum <<<"$NODE_PACKAGES" | cut -c1-8).tar
  if [[ ! -f $tarball ]]; then
    root=$IMAGES_DIR/kind-node-rootfs
    rm -rf "$root"
    mkdir -p "$root"
    log "debootstrap $DEBIAN_SUITE with kind's node packages (a few minutes)"
    debootstrap --variant=minbase --include="$NODE_PACKAGES" "$DEBIAN_SUITE" "$root" \
      http://deb.debian.org/debian >"$LOG_DIR/kind-debootstrap.log" 2>&1 \
      || die "debootstrap failed, see $LOG_DIR/kind-debootstrap.log"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  echo "$tarball"
}

# install_kind_files ROOT: kind's images/base/files and the steps of its base Dockerfile
install_kind_files() {
  local root=$1 files=$KIND_SRC/images/base/files plugin
  [[ -d $files ]] || die "kind's base files not found at $files (build-tools.sh kind downloads them)"
  # The module cache's files are read-only: the image gets kind's modes (0644, programs 0755).
  cp -r --no-preserve=mode "$files/." "$root/"
  chmod 0755 "$root"/usr/local/bin/entrypoint "$root"/usr/local/bin/clean-install "$root"/kind/bin/*
  # Debian's containerd is /usr/bin/containerd; a node container may not raise its limits.
  sed -i -e 's|^ExecStart=/usr/local/bin/containerd|ExecStart=/usr/bin/containerd|' \
    -e '/^LimitNPROC=/d' -e '/^LimitCORE=/d' -e '/^LimitNOFILE=/d' -e '/^OOMScoreAdjust=/d' \
    "$root/etc/systemd/system/containerd.service"
  sed -i 's/^\( *restrict_oom_score_adj = \).*/\1true/' "$root/etc/containerd/config.toml"
  grep -q 'restrict_oom_score_adj = true' "$root/etc/containerd/config.toml" \
    || die "kind's containerd config has no restrict_oom_score_adj to set"
  # The CNI plugins where containerd looks for them (kind installs its own builds there).
  mkdir -p "$root/opt/cni/bin"
  for plugin in host-local loopback ptp portmap; do
    cp "$root/usr/lib/cni/$plugin" "$root/opt/cni/bin/"
  done
  # As kind's base Dockerfile: no units but the node's, journald without kmsg, /sbin/init.
  find "$root/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "$root"/lib/systemd/system/multi-user.target.wants/* "$root"/etc/systemd/system/*.wants/* \
    "$root"/lib/systemd/system/local-fs.target.wants/* "$root"/lib/systemd/system/sockets.target.wants/*udev* \
    "$root"/lib/systemd/system/sockets.target.wants/*initctl* "$root"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"$root/etc/systemd/journald.conf"
  ln -sf /lib/systemd/systemd "$root/sbin/init"
  chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
  chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
  mkdir -p "$root/etc/kubernetes/manifests"
}

# install_kubernetes ROOT: the node's Kubernetes programs and what kind reads from the image
install_kubernetes() {
  local root=$1
  install -m 0755 "$K8S_BIN/kubelet" "$K8S_BIN/kubectl" "$KUBEADM_BIN/kubeadm" "$root/usr/bin/"
  install -m 0755 "$CRICTL_BIN/crictl" "$root/usr/local/bin/"
  echo "$KUBERNETES_VERSION" >"$root/kind/version"
  mkdir -p "$root/kind/manifests"
  sed "s|@KIND_CNI_IMAGE@|$KIND_CNI_IMAGE|" "$E2E_DIR/cluster/manifests/kind-cni.yaml" \
    >"$root/kind/manifests/default-cni.yaml"
  # kind applies this in place of its host-path StorageClass: the local-path-provisioner of the
  # host-process cluster (the default StorageClass `local-path`), volumes where kind's own
  # provisioner puts them, the helper pod on the debootstrap base image (both images are in the
  # node's containerd: images.sh kind-node).
  sed -e "s#@LOCAL_PATH_PROVISIONER_IMAGE@#$LOCAL_PATH_PROVISIONER_IMAGE#g" \
    -e "s#@BASE_IMAGE@#$BASE_IMAGE#g" -e "s#@VOLUME_DIR@#/var/local-path-provisioner#g" \
    "$E2E_DIR/cluster/manifests/local-path-provisioner.yaml" >"$root/kind/manifests/default-storage.yaml"
}

cmd_node_image() {
  kind_docker image inspect "$KIND_NODE_IMAGE" >/dev/null 2>&1 && return 0
  local start=$SECONDS root=$IMAGES_DIR/kind-node-root images=$IMAGES_DIR/kind-node-images.tar
  local stage=$IMAGE_REGISTRY/kind-node-stage:$KIND_NODE_INPUTS container
  mkdir -p "$IMAGES_DIR" "$LOG_DIR"
  "$E2E_DIR/cluster/build-tools.sh" kind kubernetes kubeadm crictl
  with_lock kind-docker cmd_docker
  # Built with kind's dockerd, which then holds them too (and the image builds' dockerd is
  # often busy with other builds).
  TIDALMQ_E2E_DOCKER_HOST=unix://$KIND_DOCKER_SOCK "$E2E_DIR/cluster/images.sh" kind-node "$images"
  local tarball
  tarball=$(node_rootfs)
  log "assembling the node's files"
  rm -rf "$root"
  mkdir -p "$root"
  tar -C "$root" --numeric-owner -xf "$tarball"
  install_kind_files "$root"
  install_kubernetes "$root"
  log "importing the node's files as $stage"
  tar -C "$root" --numeric-owner -cf - . | kind_docker import - "$stage" >/dev/null
  rm -rf "$root"
  # The images go into the node's containerd as kind's own build puts them (not unpacked: the
  # kubelet's first use unpacks them). containerd runs only for this, in a stopped-at-exit
  # container whose filesystem becomes the node image.
  log "importing kubeadm's images into the node's containerd"
  container=kind-node-build-$$
  kind_docker rm -f "$container" >/dev/null 2>&1 || true
  kind_docker run --name "$container" --privileged -v "$images:/kind/images.tar:ro" \
    --entrypoint /bin/bash "$stage" -c '
      set -e
      containerd >/tmp/containerd.log 2>&1 &
      for i in $(seq 60); do ctr version >/dev/null 2>&1 && break; sleep 1; done
      ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests /kind/images.tar >/dev/null
      ctr --namespace=k8s.io images ls -q
      # kind base: the runtime spec of pods, with its product-files hook and no rlimits
      ctr oci spec \
        | jq ".hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" \
        | jq "del(.process.rlimits)" >/etc/containerd/cri-base.json
      kill %1; wait || true
      rm -rf /tmp/containerd.log /run/containerd' >"$LOG_DIR/kind-node-images.log" 2>&1 \
    || { kind_docker rm -f "$container" >/dev/null 2>&1; die "importing the images failed, see $LOG_DIR/kind-node-images.log"; }
  kind_docker commit \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' \
    --change 'CMD []' \
    --change 'ENV container=docker' \
    "$container" "$stage-committed" >/dev/null
  kind_docker rm -f "$container" >/dev/null
  # This Docker's commit takes no STOPSIGNAL: a one-line build adds it (systemd stops on it).
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$stage-committed" \
    | DOCKER_BUILDKIT=0 kind_docker build -q -t "$KIND_NODE_IMAGE" - >/dev/null
  kind_docker rmi "$stage-committed" "$stage" >/dev/null
  rm -f "$images"
  log "node image $KIND_NODE_IMAGE built in $((SECONDS - start)) s"
}

main() {
  case "${1:-}" in
    docker) with_lock kind-docker cmd_docker ;;
    node-image) with_lock kind-node-image cmd_node_image ;;
    rootfs) with_lock kind-node-image node_rootfs ;;
    docker-stop) with_lock kind-docker cmd_docker_stop ;;
    *) echo "usage: $0 docker|node-image|rootfs|docker-stop" >&2; exit 2 ;;
  esac
}

# One line, so bash has read all of the file before running it (editing it meanwhile is safe).
main "$@"; exit
