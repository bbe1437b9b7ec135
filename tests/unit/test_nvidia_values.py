"""Values conformance: given NVIDIA's chart values, this chart writes the ClusterPolicy (and the
GPUCluster) NVIDIA's writes.

tests/data/nvidia-chart/ holds, for each case of its cases.yaml (NVIDIA's defaults and documented
install flags), the ClusterPolicy, or for the cases marked `compare: GPUCluster` the GPUCluster, and the
ConfigMaps NVIDIA's chart rendered (render.py; provenance in its README). Each case is rendered here
with this chart and the same flags (`helm template`). Both objects are parsed with the operator's
models (`parse_document`, `parse_gpucluster_document`) and must be equal, save the deliberate
differences below, each with its reason; a difference that is no longer found fails too, so the list
never keeps stale entries. The raw specs must have the same JSON paths (what `kubectl patch
--type=json` needs), and the created ConfigMaps the same names and data.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator.api import parse_document
from gpu_operator.api.gpucluster import parse_gpucluster_document

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-operator"
DATA = ROOT / "tests" / "data" / "nvidia-chart"
CASES: dict[str, dict[str, Any]] = yaml.safe_load((DATA / "cases.yaml").read_text())
POLICY_CASES = sorted(
    name for name, case in CASES.items() if case.get("compare", "ClusterPolicy") == "ClusterPolicy"
)
GPUCLUSTER_CASES = sorted(name for name, case in CASES.items() if case.get("compare") == "GPUCluster")
NVIDIA_CHART_LABEL = "gpu-operator-v26.7.0"
OUR_CHART_LABEL = "gpu-operator-0.1.0"

Obj = dict[str, Any]
Path_ = tuple[str, ...]


# The pinned helm of `make tools`, run as tests/unit/test_chart.py runs it (same release, namespace and
# Kubernetes version as render.py gave NVIDIA's chart).
@cache
def helm_binary() -> str:
    bin_dir = subprocess.run(
        [str(ROOT / "hack" / "build-tools.sh"), "bin-dir"], capture_output=True, text=True, check=False
    ).stdout.strip()
    helm = Path(bin_dir) / "helm"
    return str(helm) if bin_dir and helm.is_file() else ""


needs_helm = pytest.mark.skipif(not helm_binary(), reason="helm not built: run `make tools`")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, check=False)


def render_chart(*args: str) -> list[Obj]:
    proc = helm(
        "template", "gpu-operator", str(CHART), "-n", "gpu-operator", "--kube-version", "1.36.0", *args
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def find(objects: tuple[Obj, ...], kind: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Difference:
    """A deliberate difference: at `path` of the parsed spec (model_dump), NVIDIA's chart gives `nvidia`
    and this one `ours`, in the cases matching `cases` (a glob)."""

    cases: str
    path: Path_
    nvidia: Any
    ours: Any
    reason: str


DIFFERENCES = (
    Difference(
        "*",
        ("daemonsets", "labels", "helm.sh/chart"),
        NVIDIA_CHART_LABEL,
        OUR_CHART_LABEL,
        "the label names the chart that wrote the policy, and its version",
    ),
    Difference(
        "crio",
        ("operator", "defaultRuntime"),
        None,
        "crio",
        "NVIDIA's chart no longer writes operator.defaultRuntime (v26.7.0 detects each node's runtime); "
        "this chart passes it on as the runtime of nodes whose kubelet reports none",
    ),
)


def _flags(args: list[str]) -> list[str]:
    return [str(DATA / a) if a.endswith(".yaml") else a for a in args]


@cache
def nvidia_objects(case: str) -> tuple[Obj, ...]:
    return tuple(d for d in yaml.safe_load_all((DATA / f"{case}.yaml").read_text()) if d)


@cache
def our_objects(case: str) -> tuple[Obj, ...]:
    return tuple(render_chart(*_flags(CASES[case]["args"])))


def config_maps(objects: tuple[Obj, ...]) -> dict[str, Any]:
    """The ConfigMaps of the chart itself (not of its NFD subchart, compared in test_nfd_is_nvidias)."""
    return {
        o["metadata"]["name"]: o["data"]
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["labels"]["helm.sh/chart"].startswith("gpu-operator-")
    }


def json_paths(value: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    """Every path into the mappings of a document (list items are values, as patches address them)."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield (*prefix, key)
            yield from json_paths(sub, (*prefix, key))


def leaves(value: Any, prefix: Path_ = ()) -> dict[Path_, Any]:
    if isinstance(value, dict) and value:
        found: dict[Path_, Any] = {}
        for key, sub in value.items():
            found.update(leaves(sub, (*prefix, str(key))))
        return found
    return {prefix: value}


def take(dump: dict[str, Any], path: Path_) -> Any:
    """Remove and return the value at `path` (None when absent)."""
    *parents, last = path
    node: Any = dump
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return node.pop(last, None) if isinstance(node, dict) else None


def test_every_case_has_nvidias_rendering() -> None:
    rendered = {p.stem for p in DATA.glob("*.yaml")} - {"cases", "values-v26.7.0", "defaults.nfd"}
    rendered = {name for name in rendered if not name.endswith(".values")}
    assert rendered == set(CASES), "run tests/data/nvidia-chart/render.py (README.md there)"
    assert set(POLICY_CASES) | set(GPUCLUSTER_CASES) == set(CASES)
    for case in CASES:
        kind = CASES[case].get("compare", "ClusterPolicy")
        assert [o["kind"] for o in nvidia_objects(case)].count(kind) == 1, case


@needs_helm
@pytest.mark.parametrize("case", POLICY_CASES)
def test_the_cluster_policy_is_nvidias(case: str) -> None:
    nvidia = find(nvidia_objects(case), "ClusterPolicy")
    ours = find(our_objects(case), "ClusterPolicy")
    assert ours["metadata"]["name"] == nvidia["metadata"]["name"] == "cluster-policy"
    nvidia_dump = parse_document(nvidia).model_dump(mode="json")
    our_dump = parse_document(ours).model_dump(mode="json")
    for difference in DIFFERENCES:
        if fnmatch.fnmatchcase(case, difference.cases):
            found = (take(nvidia_dump, difference.path), take(our_dump, difference.path))
            assert found == (difference.nvidia, difference.ours), (
                f"deliberate difference at {'.'.join(difference.path)} not found as listed: {found}"
            )
    nvidia_leaves, our_leaves = leaves(nvidia_dump), leaves(our_dump)
    different = {
        ".".join(path): (nvidia_leaves.get(path, "(absent)"), our_leaves.get(path, "(absent)"))
        for path in nvidia_leaves.keys() | our_leaves.keys()
        if nvidia_leaves.get(path, "(absent)") != our_leaves.get(path, "(absent)")
    }
    assert not different, f"(NVIDIA's chart, this chart) differ: {different}"


@needs_helm
@pytest.mark.parametrize("case", POLICY_CASES)
def test_the_same_json_paths_exist(case: str) -> None:
    """Where NVIDIA's chart wrote a field, `kubectl patch --type=json` finds one in this chart's policy."""
    nvidia = set(json_paths(find(nvidia_objects(case), "ClusterPolicy")["spec"]))
    ours = set(json_paths(find(our_objects(case), "ClusterPolicy")["spec"]))
    added = {("operator", "defaultRuntime")} if case == "crio" else set()
    assert ours == nvidia | added, (
        f"only NVIDIA's: {sorted(nvidia - ours)}; only ours: {sorted(ours - nvidia)}"
    )


@needs_helm
@pytest.mark.parametrize("case", GPUCLUSTER_CASES)
def test_the_gpucluster_is_nvidias(case: str) -> None:
    """gpuCluster.deployCR writes the GPUCluster NVIDIA's chart writes: the same spec for the operator's
    models, at the same JSON paths."""
    nvidia = find(nvidia_objects(case), "GPUCluster")
    ours = find(our_objects(case), "GPUCluster")
    assert ours["metadata"]["name"] == nvidia["metadata"]["name"] == "gpu-cluster"
    nvidia_leaves = leaves(parse_gpucluster_document(nvidia).model_dump(mode="json"))
    our_leaves = leaves(parse_gpucluster_document(ours).model_dump(mode="json"))
    different = {
        ".".join(path): (nvidia_leaves.get(path, "(absent)"), our_leaves.get(path, "(absent)"))
        for path in nvidia_leaves.keys() | our_leaves.keys()
        if nvidia_leaves.get(path, "(absent)") != our_leaves.get(path, "(absent)")
    }
    assert not different, f"(NVIDIA's chart, this chart) differ: {different}"
    nvidia_paths, our_paths = set(json_paths(nvidia["spec"])), set(json_paths(ours["spec"]))
    assert our_paths == nvidia_paths, (
        f"only NVIDIA's: {sorted(nvidia_paths - our_paths)}; only ours: {sorted(our_paths - nvidia_paths)}"
    )
    assert not [o for o in our_objects(case) if o["kind"] == "ClusterPolicy"], "clusterPolicy.deployCR=false"


@needs_helm
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_config_maps_are_created(case: str) -> None:
    assert config_maps(our_objects(case)) == config_maps(nvidia_objects(case))


def nfd_objects(objects: tuple[Obj, ...] | list[Obj]) -> list[Obj]:
    chart = [
        o for o in objects if o["metadata"].get("labels", {}).get("helm.sh/chart", "").startswith("node-")
    ]
    return sorted(chart, key=lambda o: (o["kind"], o["metadata"]["name"]))


@needs_helm
@pytest.mark.parametrize(
    "args", [["--set", "nfd.enabled=true"], ["-f", str(DATA / "values-v26.7.0.yaml")]], ids=["set", "file"]
)
def test_nfd_is_nvidias(args: list[str]) -> None:
    """nfd.enabled installs NFD (the vendored chart) exactly as NVIDIA's chart does by default: same
    objects, same configuration (NVIDIA's node-feature-discovery values are this chart's defaults)."""
    nvidia = nfd_objects([d for d in yaml.safe_load_all((DATA / "defaults.nfd.yaml").read_text()) if d])
    ours = nfd_objects(render_chart(*args))
    assert [(o["kind"], o["metadata"]["name"]) for o in ours] == [
        (o["kind"], o["metadata"]["name"]) for o in nvidia
    ]
    assert ours == nvidia


def test_a_listed_difference_applies_to_some_case() -> None:
    for difference in DIFFERENCES:
        assert [c for c in CASES if fnmatch.fnmatchcase(c, difference.cases)], difference


@needs_helm
def test_nvidia_values_file_is_accepted_by_the_schema() -> None:
    """The whole of NVIDIA's values.yaml, given with -f, passes this chart's values schema (the
    comparison above then shows it means the same)."""
    proc = helm("lint", str(CHART), "--strict", "-f", str(DATA / "values-v26.7.0.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def install_notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` prints it (`helm template` leaves it out and a dry-run install needs a
    cluster): rendered with `tpl` from a copy of the chart."""
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    (copy / "notes").mkdir()
    shutil.move(copy / "templates" / "NOTES.txt", copy / "notes" / "NOTES.txt")
    (copy / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: install-notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes/NOTES.txt") . | toJson }}\n'
    )
    proc = helm(
        "template", "gpu-operator", str(copy), "-n", "gpu-operator", "--kube-version", "1.36.0", *args
    )
    assert proc.returncode == 0, proc.stderr
    notes = [d for d in yaml.safe_load_all(proc.stdout) if d and d["metadata"]["name"] == "install-notes"]
    return str(notes[0]["data"]["notes"])


NOT_ACTED_ON = {
    "operator.image": (["--set", "operator.image=gpu-operator"], "name NVIDIA's operator image"),
    "operator.cleanupCRD": (["--set", "operator.cleanupCRD=true"], "kubectl delete crd"),
    "operator.upgradeCRD": (["--set", "operator.upgradeCRD=false"], "keeps the ClusterPolicy CRD"),
    "operator.defaultGPUMode": (["--set", "operator.defaultGPUMode=vm-passthrough"], "defaultGPUMode"),
    "operator.logging.timeEncoding": (["--set", "operator.logging.timeEncoding=rfc3339"], "timeEncoding"),
    "platform.openshift": (["--set", "platform.openshift=true"], "OpenShift"),
}


@needs_helm
def test_install_notes_list_what_is_not_acted_on(tmp_path: Path) -> None:
    assert "not acted on" not in install_notes(tmp_path / "defaults")
    # NVIDIADriver objects run the driver (the chart creates the default one).
    assert "not acted on" not in install_notes(
        tmp_path / "pools", "--set", "driver.nvidiaDriverCRD.enabled=true"
    )
    # The sandbox stacks run (only the Kata manager is not: NVIDIA never deploys it).
    assert "not acted on" not in install_notes(tmp_path / "sandbox", "--set", "sandboxWorkloads.enabled=true")
    for key, (args, said) in NOT_ACTED_ON.items():
        notes = install_notes(tmp_path / key, *args)
        assert "NVIDIA chart values accepted but not acted on" in notes and said in notes, (key, notes)


@needs_helm
def test_nvidias_values_file_gives_notes_for_what_it_sets(tmp_path: Path) -> None:
    """NVIDIA's values.yaml switches on NFD (installed) and names NVIDIA's operator image (not used)."""
    notes = install_notes(tmp_path, "-f", str(DATA / "values-v26.7.0.yaml"))
    assert "Node Feature Discovery is installed with this release" in notes, notes
    assert "name NVIDIA's operator image" in notes, notes
    assert "ghcr.io/gpu-operator/gpu-operator:0.1.0" in notes


@needs_helm
def test_install_notes_tell_what_the_gpucluster_runs_on(tmp_path: Path) -> None:
    """gpuCluster.deployCR is acted on: the notes say which GPU nodes it takes, and, with NVIDIA's
    clusterPolicy.deployCR=false, that this operator runs it beside a ClusterPolicy."""
    dra = ["--api-versions", "resource.k8s.io/v1/DeviceClass", "--set", "gpuCluster.deployCR=true"]
    beside = install_notes(tmp_path / "beside", *dra, "--set", "gpuCluster.nodeSelector.pool=dra")
    assert "GPUCluster gpu-cluster" in beside and "labelled pool=dra" in beside, beside
    assert "not acted on" not in beside and "PrerequisiteNotMet" not in beside, beside
    every = install_notes(tmp_path / "every", *dra)
    assert "on every GPU node" in every, every
    alone = install_notes(
        tmp_path / "alone",
        *dra,
        "--set",
        "clusterPolicy.deployCR=false",
        "--set",
        "driver.nvidiaDriverCRD.enabled=true",
    )
    assert "PrerequisiteNotMet" in alone and "clusterPolicy.deployCR" in alone, alone
