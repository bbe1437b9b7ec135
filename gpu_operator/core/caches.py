"""The core's memory across passes, as one object its owner passes in.

The planner is a pure function of the policy and the watched cluster, but between two passes only what
some event touched differs, so it keeps results while their inputs stay equal (gpu_operator/core/memo.py):
a pass over a large cluster then costs what changed, not what exists. Those results live here rather
than in module globals, so that whoever runs passes decides how long they are kept: the operator keeps
one Caches for its whole life (in its Memory, gpu_operator/core/memory.py), a test or the bench makes
its own, and two of them never see each other's results. What is kept never changes a decision, only its cost
(tests/unit/test_memo.py builds every pass warm and cold and compares them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpu_operator.core.memo import Memo

if TYPE_CHECKING:
    from gpu_operator.api import FieldError
    from gpu_operator.api.spec import ClusterPolicySpec
    from gpu_operator.core.status import Standing, Tally
    from gpu_operator.core.upgrade import UpgradeNode, UpgradePlan


@dataclass(frozen=True, eq=False)
class Caches:
    """What the core keeps from one pass to the next. Results taken from it are shared by the passes
    that find them, so no caller may mutate them. Not thread-safe: one pass at a time uses it (the
    operator's work queue runs one pass at a time)."""

    parsed: Memo[ClusterPolicySpec | list[FieldError]] = field(default_factory=Memo)
    """Spec content → its parsed spec, or the errors it was refused with (plan._parsed). The same
    parsed object for every pass of a generation is what lets the per-node memos below compare the
    spec by identity."""
    rendered: Memo[list[dict[str, Any]]] = field(default_factory=Memo)
    """The last rendered, owned and hashed objects, and the policy and cluster facts they came from
    (plan._rendered): most passes are caused by pod and node events and change neither."""
    pools: Memo[list[dict[str, Any]]] = field(default_factory=Memo)
    """NVIDIADriver name → its pool DaemonSets, while the driver, its pools and the cluster facts stay the
    same (driver_pool_plan._daemonsets)."""
    labels: Memo[dict[str, str] | None] = field(default_factory=Memo)
    """Node name → the labels to write there (None: those it has), while the node, the spec and the
    node's operand pods stay the same (plan._label_changes)."""
    standings: Memo[tuple[Standing | None, ...]] = field(default_factory=Memo)
    """Node name → where each component stands on it (None: disabled), while the node, the spec and
    the node's operand pods stay the same (status.standings)."""
    blocks: Memo[tuple[Tally, ...]] = field(default_factory=Memo)
    """Block of status.BLOCK GPU nodes → each component's tally on them, while their standings stay
    the same (status.policy_status): a pass sums the blocks and counts again only changed ones."""
    upgrade_nodes: Memo[UpgradeNode] = field(default_factory=Memo)
    """Node name → how the driver-upgrade state machine sees it, while the node and whether validators
    run stay the same (driver_upgrade.upgrade_nodes)."""
    manual_upgrade: Memo[UpgradePlan] = field(default_factory=Memo)
    """The last driver-upgrade plan made with autoUpgrade off and what it read of the facts
    (driver_upgrade.plan_driver_upgrade): during a rollout those stay the same while the rest moves."""
