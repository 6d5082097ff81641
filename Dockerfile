# syntax=docker/dockerfile:1
#
# gpu-webhook: the admission server image.
#   docker build -t gpu-webhook:0.1.0 .
# Two stages: the builder turns the project (pyproject.toml: dependencies and the `gpu-webhook` console
# script) into wheels and installs them under /install; the runtime stage copies only that tree onto a clean
# copy of the same base. No compiler is installed in either stage (every dependency ships manylinux wheels),
# and pip's cache is disabled, so the final image holds no build tools and no caches.
#
# The base is pinned by patch-version tag AND by the digest of its multi-architecture index
# (python:3.11.14-slim-bookworm, as referenced by several public projects; verify or refresh it with
# `docker buildx imagetools inspect python:3.11.14-slim-bookworm`). Override with --build-arg PYTHON_IMAGE=...
# Where no registry is reachable, a local Debian bookworm root filesystem with python3 (3.11) and python3-pip,
# made with mmdebstrap, serves as the base: tests/e2e/build_image.sh builds the image that way with buildah.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the package build reads (see .dockerignore: everything else is excluded from the context).
COPY pyproject.toml README.md ./
COPY webhook/ webhook/
COPY rules/ rules/
# /install mirrors /usr/local: the packages go to the site directory the base's interpreter reads under /usr/local
# (site-packages on the official image; dist-packages on a Debian python3 base, whose interpreter is
# /usr/bin/python3), the console scripts to /install/bin. --target also keeps pip off a Debian base's
# system packages (PEP 668).
RUN python3 -m pip wheel --no-cache-dir --wheel-dir /wheels . \
 && site="$(python3 -c 'import site; print(next(p for p in site.getsitepackages() if p.startswith("/usr/local/")))')" \
 && python3 -m pip install --no-cache-dir --no-index --target "/install${site#/usr/local}" /wheels/*.whl \
 && mv "/install${site#/usr/local}/bin" /install/bin

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-webhook" \
      org.opencontainers.image.description="Kubernetes admission webhook that enforces GPU resource policy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpu-webhook/gpu-webhook" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.14-slim-bookworm"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    GPU_WEBHOOK_PORT=8443
# The installed tree only: the site directory and the console script (its shebang is the base's python3,
# the same interpreter in both stages).
COPY --from=builder /install /usr/local
# Non-root, numeric (Kubernetes' runAsNonRoot can only verify a numeric user). The root filesystem can be
# read-only: the server writes only under /tmp (mount an emptyDir there, as the manifests do).
USER 65532:65532
# 8443: HTTPS admission reviews and probes; 9090: plain-HTTP Prometheus metrics.
EXPOSE 8443 9090
ENTRYPOINT ["gpu-webhook", "serve", "--rules", "/etc/gpu-webhook/rules", "--tls-dir", "/etc/gpu-webhook/tls"]
