"""`bench.run --side-by-side`: NVIDIA's operator beside ours (bench/nvidia.py, bench/versus.py, the report),
the pure parts: options, NVIDIA's command line and environment, predicates, summaries and the table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import condition, pod_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import nvidia, report, run, versus
from bench.cluster import NAMESPACE, ROOT, SERVICE_ACCOUNT_USER, bin_dir, versions
from gpu_operator.core.components import BY_NAME, COMPONENTS

BUILD = nvidia.Build(Path("/cache/tools/nvidia-gpu-operator-v26.7.0-0123456789"))


# --- options ---------------------------------------------------------------------------------------------


def test_side_by_side_writes_its_own_results_and_runs_no_limit() -> None:
    settings = run.parse_settings(["--sizes", "10", "--rounds", "10=2", "--side-by-side"])
    assert settings.side_by_side and settings.sizes == [10] and settings.rounds == {10: 2}
    assert settings.out == ROOT / "bench" / "results" / "latest-side-by-side"
    realistic = run.parse_settings(["--side-by-side", "--out", "bench/results/latest-realistic"])
    assert realistic.out == Path("bench/results/latest-realistic-side-by-side")
    plain = run.parse_settings([])
    assert not plain.side_by_side and plain.out == ROOT / "bench" / "results" / "latest"


def test_side_by_side_refuses_operator_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_settings(["--side-by-side", "--operator-only"])
    assert "--side-by-side has no limit runs" in capsys.readouterr().err


# --- NVIDIA's process ------------------------------------------------------------------------------------


def test_nvidia_runs_in_its_own_mount_namespace_with_the_builds_opt() -> None:
    command = nvidia.command(BUILD, Path("/k/kubeconfig"), 29591, 29592)
    assert command[:6] == ["unshare", "--map-root-user", "--mount", "--propagation", "private", "--"]
    assert command[6:9] == ["sh", "-c", nvidia.MOUNT_AND_EXEC]
    # sh's $0, then $1 (mounted on /opt and shifted away), then the operator and its flags.
    assert command[9:12] == ["nvidia-gpu-operator", f"{BUILD.dir}/opt", f"{BUILD.dir}/bin/gpu-operator"]
    assert command[12:] == [
        "--kubeconfig=/k/kubeconfig",
        "--leader-elect=false",
        "--health-probe-bind-address=127.0.0.1:29591",
        "--metrics-bind-address=127.0.0.1:29592",
    ]


def test_the_mount_script_mounts_its_first_argument_and_becomes_the_rest(tmp_path: Path) -> None:
    """The script as sh runs it, with a `mount` that only records its arguments."""
    (tmp_path / "mount").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/mounted\n')
    (tmp_path / "mount").chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", nvidia.MOUNT_AND_EXEC, "name", "/the/opt", "echo", "operator", "--flag"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert (tmp_path / "mounted").read_text() == "--bind /the/opt /opt\n"
    assert out.stdout == "operator --flag\n"


def test_nvidia_gets_the_namespace_and_the_images_ours_defaults_to() -> None:
    base = {"PATH": "/bin", "HOME": "/root", "KUBECONFIG": "/admin", "DRIVER_IMAGE": "mine/driver:1"}
    environ = nvidia.environment(base)
    assert environ["PATH"] == "/bin" and environ["HOME"] == "/root"
    assert "KUBECONFIG" not in environ  # the command line names the ServiceAccount's
    assert environ["OPERATOR_NAMESPACE"] == NAMESPACE
    assert environ["DRIVER_IMAGE"] == "nvcr.io/nvidia/driver:" + BY_NAME["driver"].default_image.version
    assert environ["DRIVER_MANAGER_IMAGE"] == "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
    assert environ["VALIDATOR_IMAGE"] == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert environ["GFD_IMAGE"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert {c.image_env for c in COMPONENTS} <= environ.keys()


def test_components_sharing_an_image_variable_default_to_the_same_image() -> None:
    """One variable per image in NVIDIA's operator (VALIDATOR_IMAGE serves three states): the defaults
    written for it must agree, or NVIDIA's would run another image than ours."""
    by_variable: dict[str, set[str]] = {}
    for c in COMPONENTS:
        image = c.default_image
        by_variable.setdefault(c.image_env, set()).add(f"{image.repository}/{image.name}:{image.version}")
    assert all(len(images) == 1 for images in by_variable.values()), by_variable


def test_nvidia_rbac_is_its_charts_serviceaccount_and_roles_only() -> None:
    command = nvidia.rbac_command(Path("/t/helm"), BUILD.chart)
    assert command[:6] == ["/t/helm", "template", "gpu-operator", str(BUILD.chart), "--namespace", NAMESPACE]
    shown = [command[i + 1] for i, arg in enumerate(command) if arg == "--show-only"]
    assert shown == [f"templates/{name}.yaml" for name in nvidia.RBAC_TEMPLATES]
    # The same ServiceAccount name as ours: one audit filter for both.
    assert SERVICE_ACCOUNT_USER.split(":") == ["system", "serviceaccount", NAMESPACE, "gpu-operator"]


def test_the_build_keeps_its_parts_where_the_image_has_them(tmp_path: Path) -> None:
    build = nvidia.Build(tmp_path)
    (tmp_path / "chart" / "gpu-operator" / "crds").mkdir(parents=True)
    for name in ("nvidia.com_gpuclusters.yaml", "nvidia.com_clusterpolicies.yaml"):
        (tmp_path / "chart" / "gpu-operator" / "crds" / name).write_text("")
    assert build.binary == tmp_path / "bin" / "gpu-operator"
    assert build.opt == tmp_path / "opt"
    assert [p.name for p in build.crds] == ["nvidia.com_clusterpolicies.yaml", "nvidia.com_gpuclusters.yaml"]


METRICS = """# HELP controller_runtime_reconcile_total Total number of reconciliations per controller
# TYPE controller_runtime_reconcile_total counter
controller_runtime_reconcile_total{controller="clusterpolicy-controller",result="error"} 2
controller_runtime_reconcile_total{controller="clusterpolicy-controller",result="requeue"} 0
controller_runtime_reconcile_total{controller="clusterpolicy-controller",result="requeue_after"} 7
controller_runtime_reconcile_total{controller="clusterpolicy-controller",result="success"} 3
controller_runtime_reconcile_total{controller="node-labeling-controller",result="success"} 40
controller_runtime_reconcile_errors_total{controller="clusterpolicy-controller"} 2
"""


def test_nvidias_passes_are_its_clusterpolicy_reconciles() -> None:
    assert nvidia.reconciles(METRICS) == 12
    assert nvidia.reconciles(METRICS, "node-labeling-controller") == 40
    assert nvidia.reconciles("") == 0


def test_nvidias_policy_is_ready_by_its_state_alone() -> None:
    check = nvidia.policy_ready("p")
    assert check({"/p": {"metadata": {"name": "p"}, "status": {"state": "ready"}}})
    assert not check({"/p": {"metadata": {"name": "p"}, "status": {"state": "notReady"}}})
    assert not check({"/p": {"metadata": {"name": "p"}}})
    assert not check({})


def test_the_build_script_names_the_version_and_its_dir() -> None:
    script = ROOT / "hack" / "build-nvidia-operator.sh"
    key = subprocess.run([str(script), "key"], capture_output=True, text=True, check=True).stdout.strip()
    assert key.startswith(f"nvidia-gpu-operator-{versions()['NVIDIA_OPERATOR_VERSION']}-")
    found = subprocess.run([str(script), "dir"], capture_output=True, text=True, check=True).stdout.strip()
    assert found == str(ROOT / ".cache" / "tools" / key)


def test_the_nvidia_operator_built_is_the_release_our_defaults_deploy() -> None:
    assert versions()["NVIDIA_OPERATOR_VERSION"] == BY_NAME["operator-validator"].default_image.version


# --- what is measured the same way for both ----------------------------------------------------------------


def test_a_daemonset_expected_on_no_node_may_be_absent() -> None:
    def ds(name: str, n: int) -> dict[str, Any]:
        status = dict.fromkeys(
            ("desiredNumberScheduled", "updatedNumberScheduled", "numberAvailable", "numberReady"), n
        )
        return {"metadata": {"name": name, "generation": 1}, "status": {"observedGeneration": 1, **status}}

    check = run.daemonsets_rolled_out({"a": 2, "mps": 0})
    assert check({"x/a": ds("a", 2)})
    assert check({"x/a": ds("a", 2), "x/mps": ds("mps", 0)})
    assert not check({"x/a": ds("a", 2), "x/mps": ds("mps", 1)})
    assert not check({"x/mps": ds("mps", 0)})
    assert run.desired_pods({"x/a": ds("a", 2), "x/b": {"metadata": {"name": "b"}}}) == {"a": 2, "b": 0}


def test_nvidias_pods_are_known_by_their_app_label() -> None:
    def pod(app: str, ready: bool) -> dict[str, Any]:
        return pod_body(app, "gpu-9", labels={"app": app}, conditions=[condition("Ready", ready)])

    check = run.pods_ready(frozenset({"nvidia-driver-daemonset", "nvidia-dcgm"}), run.APP_LABEL)
    assert check({"1": pod("nvidia-driver-daemonset", True), "2": pod("nvidia-dcgm", True)})
    assert not check({"1": pod("nvidia-driver-daemonset", True), "2": pod("nvidia-dcgm", False)})
    assert not check({"1": pod("nvidia-driver-daemonset", True)})


def operator_run(rollout: float, ready: float, join: float, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "rollout_s": rollout,
        "converge_s": ready,
        "join_s": join,
        "join_policy_ready_s": None,
        "requests": 250,
        "converge_cpu_s": 2.0,
        "process_cpu_s": 9.5,
        "process_peak_rss_mib": 100.0,
        "passes": 12,
        "requests_by_kind": {"patch nodes": 40},
        "join_requests_by_kind": {},
        "daemonsets": {"nvidia-driver-daemonset": 10},
    }
    found.update(extra)
    return found


def test_each_side_is_summarised_and_paired_by_round() -> None:
    ours = [
        operator_run(10.0, 10.0, 1.0, rest_s=300.0, rest_writes=[], join_policy_ready_s=1.5),
        operator_run(12.0, 12.0, 1.2),
    ]
    theirs = [
        operator_run(
            20.0, 18.0, 2.0, rest_s=300.0, rest_writes=["+1s patch nodes"], process_peak_rss_mib=80.0
        ),
        operator_run(20.0, 19.0, 2.4, process_peak_rss_mib=90.0),
    ]
    summary = versus.summarise(10, ours, theirs, [1.0, 3.0], 600.0)
    assert summary["rounds"] == 2 and summary["load_average_1m"] == {"min": 1.0, "max": 3.0}
    assert summary["rollout_ratio"] == pytest.approx(0.55)  # median of 10/20 and 12/20
    assert summary["node_join_ratio"] == pytest.approx(0.5)
    mine, nvidias = summary["ours"], summary["nvidia"]
    assert mine["rollout_s"] == 11.0 and nvidias["ready_s"] == 18.5
    assert mine["node_join_policy_ready_s"] == 1.5 and nvidias["node_join_policy_ready_s"] is None
    assert mine["requests_per_node"] == 25.0
    assert mine["idle_writes_per_min"] == 0.0 and nvidias["idle_writes_per_min"] == pytest.approx(0.2)
    assert nvidias["peak_rss_mib"] == 90.0 and nvidias["cpu_s"] == 9.5
    assert nvidias["rollout_runs_s"] == [20.0, 20.0]


def test_side_by_side_takes_a_fresh_cluster_per_run_ours_first(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []

    class FakeBench:
        def __init__(self, settings: run.Settings, nodes: int, operator: str, run_name: str) -> None:
            self.operator, self.run_name = operator, run_name
            self.cluster_up_s, self.user, self.loads = 1.0, SERVICE_ACCOUNT_USER, [2.0]

        def setup(self) -> None:
            calls.append(("setup", self.run_name))

        def operator_round(self, round_no: int, rest: bool, cleanup: bool) -> dict[str, Any]:
            calls.append((f"round rest={rest} cleanup={cleanup}", self.run_name))
            return operator_run(10.0 if self.operator == run.OURS else 20.0, 1.0, 1.0, rest_s=0.0)

        def teardown(self) -> None:
            calls.append(("teardown", self.run_name))

    monkeypatch.setattr(run, "SizeBench", FakeBench)
    settings = run.parse_settings(["--sizes", "10", "--rounds", "10=2", "--side-by-side"])
    summary = run.side_by_side(settings, 10)
    assert [name for step, name in calls if step == "setup"] == [
        "ours-r1",
        "nvidia-r1",
        "ours-r2",
        "nvidia-r2",
    ]
    assert calls[:3] == [
        ("setup", "ours-r1"),
        ("round rest=True cleanup=False", "ours-r1"),
        ("teardown", "ours-r1"),
    ]
    assert ("round rest=False cleanup=False", "nvidia-r2") in calls
    assert summary["rollout_ratio"] == 0.5 and summary["ours"]["runs"] == 2


def test_the_table_has_a_column_for_each_operator() -> None:
    summary = versus.summarise(
        10,
        [operator_run(10.0, 10.5, 1.0, rest_s=300.0, rest_writes=[])],
        [operator_run(20.0, 18.0, 2.0, rest_s=300.0, rest_writes=[], process_peak_rss_mib=80.4)],
        [1.0],
        60.0,
    )
    text = report.versus_table({"10": summary})
    header, rule, row = text.splitlines()
    assert header.startswith(
        "| GPU nodes | runs | rollout s ours | rollout s NVIDIA's | rollout ours/NVIDIA's | ready s ours |"
    )
    assert header.endswith("| peak RSS MiB ours | peak RSS MiB NVIDIA's |")
    assert len(row.split("|")) == len(header.split("|")) == len(rule.split("|"))
    assert row == (
        "| 10 | 1 | 10.00 | 20.00 | 0.50 | 10.50 | 18.00 | 1.00 | 2.00 | 25.0 | 25.0 | 2.0 | 2.0 | 100 | 80 |"
    )


def test_the_markdown_of_a_side_by_side_run_names_both_and_their_traffic() -> None:
    summary = versus.summarise(
        10,
        [operator_run(10.0, 10.5, 1.0, rest_s=300.0, rest_writes=[])],
        [operator_run(20.0, 18.0, 2.0, rest_s=300.0, rest_writes=["+3.000s patch nodes gpu-node-1 (200)"])],
        [1.0],
        60.0,
    )
    document = {
        "date": "2026-12-06T14:00:00Z",
        "git_commit": "0123456789abcdef",
        "machine": {"nproc": 2, "cpu_model": "Test CPU", "memory_gib": 24.0},
        "load_average": {"min": 1.0, "max": 3.5},
        "settings": {"side_by_side": True, "nvidia_operator": "nvidia-gpu-operator-v26.7.0-0123456789"},
        "results": {"10": summary},
    }
    text = report.markdown(document)
    assert "`0123456789ab`" in text and "`nvidia-gpu-operator-v26.7.0-0123456789`" in text
    assert "| rollout s ours | rollout s NVIDIA's |" in text
    assert "#### ours" in text and "#### NVIDIA's" in text
    assert "- writes at rest: +3.000s patch nodes gpu-node-1 (200)" in text
    assert "- DaemonSets (pods wanted): nvidia-driver-daemonset 10" in text


def test_nvidias_chart_renders_its_serviceaccount_and_roles_for_the_bench() -> None:
    """With the build (`make nvidia-operator`) and helm (`make tools`) at hand: what the bench applies."""
    try:
        build = nvidia.build()
    except RuntimeError:
        pytest.skip("NVIDIA's operator not built: run `make nvidia-operator`")
    helm = bin_dir() / "helm"
    if not helm.is_file():
        pytest.skip("helm not built: run `make tools`")
    out = subprocess.run(nvidia.rbac_command(helm, build.chart), capture_output=True, text=True, check=True)
    objects = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    kinds = {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects}
    assert kinds == {
        ("ServiceAccount", "gpu-operator", NAMESPACE),
        ("Role", "gpu-operator", NAMESPACE),
        ("RoleBinding", "gpu-operator", NAMESPACE),
        ("ClusterRole", "gpu-operator", None),
        ("ClusterRoleBinding", "gpu-operator", None),
    }
    # Its three watched kinds among the CRDs the bench applies (nvidia.CRD_NAMES waits for them).
    watched = {f"nvidia.com_{name.split('.')[0]}.yaml" for name in nvidia.CRD_NAMES}
    assert watched <= {p.name for p in build.crds}
    assert (build.opt / "gpu-operator" / "state-driver" / "0500_daemonset.yaml").is_file()


def test_the_sample_has_one_field_nvidias_crd_does_not_declare() -> None:
    """Why NVIDIA's policy is applied client-side with `--validate=warn` (SizeBench.apply_policy): its
    API server drops that one field, a deprecated alias whose value (no ServiceMonitor) is NVIDIA's
    default anyway."""
    try:
        build = nvidia.build()
    except RuntimeError:
        pytest.skip("NVIDIA's operator not built: run `make nvidia-operator`")
    crd = yaml.safe_load((build.chart / "crds" / "nvidia.com_clusterpolicies.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    def undeclared(value: dict[str, Any], node: dict[str, Any], path: str) -> list[str]:
        found = []
        for key, item in value.items():
            declared = node.get("properties", {})
            if key not in declared:
                found.append(f"{path}.{key}")
            elif isinstance(item, dict):
                found += undeclared(item, declared[key], f"{path}.{key}")
        return found

    sample = run.own_driver(yaml.safe_load(run.POLICY.read_text()))
    assert undeclared(sample["spec"], schema, "spec") == ["spec.dcgmExporter.serviceMonitoring"]
    assert sample["spec"]["dcgmExporter"]["serviceMonitoring"] is False


def test_nvidias_policy_has_every_section_its_crd_requires() -> None:
    """NVIDIA's API server refuses a ClusterPolicy without them (the first side-by-side run stopped there)."""
    policy = nvidia.with_required_sections(run.own_driver(yaml.safe_load(run.POLICY.read_text())))
    assert set(nvidia.REQUIRED_SECTIONS) <= set(policy["spec"])
    assert policy["spec"]["driver"]["useNvidiaDriverCRD"] is False, "what the sample sets is kept"
    try:
        build = nvidia.build()
    except RuntimeError:
        pytest.skip("NVIDIA's operator not built: run `make nvidia-operator`")
    crd = yaml.safe_load((build.chart / "crds" / "nvidia.com_clusterpolicies.yaml").read_text())
    required = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["required"]
    assert sorted(required) == sorted(nvidia.REQUIRED_SECTIONS)
