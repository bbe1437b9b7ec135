# syntax=docker/dockerfile:1
# The gpu-operator image: the package's wheel (with its Jinja templates and CRD) on python:3.11-slim.
#   make image            (IMAGE=gpu-operator:dev)
# Base pinned by tag and digest (a multi-arch index digest); bump both together, e.g. with
# `docker buildx imagetools inspect python:3.11-slim-bookworm` or Renovate.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is built from (pyproject.toml force-includes manifests/templates and the CRD).
COPY pyproject.toml README.md ./
COPY gpu_operator ./gpu_operator
COPY manifests ./manifests
COPY crds ./crds
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
COPY --from=builder /dist/ /tmp/dist/
# Install the wheel and its dependencies, then drop pip and the build tooling from the image.
RUN pip install --no-cache-dir /tmp/dist/*.whl \
    && rm -rf /tmp/dist \
    && python -m pip uninstall --yes pip setuptools wheel \
    && gpu-operator --version
# The distroless "nonroot" uid/gid; the chart's securityContext runs as the same.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["gpu-operator"]
CMD ["run"]
