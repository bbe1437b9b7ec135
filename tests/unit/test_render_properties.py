"""Property tests of the renderer: any valid ClusterPolicy renders to well-formed objects, and every
user-supplied string comes out exactly as it went in."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_operator.api import parse_spec
from gpu_operator.api.common import quantity_value
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS, Component
from gpu_operator.core.render import PREREQUISITES, ClusterFacts, render, variants
from gpu_operator.core.template_functions import RESERVED_LABELS
from gpu_operator.core.yaml_text import to_yaml

Obj = dict[str, Any]

# Text as users might write it, and as attackers might: any unicode but surrogates (which neither
# JSON nor the API server carries).
# Control characters other than tab and newlines are refused in what goes into a container
# (api.common._printable), and so are lone surrogates (Cs).
UNPRINTABLE = "".join(map(chr, [*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]))
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters=UNPRINTABLE), max_size=40)
NAME = st.from_regex(r"[a-z]([a-z0-9-]{0,14}[a-z0-9])?", fullmatch=True)
IMAGE_NAME = st.from_regex(r"[a-z][a-z0-9]{0,7}(-[a-z0-9]{1,6}){0,2}", fullmatch=True)
ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,15}", fullmatch=True)
LABEL_KEY = st.from_regex(r"([a-z]{1,8}\.example\.com/)?[a-z]([a-z0-9-]{0,9}[a-z0-9])?", fullmatch=True)
LABEL_VALUE = st.from_regex(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?", fullmatch=True)
CONFIG_KEY = st.from_regex(r"[-._a-zA-Z0-9]{1,20}", fullmatch=True)
TAG = st.from_regex(r"v?[0-9]{1,3}\.[0-9]{1,3}(-[a-z0-9]{1,8})?", fullmatch=True)
DIGEST = st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: f"sha256:{h}")
QUANTITY = st.one_of(st.integers(0, 64), st.sampled_from(["100m", "1", "1.5", "1e3"]))
# Amounts a node can hold (api.common.CPU_MAX, BYTES_MAX): gibibytes of memory, not of CPUs.
AMOUNTS = {"cpu": QUANTITY, "memory": QUANTITY | st.sampled_from(["512Mi", "2Gi"])}
# Never 0: a DaemonSet cannot roll with no pod unavailable (the models refuse it, as the API server).
INT_OR_PERCENT = st.one_of(st.integers(1, 10), st.integers(1, 100).map(lambda n: f"{n}%"))

SECTIONS = {c.section for c in COMPONENTS}
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@st.composite
def image_fields(draw: st.DrawFn) -> Obj:
    kind = draw(st.sampled_from(["none", "triple", "digest", "full", "name-tag"]))
    if kind == "triple":
        return {"repository": "registry.example.com/nvidia", "image": draw(IMAGE_NAME), "version": draw(TAG)}
    if kind == "digest":
        return {"repository": "nvcr.io/nvidia", "image": draw(IMAGE_NAME), "version": draw(DIGEST)}
    if kind == "full":
        return {"image": f"registry.example.com:5000/{draw(IMAGE_NAME)}@{draw(DIGEST)}"}
    if kind == "name-tag":
        return {"image": f"nvidia/{draw(IMAGE_NAME)}", "version": draw(TAG)}
    return {}


def within_limits(resources: Obj) -> Obj:
    """No request above its limit (the API server refuses it; so do the models)."""
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for name in [
        n for n in requests if n in limits and quantity_value(requests[n]) > quantity_value(limits[n])
    ]:
        requests[name] = limits[name]
    return resources


ENV = st.lists(st.fixed_dictionaries({"name": ENV_NAME, "value": TEXT}), max_size=4)


@st.composite
def component_section(draw: st.DrawFn) -> Obj:
    section: Obj = draw(image_fields())
    optional = {
        "enabled": st.booleans(),
        "imagePullPolicy": st.sampled_from(["Always", "Never", "IfNotPresent"]),
        "imagePullSecrets": st.lists(NAME, max_size=3),
        "env": ENV,
        "args": st.lists(TEXT, max_size=3),
        "hostNetwork": st.booleans(),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.fixed_dictionaries({}, optional=AMOUNTS),
                "requests": st.fixed_dictionaries({}, optional=AMOUNTS),
            },
        ).map(within_limits),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            section[key] = draw(strategy)
    return section


def toleration_as_the_api_server_takes_it(toleration: Obj) -> Obj:
    """core/v1's rules: no key means Exists, Exists means no value, seconds only with NoExecute."""
    if not toleration.get("key"):
        toleration["operator"] = "Exists"
    if toleration.get("operator") == "Exists":
        toleration.pop("value", None)
    if "tolerationSeconds" in toleration:
        toleration["effect"] = "NoExecute"
    return toleration


TOLERATION = st.fixed_dictionaries(
    {},
    optional={
        "key": LABEL_KEY,
        "operator": st.sampled_from(["Exists", "Equal"]),
        "value": LABEL_VALUE,
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        "tolerationSeconds": st.integers(0, 3600),
    },
).map(toleration_as_the_api_server_takes_it)

DAEMONSETS = st.fixed_dictionaries(
    {},
    optional={
        "labels": st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=3),
        "annotations": st.dictionaries(LABEL_KEY, TEXT, max_size=3),
        "tolerations": st.lists(TOLERATION, max_size=3),
        "priorityClassName": NAME,
        "updateStrategy": st.sampled_from(["RollingUpdate", "OnDelete"]),
        "rollingUpdate": st.fixed_dictionaries({"maxUnavailable": INT_OR_PERCENT}),
    },
)


@st.composite
def policies(draw: st.DrawFn) -> Obj:
    spec: Obj = {}
    for section in sorted(draw(st.sets(st.sampled_from(sorted(SECTIONS))))):
        spec[section] = draw(component_section())
    if draw(st.booleans()):
        spec["daemonsets"] = draw(DAEMONSETS)
    if draw(st.booleans()):
        spec["mig"] = {"strategy": draw(st.sampled_from(["none", "single", "mixed"]))}
    if draw(st.booleans()):
        spec["cdi"] = {"enabled": draw(st.booleans())}
    if "driver" in spec and draw(st.booleans()):
        spec["driver"]["usePrecompiled"] = draw(st.booleans())
        spec["driver"]["upgradePolicy"] = {"autoUpgrade": draw(st.booleans())}
        spec["driver"]["manager"] = {"env": draw(ENV)}
    if "devicePlugin" in spec and draw(st.booleans()):
        spec["devicePlugin"]["config"] = {"name": draw(NAME), "default": draw(CONFIG_KEY)}
    if "dcgmExporter" in spec and draw(st.booleans()):
        spec["dcgmExporter"]["serviceMonitor"] = {
            "enabled": draw(st.booleans()),
            "additionalLabels": draw(st.dictionaries(LABEL_KEY, LABEL_VALUE, max_size=2)),
        }
        spec["dcgmExporter"]["enablePodLabels"] = draw(st.booleans())
        spec["dcgmExporter"]["config"] = {"name": draw(NAME)}
    if "migManager" in spec and draw(st.booleans()):
        spec["migManager"]["config"] = {"name": draw(NAME)}
    return spec


FACTS = st.builds(
    ClusterFacts,
    namespace=NAME,
    os_tag=st.sampled_from([None, "ubuntu22.04", "rhel9", "sles15.5"]),
    kernels=st.sampled_from(
        [(), (("5.15.0-105-generic", "ubuntu22.04"),), (("5.15.0", None), ("6.8.0", "x"))]
    ),
    runtimes=st.sampled_from([(), ("containerd",), ("crio",), ("containerd", "crio", "docker")]),
)


def last_values(env: list[Obj] | None) -> dict[str, str]:
    return {e["name"]: e["value"] for e in env or []}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=policies(), facts=FACTS)
def test_any_valid_policy_renders_well_formed_objects(raw: Obj, facts: ClusterFacts) -> None:
    policy = parse_spec(raw)
    objects = render(policy, facts)

    for obj in objects:
        assert obj["apiVersion"] and obj["kind"] and obj["metadata"]["name"]
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "gpu-operator"
        assert labels["app.kubernetes.io/part-of"] in ("gpu-operator", "nvidia-gpu")  # GFD: NVIDIA's selector

    rendered = {o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects}
    assert rendered == {PREREQUISITES} | {c.component_label for c in COMPONENTS if c.enabled(policy)}

    for component in COMPONENTS:
        if not component.enabled(policy):
            continue
        found = [
            o
            for o in objects
            if o["kind"] == "DaemonSet"
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == component.component_label
        ]
        assert len(found) == len(variants(component, policy, facts))
        for ds in found:
            check_daemonset(ds, component, policy)

    assert list(yaml.load_all(to_yaml(objects), Loader=LOADER)) == objects


# Set by the operator from the user's own values (NVIDIA's runtime paths of toolkit.env, the driver
# digest), so not the user's value itself.
DERIVED_ENV = {
    "RUNTIME",
    "RUNTIME_CONFIG",
    "CONTAINERD_CONFIG",
    "CRIO_CONFIG",
    "DOCKER_CONFIG",
    "RUNTIME_DROP_IN_CONFIG",
    "RUNTIME_DROP_IN_CONFIG_HOST_PATH",
    "RUNTIME_SOCKET",
    "CONTAINERD_SOCKET",
    "DOCKER_SOCKET",
    "RUNTIME_CONFIG_SOURCE",
    "NRI_SOCKET",
    "CONTAINERD_RUNTIME_CLASS",
    "DRIVER_CONFIG_DIGEST",
    "HOST_ROOT",
}


def check_daemonset(ds: Obj, component: Component, policy: ClusterPolicySpec) -> None:
    template_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"][component.deploy_label] == "true"
    spec = component.spec(policy)
    main = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    assert len(env) == len(main.get("env", []))
    wanted = {
        k: v for k, v in last_values([e.model_dump() for e in spec.env or []]).items() if k not in DERIVED_ENV
    }
    for key, value in (policy.daemonsets.labels or {}).items():
        if key not in RESERVED_LABELS:
            assert template_labels[key] == value
    for key, value in (policy.daemonsets.annotations or {}).items():
        assert ds["spec"]["template"]["metadata"]["annotations"][key] == value
    if component.name == "mps-control-daemon":
        return  # NVIDIA gives it none of devicePlugin's env and args
    assert wanted.items() <= env.items()
    if spec.args is not None:
        assert main["args"] == spec.args
