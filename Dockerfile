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
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-index --prefix /install /wheels/*.whl

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
# The installed tree only: site-packages and the console script (its shebang is /usr/local/bin/python,
# the same interpreter in both stages).
COPY --from=builder /install /usr/local
# Non-root, numeric (Kubernetes' runAsNonRoot can only verify a numeric user). The root filesystem can be
# read-only: the server writes only under /tmp (mount an emptyDir there, as the manifests do).
USER 65532:65532
# 8443: HTTPS admission reviews and probes; 9090: plain-HTTP Prometheus metrics.
EXPOSE 8443 9090
ENTRYPOINT ["gpu-webhook", "serve", "--rules", "/etc/gpu-webhook/rules", "--tls-dir", "/etc/gpu-webhook/tls"]
