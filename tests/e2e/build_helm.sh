#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v4/cmd/helm, the `tool` of tests/e2e/helm/go.mod) from the Go module proxy into a
# cache outside the repository, as build.sh does for the control plane:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/helm-<version>/bin/helm
# The bin directory is printed as the last line.
# Idempotent: a stamp holds the hash of go.mod, go.sum, this script and `go version`; when it matches and the
# binary is there, nothing is rebuilt (a warm run takes well under a second).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/helm"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
helm_version="$(pinned_version build_helm.sh "$module/go.mod" helm.sh/helm/v4)"
cache_dirs "helm-$helm_version"

require_go build_helm.sh
want_stamp="$( { go version; sha256sum "$module/go.mod" "$module/go.sum" "$here/build_helm.sh" "$here/build_lib.sh" | cut -d' ' -f1; } \
    | sha256sum | cut -d' ' -f1)"
if [[ "$force" == 0 && -x "$bin/helm" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want_stamp" ]]; then
    echo "build_helm.sh: helm $helm_version is up to date in $bin" >&2
    echo "$bin"
    exit 0
fi

mkdir -p "$bin"
rm -f "$out/stamp"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
# What helm's own Makefile sets for a release build from a tag.
pkg=helm.sh/helm/v4/internal/version
ldflags="-s -w -X $pkg.version=$helm_version -X $pkg.metadata= -X $pkg.gitTreeState=clean"

# Built to a temporary name then moved, so an interrupted build never leaves a half-written binary behind.
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build_helm.sh: building helm $helm_version ..." >&2
(cd "$module" && go build -trimpath -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
mv -f "$tmp/helm" "$bin/helm"
echo "$want_stamp" > "$out/stamp"
echo "build_helm.sh: helm $helm_version built in $bin in $((SECONDS - start)) s" >&2
echo "$bin"
