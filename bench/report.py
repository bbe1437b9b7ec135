"""bench/results/latest.md: the results as a Markdown table, plus the traffic details (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.stats import idle_verdict, median, ratio_verdict, rss_verdict

COLUMNS = (
    "GPU nodes",
    "runs",
    "operator s",
    "limit s",
    "ratio",
    "node join operator s",
    "node join limit s",
    "idle writes/min",
    "requests/node",
    "peak RSS MiB",
    "CPU s",
)


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def mark(met: bool | None) -> str:
    return "" if met is None else (" ✓" if met else " ✗")


def row(result: Mapping[str, Any]) -> list[str]:
    nodes = int(result["nodes"])
    r = ratio_verdict(nodes, result.get("ratio"))
    idle = idle_verdict(result.get("idle_writes_per_min"))
    rss = rss_verdict(nodes, result.get("peak_rss_mib"))
    return [
        str(nodes),
        str(result.get("rounds", "")),
        fmt(result.get("operator_s")),
        fmt(result.get("limit_s")),
        f"{fmt(r.value)} (≤ {r.target:g}){mark(r.met)}",
        fmt(result.get("node_join_operator_s")),
        fmt(result.get("node_join_limit_s")),
        f"{fmt(idle.value, 1)}{mark(idle.met)}",
        fmt(result.get("requests_per_node"), 1),
        f"{fmt(rss.value, 0)}{mark(rss.met)}",
        fmt(result.get("cpu_s"), 1),
    ]


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per size, smallest first."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---:" for _ in COLUMNS) + "|"]
    for key in sorted(results, key=int):
        lines.append("| " + " | ".join(row(results[key])) + " |")
    return "\n".join(lines) + "\n"


def _counts(title: str, counts: Mapping[str, int]) -> list[str]:
    if not counts:
        return [f"- {title}: none"]
    return [f"- {title}: " + ", ".join(f"{key} {n}" for key, n in counts.items())]


def details(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Per size: the operator's requests by verb and resource, and what it did at rest."""
    lines: list[str] = []
    for key in sorted(results, key=int):
        result = results[key]
        lines.append(f"### {key} GPU nodes")
        if result.get("converge_cpu_s") is not None:
            lines.append(
                f"- operator CPU while converging (median): {fmt(result['converge_cpu_s'], 1)} s, of it "
                f"while passes ran {fmt(result.get('planning_cpu_s'), 1)} s, on the event loop's thread "
                f"(passes and watches) {fmt(result.get('event_loop_cpu_s'), 1)} s"
            )
        joins = result.get("node_join_operator_all_s") or []
        if len(joins) > 1:
            lines.append(
                f"- operator node joins ({len(joins)}): median {fmt(median(joins))} s, "
                + ", ".join(fmt(j) for j in joins)
            )
        lines.extend(_saturation(result))
        lines.extend(_traffic(result))
        lines.append("")
    return "\n".join(lines)


def _saturation(result: Mapping[str, Any]) -> list[str]:
    """Runs whose control plane could not keep up: the API server closed pod watchers as unresponsive."""
    ours = result.get("pod_watchers_closed_runs") or []
    limit = result.get("limit_pod_watchers_closed_runs") or []
    if not any(ours) and not any(limit):
        return []
    return [
        "- pod watchers the API server closed as unresponsive, per operator run: "
        + (", ".join(str(n) for n in ours) or "-")
        + "; per limit run: "
        + (", ".join(str(n) for n in limit) or "-")
        + " (a saturated control plane: kwok then replays every pod; bench/README.md)"
    ]


def _traffic(result: Mapping[str, Any]) -> list[str]:
    """An operator's requests by verb and resource while converging and at rest (its first run)."""
    lines = _counts("requests during convergence (first run)", result.get("convergence_requests", {}))
    window = result.get("idle_window_s")
    lines.extend(_counts(f"requests during {fmt(window, 0)} s at rest", result.get("idle_requests", {})))
    writes = result.get("idle_writes") or []
    lines.append("- writes at rest: " + ("; ".join(writes) if writes else "none"))
    reads = result.get("idle_reads") or []
    none = "none (reads come only from watches)"
    lines.append("- GET/LIST at rest: " + ("; ".join(reads) if reads else none))
    return lines


def _header(document: Mapping[str, Any]) -> str:
    machine = document.get("machine", {})
    loads = document.get("load_average", {})
    header = (
        f"Measured {document.get('date', '')} at commit `{str(document.get('git_commit', ''))[:12]}`"
        f"{' (uncommitted changes)' if document.get('git_dirty') else ''} on {machine.get('nproc')} CPUs "
        f"({machine.get('cpu_model')}), {machine.get('memory_gib')} GiB; load average "
        f"{fmt(loads.get('min'), 1)} to {fmt(loads.get('max'), 1)} during the run."
    )
    settings = document.get("settings", {})
    header += (
        f" Emulated operand images: `{settings.get('sim_profile', 'instant')}` profile"
        f" (time scale {settings.get('sim_time_scale', 1.0):g}, hack/emulators/profile.py)."
    )
    return header


def markdown(document: Mapping[str, Any]) -> str:
    """The whole of latest.md: the table the README quotes, how it was measured, and the details."""
    if document.get("settings", {}).get("side_by_side"):
        return versus_markdown(document)
    notes = (
        "Times are medians over the runs; ratio is the median of per-run ratios (each operator run "
        "paired with the limit run next to it on the same cluster). Limit: `gpu-operator render` "
        "applied with `kubectl apply --server-side` plus every deploy label at once. ✓/✗: target met or "
        "missed (ratio ≤ 1.25 up to 100 nodes, ≤ 1 at 1000; 0 writes/min at rest; peak RSS "
        "< 150 MiB at 1000 nodes). See bench/README.md."
    )
    results = document.get("results", {})
    return "\n".join([_header(document), "", table(results), notes, "", details(results)])


# --- --side-by-side: ours against NVIDIA's operator ------------------------------------------------------

SIDE_NAMES = {"ours": "ours", "nvidia": "NVIDIA's"}
# (column, key in a side's summary, digits): each a column for ours and one for NVIDIA's.
VERSUS_NUMBERS = (
    ("rollout s", "rollout_s", 2),
    ("ready s", "ready_s", 2),
    ("node join s", "node_join_s", 2),
    ("requests/node", "requests_per_node", 1),
    ("CPU converging s", "converge_cpu_s", 1),
    ("peak RSS MiB", "peak_rss_mib", 0),
)


def versus_columns() -> list[str]:
    columns = ["GPU nodes", "runs"]
    for title, _, _ in VERSUS_NUMBERS:
        columns += [f"{title} {name}" for name in SIDE_NAMES.values()]
        if title == "rollout s":
            columns.append("rollout ours/NVIDIA's")
    return columns


def versus_row(result: Mapping[str, Any]) -> list[str]:
    cells = [str(result["nodes"]), str(result.get("rounds", ""))]
    for title, key, digits in VERSUS_NUMBERS:
        cells += [fmt((result.get(side) or {}).get(key), digits) for side in SIDE_NAMES]
        if title == "rollout s":
            cells.append(fmt(result.get("rollout_ratio")))
    return cells


def versus_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per size, smallest first: each number for ours, then for NVIDIA's."""
    columns = versus_columns()
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
    for key in sorted(results, key=int):
        lines.append("| " + " | ".join(versus_row(results[key])) + " |")
    return "\n".join(lines) + "\n"


def versus_details(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Per size and operator: what it deployed, its passes and CPU, its requests while converging and
    at rest."""
    lines: list[str] = []
    for key in sorted(results, key=int):
        lines.append(f"### {key} GPU nodes")
        for side, name in SIDE_NAMES.items():
            result = results[key].get(side) or {}
            lines.append(f"#### {name}")
            lines.append(
                f"- rollout s per run: {', '.join(fmt(v) for v in result.get('rollout_runs_s', []))}; "
                f"ready s: {', '.join(fmt(v) for v in result.get('ready_runs_s', []))}; "
                f"node join s: {', '.join(fmt(v) for v in result.get('node_join_runs_s', []))}"
            )
            lines.append(
                f"- passes while converging (median): {fmt(result.get('passes'), 0)}; CPU of its first "
                f"process, start to the end of its node join: {fmt(result.get('cpu_s'), 1)} s; "
                f"idle writes/min: {fmt(result.get('idle_writes_per_min'), 1)}"
            )
            deployed = result.get("daemonsets") or {}
            lines.append("- DaemonSets (pods wanted): " + ", ".join(f"{k} {v}" for k, v in deployed.items()))
            lines.extend(_traffic(result))
        lines.append("")
    return "\n".join(lines)


def versus_markdown(document: Mapping[str, Any]) -> str:
    """latest-side-by-side.md: the two operators' table, how it was measured, and the details."""
    notes = (
        "Ours against NVIDIA's operator "
        f"(`{document.get('settings', {}).get('nvidia_operator', '')}`, built from its source), each run on "
        "a fresh cluster, alternating. rollout: the ClusterPolicy applied → every DaemonSet current and "
        "available on exactly the nodes it should run on; ready: → the operator's own status (ours: "
        "`ready` with every GPU node counted; NVIDIA's: `state: ready`); node join: a new GPU node → a Ready "
        "pod of each of its operands. Times are medians over the runs; the ratio is the median of the "
        "per-round ratios. Requests from the API server's audit log by the operator's ServiceAccount, from "
        "the apply to 5 s after the later of rollout and ready; ours includes its Lease renewals, NVIDIA's "
        "runs without leader election. See bench/README.md."
    )
    results = document.get("results", {})
    return "\n".join([_header(document), "", versus_table(results), notes, "", versus_details(results)])
