#!/usr/bin/env bash
# Builds the e2e control plane from Go modules into a cache outside the repository:
#   kube-apiserver, kube-scheduler, kube-controller-manager, kubectl  (tests/e2e/controlplane, k8s.io/kubernetes)
#   etcd                                                              (tests/e2e/etcd, go.etcd.io/etcd/server/v3)
#   kwok + its stage files                                            (tests/e2e/kwok, sigs.k8s.io/kwok)
#
# Output: ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/<k8s-version>/bin, printed as the last line.
# Idempotent: a stamp holds the hash of every go.mod/go.sum, this script and `go version`; when it matches and every
# binary is there, nothing is rebuilt (a warm run takes well under a second).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
k8s_version="$(pinned_version build.sh "$here/controlplane/go.mod" k8s.io/kubernetes)"
cache_dirs "$k8s_version"
require_go build.sh

binaries=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok)
stamp_input() {
    go version
    for f in "$here"/controlplane/go.mod "$here"/controlplane/go.sum "$here"/etcd/go.mod "$here"/etcd/go.sum \
        "$here"/kwok/go.mod "$here"/kwok/go.sum "$here"/build.sh "$here"/build_lib.sh; do
        sha256sum "$f" | cut -d' ' -f1
    done
}
want_stamp="$(stamp_input | sha256sum | cut -d' ' -f1)"

warm=1
[[ "$force" == 1 ]] && warm=0
[[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$want_stamp" ]] || warm=0
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || warm=0; done
[[ -d "$out/kwok-stages" ]] || warm=0
if [[ "$warm" == 1 ]]; then
    echo "build.sh: $k8s_version control plane is up to date in $bin" >&2
    echo "$bin"
    exit 0
fi

mkdir -p "$bin"
rm -f "$out/stamp"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
minor="${k8s_version#v1.}"
minor="${minor%%.*}"
# -s -w: no symbol table or DWARF, as upstream's release builds (hack/lib/golang.sh); linking takes less than half.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X '$pkg.gitVersion=$k8s_version' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
    ldflags+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=1970-01-01T00:00:00Z'"
done

step() {  # step NAME COMMAND...: runs a build step, timing it.
    local name="$1" start
    shift
    start=$SECONDS
    echo "build.sh: building $name ..." >&2
    "$@"
    echo "build.sh: $name built in $((SECONDS - start)) s" >&2
}

# Built to a temporary name then moved, so an interrupted build never leaves a half-written binary behind.
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
step "kube-apiserver, kube-scheduler, kube-controller-manager, kubectl $k8s_version" \
    bash -c 'cd "$1/controlplane" && go build -trimpath -ldflags "$2" -o "$3/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler \
        k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl' _ "$here" "$ldflags" "$tmp"
step etcd bash -c 'cd "$1/etcd" && go build -trimpath -ldflags "-s -w" -o "$2/etcd" go.etcd.io/etcd/server/v3' \
    _ "$here" "$tmp"
step kwok bash -c 'cd "$1/kwok" && go build -trimpath -ldflags "-s -w" -o "$2/kwok" sigs.k8s.io/kwok/cmd/kwok' \
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
