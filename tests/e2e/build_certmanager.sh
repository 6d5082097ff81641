#!/usr/bin/env bash
# Builds cert-manager-lite (tests/e2e/certmanager: the controller and cainjector packages of the root module
# github.com/cert-manager/cert-manager in one process; upstream's cmd/ modules are not on the module proxy) and
# copies its CRDs from the module source, into a cache outside the repository, as build.sh does for the control
# plane:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/cert-manager-<version>/bin/cert-manager-lite
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/cert-manager-<version>/crds/*.yaml
# The bin directory is printed as the last line.
# Idempotent: a stamp holds the hash of go.mod, go.sum, main.go, this script and `go version`; when it matches and
# the binary is there, nothing is rebuilt (a warm run takes well under a second).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/certmanager"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
cm_version="$(pinned_version build_certmanager.sh "$module/go.mod" github.com/cert-manager/cert-manager)"
cache_dirs "cert-manager-$cm_version"

require_go build_certmanager.sh
want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$module/main.go" "$here/build_certmanager.sh" \
    "$here/build_lib.sh")"
[[ -d "$out/crds" ]] && exit_if_up_to_date build_certmanager.sh "cert-manager-lite $cm_version" "$want_stamp" \
    cert-manager-lite

begin_build
step build_certmanager.sh "cert-manager-lite $cm_version" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2/cert-manager-lite" .' _ "$module" "$tmp"
src="$(cd "$module" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"
rm -rf "$out/crds"
mkdir -p "$tmp/crds"
cp "$src"/deploy/crds/*.yaml "$tmp/crds/"
chmod -R u+w "$tmp/crds"
mv "$tmp/crds" "$out/crds"
mv -f "$tmp/cert-manager-lite" "$bin/cert-manager-lite"
echo "$want_stamp" > "$out/stamp"
echo "build_certmanager.sh: cert-manager-lite $cm_version built in $bin" >&2
echo "$bin"
