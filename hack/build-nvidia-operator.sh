#!/usr/bin/env bash
# Build, or reuse, NVIDIA's own operator (github.com/NVIDIA/gpu-operator cmd/gpu-operator) at the release
# our defaults deploy, with what its image ships beside it, for the side-by-side benchmark
# (bench/nvidia.py, `make bench BENCH_ARGS=--side-by-side`).
#
#   hack/build-nvidia-operator.sh          ensure .cache/tools/<key> is complete (build only if needed)
#   hack/build-nvidia-operator.sh key      print <key> (version + hash of the recipe)
#   hack/build-nvidia-operator.sh dir      print the absolute output dir (no build)
#
# <key>/bin/gpu-operator       the binary, built as NVIDIA's `make cmds` does (Makefile:219-226)
# <key>/opt/gpu-operator/      what docker/Dockerfile:128-136 copies there: assets/, manifests/ and
#                              the CRDs; the operator reads its states from that fixed path
#                              (controllers/state_manager.go:798-818, internal/state/manager.go:126-144)
# <key>/chart/gpu-operator/    its Helm chart (deployments/gpu-operator): CRDs and RBAC for the bench
#
# The source: NVIDIA_OPERATOR_GIT, a local clone or mirror (bare or not) or a URL (default GitHub); its
# tag NVIDIA_OPERATOR_VERSION must be NVIDIA_OPERATOR_COMMIT (hack/versions.env), and the tree vendors
# every module (vendor/), so the build downloads nothing (GOPROXY=off, -mod=vendor).
#
# The key, as hack/build-tools.sh's: the version makes it readable, a hash of the commit, the link flags,
# the Go minor version and this script makes it change whenever anything that shapes the output
# changes. Cached at two levels like the toolchain (hack/tools-cache.sh).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
# shellcheck source=tools-cache.sh
source "${HACK_DIR}/tools-cache.sh"
CACHE_NAME=build-nvidia-operator
NVIDIA_OPERATOR_GIT="${NVIDIA_OPERATOR_GIT:-https://github.com/NVIDIA/gpu-operator.git}"

# What docker/Dockerfile:24-32 copies into its builder stage (plus what the image copies next to the
# binary, and the chart): the rest of the tree is not needed to build cmd/gpu-operator.
SOURCE_PATHS=(go.mod go.sum vendor cmd api controllers internal assets manifests deployments/gpu-operator)
# Version stamps as NVIDIA's Makefile sets them (VERSION_PKG, Makefile:73; BUILD_FLAGS, Makefile:219):
# gitCommit is `git describe --match="" --long --always`, the abbreviated commit (8 digits here).
VERSION_PKG=github.com/NVIDIA/gpu-operator/internal/info
LDFLAGS="-s -w -X ${VERSION_PKG}.gitCommit=${NVIDIA_OPERATOR_COMMIT:0:8} -X ${VERSION_PKG}.version=${NVIDIA_OPERATOR_VERSION}"
GO_MAJOR="$(go env GOVERSION 2>/dev/null | grep -oE '^go[0-9]+\.[0-9]+' || echo no-go)"

nvidia_key() {
  local hash
  hash="$(cat "${BASH_SOURCE[0]}" <(printf '%s\n%s\n%s\n' "${NVIDIA_OPERATOR_COMMIT}" "${LDFLAGS}" "${GO_MAJOR}") |
    sha256sum | cut -c1-10)"
  printf 'nvidia-gpu-operator-%s-%s\n' "${NVIDIA_OPERATOR_VERSION}" "${hash}"
}

complete() { # dir -> 0 when the binary, its states and the chart are there and the stamp says done
  local dir="$1"
  [[ -f "${dir}/.complete" && -x "${dir}/bin/gpu-operator" ]] || return 1
  [[ -d "${dir}/opt/gpu-operator/state-driver" && -d "${dir}/opt/gpu-operator/manifests" ]] || return 1
  [[ -f "${dir}/chart/gpu-operator/Chart.yaml" ]]
}

export_source() { # dest: the tree at NVIDIA_OPERATOR_COMMIT, after checking the tag names that commit
  local dest="$1" repo="${NVIDIA_OPERATOR_GIT}" tag="refs/tags/${NVIDIA_OPERATOR_VERSION}" found
  if ! git -C "${repo}" rev-parse --git-dir >/dev/null 2>&1; then
    repo="${dest}.git"
    git init -q --bare "${repo}"
    git -C "${repo}" fetch -q --depth 1 "${NVIDIA_OPERATOR_GIT}" "+${tag}:${tag}"
  fi
  found="$(git -C "${repo}" rev-parse "${tag}^{commit}")"
  if [[ "${found}" != "${NVIDIA_OPERATOR_COMMIT}" ]]; then
    echo "${CACHE_NAME}: ${NVIDIA_OPERATOR_VERSION} is ${found} in ${NVIDIA_OPERATOR_GIT}, not ${NVIDIA_OPERATOR_COMMIT}" >&2
    exit 1
  fi
  mkdir -p "${dest}"
  git -C "${repo}" archive --format=tar "${NVIDIA_OPERATOR_COMMIT}" "${SOURCE_PATHS[@]}" | tar -x -C "${dest}"
  [[ -f "${dest}/vendor/modules.txt" ]] ||
    { echo "${CACHE_NAME}: ${NVIDIA_OPERATOR_VERSION} does not vendor its modules; the recipe needs GOFLAGS=-mod=mod" >&2; exit 1; }
}

build_into() { # dest dir (must not exist)
  local dest="$1" out
  out="$(cache_tmp)"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "rm -rf '${out}'" EXIT
  local start=${SECONDS} src="${out}/src"
  echo "${CACHE_NAME}: building ${NVIDIA_OPERATOR_VERSION} from ${NVIDIA_OPERATOR_GIT} (cold: minutes on 2 cores)" >&2
  export_source "${src}"
  # CGO off as NVIDIA's cmds target (Makefile:225); vendored modules only, no proxy, no VCS stamp (an
  # archive has no .git); -trimpath as our other tools.
  (
    cd "${src}"
    GOFLAGS="-mod=vendor -buildvcs=false" GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0 \
      go build -trimpath -ldflags "${LDFLAGS}" -o "${out}/bin/gpu-operator" ./cmd/gpu-operator
  )
  # It logs its version first and exits without OPERATOR_NAMESPACE before any request (main.go:106-124);
  # `go version -m` would not tell: -trimpath leaves -ldflags out of the build info.
  local said stamp="version: ${NVIDIA_OPERATOR_VERSION}, commit: ${NVIDIA_OPERATOR_COMMIT:0:8}"
  said="$(env -u OPERATOR_NAMESPACE "${out}/bin/gpu-operator" 2>&1 || true)"
  grep -qF "${stamp}" <<<"${said}" ||
    { echo "${CACHE_NAME}: the binary does not say '${stamp}': ${said}" >&2; exit 1; }
  # The image's layout (docker/Dockerfile:128-136): assets/ is /opt/gpu-operator itself.
  mkdir -p "${out}/opt" "${out}/chart"
  mv "${src}/assets" "${out}/opt/gpu-operator"
  mv "${src}/manifests" "${out}/opt/gpu-operator/manifests"
  cp "${src}"/deployments/gpu-operator/crds/nvidia.com_{clusterpolicies,nvidiadrivers,gpuclusters}.yaml \
    "${src}/deployments/gpu-operator/charts/node-feature-discovery/crds/nfd-api-crds.yaml" "${out}/opt/gpu-operator/"
  mv "${src}/deployments/gpu-operator" "${out}/chart/gpu-operator"
  rm -rf "${src}" "${src}.git"
  cache_finish "${out}" "${dest}" "${start}"
}

case "${1:-ensure}" in
  key) nvidia_key ;;
  dir) echo "${ROOT_DIR}/.cache/tools/$(nvidia_key)" ;;
  ensure) cache_ensure "$(nvidia_key)" ;;
  *)
    echo "usage: $0 [ensure|key|dir]" >&2
    exit 2
    ;;
esac
