#!/usr/bin/env bash
# Builds the e2e control plane from Go modules into a cache outside the repository:
#   kube-apiserver, kube-scheduler, kube-controller-manager, kubectl  (tests/e2e/controlplane, k8s.io/kubernetes)
#   etcd                                                              (tests/e2e/etcd, go.etcd.io/etcd/server/v3)
#   kwok + its stage files                                            (tests/e2e/kwok, sigs.k8s.io/kwok)
#
# Output: ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/<k8s-version>/bin, printed as the last line.
# Version: GPU_WEBHOOK_E2E_K8S=MINOR (for example 1.30) builds the Kubernetes release that tests/e2e/controlplane-MINOR
# pins instead of the default tests/e2e/controlplane; each release has a cache folder of its own, so several
# stay built side by side. etcd and kwok are the same for every release.
# Idempotent: a stamp holds the hash of every go.mod/go.sum, this script and `go version`; when it matches and every
# binary is there, nothing is rebuilt (a warm run takes well under a second).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"

# The Go module that pins the control plane's Kubernetes release: controlplane/, or controlplane-$GPU_WEBHOOK_E2E_K8S.
controlplane="$here/controlplane"
if [[ -n "${GPU_WEBHOOK_E2E_K8S:-}" ]]; then
    controlplane="$here/controlplane-$GPU_WEBHOOK_E2E_K8S"
    if [[ ! -f "$controlplane/go.mod" ]]; then
        known="$(cd "$here" && for d in controlplane-*/; do d="${d#controlplane-}"; printf '%s ' "${d%/}"; done)"
        echo "build.sh: GPU_WEBHOOK_E2E_K8S=$GPU_WEBHOOK_E2E_K8S names no control plane module ($controlplane/go.mod" \
            "is missing); set it to one of: ${known% } or unset it for the release that $here/controlplane pins" >&2
        exit 2
    fi
fi
k8s_version="$(pinned_version build.sh "$controlplane/go.mod" k8s.io/kubernetes)"
cache_dirs "$k8s_version"
require_go build.sh

binaries=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok)
want_stamp="$(stamp_of "$controlplane"/go.mod "$controlplane"/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum \
    "$here"/kwok/go.mod "$here"/kwok/go.sum "$here"/build.sh "$here"/build_lib.sh)"
[[ -d "$out/kwok-stages" ]] && exit_if_up_to_date build.sh "$k8s_version control plane" "$want_stamp" "${binaries[@]}"

begin_build
ldflags="$(k8s_ldflags "$k8s_version")"
step build.sh "kube-apiserver, kube-scheduler, kube-controller-manager, kubectl $k8s_version" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "$2" -o "$3/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl' _ "$controlplane" "$ldflags" "$tmp"
step build.sh etcd bash -c 'cd "$1/etcd" && go build -trimpath -ldflags "-s -w" -o "$2/etcd" go.etcd.io/etcd/server/v3' \
    _ "$here" "$tmp"
step build.sh kwok bash -c 'cd "$1/kwok" && go build -trimpath -ldflags "-s -w" -o "$2/kwok" sigs.k8s.io/kwok/cmd/kwok' \
    _ "$here" "$tmp"

# kwok's stage files ship in its module source, not in the binary.
kwok_dir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
rm -rf "$out/kwok-stages"
mkdir -p "$tmp/kwok-stages"
cp -r "$kwok_dir/kustomize/stage/." "$tmp/kwok-stages/"
chmod -R u+w "$tmp/kwok-stages"
mv "$tmp/kwok-stages" "$out/kwok-stages"

for b in "${binaries[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
echo "$want_stamp" > "$out/stamp"
echo "build.sh: $k8s_version control plane built in $bin" >&2
echo "$bin"
