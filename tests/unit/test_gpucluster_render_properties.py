"""Property tests of the GPUCluster's render: any valid GPUCluster renders to well-formed objects, every
user string comes out exactly as it went in, and the kubelet plugin's FEATURE_GATES and validation
resources follow NVIDIA's rules."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_render_properties import AMOUNTS, ENV_NAME, LABEL_KEY, LABEL_VALUE, TAG, TEXT

from gpu_operator.api.common import quantity_value
from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.core.gpucluster_render import render_gpucluster
from gpu_operator.core.render import ClusterFacts
from gpu_operator.core.template_functions import RESERVED_LABELS
from gpu_operator.core.yaml_text import to_yaml

Obj = dict[str, Any]
ENV = st.lists(st.fixed_dictionaries({"name": ENV_NAME, "value": TEXT}), max_size=3)
GATE = st.from_regex(r"[A-Z][A-Za-z]{0,15}", fullmatch=True)


@st.composite
def resources(draw: st.DrawFn) -> Obj | None:
    requests = draw(
        st.dictionaries(st.sampled_from(sorted(AMOUNTS)), st.sampled_from(["100m", "1", "2"]), max_size=2)
    )
    limits = draw(
        st.dictionaries(st.sampled_from(sorted(AMOUNTS)), st.sampled_from(["100m", "1", "2"]), max_size=2)
    )
    # A valid container never requests more than its limit.
    limits = {k: max(v, requests.get(k, v), key=quantity_value) for k, v in limits.items()}
    body = {k: v for k, v in (("requests", requests), ("limits", limits)) if v}
    return body or None


@st.composite
def plugin(draw: st.DrawFn) -> Obj:
    body: Obj = {"env": draw(ENV)}
    found = draw(resources())
    if found:
        body["resources"] = found
    if draw(st.booleans()):
        body["healthcheck"] = {"enabled": draw(st.booleans()), "port": draw(st.integers(1, 65535))}
    return body


@st.composite
def gpuclusters(draw: st.DrawFn) -> Obj:
    dra: Obj = {
        "repository": "registry.example.com/nvidia",
        "image": "dra-driver-nvidia-gpu",
        "version": draw(TAG),
        "featureGates": draw(st.dictionaries(GATE, st.booleans(), max_size=4)),
        "gpus": {"kubeletPlugin": draw(plugin())},
    }
    if draw(st.booleans()):
        dra["computeDomains"] = {
            "enabled": draw(st.booleans()),
            "controller": {"env": draw(ENV)},
            "kubeletPlugin": draw(plugin()),
        }
    spec: Obj = {
        "draDriver": dra,
        "daemonsets": {
            "labels": draw(st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3)),
            "annotations": draw(st.dictionaries(LABEL_KEY, TEXT, max_size=2)),
        },
    }
    if draw(st.booleans()):
        spec["dcgm"] = {"enabled": draw(st.booleans()), "env": draw(ENV)}
    if draw(st.booleans()):
        spec["dcgmExporter"] = {
            "env": draw(ENV),
            "podLabelAllowlistRegex": draw(st.lists(TEXT.filter(bool), max_size=2)),
        }
    return spec


def env_of(ctr: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in ctr.get("env", [])}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=gpuclusters())
def test_any_valid_gpucluster_renders_well_formed_objects(raw: Obj) -> None:
    spec = parse_gpucluster_spec(raw)
    objects = render_gpucluster(spec, ClusterFacts(namespace="dra"))
    # What `render` prints reads back as the same objects.
    assert [o for o in yaml.safe_load_all(to_yaml(objects)) if o] == objects
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    assert len(by_name) == len(objects)
    plugin_ds = by_name[("DaemonSet", "nvidia-dra-driver-kubelet-plugin")]
    pod = plugin_ds["spec"]["template"]["spec"]
    gpus = next(c for c in pod["containers"] if c["name"] == "gpus")
    expected_env = {e["name"]: e["value"] for e in raw["draDriver"]["gpus"]["kubeletPlugin"]["env"]}
    assert expected_env.items() <= env_of(gpus).items()
    gates = raw["draDriver"]["featureGates"]
    if gates and "FEATURE_GATES" not in expected_env:
        assert env_of(gpus)["FEATURE_GATES"].split(",") == sorted(
            f"{k}={str(v).lower()}" for k, v in gates.items()
        )
    init = pod["initContainers"][0].get("resources", {})
    for name, limit in (init.get("limits") or {}).items():
        assert quantity_value(limit) >= quantity_value((init.get("requests") or {}).get(name, limit))
    for obj in objects:
        for key, value in (raw["daemonsets"]["labels"] or {}).items():
            if key not in RESERVED_LABELS and obj["kind"] in ("DaemonSet", "Deployment"):
                assert obj["metadata"]["labels"][key] == value
        if obj["kind"] in ("DaemonSet", "Deployment"):
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
