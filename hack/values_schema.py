"""Generate the chart's values.schema.json: the operand part from the pydantic models, the rest by hand.

The chart writes each top-level operand key (`driver`, `devicePlugin`, ...) into the ClusterPolicy's
spec the way NVIDIA's chart does, so those keys get the schema of the matching `ClusterPolicySpec`
field, plus what NVIDIA's values add there: chart-only keys (`config.create`/`data`,
`driver.nvidiaDriverCRD`), "" for an unset string of a section (the chart leaves it out) and numbers
for `version` (written as a string). A typo or a wrong type fails `helm install`/`helm template` with
the value's path, before anything reaches the cluster. The ClusterPolicy's own `spec.operator` comes
from NVIDIA's keys of the chart's `operator` section and from `clusterPolicy.operator`; the rest of
`operator` configures the operator's Deployment.

Helm 3.21 validates with santhosh-tekuri/jsonschema v6 (draft 2020-12 by default; `$defs`/`$ref`
work). Pydantic's titles and the CRD-only `x-kubernetes-*` keys are dropped; CEL rules are the API
server's job.

    python hack/values_schema.py            print the schema
    python hack/values_schema.py --write    write it to the chart (make chart-schema)
    python hack/values_schema.py --check    exit 1 when the committed file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpu_operator.api.gpucluster import DRADriverSpec
from gpu_operator.api.spec import ClusterPolicySpec

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_FILE = ROOT / "charts" / "gpu-operator" / "values.schema.json"

Schema = dict[str, Any]

# ClusterPolicySpec fields that are not top-level chart keys (see the module docstring).
NOT_TOP_LEVEL = ("operator",)
# NVIDIA's keys of the chart's `operator` section that go to the ClusterPolicy's spec.operator.
POLICY_OPERATOR_KEYS = ("runtimeClass", "defaultRuntime", "use_ocp_driver_toolkit")
# Sections that hold an image whose unset strings NVIDIA's values write as "" (left out by the chart).
_IMAGE_SECTIONS = ("DriverManagerSpec",)
# Keywords whose value maps names to schemas (not keywords themselves).
_NAME_MAPS = ("properties", "$defs", "patternProperties")

_STRING: Schema = {"type": "string"}
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_NAME: Schema = {"type": "string", "pattern": _DNS_SUBDOMAIN, "maxLength": 253}
"""An object name the API server requires to be a DNS-1123 subdomain."""
_NAME_OR_EMPTY: Schema = {"type": "string", "pattern": f"^$|{_DNS_SUBDOMAIN}", "maxLength": 253}
_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJECT: Schema = {"type": "object"}
_LIST_OF_OBJECTS: Schema = {"type": "array", "items": {"type": "object"}}
_QUANTITY: Schema = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "minLength": 1}]}
_RESOURCE_LIST: Schema = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"cpu": _QUANTITY, "memory": _QUANTITY, "ephemeral-storage": _QUANTITY},
}


def _strict(properties: Schema, description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": False,
        "properties": properties,
    }


# NVIDIA's chart-only keys inside operand sections: (section, sub-section or "", keys).
def _chart_only() -> tuple[tuple[str, str, Schema], ...]:
    create: Schema = {
        "type": "boolean",
        "description": "Create the ConfigMap `name` from `data` (NVIDIA's chart).",
    }
    return (
        (
            "devicePlugin",
            "config",
            {
                "create": create,
                "data": {**_STRING_MAP, "description": "Configurations by name (ConfigMap keys)."},
            },
        ),
        (
            "migManager",
            "config",
            {
                "create": create,
                "data": {**_STRING_MAP, "description": "config.yaml: mig-parted configurations."},
            },
        ),
        (
            "dcgmExporter",
            "config",
            {"create": create, "data": {"type": "string", "description": "The metrics CSV."}},
        ),
        (
            "driver",
            "",
            {
                "nvidiaDriverCRD": _strict(
                    {
                        "enabled": {
                            "type": "boolean",
                            "description": "Written as spec.driver.useNvidiaDriverCRD.",
                        },
                        "deployDefaultCR": {"type": "boolean"},
                        "driverType": {"enum": ["gpu", "vgpu", "vgpu-host-manager"]},
                        "nodeSelector": _STRING_MAP,
                    },
                    "NVIDIADriver objects: not supported by this operator (reported).",
                )
            },
        ),
    )


def _operator_spec_fields(model: Schema) -> Schema:
    """NVIDIA's keys of the `operator` section that go to the ClusterPolicy's spec.operator."""
    fields = model["$defs"]["OperatorSpec"]["properties"]
    return {name: fields[name] for name in POLICY_OPERATOR_KEYS}


def _nvidia_operator_keys() -> Schema:
    """NVIDIA's other keys of its `operator` section (its operator's Deployment), with their meaning here."""
    return {
        "repository": {
            "type": "string",
            "description": "NVIDIA's operator image registry: not used (this chart runs its own; reported).",
        },
        "version": {
            "type": ["string", "number"],
            "description": "NVIDIA's operator image tag: not used (reported).",
        },
        "imagePullPolicy": {
            "enum": ["Always", "IfNotPresent", "Never"],
            "description": "Replaces image.pullPolicy.",
        },
        "annotations": {**_STRING_MAP, "description": "Annotations of the operator's pod (NVIDIA's name)."},
        "labels": {**_STRING_MAP, "description": "Labels of every object of the chart (NVIDIA's name)."},
        "logging": _strict(
            {
                "timeEncoding": {"enum": ["epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano"]},
                "level": {
                    "anyOf": [
                        {"enum": ["debug", "info", "warn", "error", "dpanic", "panic", "fatal"]},
                        {"type": "integer", "minimum": 0},
                    ]
                },
                "develMode": {"type": "boolean"},
            },
            "NVIDIA's operator logging: level debug (or a number) means verbose, develMode plain logs.",
        ),
        "cleanupCRD": {"type": "boolean", "description": "Not done by this chart (reported)."},
        "upgradeCRD": {"type": "boolean", "description": "The operator keeps its CRD current anyway."},
        "defaultGPUMode": {
            "type": "string",
            "description": "Not a ClusterPolicy field: not used (reported).",
        },
    }


def operator_schema(model: Schema) -> Schema:
    """The chart's `operator` section: the operator's Deployment and image, and NVIDIA's keys."""
    image = _strict(
        {
            "repository": {
                "type": "string",
                "description": "Registry and path; empty means `name` is the whole image.",
            },
            "name": {"type": "string", "minLength": 1},
            "tag": {"type": "string", "description": "Empty means the chart's appVersion."},
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        },
        "The operator image: <repository>/<name>:<tag>.",
    )
    return _strict(
        {
            "image": {
                "anyOf": [
                    image,
                    {"type": "string", "description": "NVIDIA's operator image name: not used (reported)."},
                ]
            },
            "imagePullSecrets": {
                "type": "array",
                "items": {
                    "anyOf": [
                        _NAME,
                        {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["name"],
                            "properties": {"name": _NAME},
                        },
                    ]
                },
            },
            "replicas": {
                "type": "integer",
                "minimum": 0,
                "maximum": 10,
                "description": "Operator replicas (one leads, by a Lease; the others stand by); 0 "
                "installs only the CRD, RBAC and ClusterPolicy.",
            },
            "resources": _strict(
                {"requests": _RESOURCE_LIST, "limits": _RESOURCE_LIST}, "The operator container's resources."
            ),
            "nodeSelector": _STRING_MAP,
            "tolerations": _LIST_OF_OBJECTS,
            "affinity": _OBJECT,
            "priorityClassName": _NAME_OR_EMPTY,
            "logFormat": {"enum": ["plain", "full", "json"]},
            "port": {
                "type": "integer",
                "minimum": 1,
                "maximum": 65535,
                "description": "HTTP port of /metrics, /healthz and /readyz.",
            },
            "metrics": _strict(
                {
                    "service": _strict({"annotations": _STRING_MAP}, "The metrics Service."),
                    "serviceMonitor": _strict(
                        {
                            "enabled": {"type": "boolean"},
                            "interval": {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h))+$"},
                            "labels": _STRING_MAP,
                            "additionalLabels": {**_STRING_MAP, "description": "NVIDIA's name for labels."},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": _LIST_OF_OBJECTS,
                        },
                        "A ServiceMonitor (Prometheus operator) for the metrics Service.",
                    ),
                },
                "The operator's Prometheus metrics.",
            ),
            "verbose": {"type": "boolean", "description": "Debug logging."},
            "admissionPolicy": {
                "type": "boolean",
                "description": "Pin what the operator's token may create or change (admission policy).",
            },
            "createCRD": {
                "type": "boolean",
                "description": "Create the ClusterPolicy CRD when absent (it is kept current either way).",
            },
            "env": {
                "type": "array",
                "description": "Extra environment, e.g. image fallbacks such as DRIVER_IMAGE.",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string", "minLength": 1}, "value": _STRING},
                },
            },
            "podAnnotations": _STRING_MAP,
            "podLabels": _STRING_MAP,
            "serviceAccount": _strict(
                {
                    "create": {"type": "boolean"},
                    "name": {**_NAME_OR_EMPTY, "description": "Empty means the release's full name."},
                },
                "The operator's ServiceAccount.",
            ),
            **_operator_spec_fields(model),
            **_nvidia_operator_keys(),
        },
        "The operator's Deployment, and NVIDIA's keys of this section (runtimeClass, ...: spec.operator).",
    )


def cluster_policy_schema() -> Schema:
    return _strict(
        {
            "create": {"type": "boolean", "description": "Create the ClusterPolicy from these values."},
            "deployCR": {
                "type": "boolean",
                "description": "NVIDIA's name: created when create and deployCR.",
            },
            "name": _NAME,
            "operator": {
                "$ref": "#/$defs/OperatorSpec",
                "description": "The ClusterPolicy's spec.operator; wins over the same keys of `operator`.",
            },
        },
        "The ClusterPolicy this release creates.",
    )


def nfd_schema() -> Schema:
    return _strict(
        {
            "enabled": {
                "type": "boolean",
                "description": "Install Node Feature Discovery (the vendored chart) with this release.",
            },
            "nodefeaturerules": {
                "type": "boolean",
                "description": "A NodeFeatureRule labelling nodes with GPUDirect modules loaded (needs NFD).",
            },
        },
        "Node Feature Discovery (a dependency of the chart, as in NVIDIA's).",
    )


def node_discovery_schema() -> Schema:
    return {
        "enum": ["auto", "builtin", "nfd", "none"],
        "description": "How GPU nodes are found: auto (the node agent, idle while NFD is installed), "
        "builtin (the agent, always), nfd (NFD: nfd.enabled or separately), none (by hand).",
    }


def node_discovery_agent_schema() -> Schema:
    return _strict(
        {
            "rescanSeconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 86400,
                "description": "How often the agent reads sysfs again.",
            },
            "priorityClassName": _STRING,
            "resources": _strict(
                {"requests": _RESOURCE_LIST, "limits": _RESOURCE_LIST}, "The agent container's resources."
            ),
        },
        "The node discovery agent's DaemonSet (nodeDiscovery auto or builtin).",
    )


def gpucluster_schema() -> Schema:
    return _strict(
        {
            "deployCR": {
                "type": "boolean",
                "description": "Create the GPUCluster gpu-cluster from these values (draDriver, dcgm, "
                "dcgmExporter, hostPaths, daemonsets).",
            },
            "nodeSelector": {
                **_STRING_MAP,
                "description": "Its spec.nodeSelector (not in NVIDIA's chart): the GPU nodes moved to DRA; "
                "empty, every GPU node.",
            },
        },
        "NVIDIA's GPUCluster (DRA) CR.",
    )


def dra_driver_schema(model: Schema) -> Schema:
    """The chart's `draDriver` section: the GPUCluster's spec.draDriver, as NVIDIA's values write it
    (unset strings as "", `version` maybe a number). Its definitions join the model's."""
    dra: Schema = _clean(DRADriverSpec.model_json_schema())
    for name, definition in dra.pop("$defs", {}).items():
        if model["$defs"].setdefault(name, definition) != definition:
            raise SystemExit(f"DRADriverSpec's definition {name} differs from ClusterPolicySpec's")
    _nvidia_strings(dra)
    dra["description"] = "NVIDIA's DRA driver: the GPUCluster's spec.draDriver (gpuCluster.deployCR)."
    return dra


def cleanup_schema() -> Schema:
    return _strict(
        {
            "enabled": {"type": "boolean"},
            "timeoutSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        },
        "The pre-delete hook that deletes the ClusterPolicy while the operator can still clean up.",
    )


def doctor_schema() -> Schema:
    subject = {
        "type": "object",
        "required": ["kind", "name"],
        "properties": {
            "kind": {"enum": ["User", "Group", "ServiceAccount"]},
            "name": {"type": "string", "minLength": 1},
            "namespace": _STRING,
            "apiGroup": _STRING,
        },
        "additionalProperties": False,
    }
    return _strict(
        {
            "rbac": _strict(
                {"create": {"type": "boolean"}, "subjects": {"type": "array", "items": subject}},
                "The doctor's read-only ClusterRole and who it is bound to.",
            )
        },
        "`gpu-operator doctor`.",
    )


def _nullable_string(schema: Schema) -> bool:
    branches = schema.get("anyOf", [])
    return {"type": "null"} in branches and any(b.get("type") == "string" or "enum" in b for b in branches)


def _nvidia_strings(section: Schema) -> None:
    """NVIDIA's values write an unset string of a section as "" (the chart leaves it out) and may give
    `version` as a number (the chart writes it as a string)."""
    for name, prop in section.get("properties", {}).items():
        if _nullable_string(prop):
            prop["anyOf"].append({"const": ""})
        if name == "version" and "anyOf" in prop:
            prop["anyOf"].append({"type": "number"})


def _inline(model: Schema, schema: Schema) -> Schema:
    """A copy of the definition a property refers to (directly or as the non-null branch of anyOf), so
    keys can be added to it at this place only."""
    ref = schema.get("$ref") or next((b["$ref"] for b in schema.get("anyOf", []) if "$ref" in b), None)
    if ref is None:
        raise SystemExit(f"expected a reference to a section: {schema}")
    copy: Schema = json.loads(json.dumps(model["$defs"][ref.rsplit("/", 1)[1]]))
    return copy


def _nvidia_sections(model: Schema) -> None:
    """Turn the model's operand sections into NVIDIA's values sections (see the module docstring)."""
    top = model["properties"]
    for name in top:
        if name not in NOT_TOP_LEVEL:
            section = _inline(model, top[name])
            top[name] = {**section, "description": top[name].get("description", section.get("description"))}
            _nvidia_strings(top[name])
    for name in _IMAGE_SECTIONS:
        _nvidia_strings(model["$defs"][name])
    for name, sub, keys in _chart_only():
        target: Schema = top[name]
        if sub:
            inlined = _inline(model, target["properties"][sub])
            target["properties"][sub] = inlined
            target = inlined
        target["properties"].update(keys)


def _clean(schema: Any) -> Any:
    """Drop pydantic titles and CRD-only `x-kubernetes-*` keywords, recursively."""
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result: Schema = {}
    for key, value in schema.items():
        if key == "title" or key.startswith("x-kubernetes-"):
            continue
        if key in _NAME_MAPS and isinstance(value, dict):
            result[key] = {name: _clean(sub) for name, sub in value.items()}
        else:
            result[key] = _clean(value)
    return result


def values_schema() -> Schema:
    model: Schema = _clean(ClusterPolicySpec.model_json_schema())
    _nvidia_sections(model)
    operands = {name: sub for name, sub in model["properties"].items() if name not in NOT_TOP_LEVEL}
    properties: Schema = {
        "global": {"type": "object", "description": "Helm's global values (unused)."},
        "nameOverride": {"type": "string", "description": "Replaces the chart name in object names."},
        "fullnameOverride": {"type": "string", "description": "The name of the operator's objects."},
        "operator": operator_schema(model),
        "clusterPolicy": cluster_policy_schema(),
        "nodeDiscovery": node_discovery_schema(),
        "nodeDiscoveryAgent": node_discovery_agent_schema(),
        "nfd": nfd_schema(),
        "node-feature-discovery": {
            "type": "object",
            "description": "Values of the NFD subchart (nfd.enabled); its own schema checks them.",
        },
        "platform": _strict(
            {"openshift": {"type": "boolean", "description": "Not supported (reported when true)."}},
            "NVIDIA's platform switches.",
        ),
        "gpuCluster": gpucluster_schema(),
        "draDriver": dra_driver_schema(model),
        "extraObjects": {
            "type": "array",
            "description": "More manifests for the release; strings are rendered with `tpl`.",
            "items": {"anyOf": [{"type": "object"}, {"type": "string"}]},
        },
        "cleanup": cleanup_schema(),
        "doctor": doctor_schema(),
    }
    overlap = properties.keys() & operands.keys()
    if overlap:
        raise SystemExit(f"ClusterPolicySpec fields collide with chart keys: {sorted(overlap)}")
    properties.update(operands)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": "Generated by hack/values_schema.py (make chart-schema); do not edit.",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "$defs": model["$defs"],
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE.relative_to(ROOT)}")
    group.add_argument("--check", action="store_true", help="exit 1 when the committed file is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        SCHEMA_FILE.write_text(text)
    elif args.check:
        if not SCHEMA_FILE.is_file() or SCHEMA_FILE.read_text() != text:
            print(f"{SCHEMA_FILE.relative_to(ROOT)} is stale: run `make chart-schema`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
