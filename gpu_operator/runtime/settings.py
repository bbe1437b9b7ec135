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
    lease_api_timeout_seconds: tuple[float, float] = (2.0, 3.0)
    """(connect, read) of the lease's own calls: one round never outlasts the renew deadline."""

    resync_seconds: float = 600.0
    """A pass without any watch event after this long: a safety net only, since a pass with nothing
    changed reads caches and writes nothing."""
    max_backoff_seconds: float = 60.0
    """Longest wait before retrying a failed pass (doubling from 1 s); watch events wake it sooner."""
    stale_retry_seconds: float = 0.5
    """A write that found its object changed since the snapshot (409) asks for another pass this soon:
    the watch may bring the new version without a change a pass would react to."""
    stale_wait_seconds: float = 0.5
    """A label write refused as stale waits this long at most for the node's watch event to bring the
    newer version (reconciler `_node_after_conflict`), and only then reads the node."""
    status_interval_seconds: float = 2.0
    """A status write that only tells a rollout's progress (node counts, messages, components becoming
    ready; status.progress_only) waits until this long after the policy's last one; a changed
    state, condition or generation goes out at once. A
    1000-node rollout runs hundreds of passes: without it each would patch the ClusterPolicy (whose
    schema the API server validates on every write) and wait for it before the next labels."""
    pass_spacing: float = 2.0
    """After a pass, the next waits this many times the CPU seconds the pass took (at most
    max_pass_spacing_seconds): planning never takes more than a third of a core, and the events of
    the wait are planned together."""
    max_pass_spacing_seconds: float = 1.0
    planning_burst_seconds: float = 2.5
    planning_share: float = 0.005
    """Passes may spend `planning_burst_seconds` of CPU back to back (spaced as above), and once that is
    spent, `planning_share` of a core: the budget refills at that rate and the next pass waits for it,
    at most max_budget_wait_seconds (a pass's cost beyond that is not carried over, loop.Budget).
    Spacing by cost alone bounds the share of a core, not the CPU of a rollout: cheaper passes only
    came more often, and a 1000-node rollout that the DaemonSet controller paces over 15 minutes
    planned 2000 times (97 s of CPU). A 10- or 100-node rollout plans for under the burst (about 0.3
    and 1.4 s on the bench's 2 cores) and never waits; at 1000 nodes a pass of 40 to 60 ms waits 8 to
    10 s, which the DaemonSet controller's own pace there (10 to 20 pods a second) hides. A node
    that joins after such a rollout is served at once: a minute at rest refills 0.3 s, twenty such
    passes (bench/README.md: 2.9 s; at 0.5 % with the debt carried over it waited 30 s)."""
    max_budget_wait_seconds: float = 10.0
    writers: int = 16
    """Concurrent API writes in one pass: enough to label 1000 nodes quickly, few enough for the API
    server."""
    appliers: int = 8
    """Concurrent applies of the operands' objects, beside the writers' label writes: a stage's
    DaemonSet never queues behind a thousand node labels."""
    watch_coalesce_seconds: float = 0.2
    """While a pass runs or waits to run, the watches of pods, nodes and the operator's objects read
    their connections at most this often (gpu_operator/runtime/watch_stream.py `read`): the pass would see the
    events no sooner, and the event loop pays for each wake-up about what it pays for the events it
    brings. Short enough that the API server's buffers for the watch never fill (it closes a watcher
    that stays behind)."""
    watch_quiet_seconds: float = 1.0
    watch_quiet_bytes: int = 192 * 1024
    """Between passes (most of a 1000-node rollout, while they wait for their planning budget), a watch
    whose events come at less than `watch_quiet_bytes` per `watch_quiet_seconds` reads only that often:
    no pass reads the Store meanwhile, and the fewer events a read brings, the more each costs
    (bench/watch_cost.py, node events at 20 a second: 372 µs each read every 0.2 s, 164 µs every second;
    bench/README.md, "2026-12-04, night"). The nodes and DaemonSets of a rollout are such watches; the
    pods (about 600 KB a second at 1000 nodes) stay at `watch_coalesce_seconds`. Only while the next
    pass is further off than a quiet interval and one more (Loop.settle), so that every watch reads at
    most `watch_coalesce_seconds` before it starts. The bound keeps what waits in the connection under
    what its buffers held in bench/watch_cost.py (300 KB waiting slowed its server)."""
    watch_server_timeout_seconds: int = 300
    """Watches end on the server after this long and are resumed from their resourceVersion."""
    request_timeout_seconds: float = 60.0
    """Kopf's own API requests (its watches and listings)."""
    api_timeout_seconds: tuple[float, float] = (5.0, 30.0)
    """(connect, read) of every API call of the operator's own client: a silent connection (a black hole,
    a paused API server) fails the call instead of blocking the pass."""
    stuck_after_seconds: float = 180.0
    """Liveness fails when work has waited this long without any pass finishing. Every API call of a
    pass has a read timeout, so a pass that still has not ended after this long is hung in the process
    itself; a restart is then the one way out."""
    watch_retry_seconds: float = 5.0
    """A watch that failed (its CRD gone, the API server down past Kopf's retries) lists again after
    this long (gpu_operator/runtime/watch_guard.py)."""
    create_crd: bool = True
    """Create the ClusterPolicy CRD when it is absent (the chart's operator.createCRD); it is updated
    to the operator's schema either way."""
    list_chunk_size: int = 500
    """Initial listings in pages: 9000 operand pods at 1000 nodes are never one response in memory."""

    def __post_init__(self) -> None:
        # Frozen all the way down: a plain dict passed in could still change under the operator.
        object.__setattr__(self, "environ", MappingProxyType(dict(self.environ)))
