"""`gpu-operator validate` and `render` with GPUCluster documents: NVIDIA's sample valid as it is, each
problem one line naming the document and field, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_operator import cli
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.gpucluster_render import DRA_DRIVER_IMAGE_ENV

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "nvidia" / "gpucluster-sample.yaml"
GPUCLUSTER = (
    "apiVersion: nvidia.com/v1alpha1\nkind: GPUCluster\nmetadata:\n  name: {name}\nspec:\n"
    "  draDriver: {{repository: nvcr.io/nvidia, image: dra-driver-nvidia-gpu, version: v0.5.0}}\n"
)
POLICY = "apiVersion: nvidia.com/v1\nkind: ClusterPolicy\nmetadata:\n  name: cluster-policy\nspec: {}\n"


@pytest.fixture(autouse=True)
def _no_image_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [c.image_env for c in COMPONENTS] + [DRA_DRIVER_IMAGE_ENV]:
        monkeypatch.delenv(name, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpucluster.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_nvidias_sample_validates(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", "-f", str(SAMPLE))
    assert (code, err) == (0, "")
    assert out == (
        "gpucluster/gpu-cluster: valid (DRA driver v0.4.0 with computeDomains; DCGM exporter; "
        "every GPU node)\n"
    )


def test_node_selector_is_summarised(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, GPUCLUSTER.format(name="gpu-cluster") + "  nodeSelector: {pool: dra}\n")
    code, out, _ = run(capsys, "validate", "-f", str(path))
    assert code == 0 and out.endswith("(DRA driver v0.5.0; GPU nodes with pool=dra)\n")


def test_every_problem_names_its_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = GPUCLUSTER.format(name="mine") + "  hostPaths: {kubeletRootDir: relative}\n"
    path = write(tmp_path, f"{POLICY}---\n{bad}")
    code, out, err = run(capsys, "validate", "-f", str(path))
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert [line.split(": ")[1] for line in lines] == ["document 2", "document 2"]
    assert "spec.hostPaths.kubeletRootDir" in lines[0]
    assert "metadata.name: 'mine': GPUCluster is a singleton, metadata.name must be 'gpu-cluster'" in lines[1]


def test_an_image_without_registry_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, GPUCLUSTER.format(name="gpu-cluster").replace("nvcr.io/nvidia", "nvidia"))
    code, _, err = run(capsys, "validate", "-f", str(path))
    assert code == 2 and "gpucluster/gpu-cluster: spec.draDriver.repository: 'nvidia/dra-driver" in err


def test_ignored_root_fs_is_a_warning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, GPUCLUSTER.format(name="gpu-cluster") + "  hostPaths: {rootFS: /host}\n")
    code, _, err = run(capsys, "validate", "-f", str(path))
    assert code == 0
    assert "warning: gpucluster/gpu-cluster: accepted but not acted on: spec.hostPaths.rootFS" in err


def test_render_a_gpucluster_alone(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, GPUCLUSTER.format(name="gpu-cluster"))
    code, out, err = run(capsys, "render", "-f", str(path), "--namespace", "dra")
    assert (code, err) == (0, "")
    objects = [o for o in yaml.safe_load_all(out) if o]
    daemonsets = [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"]
    assert daemonsets == ["nvidia-dra-driver-kubelet-plugin", "nvidia-dra-validator"]
    assert {o["metadata"].get("namespace", "dra") for o in objects} == {"dra"}


def test_render_with_a_clusterpolicy_adds_the_dra_stack(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, f"{POLICY}---\n{GPUCLUSTER.format(name='gpu-cluster')}")
    code, out, _ = run(capsys, "render", "-f", str(path))
    assert code == 0
    names = {o["metadata"]["name"] for o in yaml.safe_load_all(out) if o}
    assert {"nvidia-device-plugin-daemonset", "nvidia-dra-driver-kubelet-plugin", "gpu.nvidia.com"} <= names


def test_render_takes_one_gpucluster(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    one = GPUCLUSTER.format(name="gpu-cluster")
    code, out, err = run(capsys, "render", "-f", str(write(tmp_path, f"{one}---\n{one}")))
    assert (code, out) == (2, "")
    assert "render takes at most one GPUCluster, this file has 2" in err
