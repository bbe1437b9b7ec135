"""The operator's settings: built once by the CLI (`gpu-operator run`), frozen, passed down.

Every tunable of the running operator is here, with why it has its value; no module keeps its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpu_operator.runtime.leader import Timing

LogFormat = Literal["plain", "full", "json"]


@dataclass(frozen=True)
class Settings:
    namespace: str = "gpu-operator"
    """Namespace of the operands (ClusterPolicies are cluster-scoped)."""
    environ: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The operator's environment as it started: image fallbacks such as DRIVER_IMAGE (OLM style)."""
    listen: str = ""
    """HOST:PORT of /metrics, /healthz and /readyz; empty: no HTTP server."""
    log_format: LogFormat = "plain"
    verbose: bool = False

    leader_election: bool = True
    """Only the holder of the Lease `lease_name` (in `namespace`) reconciles and writes
    (gpu_operator/runtime/leader.py); off, this process always does (one replica only)."""
    lease_name: str = "gpu-operator"
    identity: str = ""
    """This replica's name in the Lease (the CLI sets the pod name plus a random suffix)."""
    lease: Timing = field(default_factory=Timing)

    resync_seconds: float = 600.0
    """A pass without any watch event after this long: a safety net only, since a pass with nothing
    changed reads caches and writes nothing."""
    pass_rate_nodes_per_second: float = 150.0
    """Passes are rate limited by a token bucket (as client-go limits requests) in which a pass costs
    one token per GPU node still rolling out (Plan.nodes_rolling_out, as the pass before it counted them):
    refilled at this rate, a 1000-node rollout plans at most every 6.7 s once its burst is spent,
    while the DaemonSet controller, which creates 10 to 20 pods a second, sets its pace anyway (a
    pass then labels a hundred nodes' next stage at once)."""
    pass_burst_nodes: float = 100_000.0
    """What the bucket holds: every pass of a small or medium cluster's rollout (a 100-node rollout
    takes a few hundred passes), 100 back to back at 1000 nodes."""
    pass_min_cost_share: float = 0.1
    """The least a pass costs, as a share of the cluster's nodes: it looks over every node even when
    few are rolling out. So the passes of a node joining a settled 1000-node cluster cost 100 tokens
    each, not 1000: planned at once even right after a rollout has emptied the bucket."""
    retry_seconds: float = 1.0
    """The first wait before retrying a failed pass, doubled with each failure in a row."""
    max_backoff_seconds: float = 60.0
    """The longest wait before retrying a failed pass; watch events ask for a pass sooner."""
    stale_retry_seconds: float = 0.5
    """A write that found its object changed since the snapshot (409) asks for another pass this soon:
    the watch may bring the new version without a change a pass would react to."""
    stale_wait_seconds: float = 0.5
    """A label write refused as stale waits this long at most for the node's watch event to bring the
    newer version (reconciler `_node_after_conflict`), and only then reads the node."""
    status_interval_seconds: float = 2.0
    """A status write that only tells a rollout's progress (node counts, messages, components becoming
    ready; status.progress_only) waits until this long after the policy's last one; a changed
    state, condition or generation goes out at once. A large rollout runs hundreds of passes: without
    it each would patch the ClusterPolicy (whose schema the API server validates on every write)."""
    writers: int = 16
    """Concurrent API writes in one pass: enough to label 1000 nodes quickly, few enough for the API
    server."""
    appliers: int = 8
    """Concurrent applies of the operands' objects, beside the writers' label writes: a stage's
    DaemonSet never queues behind a thousand node labels."""
    watch_batch_seconds: float = 0.2
    """While a pass runs or is asked for, a watch reads its connection at most this often: the pass
    would not see the events sooner, and events read together cost the event loop far less than
    read one by one. Idle, a watch reads every event at once."""
    watch_server_timeout_seconds: int = 300
    """Watches end on the server after this long and are resumed from their resourceVersion."""
    watch_inactivity_seconds: float = 70.0
    """A watch that brings nothing for this long, not even the bookmark the API server sends every
    minute, is taken for a half-open connection and reopened."""
    request_timeout_seconds: float = 60.0
    """One page of an informer's listing (gpu_operator/runtime/informer.py)."""
    api_timeout_seconds: tuple[float, float] = (10.0, 30.0)
    """(connect, read) of every API call of the operator's own client: a silent connection (a black hole,
    a paused API server) fails the call instead of blocking the pass. A TLS handshake is two round trips
    inside the connect timeout: on a saturated API server each can take seconds."""
    stuck_after_seconds: float = 180.0
    """Liveness fails when work has waited this long without any pass finishing. Every API call of a
    pass has a read timeout, so a pass that still has not ended after this long is hung in the process
    itself; a restart is then the one way out."""
    watch_retry_seconds: float = 5.0
    """A watch that failed (its CRD gone, the API server down) lists again after this long, doubled with
    each failure in a row up to twelve times as long (gpu_operator/runtime/informer.py)."""
    create_crd: bool = True
    """Create the ClusterPolicy CRD when it is absent (the chart's operator.createCRD); it is updated
    to the operator's schema either way."""
    list_chunk_size: int = 100
    """Initial listings in pages: the operand pods of a large cluster (nine on every GPU node) are never
    one response in memory, and one page decoded is a few MiB (a decoded node or pod takes over ten times
    its JSON): the process keeps the memory of its largest moment."""

    def __post_init__(self) -> None:
        # Frozen all the way down: a plain dict passed in could still change under the operator.
        object.__setattr__(self, "environ", MappingProxyType(dict(self.environ)))
