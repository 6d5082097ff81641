#!/usr/bin/env bash
# Builds containerd 2.x (containerd, containerd-shim-runc-v2, ctr; tests/e2e/containerd/go.mod) for the real node's
# DRA test (tests/e2e/test_25_dra_real_node.py) into a cache outside the repository, as build_node.sh does:
#   ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/containerd-<version>/bin
# Debian's containerd 1.6 (the other real-node tests') has no CDI support: it drops the CDI devices the kubelet
# passes for a prepared DRA claim. 2.x injects them. Static (CGO_ENABLED=0, no btrfs snapshotter). The bin directory is
# printed as the last line. Cold about 3.5 minutes on 2 shared cores (modules downloaded); warm well under a second.
# Idempotent: a stamp holds the hash of go.mod, go.sum, this script and `go version`.
# Options: --force rebuilds; --print-dir prints the bin directory and exits (no build).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/containerd"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
version="$(pinned_version build_containerd.sh "$module/go.mod" github.com/containerd/containerd/v2)"
cache_dirs "containerd-$version"

require_go build_containerd.sh
binaries=(containerd containerd-shim-runc-v2 ctr)
want_stamp="$(stamp_of "$module/go.mod" "$module/go.sum" "$here/build_containerd.sh" "$here/build_lib.sh")"
exit_if_up_to_date build_containerd.sh "containerd $version" "$want_stamp" "${binaries[@]}"

begin_build
step build_containerd.sh "containerd, containerd-shim-runc-v2, ctr $version" \
    bash -c 'cd "$1" && go build -tags no_btrfs -trimpath -ldflags "$3" -o "$2/" \
        github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
        github.com/containerd/containerd/v2/cmd/ctr' _ "$module" "$tmp" \
    "-s -w -X github.com/containerd/containerd/v2/version.Version=$version"
for b in "${binaries[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
echo "$want_stamp" > "$out/stamp"
echo "build_containerd.sh: containerd $version built in $bin" >&2
echo "$bin"
