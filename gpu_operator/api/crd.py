"""The CustomResourceDefinitions (ClusterPolicy, NVIDIADriver), generated from the pydantic models.

`structural()` turns pydantic's JSON Schema (draft 2020-12) into the OpenAPI v3 *structural* schema that
apiextensions.k8s.io/v1 demands; `definition()` wraps a resource's spec and status schemas into its CRD;
`definition_yaml()` is what `gpu-operator crd NAME` prints and `crds/NAME.yaml` holds (`RESOURCES` by
NAME; `crd()` and `crd_yaml()` are the ClusterPolicy's). The models stay the one source of truth:
descriptions come from their attribute docstrings, admission rules (`x-kubernetes-validations`,
patterns) from their `json_schema_extra`.

The converter is deliberately strict: any schema construct it does not know how to express structurally
raises `SchemaError` naming the path, so a new model field can never silently produce a CRD the API
server refuses (or, worse, accepts with different meaning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from gpu_operator.api import GROUP, KIND, PLURAL, VERSION, gpucluster, nvidiadriver
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.api.status import ClusterPolicyStatus

Schema = dict[str, Any]

GENERATED_BY = "gpu-operator crd (gpu_operator/api/crd.py) from gpu_operator/api/spec.py and status.py"

# JSONSchemaProps keys that may appear in the output as they are (after conversion of their content).
_PASS_THROUGH = {
    "description",
    "type",
    "format",
    "required",
    "enum",
    "default",
    "nullable",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
}
# Pydantic annotations with no meaning for the API server.
_DROPPED = {"title", "examples", "$defs"}

_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING = "x-kubernetes-int-or-string"


class SchemaError(ValueError):
    """The models use a construct that has no structural-schema form."""


def structural(schema: Schema) -> Schema:
    """A structural OpenAPI v3 schema equivalent to pydantic's `model_json_schema(mode='validation')`."""
    return _Converter(schema.get("$defs", {})).convert(schema, "", ())


class _Converter:
    def __init__(self, defs: dict[str, Schema]) -> None:
        self.defs = defs

    def convert(self, node: Schema, path: str, stack: tuple[str, ...]) -> Schema:
        node = dict(node)
        if "$ref" in node:
            return self._inline(node, path, stack)
        for junctor in ("anyOf", "oneOf", "allOf"):
            if junctor in node:
                return self.convert(self._collapse(node, junctor, path), path, stack)
        return self._plain(node, path, stack)

    def _inline(self, node: Schema, path: str, stack: tuple[str, ...]) -> Schema:
        name = str(node.pop("$ref")).rsplit("/", 1)[-1]
        target = dict(self.defs[name])
        if name in stack:
            # A recursive model cannot be inlined; the server keeps the subtree as given and pydantic
            # validates it.
            return {"type": "object", _PRESERVE: True, "description": _describe(node, target)}
        description = _describe(node, target)
        merged = {**target, **node}
        if description:
            merged["description"] = description
        return self.convert(merged, path, (*stack, name))

    def _collapse(self, node: Schema, junctor: str, path: str) -> Schema:
        """`Optional[X]` → X + nullable; `int | str` → int-or-string; anything else is an error."""
        branches: list[Schema] = node.pop(junctor)
        present = [b for b in branches if b.get("type") != "null"]
        nullable = len(present) < len(branches)
        types = sorted(str(b.get("type")) for b in present)
        if types == ["integer", "string"] and all(set(b) == {"type"} for b in present):
            base: Schema = {_INT_OR_STRING: True}
        elif len(present) == 1:
            base = dict(present[0])
        else:
            raise SchemaError(
                f"{path or '(root)'}: a union other than Optional[X] or int | str has no structural "
                f"form; flatten it into one model and validate the variants in pydantic and CEL"
            )
        merged = {**base, **node}
        if "description" in base and "description" in node:
            merged["description"] = _describe(node, base)
        if nullable:
            merged["nullable"] = True
            if merged.get("default", ...) is None:
                del merged["default"]
        return merged

    def _plain(self, node: Schema, path: str, stack: tuple[str, ...]) -> Schema:
        out: Schema = {}
        for key, value in node.items():
            if key in _DROPPED or key in {"deprecated", "properties", "items", "additionalProperties"}:
                continue
            if key == "const":
                out["enum"] = [value]
            elif key == "uniqueItems":
                if value:  # the server forbids uniqueItems (quadratic); a set-type list says the same.
                    out.setdefault("x-kubernetes-list-type", "set")
            elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
                # Draft 2020-12 gives the bound; OpenAPI 3.0 gives a flag next to minimum/maximum.
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "description":
                out[key] = " ".join(str(value).split())  # docstrings wrap; the API server shows a paragraph
            elif key in _PASS_THROUGH or key.startswith("x-kubernetes-"):
                out[key] = value
            else:
                raise SchemaError(f"{path or '(root)'}: {key!r} has no place in a structural schema")

        if node.get("deprecated") and "deprecated" not in str(out.get("description", "")).lower():
            out["description"] = f"Deprecated. {out.get('description', '')}".strip()
        if isinstance(out.get("default"), dict | list) or out.get("default", ...) is None:
            # Only scalar leaf defaults go to the server. Whole-section defaults (from default_factory)
            # would make the API server write a large default tree into every object; pydantic applies
            # them on read anyway, so `spec: {}` stays `spec: {}` in etcd and in `kubectl get -o yaml`.
            del out["default"]
        if "enum" in out:
            # kube-openapi checks `enum` even for null and never matches null (validate/validator.go,
            # basicCommonValidator), so a nullable enum would reject null. Without `nullable` the server
            # prunes a null instead, which reads as "absent", exactly what pydantic's None means.
            out.pop("nullable", None)

        if "properties" in node:
            out["properties"] = {
                name: self.convert(sub, f"{path}.{name}", stack) for name, sub in node["properties"].items()
            }
        extra = node.get("additionalProperties")
        if extra is True or (extra is None and out.get("type") == "object" and "properties" not in node):
            out[_PRESERVE] = True  # dict[str, Any]: kept as given, no pruning
        elif isinstance(extra, dict) and "properties" not in node:
            out["additionalProperties"] = self.convert(extra, f"{path}.*", stack)
        # `additionalProperties: false` (extra="forbid") is dropped: pruning already removes unknown fields.
        if "items" in node:
            out["items"] = self.convert(node["items"], f"{path}[]", stack)

        if out.get(_INT_OR_STRING):
            out.pop("type", None)
        elif "type" not in out and not out.get(_PRESERVE):
            out[_PRESERVE] = True  # `Any`: no structural type, so keep whatever the user wrote
        if out.get(_PRESERVE) and out.get("type") == "array":
            raise SchemaError(f"{path}: an untyped list has no structural form")
        return out


def _describe(field: Schema, model: Schema) -> str:
    """The field's description, then the model's (where it adds something): `kubectl explain` shows both."""
    own = str(field.get("description", "")).strip()
    other = str(model.get("description", "")).strip()
    if not other or other in own:
        return own
    if not own or own in other:
        return other
    return f"{own} {other}"


@dataclass(frozen=True)
class Resource:
    """One custom resource: its names, its models, and what `kubectl get` shows of it."""

    kind: str
    plural: str
    version: str
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    """The object's description (`kubectl explain <kind>`)."""
    columns: tuple[Schema, ...]
    """additionalPrinterColumns: what `kubectl get` shows."""
    generated_by: str
    short_names: tuple[str, ...] = ()
    rules: tuple[Schema, ...] = ()
    """x-kubernetes-validations on the whole object (its name), which no spec model can carry."""

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"


_ERROR_CONDITION = '.status.conditions[?(@.type=="Error")]'
_REASON = {"name": "Reason", "type": "string", "jsonPath": f"{_ERROR_CONDITION}.reason"}
_MESSAGE = {"name": "Message", "type": "string", "priority": 1, "jsonPath": f"{_ERROR_CONDITION}.message"}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

CLUSTER_POLICY = Resource(
    kind=KIND,
    plural=PLURAL,
    version=VERSION,
    spec=ClusterPolicySpec,
    status=ClusterPolicyStatus,
    description=(
        "ClusterPolicy is the desired state of the NVIDIA GPU software stack (driver, container "
        "toolkit, device plugin, DCGM, DCGM exporter, GPU Feature Discovery, MIG manager, "
        "validator) on every GPU node of the cluster. One ClusterPolicy is active; any further one "
        "is ignored (status.state: ignored)."
    ),
    columns=(
        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
        {"name": "GPU Nodes", "type": "integer", "jsonPath": ".status.gpuNodes"},
        {"name": "Components", "type": "string", "jsonPath": ".status.componentsReady"},
        {"name": "Driver Upgrade", "type": "string", "jsonPath": ".status.driverUpgrade.summary"},
        _REASON,
        _MESSAGE,
        _AGE,
    ),
    generated_by=GENERATED_BY,
)

NVIDIA_DRIVER = Resource(
    kind=nvidiadriver.KIND,
    plural=nvidiadriver.PLURAL,
    version=nvidiadriver.VERSION,
    spec=nvidiadriver.NVIDIADriverSpec,
    status=nvidiadriver.NVIDIADriverStatus,
    description=(
        "NVIDIADriver is one NVIDIA driver (type, image, settings) for a pool of GPU nodes: the nodes its "
        "nodeSelector selects or, for the default driver, every GPU node no other NVIDIADriver selects. "
        "NVIDIA's operator deploys NVIDIADrivers instead of the ClusterPolicy's driver when the "
        "ClusterPolicy sets driver.useNvidiaDriverCRD."
    ),
    columns=(
        # Its state, its nodes, which driver, its upgrade and why it is not ready.
        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
        # Ours: NVIDIA's status has no node counts.
        {"name": "Ready", "type": "integer", "jsonPath": ".status.nodesReady"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.nodesDesired"},
        {"name": "Default", "type": "boolean", "jsonPath": ".spec.default"},
        {"name": "Type", "type": "string", "jsonPath": ".spec.driverType"},
        {"name": "Version", "type": "string", "jsonPath": ".spec.version"},
        # Ours, as the ClusterPolicy's: status.driverUpgrade is not in NVIDIA's status.
        {"name": "Driver Upgrade", "type": "string", "jsonPath": ".status.driverUpgrade.summary"},
        _REASON,
        _MESSAGE,
        _AGE,
    ),
    generated_by=(
        "gpu-operator crd nvidiadriver (gpu_operator/api/crd.py) from gpu_operator/api/nvidiadriver.py"
    ),
    short_names=nvidiadriver.SHORT_NAMES,
)

GPU_CLUSTER = Resource(
    kind=gpucluster.KIND,
    plural=gpucluster.PLURAL,
    version=gpucluster.VERSION,
    spec=gpucluster.GPUClusterSpec,
    status=gpucluster.GPUClusterStatus,
    description=(
        "GPUCluster is the desired state of the GPU stack based on Dynamic Resource Allocation: NVIDIA's "
        "DRA driver for GPUs and ComputeDomains, its DeviceClasses, DCGM, DCGM exporter and the DRA "
        "validator, on the GPU nodes its nodeSelector selects (all of them without one). Those nodes get "
        "no device plugin from the ClusterPolicy. A singleton named gpu-cluster."
    ),
    columns=(
        {"name": "Status", "type": "string", "jsonPath": ".status.state"},
        _REASON,
        _MESSAGE,
        _AGE,
    ),
    generated_by="gpu-operator crd gpucluster (gpu_operator/api/crd.py) from gpu_operator/api/gpucluster.py",
    short_names=gpucluster.SHORT_NAMES,
    rules=({"rule": gpucluster.SINGLETON_RULE, "message": gpucluster.SINGLETON_MESSAGE},),
)

RESOURCES = {"clusterpolicy": CLUSTER_POLICY, "nvidiadriver": NVIDIA_DRIVER, "gpucluster": GPU_CLUSTER}
"""The CRDs the operator keeps current (and creates, with operator.createCRD), by the name of its file in
crds/."""

SHIPPED = dict(RESOURCES)
"""Every CRD this operator defines, by the name of its file in crds/ and the chart (and of `gpu-operator
crd NAME`)."""


def spec_schema(resource: Resource = CLUSTER_POLICY) -> Schema:
    schema = structural(resource.spec.model_json_schema(mode="validation", by_alias=True))
    # NVIDIA's ClusterPolicy CRD requires nine spec sections (operator, daemonsets, driver, ...). We
    # require none: every field has NVIDIA's default, so `spec: {}` is complete, and a required list
    # here would reject the short policies NVIDIA's own docs and the seed article show. (Its NVIDIADriver
    # CRD requires `default`, `driverType` and `image`, each with a default: the same as none.)
    schema.pop("required", None)
    return schema


def status_schema(resource: Resource = CLUSTER_POLICY) -> Schema:
    return structural(resource.status.model_json_schema(mode="validation", by_alias=True))


def definition(resource: Resource) -> Schema:
    """The CustomResourceDefinition object of `resource`."""
    names: Schema = {
        "kind": resource.kind,
        "listKind": f"{resource.kind}List",
        "plural": resource.plural,
        "singular": resource.kind.lower(),
    }
    if resource.short_names:
        names["shortNames"] = list(resource.short_names)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": resource.name,
            "annotations": {"gpu-operator.nvidia.com/generated-by": resource.generated_by},
            "labels": {"app.kubernetes.io/name": "gpu-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": "Cluster",
            "versions": [
                {
                    "name": resource.version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(column) for column in resource.columns],
                    "schema": {"openAPIV3Schema": _root(resource)},
                }
            ],
        },
    }


def _root(resource: Resource) -> Schema:
    rules = {"x-kubernetes-validations": [dict(rule) for rule in resource.rules]} if resource.rules else {}
    return {
        **rules,
        "description": resource.description,
        "type": "object",
        "properties": {
            "apiVersion": {
                "description": "Versioned schema of this representation of an object.",
                "type": "string",
            },
            "kind": {"description": "The REST resource this object represents.", "type": "string"},
            "metadata": {"type": "object"},
            # Nullable: server-side apply of `spec: {}` over a non-empty spec stores null, and an
            # empty spec means "all defaults" (the operator reads null as {}).
            "spec": {**spec_schema(resource), "nullable": True},
            "status": status_schema(resource),
        },
    }


class _PlainDumper(yaml.SafeDumper):
    """Writes a value that the schema shares between fields (an inlined model's `required`, an enum)
    again in each place, not as a YAML anchor and alias: a CRD is read by people and by tools that
    handle aliases poorly."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def definition_yaml(resource: Resource) -> str:
    """The CRD as YAML, keys sorted so that the output is stable, with a generated-by header."""
    header = (
        f"# Generated by {resource.generated_by}.\n# Do not edit: change the models and run `make crd`.\n"
    )
    body = yaml.dump(definition(resource), Dumper=_PlainDumper, sort_keys=True, allow_unicode=True, width=100)
    return header + body


def crd() -> Schema:
    """The ClusterPolicy CustomResourceDefinition."""
    return definition(CLUSTER_POLICY)


def crd_yaml() -> str:
    """The ClusterPolicy CRD as YAML (`crds/clusterpolicy.yaml`)."""
    return definition_yaml(CLUSTER_POLICY)
