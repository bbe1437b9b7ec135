"""The emulated DRA kubelet plugin (hack/emulators/dra_plugin.py): the ResourceSlice it publishes for a
node's simulated GPUs, whole and MIG, with the attributes NVIDIA's DRA driver publishes."""

from __future__ import annotations

from hack.emulators import dra_plugin, images, operands
from hack.emulators.gpus import MODELS, GpuModel
from hack.emulators.node import MigGpu


def h100() -> GpuModel:
    return next(m for m in MODELS.values() if m.mig_capable)


def test_whole_gpus_with_nvidias_attributes() -> None:
    model = h100()
    found = dra_plugin.devices("gpu-0", model, 2, [], "580.105.08")
    assert [d["name"] for d in found] == ["gpu-0", "gpu-1"]
    attributes = found[0]["attributes"]
    assert attributes["type"] == {"string": "gpu"}
    assert attributes["productName"] == {"string": model.name}
    assert attributes["driverVersion"] == {"version": "580.105.8"}  # semantic: no leading zero
    assert attributes["uuid"]["string"].startswith("GPU-")
    assert attributes["uuid"] != found[1]["attributes"]["uuid"]
    assert found[0]["capacity"]["memory"] == {"value": f"{model.memory_mib}Mi"}
    assert {
        "architecture",
        "cudaComputeCapability",
        "cudaDriverVersion",
        "brand",
        "index",
    } <= attributes.keys()


def test_mig_devices_replace_their_gpu() -> None:
    model = h100()
    profile = model.mig_profiles[0].name
    layout = [MigGpu(True, [profile, profile]), MigGpu()]
    found = dra_plugin.devices("gpu-0", model, 2, layout, "580.105.08")
    kinds = [d["attributes"]["type"]["string"] for d in found]
    assert kinds == ["mig", "mig", "gpu"]
    mig = found[0]["attributes"]
    assert mig["profile"] == {"string": profile}
    assert mig["parentUUID"] == {"string": dra_plugin.gpu_uuid("gpu-0", 0)}
    assert len({d["name"] for d in found}) == 3


def test_the_slice_is_the_nodes_own() -> None:
    body = dra_plugin.resource_slice("gpu-0", "uid-0", [])
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["spec"]["nodeName"] == "gpu-0" and body["spec"]["driver"] == "gpu.nvidia.com"
    assert body["spec"]["pool"] == {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1}
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_the_image_runs_the_plugin() -> None:
    image = "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0"
    assert "/usr/bin/gpu-kubelet-plugin" in images.files(image) and "/bin/bash" in images.files(image)
    assert "gpu-kubelet-plugin" in operands.NAMES


def test_the_rendered_kubelet_plugin_script_hands_over_to_the_plugin() -> None:
    """The DaemonSet's `bash -c` script, as the emulated kubelet reads it: source driver-ready, exec the
    plugin (the `if` block that masks the driver's params file has no effect)."""
    from gpu_operator.api.gpucluster import parse_gpucluster_spec
    from gpu_operator.core.gpucluster_render import render_gpucluster
    from gpu_operator.core.render import ClusterFacts
    from hack.emulators import shell

    objects = render_gpucluster(parse_gpucluster_spec({}), ClusterFacts(namespace="gpu-operator"))
    plugin = next(o for o in objects if o["metadata"]["name"] == "nvidia-dra-driver-kubelet-plugin")
    gpus = next(c for c in plugin["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus")
    found = shell.shell_script((*gpus["command"], *gpus["args"]))
    assert found is not None and found[0] == "inline"
    script = shell.parse(gpus["args"][0], {"LOG_VERBOSITY": "4"})
    assert [s.kind for s in script.steps][-1] == "run"
    assert script.steps[-1].argv[0] == "gpu-kubelet-plugin"
    assert "source" in [s.kind for s in script.steps]
