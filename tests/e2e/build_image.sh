#!/usr/bin/env bash
# Builds the webhook image from the repository's Dockerfile with buildah (no daemon, no registry), for the e2e
# suite's real node, into a cache outside the repository:
#   base   a local Debian bookworm root filesystem with python3 (3.11), python3-pip and ca-certificates, made by
#          mmdebstrap from the Debian registry and committed as localhost/gpu-webhook-base:bookworm-python3.11
#          (kept while the package list in this script is unchanged);
#   image  `buildah bud --build-arg PYTHON_IMAGE=<that base>` of the Dockerfile, tagged as the chart's default
#          image (docker.io/library/gpu-webhook:<appVersion>), written as an OCI archive that the node imports.
# The Dockerfile's default base (python:3.11.x-slim-bookworm by digest) is for real registries; this is the local
# path. buildah's storage lives in the cache (vfs driver), not in the clone or /var/lib/containers.
#
# Output: ${GPU_WEBHOOK_E2E_CACHE:-$HOME/.cache/gpu-webhook-e2e}/image/gpu-webhook.oci.tar, printed as the last line.
# Idempotent: a stamp holds the hash of everything the image build reads (the Dockerfile, .dockerignore,
# pyproject.toml, README.md, webhook/, rules/) and this script; when it matches, nothing is rebuilt.
# Options: --force rebuilds; --print-dir prints the output directory and exits.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=build_lib.sh
source "$here/build_lib.sh"
parse_options "$0" "$@"
cache_dirs image
archive="$out/gpu-webhook.oci.tar"

for tool in buildah mmdebstrap; do
    if ! command -v "$tool" >/dev/null; then
        echo "build_image.sh: $tool is missing; run tests/e2e/build_node.sh as root (it installs the Debian packages)" >&2
        exit 1
    fi
done

app_version="$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' "$repo/charts/gpu-webhook/Chart.yaml")"
image="docker.io/library/gpu-webhook:$app_version"
base_packages="python3,python3-pip,ca-certificates"
base="localhost/gpu-webhook-base:bookworm-python3.11"
bah=(buildah --root "$out/storage" --runroot "$out/run" --storage-driver vfs)

want_stamp="$( {
    sha256sum "$here/build_image.sh"
    cd "$repo" && git ls-files -z Dockerfile .dockerignore pyproject.toml README.md webhook rules \
        | xargs -0 sha256sum
} | sha256sum | cut -d' ' -f1)"
if [[ "$force" == 0 && -f "$archive" && -f "$out/stamp" && "$(cat "$out/stamp")" == "$want_stamp" ]]; then
    echo "build_image.sh: $image is up to date in $archive" >&2
    echo "$archive"
    exit 0
fi
mkdir -p "$out"
rm -f "$out/stamp"

if [[ "$force" == 1 || "$(cat "$out/base.stamp" 2>/dev/null)" != "$base_packages" ]] \
    || ! "${bah[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    start=$SECONDS
    echo "build_image.sh: making the base: mmdebstrap bookworm + $base_packages ..." >&2
    rm -f "$out/base.tar"
    mmdebstrap --quiet --variant=minbase --include="$base_packages" bookworm "$out/base.tar" >&2
    container="$("${bah[@]}" from scratch)"
    "${bah[@]}" add "$container" "$out/base.tar" / >&2
    "${bah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --label "gpu-webhook.io/base=Debian bookworm minbase + $base_packages (mmdebstrap)" "$container" >&2
    "${bah[@]}" commit --quiet --rm "$container" "$base" >&2
    rm -f "$out/base.tar"
    echo "$base_packages" > "$out/base.stamp"
    echo "build_image.sh: base $base made in $((SECONDS - start)) s" >&2
fi

start=$SECONDS
echo "build_image.sh: building $image from the Dockerfile on $base ..." >&2
# pip in the builder stage fetches the dependencies from PyPI over the host's network, trusting the host's CAs.
"${bah[@]}" bud --quiet --network host --volume /etc/ssl/certs:/etc/ssl/certs:ro \
    --build-arg "PYTHON_IMAGE=$base" -t "$image" -f "$repo/Dockerfile" "$repo" >&2
rm -f "$archive.tmp"
"${bah[@]}" push --quiet "$image" "oci-archive:$archive.tmp:$image" >&2
mv -f "$archive.tmp" "$archive"
"${bah[@]}" rmi --prune >/dev/null 2>&1 || true
echo "$want_stamp" > "$out/stamp"
echo "build_image.sh: $image built in $((SECONDS - start)) s: $archive" >&2
echo "$archive"
