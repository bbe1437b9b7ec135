"""The order of a pass's writes and which of them wait (core/writes.py): decisions alone, no API."""

from __future__ import annotations

from typing import Any

from gpu_operator.core.writes import in_waves, labelled_components


def test_waves_are_the_labelled_components_objects_their_daemonsets_with_the_rest_then_the_rest() -> None:
    def body(kind: str, component: str) -> dict[str, Any]:
        labels = {"app.kubernetes.io/component": component}
        return {"kind": kind, "metadata": {"name": f"{component}-{kind}", "labels": labels}}

    objects = [
        body(kind, name)
        for name in ("nvidia-driver", "nvidia-dcgm")
        for kind in ("ServiceAccount", "DaemonSet")
    ]
    objects.append(body("RuntimeClass", "pre-requisites"))
    first, second, third = in_waves(objects, {"driver"})
    assert [o["metadata"]["name"] for o in first] == [
        "nvidia-driver-ServiceAccount",
        "pre-requisites-RuntimeClass",
    ]
    assert [o["metadata"]["name"] for o in second] == [
        "nvidia-driver-DaemonSet",
        "nvidia-dcgm-ServiceAccount",
    ]
    assert [o["metadata"]["name"] for o in third] == ["nvidia-dcgm-DaemonSet"]
    assert [o["metadata"]["name"] for o in in_waves(objects, set())[0]] == ["pre-requisites-RuntimeClass"]
    deploy = {"n1": {"nvidia.com/gpu.deploy.driver": "true"}, "n2": {"nvidia.com/gpu.deploy.dcgm": "false"}}
    assert labelled_components(deploy) == {"driver"}
    assert labelled_components({"n1": {"nvidia.com/gpu.deploy.device-plugin": "true"}}) == {
        "device-plugin",
        "mps-control-daemon",
    }
