"""Writes charts/gpu-operator/files/operand-rbac.yaml: the RBAC objects and RuntimeClasses the operator
creates for its operands, as its templates render them, with the CEL that pins them; and the shapes of
its DaemonSets' and Deployments' pods (hack/operand_pods.py).

The chart reads this one file for the names its RBAC restricts the operator's writes to
(`resourceNames`) and for the ValidatingAdmissionPolicies that admit only these objects with exactly
this content, and workloads only of these shapes (templates/admission-policy.yaml);
tests/unit/test_chart.py derives what the operator needs from the same rendering (`operand_objects`)
and fails when the file is stale.

    .venv/bin/python hack/operand_rbac.py --write     (part of `make crd`)
    .venv/bin/python hack/operand_rbac.py --check     exit 1 when the file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_operator.api import parse_spec  # noqa: E402
from gpu_operator.api.gpucluster import parse_gpucluster_spec  # noqa: E402
from gpu_operator.api.spec import OperatorSpec  # noqa: E402
from gpu_operator.core.gpucluster_render import render_gpucluster  # noqa: E402
from gpu_operator.core.render import ClusterFacts, render  # noqa: E402
from hack import operand_pods  # noqa: E402

OUTPUT = ROOT / "charts" / "gpu-operator" / "files" / "operand-rbac.yaml"
EVERYTHING = ROOT / "tests" / "data" / "policies" / "everything.yaml"
NAMESPACE = "gpu-operator"
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
RULE_FIELDS = ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs")

Obj = dict[str, Any]


def policy_objects(namespace: str = NAMESPACE, runtime_class: str | None = None, mode: str = "") -> list[Obj]:
    """What the operator applies for a policy with every component on (tests/data/policies/
    everything.yaml, sandbox workloads in KubeVirt mode, or `mode`), with `runtime_class` as its
    operator.runtimeClass when given."""
    return render(parse_spec(everything_spec(runtime_class, mode)), _facts(namespace))


def everything_spec(runtime_class: str | None = None, mode: str = "") -> dict[str, Any]:
    """everything.yaml's spec, in sandbox `mode` and with `runtime_class` when given."""
    spec: dict[str, Any] = yaml.safe_load(EVERYTHING.read_text())["spec"]
    if runtime_class is not None:
        spec = {**spec, "operator": {**(spec.get("operator") or {}), "runtimeClass": runtime_class}}
    if mode:
        spec = {**spec, "sandboxWorkloads": {**spec["sandboxWorkloads"], "mode": mode}}
    return spec


def _facts(namespace: str) -> ClusterFacts:
    return ClusterFacts(
        namespace=namespace,
        os_tag="ubuntu22.04",
        kernels=(("5.15.0-105-generic", "ubuntu22.04"),),
        config_maps={"kernel-module-params": ("nvidia.conf",)},
    )


def operand_objects(namespace: str = NAMESPACE, runtime_class: str | None = None) -> list[Obj]:
    """`policy_objects`, plus the objects only Kata mode adds (the Kata sandbox device plugin's and the
    CC manager's): a policy runs one mode or the other, and the chart admits both."""
    objects = policy_objects(namespace, runtime_class)
    seen = {_key(o): o for o in objects}
    for obj in policy_objects(namespace, runtime_class, mode="kata"):
        known = seen.get(_key(obj))
        if known is None:
            objects.append(obj)
            seen[_key(obj)] = obj
        elif obj["kind"] in (*RBAC_KINDS, "RuntimeClass") and known != obj:
            raise ValueError(f"{obj['kind']} {obj['metadata']['name']} differs between the sandbox modes")
    return objects + gpucluster_objects(_facts(namespace))


def _key(obj: Obj) -> tuple[str, str, str]:
    metadata = obj["metadata"]
    return (obj["kind"], metadata.get("namespace", ""), metadata["name"])


GPUCLUSTER_SAMPLE = ROOT / "tests" / "data" / "nvidia" / "gpucluster-sample.yaml"
DRA_KINDS = ("DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
"""The GPUCluster's cluster-scoped kinds besides RBAC: admitted by name (templates/admission-policy.yaml)."""


def gpucluster_objects(facts: ClusterFacts) -> list[Obj]:
    """What the operator applies for NVIDIA's GPUCluster sample with every state and every feature gate
    that renders RBAC on (DCGM, MPS and passthrough support too)."""
    return render_gpucluster(parse_gpucluster_spec(gpucluster_spec()), facts)


def gpucluster_spec() -> dict[str, Any]:
    """NVIDIA's GPUCluster sample's spec with every state and every feature gate that renders objects on."""
    spec = yaml.safe_load(GPUCLUSTER_SAMPLE.read_text())["spec"]
    dra = spec.get("draDriver") or {}
    gates = {**(dra.get("featureGates") or {}), "MPSSupport": True, "PassthroughSupport": True}
    return {
        **spec,
        "dcgm": {**(spec.get("dcgm") or {}), "enabled": True},
        "draDriver": {**dra, "featureGates": gates},
    }


NVIDIADRIVER_SAMPLE = ROOT / "tests" / "data" / "nvidia" / "nvidiadriver-sample.yaml"


def workload_shapes(namespace: str = NAMESPACE) -> dict[str, Obj]:
    """The shapes of the operator's DaemonSets and Deployments (hack/operand_pods.py): everything.yaml
    in both sandbox modes, NVIDIA's NVIDIADriver sample's pools, the GPUCluster above."""
    policies = [everything_spec(mode=mode) for mode in ("kubevirt", "kata")]
    driver = yaml.safe_load(NVIDIADRIVER_SAMPLE.read_text())["spec"]
    return operand_pods.shapes(
        chain(
            operand_pods.policy_renders(policies, namespace),
            operand_pods.pool_renders(driver, namespace),
            operand_pods.gpucluster_renders(gpucluster_spec(), _facts(namespace)),
        )
    )


def _quote(value: str) -> str:
    return json.dumps(value)  # a JSON string is a CEL string literal


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def _field_is(target: str, field: str, values: Sequence[str]) -> str:
    """`target.field` holds exactly `values` (an absent field counts as empty)."""
    if not values:
        return f"(!has({target}.{field}) || size({target}.{field}) == 0)"
    return f"(has({target}.{field}) && {target}.{field} == {_list(values)})"


def rules_are(rules: Sequence[Mapping[str, Any]], aggregates: bool) -> str:
    """CEL: `object.rules` is exactly `rules`, in order, and (a ClusterRole, the kind that can)
    nothing is aggregated into it. Each kind's expressions name only its own fields: the API server
    type-checks a policy's expressions against the kinds it matches (kube-controller-manager's
    validatingadmissionpolicystatus controller)."""
    parts = ["!has(object.aggregationRule)"] if aggregates else []
    if not rules:
        parts.append(_field_is("object", "rules", []))
    else:
        parts.append(f"has(object.rules) && size(object.rules) == {len(rules)}")
        for index, rule in enumerate(rules):
            parts += [_field_is(f"object.rules[{index}]", f, rule.get(f) or []) for f in RULE_FIELDS]
    return " && ".join(parts)


def binding_is(binding: Mapping[str, Any]) -> str:
    """CEL: the binding grants exactly its role to exactly its subjects (in the release namespace)."""
    ref = binding["roleRef"]
    parts = [
        f"object.roleRef.apiGroup == {_quote(ref['apiGroup'])}",
        f"object.roleRef.kind == {_quote(ref['kind'])}",
        f"object.roleRef.name == {_quote(ref['name'])}",
        f"has(object.subjects) && size(object.subjects) == {len(binding['subjects'])}",
    ]
    for index, subject in enumerate(binding["subjects"]):
        target = f"object.subjects[{index}]"
        parts += [
            f"{target}.kind == {_quote(subject['kind'])}",
            f"{target}.name == {_quote(subject['name'])}",
            f"has({target}.namespace) && {target}.namespace == variables.operandNamespace",
        ]
    return " && ".join(parts)


def by_name(expressions: Mapping[str, str]) -> str:
    """CEL: the expression of the object's name holds; an unknown name fails."""
    text = "false"
    for name in sorted(expressions, reverse=True):
        text = f"object.metadata.name == {_quote(name)} ? ({expressions[name]}) : {text}"
    return text


def operand_rbac() -> Obj:
    objects = operand_objects()
    found: Obj = {}
    for kind in RBAC_KINDS:
        mine = {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
        if kind.endswith("Binding"):
            content = {name: binding_is(o) for name, o in mine.items()}
        else:
            content = {
                name: rules_are(o.get("rules") or [], kind == "ClusterRole") for name, o in mine.items()
            }
        found[kind] = {"names": sorted(mine), "content": by_name(content)}
    for kind in DRA_KINDS:
        found[kind] = {"names": sorted({o["metadata"]["name"] for o in objects if o["kind"] == kind})}
    sentinel = "sentinel-runtime-class"
    fixed = {
        o["metadata"]["name"] for o in operand_objects(runtime_class=sentinel) if o["kind"] == "RuntimeClass"
    }
    found["RuntimeClass"] = {
        "default": OperatorSpec.model_fields["runtimeClass"].default,
        "names": sorted(fixed - {sentinel}),
        "content": "object.handler == object.metadata.name"
        " && !has(object.overhead) && !has(object.scheduling)",
    }
    found.update(workload_shapes())
    return found


HEADER = "# Generated by hack/operand_rbac.py from the operator's templates (make crd); do not edit.\n"


def text() -> str:
    return HEADER + yaml.safe_dump(operand_rbac(), sort_keys=False, width=100_000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true")
    action.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.write:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text())
        return 0
    if not OUTPUT.exists() or OUTPUT.read_text() != text():
        print(f"{OUTPUT.relative_to(ROOT)} is stale: run `make crd`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
