# Sourced by hack/build-tools.sh and hack/build-nvidia-operator.sh, never run: the two-level cache of
# built binaries. .cache/tools/<key> in the work tree (git-ignored) and a machine-wide copy in
# ${GPU_OPERATOR_TOOLS_CACHE:-$HOME/.cache/gpu-operator/tools}/<key>, hardlinked into a fresh clone, so
# CI (which runs in a fresh clone on the same machine) never rebuilds.
#
# The sourcing script sets ROOT_DIR and CACHE_NAME (its messages' prefix) and defines
#   complete DIR     0 when DIR holds a finished build (its .complete stamp and every output)
#   build_into DEST  build into `out="$(cache_tmp)"`, then `cache_finish "${out}" DEST START`
# and calls `cache_ensure KEY`.

MACHINE_CACHE="${GPU_OPERATOR_TOOLS_CACHE:-${HOME}/.cache/gpu-operator/tools}"

cache_tmp() { # -> a fresh build directory on the machine cache's file system (mv into place is atomic)
  mktemp -d "${MACHINE_CACHE}/.build.XXXXXX"
}

cache_finish() { # out dest start: stamp the build, move it into place, drop build_into's clean-up trap
  local out="$1" dest="$2" start="$3"
  printf 'built in %ss on %s cores with %s\n' "$((SECONDS - start))" "$(nproc)" "$(go env GOVERSION)" >"${out}/build-info.txt"
  touch "${out}/.complete"
  mv "${out}" "${dest}"
  trap - EXIT
  echo "${CACHE_NAME}: built in $((SECONDS - start))s -> ${dest}" >&2
}

cache_ensure() { # key: .cache/tools/<key> complete, building it (or copying the machine's) only if needed
  local key="$1" local_dir machine_dir
  local_dir="${ROOT_DIR}/.cache/tools/${key}"
  machine_dir="${MACHINE_CACHE}/${key}"
  if complete "${local_dir}"; then
    echo "${CACHE_NAME}: up to date: ${local_dir}" >&2
    return
  fi
  mkdir -p "${MACHINE_CACHE}"
  # One builder per key per machine: a second clone waits instead of building the same thing.
  exec 9>"${MACHINE_CACHE}/.${key}.lock"
  flock 9
  if ! complete "${machine_dir}"; then
    rm -rf "${machine_dir}"
    build_into "${machine_dir}"
  else
    echo "${CACHE_NAME}: reusing machine cache ${machine_dir}" >&2
  fi
  rm -rf "${local_dir}"
  mkdir -p "${ROOT_DIR}/.cache/tools"
  # Hardlinks cost no space and no time; fall back to a copy across file systems.
  cp -al "${machine_dir}" "${local_dir}" 2>/dev/null || cp -a "${machine_dir}" "${local_dir}"
  echo "${CACHE_NAME}: ready: ${local_dir}" >&2
}
