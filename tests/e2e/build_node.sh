#!/usr/bin/env bash
# Builds what the e2e suite's real node needs, into a cache outside the repository (its own stamp, so the control
# plane's cache from build.sh is never invalidated by it):
#   kubelet                        k8s.io/kubernetes/cmd/kubelet, the control plane's version and module graph
#                                  (tests/e2e/node/go.mod = tests/e2e/controlplane/go.mod's replaces + the kubelet)
#   pause                          tests/e2e/node/cmd/pause, the sandbox image's static binary
#   gpu-device-plugin-standin      tests/e2e/node/cmd/gpu-device-plugin-standin, a STAND-IN for NVIDIA's device plugin
#   busybox                        Debian's busybox-static: the shell of the test image tagged as the seed's CUDA image
#   nvidia-container-runtime, nvidia-cdi-hook, nvidia-ctk
#                                  github.com/NVIDIA/nvidia-container-toolkit (tests/e2e/nvidia/go.mod), the real
#                                  NVIDIA Container Runtime, run in CDI mode as containerd's `nvidia` handler (cgo:
#                                  it dlopens libcuda/NVML when they exist, so this step needs gcc)
# and installs, when missing, the Debian packages the node and the image builds use (apt-get update once, then
# apt-get install): containerd, runc, containernetworking-plugins, buildah, mmdebstrap, iproute2, iptables, gcc.
#
# Output: ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/node-<k8s-version>/bin, printed as the last line.
# Idempotent: a stamp holds the hash of both go.mod/go.sum pairs, the Go sources, this script and `go version`.
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build, no install).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
k8s_version="$(pinned_version build_node.sh "$here/node/go.mod" k8s.io/kubernetes)"
cache_dirs "node-$k8s_version"

debian_packages=(containerd runc containernetworking-plugins buildah mmdebstrap iproute2 iptables gcc libc6-dev)
commands=(containerd runc ctr buildah mmdebstrap ip iptables gcc)
missing=0
for c in "${commands[@]}"; do command -v "$c" >/dev/null || missing=1; done
[[ -x /usr/lib/cni/bridge ]] || missing=1
if [[ "$missing" == 1 ]]; then
    if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "build_node.sh: the real node needs the Debian packages ${debian_packages[*]}; install them as root" \
            "(apt-get install -y ${debian_packages[*]}) or run this script as root on Debian" >&2
        exit 1
    fi
    echo "build_node.sh: installing ${debian_packages[*]} from the Debian registry ..." >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${debian_packages[@]}" >&2
fi

require_go build_node.sh
binaries=(kubelet pause gpu-device-plugin-standin nvidia-container-runtime nvidia-cdi-hook nvidia-ctk busybox)
want_stamp="$(stamp_of "$here"/node/go.mod "$here"/node/go.sum "$here"/nvidia/go.mod "$here"/nvidia/go.sum \
    "$here"/build_node.sh "$here"/build_lib.sh $(find "$here/node/cmd" -name '*.go' | sort))"
exit_if_up_to_date build_node.sh "the $k8s_version node" "$want_stamp" "${binaries[@]}"

begin_build
ldflags="$(k8s_ldflags "$k8s_version")"
nvidia_version="$(pinned_version build_node.sh "$here/nvidia/go.mod" github.com/NVIDIA/nvidia-container-toolkit)"
nvidia_ldflags="-s -w -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${nvidia_version#v}"

step build_node.sh "kubelet $k8s_version, pause, gpu-device-plugin-standin" \
    bash -c 'cd "$1/node" && go build -trimpath -ldflags "$2" -o "$3/" k8s.io/kubernetes/cmd/kubelet \
        ./cmd/pause ./cmd/gpu-device-plugin-standin' _ "$here" "$ldflags" "$tmp"
step build_node.sh "nvidia-container-runtime, nvidia-cdi-hook, nvidia-ctk $nvidia_version" \
    bash -c 'cd "$1/nvidia" && CGO_ENABLED=1 go build -trimpath -ldflags "$2" -o "$3/" \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk' _ "$here" "$nvidia_ldflags" "$tmp"

step build_node.sh "busybox (Debian busybox-static)" bash -c 'cd "$1" && apt-get download -qq busybox-static >&2 && \
    dpkg-deb -x busybox-static_*.deb deb && mv deb/bin/busybox busybox' _ "$tmp"

for b in "${binaries[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
echo "$want_stamp" > "$out/stamp"
echo "build_node.sh: the $k8s_version node built in $bin" >&2
echo "$bin"
