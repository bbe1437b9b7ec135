"""`--side-by-side`: ours against NVIDIA's operator at one size, from the runs of each (pure).

Each side's runs are operator runs of bench/run.py (`SizeBench._operator_round`), on fresh clusters taken in
turn (ours, NVIDIA's, ours, ...); round i of one side is paired with round i of the other for the ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bench import audit, stats

SIDES = ("ours", "nvidia")


def side(nodes: int, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One operator's medians over its runs, and its first run's traffic (the first rests)."""
    first = runs[0]
    joined_ready = [r["join_policy_ready_s"] for r in runs if r.get("join_policy_ready_s") is not None]
    return {
        "runs": len(runs),
        "rollout_s": stats.median([r["rollout_s"] for r in runs]),
        "ready_s": stats.median([r["converge_s"] for r in runs]),
        "node_join_s": stats.median([r["join_s"] for r in runs]),
        "node_join_policy_ready_s": stats.median(joined_ready),
        "requests_per_node": stats.median([r["requests"] / nodes for r in runs]),
        "converge_cpu_s": stats.median([r["converge_cpu_s"] for r in runs]),
        "cpu_s": first["process_cpu_s"],
        "peak_rss_mib": max((r["process_peak_rss_mib"] or 0.0 for r in runs), default=None),
        "passes": stats.median([r["passes"] for r in runs]),
        "rollout_runs_s": [r["rollout_s"] for r in runs],
        "ready_runs_s": [r["converge_s"] for r in runs],
        "node_join_runs_s": [r["join_s"] for r in runs],
        **audit.first_run_traffic(first),
        "timeline": first.get("timeline", []),
        "daemonsets": first.get("daemonsets", {}),
        "operator_user": first.get("operator_user"),
        "runs_detail": list(runs),
    }


def summarise(
    nodes: int,
    ours: Sequence[dict[str, Any]],
    nvidia: Sequence[dict[str, Any]],
    loads: Sequence[float],
    wall_s: float,
) -> dict[str, Any]:
    """Per-size results: each side's summary, and ours/NVIDIA's of the rollout and the node join (median
    of the per-round ratios, as the limit's ratio is)."""
    return {
        "nodes": nodes,
        "rounds": min(len(ours), len(nvidia)),
        "ours": side(nodes, ours),
        "nvidia": side(nodes, nvidia),
        "rollout_ratio": stats.median(
            stats.paired_ratios([r["rollout_s"] for r in ours], [r["rollout_s"] for r in nvidia])
        ),
        "node_join_ratio": stats.median(
            stats.paired_ratios([r["join_s"] for r in ours], [r["join_s"] for r in nvidia])
        ),
        "wall_s": wall_s,
        "load_average_1m": {"min": min(loads), "max": max(loads)} if loads else {},
    }
