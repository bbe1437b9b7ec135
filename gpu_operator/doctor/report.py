"""The doctor's report: a table of findings and, for each, its details and the commands to run next;
or JSON (-o json)."""

from __future__ import annotations

import dataclasses
import json
from typing import TextIO

from gpu_operator.doctor.checklist import node_access
from gpu_operator.doctor.diagnosis import summary
from gpu_operator.doctor.state import (
    ClusterState,
    Finding,
)


def report_json(state: ClusterState, findings: list[Finding], out: TextIO) -> None:
    errors = sum(1 for f in findings if f.severity == "error")
    body = {
        "healthy": errors == 0,
        "errors": errors,
        "warnings": len(findings) - errors,
        "checked": {"namespace": state.namespace, "at": state.now, **summary(state)},
        "findings": [dataclasses.asdict(f) for f in findings],
    }
    out.write(json.dumps(body, indent=2) + "\n")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def report_table(state: ClusterState, findings: list[Finding], out: TextIO) -> None:
    counts = summary(state)
    errors = sum(1 for f in findings if f.severity == "error")
    checked = (
        f"{counts['nodes']} nodes ({counts['gpuNodes']} with GPUs), {counts['gpuPods']} GPU pods, "
        f"{counts['operandPods']} operand pods in {state.namespace}"
    )
    if not findings:
        print(f"healthy: nothing wrong found ({checked})", file=out)
        return
    warnings = len(findings) - errors
    counted = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    print(f"{counted} ({checked})", file=out)
    print(file=out)
    rows = [("#", "SEVERITY", "OBJECT", "NODE", "FINDING")] + [
        (str(i), f.severity, f.object, f.node or "-", f"{f.code}: {_clip(f.cause, 90)}")
        for i, f in enumerate(findings, start=1)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[4],
            file=out,
        )
    for i, finding in enumerate(findings, start=1):
        print(file=out)
        print(f"[{i}] {finding.severity} {finding.code}  {finding.object}", file=out)
        print(f"    {finding.cause}", file=out)
        for line in finding.details:
            print(f"    {line}", file=out)
        if finding.commands:
            print("    next:", file=out)
        shown: set[str] = set()
        for command in finding.commands:
            if command.level == "node" and command.where not in shown:
                shown.add(command.where)
                print(f"      on node {command.where} (ssh, or {node_access(command.where)}):", file=out)
            indent = "        " if command.level == "node" else "      "
            print(f"{indent}{command.command}", file=out)
