#!/usr/bin/env bash
# The local e2e cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok,
# run as plain processes by kwokctl's `binary` runtime from the toolchain built by
# hack/build-tools.sh, plus simulated GPU nodes and the emulators of NVIDIA's operand images
# (hack/emulators: they run the operator's pods as a kubelet and NVIDIA's images would).
#
#   hack/cluster.sh up          start, or converge an existing cluster (idempotent)
#   hack/cluster.sh down        stop every process of this cluster (by pid file) and delete its state
#   hack/cluster.sh status      exit 0 when the cluster is up and healthy
#   hack/cluster.sh kubeconfig  print the kubeconfig path, nothing else
#   hack/cluster.sh audit-log   print the API server audit log path, nothing else
#
# Settings (environment; hack/cluster.mk passes the make variables of the same name):
#   NODES, CPU_NODES            simulated GPU / CPU-only nodes: up converges to the counts given;
#                               unset, a new cluster gets 4 and 1, a running one keeps its nodes
#   CLUSTER_NAME=gpu-operator   kwokctl cluster name
#   CLUSTER_PORT_BASE=26000     ports used, all on 127.0.0.1: +443 kube-apiserver, +379/+380 etcd,
#                               +257 controller-manager, +259 scheduler, +247 kwok (below the
#                               Linux ephemeral range, so no outgoing connection can hold them)
#   POD_CIDR=127.2.0.0/16       simulated pod IPs (nodes get 127.1.x.y): loopback only
#   SIM_PROFILE=instant         emulator timing: instant (tests) or realistic (hack/emulators/profile.py)
#   SIM_TIME_SCALE=1            multiplies every emulated duration (0.2: realistic, five times faster)
#
# Every process is started with setsid by kwokctl (or here, for the emulators) and tracked by a
# pid file under the cluster directory. Stopping goes by those pids only, after checking that each
# pid still runs one of our binaries with this cluster's directory on its command line: other
# clusters and unrelated processes are never touched, and no process is looked up by name.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_DIR="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

NODES="${NODES:-}"
CPU_NODES="${CPU_NODES:-}"
CLUSTER_NAME="${CLUSTER_NAME:-gpu-operator}"
CLUSTER_PORT_BASE="${CLUSTER_PORT_BASE:-26000}"
POD_CIDR="${POD_CIDR:-127.2.0.0/16}"
SIM_PROFILE="${SIM_PROFILE:-instant}"
SIM_TIME_SCALE="${SIM_TIME_SCALE:-1}"
PYTHON="${PYTHON:-${ROOT_DIR}/.venv/bin/python}"

# kwokctl keeps clusters under $KWOK_WORKDIR/clusters/<name>; keep them in this work tree so two
# clones never share state (and so `git clean -X` removes them).
export KWOK_WORKDIR="${ROOT_DIR}/.cache/kwok"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${CLUSTER_NAME}"
KUBECONFIG_PATH="${CLUSTER_DIR}/kubeconfig.yaml"
AUDIT_LOG="${CLUSTER_DIR}/logs/audit.log"
SIM_PID_FILE="${CLUSTER_DIR}/pids/emulators.pid"
SIM_READY_FILE="${CLUSTER_DIR}/emulators.ready"
# The profile the running emulators were started with: another one means a restart of them.
SIM_SETTINGS_FILE="${CLUSTER_DIR}/emulators.settings"
FINGERPRINT_FILE="${CLUSTER_DIR}/gpu-operator.fingerprint"

APISERVER_PORT=$((CLUSTER_PORT_BASE + 443))
ETCD_PORT=$((CLUSTER_PORT_BASE + 379))
ETCD_PEER_PORT=$((CLUSTER_PORT_BASE + 380))
KCM_PORT=$((CLUSTER_PORT_BASE + 257))
SCHEDULER_PORT=$((CLUSTER_PORT_BASE + 259))
KWOK_PORT=$((CLUSTER_PORT_BASE + 247))
PORTS=("${APISERVER_PORT}" "${ETCD_PORT}" "${ETCD_PEER_PORT}" "${KCM_PORT}" "${SCHEDULER_PORT}" "${KWOK_PORT}")
# kwokctl's pid file name (pids/<name>.pid) : the executable it runs (a symlink to our binary).
COMPONENTS=(etcd:etcd kube-apiserver:kube-apiserver kube-controller-manager:kube-controller-manager
  kube-scheduler:kube-scheduler kwok-controller:kwok)

BIN_DIR="$("${HACK_DIR}/build-tools.sh" bin-dir)"
KWOKCTL="${BIN_DIR}/kwokctl"
KUBECTL="${BIN_DIR}/kubectl"

# kwokctl logs JSON lines; keep them in a file and show its tail only when something fails.
KWOKCTL_LOG="${KWOK_WORKDIR}/${CLUSTER_NAME}.kwokctl.log"

log() { echo "cluster: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }
kwokctl() {
  mkdir -p "${KWOK_WORKDIR}"
  # 8>&-: the components kwokctl starts must not inherit (and hold) the cluster lock.
  if ! "${KWOKCTL}" "$@" >>"${KWOKCTL_LOG}" 2>&1 8>&-; then
    log "kwokctl $1 $2 failed; last lines of ${KWOKCTL_LOG}:"
    tail -n 15 "${KWOKCTL_LOG}" >&2
    return 1
  fi
}

# --- processes, by pid file only ------------------------------------------------------------

# alive PID: running and not a zombie. Zombies matter here: on machines whose init does not reap
# orphans, a killed component stays <defunct> (holding no port) and `kill -0` still succeeds.
alive() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "${state}" && "${state}" != "Z" ]]
}

# owned PIDFILE EXPECTED_EXE_BASENAME -> prints the pid when it runs our process, else nothing.
owned_pid() {
  local pid_file="$1" exe_name="$2" pid exe
  [[ -f "${pid_file}" ]] || return 0
  pid="$(tr -dc '0-9' <"${pid_file}")"
  [[ -n "${pid}" ]] && alive "${pid}" || return 0
  exe="$(readlink "/proc/${pid}/exe" 2>/dev/null || true)"
  exe="${exe% (deleted)}"
  # A pid file can outlive its process (crash, reboot) and the pid be reused: only a process of
  # the expected binary whose command line names this cluster's directory is ours.
  [[ "$(basename "${exe}")" == "${exe_name}" || ("${exe_name}" == python && "$(basename "${exe}")" == python*) ]] || return 0
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -qF "${CLUSTER_DIR}/" || return 0
  echo "${pid}"
}

# Remove pid files that do not point at one of our live processes, so kwokctl neither believes a
# dead component runs nor (worse) signals an unrelated process that got the same pid.
drop_stale_pid_files() {
  local c
  for c in "${COMPONENTS[@]}"; do
    local f="${CLUSTER_DIR}/pids/${c%%:*}.pid"
    if [[ -f "${f}" && -z "$(owned_pid "${f}" "${c#*:}")" ]]; then
      log "removing stale pid file ${f}"
      rm -f "${f}"
    fi
  done
  if [[ -f "${SIM_PID_FILE}" && -z "$(owned_pid "${SIM_PID_FILE}" python)" ]]; then
    rm -f "${SIM_PID_FILE}"
  fi
}

# All live pids of this cluster (components and emulators).
cluster_pids() {
  local c
  for c in "${COMPONENTS[@]}"; do owned_pid "${CLUSTER_DIR}/pids/${c%%:*}.pid" "${c#*:}"; done
  owned_pid "${SIM_PID_FILE}" python
}

# wait_gone PID... : SIGTERM was sent (or SIGKILL by kwokctl); escalate after 5 s (a throwaway
# test cluster needs no graceful API server shutdown).
wait_gone() {
  local pid deadline=$((SECONDS + 5))
  for pid in "$@"; do
    while alive "${pid}"; do
      if ((SECONDS >= deadline)); then
        log "pid ${pid} still running; sending SIGKILL"
        kill -KILL "${pid}" 2>/dev/null || true
      fi
      # Polling a process we just signalled has nothing to wait on but time.
      sleep 0.1
    done
  done
}

stop_emulators() {
  local pid
  pid="$(owned_pid "${SIM_PID_FILE}" python)"
  if [[ -n "${pid}" ]]; then
    kill -TERM "${pid}" 2>/dev/null || true
    wait_gone "${pid}"
  fi
  rm -f "${SIM_PID_FILE}" "${SIM_READY_FILE}" "${SIM_SETTINGS_FILE}"
}

start_emulators() {
  [[ -x "${PYTHON}" ]] || die "${PYTHON} not found: run 'make venv' (the emulators need aiohttp and PyYAML)"
  local settings="profile=${SIM_PROFILE} scale=${SIM_TIME_SCALE}"
  if [[ -n "$(owned_pid "${SIM_PID_FILE}" python)" && -f "${SIM_READY_FILE}" ]] \
    && [[ "$(cat "${SIM_SETTINGS_FILE}" 2>/dev/null)" == "${settings}" ]]; then
    return
  fi
  stop_emulators
  mkdir -p "${CLUSTER_DIR}/pids" "${CLUSTER_DIR}/logs"
  log "starting the emulators (${settings})"
  # setsid: detached from make's process group, like the kwokctl components; stopped by pid.
  PYTHONPATH="${ROOT_DIR}" setsid "${PYTHON}" -m hack.emulators --kubeconfig "${KUBECONFIG_PATH}" \
    --profile "${SIM_PROFILE}" --time-scale "${SIM_TIME_SCALE}" \
    --ready-file "${SIM_READY_FILE}" >>"${CLUSTER_DIR}/logs/emulators.log" 2>&1 </dev/null 8>&- &
  # setsid execs python in place (same pid); until it has, the pid's executable is setsid.
  local pid=$! deadline=$((SECONDS + 60))
  echo "${pid}" >"${SIM_PID_FILE}"
  until [[ -f "${SIM_READY_FILE}" ]]; do
    alive "${pid}" || die "the emulators exited; see ${CLUSTER_DIR}/logs/emulators.log"
    ((SECONDS < deadline)) || die "the emulators are not ready after 60s; see ${CLUSTER_DIR}/logs/emulators.log"
    sleep 0.2 # waits on a file another process writes; nothing to block on
  done
  echo "${settings}" >"${SIM_SETTINGS_FILE}"
}

# --- control plane --------------------------------------------------------------------------

port_busy() { [[ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]]; }

write_config() { # PATH: write this cluster's kwokctl config there
  local cfg="$1"
  cat >"${cfg}" <<EOF
# Generated by hack/cluster.sh; the options are documented in kwok's KwokctlConfiguration.
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  kubeVersion: ${K8S_VERSION}
  etcdVersion: ${ETCD_VERSION#v}
  kwokVersion: ${KWOK_VERSION}
  # Every binary is local: kwokctl never downloads anything.
  kubeApiserverBinary: ${BIN_DIR}/kube-apiserver
  kubeControllerManagerBinary: ${BIN_DIR}/kube-controller-manager
  kubeSchedulerBinary: ${BIN_DIR}/kube-scheduler
  kubectlBinary: ${BIN_DIR}/kubectl
  etcdBinary: ${BIN_DIR}/etcd
  etcdctlBinary: ${BIN_DIR}/etcdctl
  kwokControllerBinary: ${BIN_DIR}/kwok
  bindAddress: 127.0.0.1
  kubeApiserverPort: ${APISERVER_PORT}
  etcdPort: ${ETCD_PORT}
  etcdPeerPort: ${ETCD_PEER_PORT}
  kubeControllerManagerPort: ${KCM_PORT}
  kubeSchedulerPort: ${SCHEDULER_PORT}
  kwokControllerPort: ${KWOK_PORT}
  # TLS, RBAC authorization (Node,RBAC), the default admission plugins and service-account
  # token signing (TokenRequest): the operator runs with a ServiceAccount token, so RBAC is real.
  securePort: true
  kubeAuthorization: true
  kubeAdmission: true
  # Lift client rate limits of controller-manager and scheduler (and API priority & fairness),
  # so 1000 nodes wait on nothing but CPU.
  disableQPSLimits: true
  kubeAuditPolicy: ${HACK_DIR}/audit-policy.yaml
  # Stages live in the cluster (hack/kwok/stages.yaml), so tests can add failure stages.
  enableCRDs:
    - Stage
# One controller manager and one scheduler, so no leader election: on a loaded machine a lease renewal
# that misses its deadline makes them exit ("leaderelection lost"), and nothing would start them again.
# The DaemonSet controller without its staleness check (KEP-5647, beta since 1.36): when its informer
# lags its own writes, as it does with 1000 nodes on 2 cores, each sync fails ("read version ... is not
# as new as written version") and is retried with per-object backoff up to 1000 s, so a DaemonSet's
# status stays behind its pods for minutes, on both sides of a benchmark, by chance.
# No Endpoints or EndpointSlice controllers: the API server refuses every loopback address a simulated
# pod has (hack/README.md, "Known limits"), so they can never write an endpoint; with 1000 pods behind
# a Service each of their retries sends and refuses a 1000-address object and logs an Event naming
# them all, on every pod change, at a cost that grows with the square of the nodes.
componentsPatches:
  - name: kube-controller-manager
    extraArgs:
      - key: leader-elect
        value: "false"
      - key: feature-gates
        value: StaleControllerConsistencyDaemonSet=false
      - key: controllers
        value: "*,-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller"
  - name: kube-scheduler
    extraArgs:
      - key: leader-elect
        value: "false"
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
# kwokctl passes this through without applying kwok's defaults, so they are all spelled out.
options:
  cidr: ${POD_CIDR}
  # Fallback only: every simulated node is created with its own 127.1.x.y InternalIP.
  nodeIP: 127.1.255.254
  manageAllNodes: true
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
  # The operand pods are the emulators' (hack/kwok/stages.yaml): no Stage matches them, so kwok need not
  # look at their events at all. It still did, one at a time on one goroutine: at 1000 nodes its pod
  # watch then fell behind, the API server closed it as unresponsive, and kwok (v0.8.0,
  # pkg/utils/informer/event.go:77-79) watches again from resourceVersion 0, which replays every pod
  # (bench/README.md, "a saturated control plane").
  disregardStatusWithLabelSelector: app.kubernetes.io/managed-by=gpu-operator
  # No logs/exec/port-forward or pprof endpoints: nothing is ever meant to connect to a node.
  enableDebuggingHandlers: false
  enableProfilingHandler: false
  enableContentionProfiling: false
EOF
}

healthy() {
  [[ -f "${KUBECONFIG_PATH}" ]] || return 1
  local c
  for c in "${COMPONENTS[@]}"; do
    [[ -n "$(owned_pid "${CLUSTER_DIR}/pids/${c%%:*}.pid" "${c#*:}")" ]] || return 1
  done
  [[ "$(kc get --raw /readyz --request-timeout=5s 2>/dev/null)" == "ok" ]]
}

create_cluster() {
  local cfg="$1" p
  local deadline=$((SECONDS + 10))
  for p in "${PORTS[@]}"; do
    # A process killed a moment ago may still be closing its sockets.
    while port_busy "${p}" && ((SECONDS < deadline)); do sleep 0.2; done
    if port_busy "${p}"; then
      ss -Hltnp "sport = :${p}" >&2 || true
      die "port 127.0.0.1:${p} is in use by another process; set CLUSTER_PORT_BASE (now ${CLUSTER_PORT_BASE}) to move this cluster's ports"
    fi
  done
  log "creating cluster ${CLUSTER_NAME} (kube-apiserver https://127.0.0.1:${APISERVER_PORT})"
  # --kubeconfig '': leave ~/.kube/config alone; tests and users take ${KUBECONFIG_PATH}.
  if ! kwokctl create cluster --name "${CLUSTER_NAME}" --config "${cfg}" --kubeconfig '' --timeout 5m; then
    cmd_down # whatever did start must not linger
    die "could not create the cluster"
  fi
}

restart_cluster() {
  log "cluster ${CLUSTER_NAME} exists but is not healthy: restarting its processes"
  stop_emulators
  drop_stale_pid_files
  local pids
  mapfile -t pids < <(cluster_pids)
  kwokctl stop cluster --name "${CLUSTER_NAME}" || true
  ((${#pids[@]} == 0)) || wait_gone "${pids[@]}"
  kwokctl start cluster --name "${CLUSTER_NAME}" --timeout 3m || return 1
  # kwokctl start returns once /version answers; /readyz takes a few seconds more.
  local deadline=$((SECONDS + 60))
  until healthy; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5 # polling the API server's readiness; there is nothing to block on
  done
}

apply_stages() {
  # Not `kubectl wait`: it errors out instead of waiting while the CRD has no conditions yet.
  local deadline=$((SECONDS + 60)) jsonpath='{.status.conditions[?(@.type=="Established")].status}'
  until [[ "$(kc get crd stages.kwok.x-k8s.io -o jsonpath="${jsonpath}" 2>/dev/null)" == True ]]; do
    ((SECONDS < deadline)) || die "kwok's Stage CRD is not established"
    sleep 0.2 # polling the API server; nothing to block on
  done
  kc apply --server-side --field-manager=gpu-operator-cluster -f "${HACK_DIR}/kwok/stages.yaml" >/dev/null
  # NFD's NodeFeature API, through which GFD publishes its labels (the emulators play nfd-master).
  kc apply --server-side --field-manager=gpu-operator-cluster -f "${HACK_DIR}/nfd/nodefeature-crd.yaml" >/dev/null
}

# Converge the simulated nodes to NODES GPU nodes and CPU_NODES CPU-only nodes.
reconcile_nodes() {
  local tmp existing extra start=${SECONDS}
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now
  trap "rm -rf '${tmp}'" RETURN
  existing="${tmp}/existing.txt"
  kc get nodes -l gpu-operator.sim/simulated=true -o name >"${existing}"
  # Counts not given: keep what runs (a plain `make cluster-up` is a no-op), 4 + 1 when new.
  if [[ -z "${NODES}" ]]; then
    NODES="$(grep -c '^node/gpu-node-' "${existing}" || true)"
    ((NODES > 0)) || NODES=4
  fi
  if [[ -z "${CPU_NODES}" ]]; then
    CPU_NODES="$(grep -c '^node/cpu-node-' "${existing}" || true)"
    [[ -s "${existing}" ]] || CPU_NODES=1
  fi
  local missing chunks
  missing="$(python3 "${HACK_DIR}/gen_nodes.py" --gpu "${NODES}" --cpu "${CPU_NODES}" \
    --skip-from "${existing}" --out-dir "${tmp}/new" --chunk 50 --kubelet-version "${K8S_VERSION}")"
  if ((missing > 0)); then
    chunks=("${tmp}"/new/nodes-*.json)
    log "creating ${missing} nodes"
    # kubectl sends one request per object; a few processes in parallel keep the API server busy.
    printf '%s\n' "${chunks[@]}" |
      xargs -P 4 -I{} "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" create -f {} -o name >/dev/null
  fi
  # Nodes beyond the wanted counts (a previous, larger NODES).
  mapfile -t extra < <(sed 's|^node/||' "${existing}" | awk -v g="${NODES}" -v c="${CPU_NODES}" '
    /^gpu-node-[0-9]+$/ { i = substr($0, 10) + 0; if (i >= g) print }
    /^cpu-node-[0-9]+$/ { i = substr($0, 10) + 0; if (i >= c) print }')
  if ((${#extra[@]})); then
    log "deleting ${#extra[@]} nodes beyond NODES=${NODES} CPU_NODES=${CPU_NODES}"
    printf '%s\n' "${extra[@]}" |
      xargs -P 4 -n 50 "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" delete node --wait=false >/dev/null
  fi
  wait_nodes_ready "$((NODES + CPU_NODES))"
  log "$((NODES + CPU_NODES)) nodes Ready ($((SECONDS - start))s)"
}

# Poll one LIST until exactly N simulated nodes exist and all are Ready. (`kubectl wait` checks
# nodes one after the other: ~100 s for 1000 nodes, and it waits on nodes being deleted.)
wait_nodes_ready() {
  local want="$1" deadline=$((SECONDS + 300)) total=0 ready=0
  local jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
  while true; do
    read -r total ready < <(kc get nodes -l gpu-operator.sim/simulated=true -o jsonpath="${jsonpath}" |
      awk '{ t++ } $1 == "True" { r++ } END { print t + 0, r + 0 }')
    [[ "${total}" == "${want}" && "${ready}" == "${want}" ]] && return
    ((SECONDS < deadline)) || die "nodes: ${ready} of ${total} Ready after 300s, want ${want}"
    sleep 1 # polling the API server; nothing to block on
  done
}

cmd_up() {
  [[ -x "${KWOKCTL}" ]] || die "toolchain missing in ${BIN_DIR}: run 'make tools'"
  local start=${SECONDS} cfg fingerprint
  mkdir -p "${KWOK_WORKDIR}"
  cfg="${KWOK_WORKDIR}/${CLUSTER_NAME}.kwokctl.yaml"
  write_config "${cfg}"
  # Anything that changes how the processes are started means a new cluster.
  fingerprint="$(cat "${cfg}" "${HACK_DIR}/audit-policy.yaml" | sha256sum | cut -c1-16)"
  if [[ -d "${CLUSTER_DIR}" && "$(cat "${FINGERPRINT_FILE}" 2>/dev/null)" != "${fingerprint}" ]]; then
    log "cluster ${CLUSTER_NAME} was made with other settings or binaries: recreating it"
    cmd_down
  fi
  if healthy; then
    log "cluster ${CLUSTER_NAME} is already up"
  elif [[ -f "${CLUSTER_DIR}/kwok.yaml" ]] && restart_cluster; then
    log "cluster ${CLUSTER_NAME} restarted"
  else
    if [[ -d "${CLUSTER_DIR}" ]]; then cmd_down; fi
    create_cluster "${cfg}"
    echo "${fingerprint}" >"${FINGERPRINT_FILE}"
  fi
  apply_stages
  start_emulators
  reconcile_nodes
  log "up in $((SECONDS - start))s"
  cat >&2 <<EOF

  Cluster ${CLUSTER_NAME}: ${NODES} GPU + ${CPU_NODES} CPU kwok nodes, API https://127.0.0.1:${APISERVER_PORT}
    export KUBECONFIG=${KUBECONFIG_PATH}      # or: export KUBECONFIG=\$(make -s kubeconfig)
    ${KUBECTL} get nodes
  Audit log: ${AUDIT_LOG}   Logs: ${CLUSTER_DIR}/logs
  Stop: make cluster-down

EOF
}

cmd_down() {
  if [[ ! -d "${CLUSTER_DIR}" ]]; then
    log "cluster ${CLUSTER_NAME} is not there"
    return
  fi
  stop_emulators
  # A cluster started before the emulators existed still runs the old device simulator, which would
  # go on writing GPU capacities into the next cluster of this name.
  local legacy
  legacy=$(owned_pid "${CLUSTER_DIR}/pids/device-sim.pid" python)
  if [[ -n "${legacy}" ]]; then
    kill -TERM "${legacy}" 2>/dev/null || true
    wait_gone "${legacy}"
  fi
  drop_stale_pid_files
  local pids
  mapfile -t pids < <(cluster_pids)
  # kwokctl kills each component by its pid file, then removes the cluster directory.
  # --kubeconfig: a file of its own, so kwokctl leaves ~/.kube/config alone ('' is refused here).
  if ! kwokctl delete cluster --name "${CLUSTER_NAME}" --kubeconfig "${CLUSTER_DIR}/unused-kubeconfig"; then
    log "kwokctl delete failed; stopping the processes by pid"
    ((${#pids[@]} == 0)) || kill -TERM "${pids[@]}" 2>/dev/null || true
  fi
  ((${#pids[@]} == 0)) || wait_gone "${pids[@]}"
  rm -rf "${CLUSTER_DIR}"
  log "cluster ${CLUSTER_NAME} is down"
}

case "${1:-}" in
  up | down)
    mkdir -p "${KWOK_WORKDIR}"
    # One up/down per cluster at a time (e.g. two test sessions starting together).
    exec 8>"${KWOK_WORKDIR}/${CLUSTER_NAME}.lock"
    flock 8
    : >"${KWOKCTL_LOG}" # this run's kwokctl output only
    "cmd_$1"
    ;;
  status) healthy ;;
  kubeconfig) echo "${KUBECONFIG_PATH}" ;;
  audit-log) echo "${AUDIT_LOG}" ;;
  *)
    echo "usage: $0 up|down|status|kubeconfig|audit-log" >&2
    exit 2
    ;;
esac
