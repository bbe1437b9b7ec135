#!/usr/bin/env bash
# Build, or reuse, the pinned local control-plane toolchain (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, kwok, kwokctl, helm) from Go modules.
#
#   hack/build-tools.sh          ensure .cache/tools/<key>/bin is complete (build only if needed)
#   hack/build-tools.sh key      print <key> (versions + hash of the recipe)
#   hack/build-tools.sh bin-dir  print the absolute bin dir (no build)
#
# Why a cache key with a hash: the binaries are a pure function of hack/tools/go.{mod,sum}, the
# link flags below and the Go major version; the versions make the key readable, the hash makes it
# change whenever anything that shapes the output changes, so a stale directory is never reused.
#
# Two cache levels (hack/tools-cache.sh): .cache/tools/<key> in the work tree (git-ignored) and a
# machine-wide copy in ${GPU_OPERATOR_TOOLS_CACHE:-$HOME/.cache/gpu-operator/tools}/<key>, hardlinked
# into a fresh clone, so CI (which runs in a fresh clone on the same machine) never rebuilds.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "${HACK_DIR}/.." && pwd)"
TOOLS_MOD_DIR="${HACK_DIR}/tools"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
# shellcheck source=tools-cache.sh
source "${HACK_DIR}/tools-cache.sh"
CACHE_NAME=build-tools
TOOLS=(etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl helm)

# Version stamps, as upstream's release builds inject them; without them kube binaries report
# v0.0.0-master and kwokctl (which parses `--version` to pick flags) would misjudge them, and helm
# assumes Kubernetes 1.20 (`helm template` then refuses a chart with kubeVersion >= 1.30).
#
# Kubernetes (hack/lib/version.sh kube::version::ldflags): gitVersion, gitMajor, gitMinor,
# gitCommit, gitTreeState and buildDate in component-base/version and client-go/pkg/version. The
# release commit is not in the module (built from the module proxy, no git): gitCommit is left
# empty rather than the unexpanded "$Format:%H$"; the fixed build date keeps the output reproducible.
k8s_minor="${K8S_VERSION#v1.}"
k8s_minor="${k8s_minor%%.*}"
K8S_LDFLAGS=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${k8s_minor}"
  K8S_LDFLAGS+=" -X ${pkg}.gitCommit= -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
# Helm (its Makefile, v3.21.4): version, metadata (empty for a tagged release), gitCommit (the tag's
# commit, HELM_COMMIT in versions.env), gitTreeState; and the Kubernetes version it assumes without
# a cluster (`helm template`, `helm lint`): major+1 and minor of the k8s.io/client-go it links
# (`go list -m k8s.io/client-go`: v0.36.x -> 1.36), set in pkg/chartutil and pkg/lint/rules.
client_go="${K8S_STAGING_VERSION#v}"
client_go_major="$((${client_go%%.*} + 1))"
client_go_minor="${client_go#*.}"
client_go_minor="${client_go_minor%%.*}"
HELM_LDFLAGS=" -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
HELM_LDFLAGS+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitCommit=${HELM_COMMIT}"
HELM_LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  HELM_LDFLAGS+=" -X ${pkg}.k8sVersionMajor=${client_go_major} -X ${pkg}.k8sVersionMinor=${client_go_minor}"
done
# -s -w: no symbol tables / DWARF; these binaries are never debugged and it halves their size.
LDFLAGS="-s -w${K8S_LDFLAGS}${HELM_LDFLAGS}"
# Without Go the key still resolves (make evaluates it on every run); building then fails clearly.
GO_MAJOR="$(go env GOVERSION 2>/dev/null | grep -oE '^go[0-9]+\.[0-9]+' || echo no-go)"

tools_key() {
  local hash
  hash="$(cat "${TOOLS_MOD_DIR}/go.mod" "${TOOLS_MOD_DIR}/go.sum" <(printf '%s\n%s\n' "${LDFLAGS}" "${GO_MAJOR}") |
    sha256sum | cut -c1-10)"
  printf 'k8s-%s-etcd-%s-kwok-%s-helm-%s-%s\n' "${K8S_VERSION}" "${ETCD_VERSION}" "${KWOK_VERSION}" "${HELM_VERSION}" "${hash}"
}

# Fail early when go.mod and versions.env disagree: versions.env is what people read.
check_pins() {
  local mod="${TOOLS_MOD_DIR}/go.mod" want
  local -a wants=(
    "k8s.io/kubernetes ${K8S_VERSION}"
    "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}"
    "go.etcd.io/etcd/etcdctl/v3 ${ETCD_VERSION}"
    "sigs.k8s.io/kwok ${KWOK_VERSION}"
    "helm.sh/helm/v3 ${HELM_VERSION}"
  )
  for want in "${wants[@]}"; do
    if ! grep -qE "^[[:space:]]+${want//./\\.}([[:space:]]|$)" "${mod}"; then
      echo "build-tools: ${mod} does not require '${want}' (see hack/versions.env)" >&2
      exit 1
    fi
  done
  if grep -E '^[[:space:]]+k8s\.io/[a-z-]+ => k8s\.io/[a-z-]+ v' "${mod}" | grep -vq " ${K8S_STAGING_VERSION}\$"; then
    echo "build-tools: every k8s.io replace in ${mod} must point at ${K8S_STAGING_VERSION}" >&2
    exit 1
  fi
}

complete() { # dir -> 0 when every tool is there and the stamp says the build finished
  local dir="$1" tool
  [[ -f "${dir}/.complete" ]] || return 1
  for tool in "${TOOLS[@]}"; do
    [[ -x "${dir}/bin/${tool}" ]] || return 1
  done
}

build_into() { # dest dir (must not exist)
  local dest="$1" out
  out="$(cache_tmp)"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "rm -rf '${out}'" EXIT
  local -a pkgs
  # The `tool` block of go.mod is the list of packages to build.
  mapfile -t pkgs < <(sed -n '/^tool (/,/^)/{/^tool (/d;/^)/d;s/^[[:space:]]*//;p}' "${TOOLS_MOD_DIR}/go.mod")
  echo "build-tools: building ${#pkgs[@]} tools (cold: ~5 min on 2 cores; compiled packages are cached in ~/.cache/go-build)" >&2
  local start=${SECONDS}
  # One `go build` for all packages so the shared k8s.io packages compile once, in parallel.
  # CGO off: static binaries that do not depend on this machine's C toolchain (as upstream ships).
  (
    cd "${TOOLS_MOD_DIR}"
    GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0 \
      go build -trimpath -ldflags "${LDFLAGS}" -o "${out}/bin/" "${pkgs[@]}"
  )
  # Binaries are named after the last import path element that is not a major-version suffix.
  mv "${out}/bin/server" "${out}/bin/etcd"
  local tool
  for tool in "${TOOLS[@]}"; do
    [[ -x "${out}/bin/${tool}" ]] || { echo "build-tools: ${tool} was not built" >&2; exit 1; }
  done
  "${out}/bin/kube-apiserver" --version | grep -qF "${K8S_VERSION}" ||
    { echo "build-tools: kube-apiserver does not report ${K8S_VERSION}" >&2; exit 1; }
  "${out}/bin/helm" version --template '{{.Version}} {{.GitCommit}}' | grep -qxF "${HELM_VERSION} ${HELM_COMMIT}" ||
    { echo "build-tools: helm does not report ${HELM_VERSION} ${HELM_COMMIT}" >&2; exit 1; }
  cache_finish "${out}" "${dest}" "${start}"
}

ensure() {
  check_pins
  cache_ensure "$(tools_key)"
}

case "${1:-ensure}" in
  key) tools_key ;;
  bin-dir) echo "${ROOT_DIR}/.cache/tools/$(tools_key)/bin" ;;
  ensure) ensure ;;
  *)
    echo "usage: $0 [ensure|key|bin-dir]" >&2
    exit 2
    ;;
esac
