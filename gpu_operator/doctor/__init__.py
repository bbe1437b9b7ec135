"""`gpu-operator doctor`: record the cluster's GPU state (recording.py), diagnose it (diagnosis.py, pure)
and print what is wrong and what to run next (report.py).

Exit status: 0 nothing wrong (warnings allowed), 1 problems found, 2 bad input: an unknown node or
pod, an unusable kubeconfig or state file, an API server that cannot be reached or refuses to let us
read.
"""

from __future__ import annotations

from typing import TextIO

from gpu_operator.doctor.diagnosis import diagnose
from gpu_operator.doctor.recording import (
    DoctorError,
    check_scope,
    kube_from_kubeconfig,
    load_state,
    record,
    save_state,
)
from gpu_operator.doctor.report import report_json, report_table
from gpu_operator.doctor.state import Scope

EXIT_HEALTHY = 0
EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2
__all__ = ["EXIT_BAD_INPUT", "EXIT_HEALTHY", "EXIT_PROBLEMS", "DoctorError", "run"]


def run(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespace: str,
    scope: Scope,
    output: str,
    log_lines: int,
    state_file: str | None,
    save: str | None,
    out: TextIO,
) -> int:
    if state_file:
        state = load_state(state_file)
    else:
        kube = kube_from_kubeconfig(kubeconfig, context)
        try:
            state = record(kube, namespace, log_lines, scope.pod)
        finally:
            kube.close()  # its connections and the thread of its event loop
    if save:
        save_state(state, save)
    check_scope(state, scope)
    findings = diagnose(state, scope)
    (report_json if output == "json" else report_table)(state, findings, out)
    return EXIT_PROBLEMS if any(f.severity == "error" for f in findings) else EXIT_HEALTHY
