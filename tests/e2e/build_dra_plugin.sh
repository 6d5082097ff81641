#!/usr/bin/env bash
# Builds gpu-dra-plugin-standin (tests/e2e/dra/cmd/gpu-dra-plugin-standin), a STAND-IN for NVIDIA's DRA kubelet
# plugin, on k8s.io/dynamic-resource-allocation at the suite's release (tests/e2e/dra/go.mod), into a cache outside
# the repository, as build_node.sh does for the kubelet:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/dra-plugin-<version>/bin/gpu-dra-plugin-standin
# The real-node DRA test (tests/e2e/test_25_dra_real_node.py) runs it; the bin directory is printed as the last line.
# Idempotent: a stamp holds the hash of go.mod, go.sum, the Go sources, this script and `go version`; it is trusted
# only while the binary is there too. Cold (empty module, build and e2e caches) 5 min 38 s on 2 shared cores (load
# about 10 from other runs); warm 0.06 s (the stamp matches) (docs/dra.md).
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/dra"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
version="$(pinned_version build_dra_plugin.sh "$module/go.mod" k8s.io/dynamic-resource-allocation)"
cache_dirs "dra-plugin-$version"

require_go build_dra_plugin.sh
want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$here/build_dra_plugin.sh" "$here/build_lib.sh" \
    $(find "$module/cmd" -name '*.go' | sort))"
exit_if_up_to_date build_dra_plugin.sh "gpu-dra-plugin-standin ($version)" "$want_stamp" gpu-dra-plugin-standin

begin_build
step build_dra_plugin.sh "gpu-dra-plugin-standin (k8s.io/dynamic-resource-allocation $version)" \
    bash -c 'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2/" ./cmd/gpu-dra-plugin-standin' _ "$module" "$tmp"
mv -f "$tmp/gpu-dra-plugin-standin" "$bin/gpu-dra-plugin-standin"
echo "$want_stamp" > "$out/stamp"
echo "build_dra_plugin.sh: gpu-dra-plugin-standin $version built in $bin" >&2
echo "$bin"
