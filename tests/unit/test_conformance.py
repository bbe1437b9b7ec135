"""Conformance: `gpu-operator render` against the objects NVIDIA's own controller renders.

Each case is a file `nvidia/<case>.<variant>.yaml` of the conformance directory
(tests/data/nvidia-conformance, or `$NVIDIA_CONFORMANCE_DIR` with the same layout: policies/, nodes/,
nvidia/, optionally configmaps/). It is rendered from `policies/<case>.yaml` for the node in
`nodes/<node>.yaml`, where the variant is `<node>` or `<node>-noprom` (a cluster without the
Prometheus operator's ServiceMonitor CRD), with the ConfigMaps of `configmaps/<case>.yaml` (a List,
when there is one: those NVIDIA's API server held, passed as `--config-maps`).

Compared is what NVIDIA's images and the cluster read: object kinds and names; DaemonSet selectors, node
selectors, tolerations and update strategy; pod host namespaces, runtime class, ServiceAccount and
shareProcessNamespace; containers and init containers (names and order), their images, commands, args,
env, envFrom, probe and preStop handlers, ports, privileged, and every volume mount with its volume source,
readOnly, propagation and subPath, their resource claims; ConfigMap data; Services, ServiceMonitors,
RuntimeClasses; the whole spec of DeviceClasses, ResourceClaimTemplates and admission policies (the
GPUCluster's), a Deployment's pod as a DaemonSet's; and the effective RBAC of every ServiceAccount (the
rules of all Roles and ClusterRoles bound to it). Labels, annotations (except the CDI ones the NRI plugin
reads), field order, resources and probe timings may differ.

Every deliberate difference is a rule in deliberate-differences.yaml, with its reason; a rule that matches
nothing in the cases it applies to fails too, so the file never keeps stale entries.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_operator import cli
from gpu_operator.api import parse_document
from gpu_operator.api.crd import crd
from gpu_operator.api.gpucluster import parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import parse_driver_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.driver_pool_render import render_pools
from gpu_operator.core.gpucluster_render import FOLDERS as GPUCLUSTER_FOLDERS
from gpu_operator.core.gpucluster_render import render_gpucluster
from gpu_operator.core.render import ClusterFacts, Variant

Obj = dict[str, Any]
Fields = dict[tuple[str, str], Any]
"""(container name or "", field) → normalized value."""

REPO_DIR = Path(__file__).resolve().parents[1] / "data" / "nvidia-conformance"
DIFFERENCES = REPO_DIR / "deliberate-differences.yaml"
FLAGS = {"noprom": "--no-servicemonitor-crd"}


class Absent:
    def __repr__(self) -> str:
        return "absent"


ABSENT: Any = Absent()


# --- cases ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    directory: Path
    name: str
    """`<case>.<variant>`, e.g. b-chart-default.containerd-noprom."""

    @property
    def policy(self) -> Path:
        return self.directory / "policies" / f"{self.name.split('.')[0]}.yaml"

    @property
    def node(self) -> Path:
        return self.directory / "nodes" / f"{self.variant[0]}.yaml"

    @property
    def config_maps(self) -> Path:
        """The ConfigMaps the policy names (a List), in the fake API server NVIDIA's controller ran on."""
        return self.directory / "configmaps" / f"{self.name.split('.')[0]}.yaml"

    @property
    def variant(self) -> list[str]:
        return self.name.split(".", 1)[1].split("-")

    @property
    def expected(self) -> Path:
        return self.directory / "nvidia" / f"{self.name}.yaml"


def cases_in(directory: Path) -> list[Case]:
    return [
        Case(directory, p.name.removesuffix(".yaml")) for p in sorted((directory / "nvidia").glob("*.yaml"))
    ]


SELECTED = Path(os.environ.get("NVIDIA_CONFORMANCE_DIR") or REPO_DIR)
CASES = cases_in(SELECTED)


# libyaml's loader where PyYAML has it: the cases are thousands of lines each.
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(text: str) -> list[Obj]:
    return [d for d in yaml.load_all(text, Loader=LOADER) if d]


def render(case: Case) -> list[Obj]:
    """Our objects, through the CLI exactly as a user runs it."""
    unknown = [flag for flag in case.variant[1:] if flag not in FLAGS]
    assert not unknown, f"{case.name}: unknown variant {unknown}; known: {sorted(FLAGS)}"
    argv = ["render", "-f", str(case.policy), "--nodes", str(case.node)]
    argv += [FLAGS[flag] for flag in case.variant[1:]]
    if case.config_maps.exists():
        argv += ["--config-maps", str(case.config_maps)]
    args = cli.build_parser({}).parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = args.handler(args, out, err)
    assert code == cli.EXIT_OK, f"{case.name}: render failed: {err.getvalue()}"
    return documents(out.getvalue())


# --- what is compared -----------------------------------------------------------------------------


def _path(path: str) -> str:
    return path.rstrip("/") or "/"


def _source(volume: Mapping[str, Any] | None) -> Any:
    """A volume's source, with Kubernetes' defaults filled in so that equal sources compare equal."""
    if volume is None:
        return "no such volume"
    if "hostPath" in volume:
        return {"hostPath": _path(volume["hostPath"]["path"]), "type": volume["hostPath"].get("type") or ""}
    for kind, name_key in (("configMap", "name"), ("secret", "secretName")):
        if kind in volume:
            source = volume[kind]
            items = sorted(source.get("items") or [], key=lambda item: item["key"])
            return {
                kind: source.get(name_key),
                "items": items,
                "defaultMode": source.get("defaultMode", 0o644),
            }
    if "emptyDir" in volume:
        return {"emptyDir": (volume["emptyDir"] or {}).get("medium", "")}
    return {key: value for key, value in volume.items() if key != "name"}


BOTH_VALUE_AND_VALUE_FROM = "value and valueFrom: the API server refuses the pod template"


def _env_value(entry: Mapping[str, Any]) -> Any:
    if "valueFrom" not in entry:
        return entry.get("value", "")
    if entry.get("value"):
        return BOTH_VALUE_AND_VALUE_FROM
    source = dict(entry["valueFrom"])
    if "fieldRef" in source:
        return {"fieldRef": source["fieldRef"]["fieldPath"]}
    return source


def _handler(handler: Mapping[str, Any] | None) -> Any:
    if not handler:
        return ABSENT
    if "exec" in handler:
        return {"exec": handler["exec"].get("command")}
    if "httpGet" in handler:
        get = handler["httpGet"]
        return {"httpGet": get.get("path"), "port": get.get("port"), "scheme": get.get("scheme", "HTTP")}
    if "tcpSocket" in handler:
        return {"tcpSocket": handler["tcpSocket"].get("port")}
    return dict(handler)


def _container(ctr: Mapping[str, Any], volumes: Mapping[str, Any]) -> Fields:
    name = ctr["name"]
    fields: Fields = {
        (name, "image"): ctr.get("image"),
        (name, "imagePullPolicy"): ctr.get("imagePullPolicy"),
        # Absent and empty are told apart: `args: []` replaces the image's arguments (with a `command`
        # of `sh -c` it leaves a shell with nothing to run), where NVIDIA's render keeps them.
        (name, "command"): ctr.get("command", ABSENT),
        (name, "args"): ctr.get("args", ABSENT),
        (name, "envFrom"): ctr.get("envFrom") or [],
        (name, "privileged"): bool((ctr.get("securityContext") or {}).get("privileged")),
        (name, "preStop"): _handler((ctr.get("lifecycle") or {}).get("preStop")),
    }
    for kind in ("startup", "liveness", "readiness"):
        fields[(name, f"probe {kind}")] = _handler(ctr.get(f"{kind}Probe"))
    claims = (ctr.get("resources") or {}).get("claims")
    if claims:
        fields[(name, "claims")] = claims
    for entry in ctr.get("env") or []:
        key = (name, f"env {entry['name']}")
        assert key not in fields, f"container {name}: env {entry['name']} set twice"
        fields[key] = _env_value(entry)
    for port in ctr.get("ports") or []:
        fields[(name, f"port {port['containerPort']}")] = {
            "name": port.get("name", ""),
            "hostPort": port.get("hostPort", 0),
            "protocol": port.get("protocol", "TCP"),
        }
    for mount in ctr.get("volumeMounts") or []:
        path = _path(mount["mountPath"])
        fields[(name, f"mount {path}")] = _source(volumes.get(mount["name"]))
        fields[(name, f"mount {path} readOnly")] = bool(mount.get("readOnly"))
        fields[(name, f"mount {path} mountPropagation")] = mount.get("mountPropagation", "None")
        fields[(name, f"mount {path} subPath")] = mount.get("subPath", "")
    return fields


POD_DEFAULTS: dict[str, Any] = {
    "hostPID": False,
    "hostNetwork": False,
    "hostIPC": False,
    "runtimeClassName": ABSENT,
    "serviceAccountName": "default",
    "shareProcessNamespace": False,
    "priorityClassName": ABSENT,
    "automountServiceAccountToken": True,
}
CDI_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/"


def _daemonset(obj: Obj) -> Fields:
    spec = obj["spec"]
    template = spec["template"]
    pod = template["spec"]
    fields: Fields = {("", f"selector {k}"): v for k, v in spec["selector"]["matchLabels"].items()}
    # A Deployment's `strategy` (the GPUCluster's ComputeDomain controller) reads as a DaemonSet's.
    strategy = spec.get("updateStrategy") or spec.get("strategy") or {}
    fields[("", "updateStrategy")] = strategy.get("type", "RollingUpdate")
    if "replicas" in spec:
        fields[("", "replicas")] = spec["replicas"]
    if pod.get("resourceClaims"):
        fields[("", "resourceClaims")] = pod["resourceClaims"]
    fields.update((("", f"nodeSelector {k}"), v) for k, v in (pod.get("nodeSelector") or {}).items())
    fields[("", "tolerations")] = pod.get("tolerations") or []
    fields.update((("", name), pod.get(name, default)) for name, default in POD_DEFAULTS.items())
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    fields.update(
        (("", f"annotation {k}"), v) for k, v in annotations.items() if k.startswith(CDI_ANNOTATION_PREFIX)
    )
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for kind in ("initContainers", "containers"):
        fields[("", kind)] = [c["name"] for c in pod.get(kind) or []]
        for ctr in pod.get(kind) or []:
            fields.update(_container(ctr, volumes))
    return fields


def _config_data(key: str, value: str) -> Any:
    if key.endswith((".yaml", ".yml", ".json")):
        return yaml.safe_load(value)
    if key.endswith(".sh"):
        return {"interpreter": value.splitlines()[0] if value else ""}
    return value


def _service(obj: Obj) -> Fields:
    spec = obj["spec"]
    fields: Fields = {
        ("", "type"): spec.get("type", "ClusterIP"),
        ("", "internalTrafficPolicy"): spec.get("internalTrafficPolicy", "Cluster"),
    }
    fields.update((("", f"selector {k}"), v) for k, v in (spec.get("selector") or {}).items())
    for port in spec.get("ports") or []:
        fields[("", f"port {port.get('name', '')}")] = {
            "port": port["port"],
            # The API server defaults an absent (or zero, in NVIDIA's dump) targetPort to the port.
            "targetPort": port.get("targetPort") or port["port"],
            "protocol": port.get("protocol", "TCP"),
        }
    return fields


def _service_monitor(obj: Obj) -> Fields:
    spec = obj["spec"]
    fields: Fields = {
        (("", key)): spec.get(key, ABSENT) for key in ("jobLabel", "selector", "namespaceSelector")
    }
    for endpoint in spec.get("endpoints") or []:
        # Prometheus' defaults: no relabelings, honorLabels false.
        normalized = {k: v for k, v in endpoint.items() if v not in ([], False, None)}
        fields[("", f"endpoint {endpoint.get('port', '')}")] = normalized
    # Prometheus selects ServiceMonitors by label: NVIDIA's labels must be there; extra ones are ours.
    fields.update((("", f"label {k}"), v) for k, v in (obj["metadata"].get("labels") or {}).items())
    return fields


WHOLE_SPEC_KINDS = frozenset(
    {"DeviceClass", "ResourceClaimTemplate", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
)
"""The GPUCluster's objects whose whole spec is what the API server and the DRA driver read."""


def fields_of(obj: Obj) -> Fields:
    kind = obj["kind"]
    if kind in ("DaemonSet", "Deployment"):
        return _daemonset(obj)
    if kind in WHOLE_SPEC_KINDS:
        return {("", "spec"): obj.get("spec")}
    if kind == "ConfigMap":
        return {("", f"data {k}"): _config_data(k, v) for k, v in (obj.get("data") or {}).items()}
    if kind == "Service":
        return _service(obj)
    if kind == "ServiceMonitor":
        return _service_monitor(obj)
    if kind == "RuntimeClass":
        return {("", "handler"): obj.get("handler")}
    return {}


# --- effective RBAC -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    cluster: bool
    """Cluster-wide (a ClusterRole bound by a ClusterRoleBinding), else in the operand namespace."""
    group: str
    resource: str
    name: str
    verb: str

    def covers(self, other: Grant) -> bool:
        return (
            (self.cluster or not other.cluster)
            and self.group in (other.group, "*")
            and self.resource in (other.resource, "*")
            and self.name in ("", other.name)
            and self.verb in (other.verb, "*")
        )

    def __str__(self) -> str:
        where = "cluster" if self.cluster else "namespace"
        name = f"/{self.name}" if self.name else ""
        return f"{where} {self.group or 'core'}/{self.resource}{name} {self.verb}"


def grants(objects: Iterable[Obj]) -> dict[str, set[Grant]]:
    """ServiceAccount name → every permission its bindings give it."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("Role", "ClusterRole")}
    result: dict[str, set[Grant]] = {
        o["metadata"]["name"]: set() for o in objects if o["kind"] == "ServiceAccount"
    }
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = roles.get((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
        cluster = binding["kind"] == "ClusterRoleBinding"
        for subject in binding.get("subjects") or []:
            if subject.get("kind") != "ServiceAccount" or role is None:
                continue
            found = result.setdefault(subject["name"], set())
            for rule in role.get("rules") or []:
                found.update(
                    Grant(cluster, group, resource, name, verb)
                    for group in rule.get("apiGroups") or [""]
                    for resource in rule.get("resources") or []
                    for name in rule.get("resourceNames") or [""]
                    for verb in rule.get("verbs") or []
                )
    return result


# --- differences ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    object: str
    """Kind/name."""
    container: str
    field: str
    nvidia: Any
    ours: Any

    def __str__(self) -> str:
        where = f" [{self.container}]" if self.container else ""
        if isinstance(self.nvidia, dict) and isinstance(self.ours, dict):
            how = _dict_difference(self.nvidia, self.ours)
        else:
            how = f"NVIDIA {_show(self.nvidia)}, ours {_show(self.ours)}"
        return f"{self.object}{where} {self.field}: {how}"


SHOWN = 400


def _show(value: Any) -> str:
    text = "absent" if value is ABSENT else json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _dict_difference(nvidia: dict[str, Any], ours: dict[str, Any]) -> str:
    """Large mappings (a ConfigMap's YAML, a volume source): name what differs, key by key."""
    parts = [
        f"{key}: NVIDIA {_show(nvidia.get(key, ABSENT))}, ours {_show(ours.get(key, ABSENT))}"
        for key in sorted(set(nvidia) | set(ours))
        if nvidia.get(key, ABSENT) != ours.get(key, ABSENT)
    ]
    return "; ".join(parts)


def _parent(field: str) -> str | None:
    """`mount /x readOnly` belongs to `mount /x`: when the mount itself is missing, say it once."""
    parts = field.split(" ")
    return " ".join(parts[:2]) if len(parts) > 2 else None


def _compare(key: str, nvidia: Fields, ours: Fields) -> list[Difference]:
    theirs_ctrs = set(nvidia.get(("", "initContainers"), []) + nvidia.get(("", "containers"), []))
    our_ctrs = set(ours.get(("", "initContainers"), []) + ours.get(("", "containers"), []))
    found = []
    for container, field in sorted(set(nvidia) | set(ours)):
        if container and not (container in theirs_ctrs and container in our_ctrs):
            continue  # the container lists already differ
        parent = _parent(field)
        if parent and ((container, parent) in nvidia) != ((container, parent) in ours):
            continue
        a, b = nvidia.get((container, field), ABSENT), ours.get((container, field), ABSENT)
        if field.startswith("label ") and a is ABSENT:
            continue
        if a != b:
            found.append(Difference(key, container, field, a, b))
    return found


def differences(nvidia_objects: list[Obj], our_objects: list[Obj]) -> list[Difference]:
    def by_key(objects: list[Obj]) -> dict[str, Obj]:
        return {f"{o['kind']}/{o['metadata']['name']}": o for o in objects}

    theirs, ours = by_key(nvidia_objects), by_key(our_objects)
    found: list[Difference] = []
    for key in sorted(set(theirs) | set(ours)):
        if key not in ours or key not in theirs:
            found.append(
                Difference(
                    key,
                    "",
                    "object",
                    "present" if key in theirs else ABSENT,
                    "present" if key in ours else ABSENT,
                )
            )
            continue
        found.extend(_compare(key, fields_of(theirs[key]), fields_of(ours[key])))
    their_grants, our_grants = grants(nvidia_objects), grants(our_objects)
    for account in sorted(set(their_grants) & set(our_grants)):
        mine, expected = our_grants[account], their_grants[account]
        for grant in sorted(expected, key=str):
            if not any(g.covers(grant) for g in mine):
                found.append(Difference(f"ServiceAccount/{account}", "", f"rbac {grant}", "granted", ABSENT))
        for grant in sorted(mine, key=str):
            if not any(g.covers(grant) for g in expected):
                found.append(Difference(f"ServiceAccount/{account}", "", f"rbac {grant}", ABSENT, "granted"))
    return found


# --- deliberate differences -----------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    object: str
    field: str
    reason: str
    container: str = "*"
    nvidia: Any = None
    ours: Any = None
    """None: any value; "absent"/"present"; else the exact (normalized) value."""
    when: str | None = None
    """A policy field (dotted path in the spec, e.g. hostPaths.kubeletRootDir): the rule applies only to
    cases whose policy sets it (to a value that is neither empty nor false nor the default); where no
    case does, the rule is kept for NVIDIA's further documented cases."""

    def matches(self, diff: Difference) -> bool:
        return (
            fnmatch.fnmatchcase(diff.object, self.object)
            and fnmatch.fnmatchcase(diff.container, self.container)
            and fnmatch.fnmatchcase(diff.field, self.field)
            and _value_matches(self.nvidia, diff.nvidia)
            and _value_matches(self.ours, diff.ours)
        )

    def applies(self, case: Case) -> bool:
        if self.when is None:
            return True
        value = _field(policy_of(case), self.when)
        return bool(value) and value != _field(DEFAULT_SPEC, self.when)

    def __str__(self) -> str:
        when = f" when {self.when} is set" if self.when else ""
        return (
            f"{self.object} [{self.container}] {self.field} (nvidia: {self.nvidia}, ours: {self.ours}){when}"
        )


DEFAULT_SPEC = ClusterPolicySpec()


@cache
def policy_of(case: Case) -> ClusterPolicySpec:
    return parse_document(yaml.safe_load(case.policy.read_text()))


def _field(spec: ClusterPolicySpec, path: str) -> Any:
    value: Any = spec
    for part in path.split("."):
        value = getattr(value, part, None)
    return value


def _value_matches(expected: Any, value: Any) -> bool:
    if expected is None:
        return True
    if expected == "absent":
        return value is ABSENT
    if expected == "present":
        return value is not ABSENT
    return bool(expected == value)


@cache
def rules() -> tuple[Rule, ...]:
    entries = yaml.safe_load(DIFFERENCES.read_text()) or []
    loaded = []
    for index, entry in enumerate(entries):
        assert isinstance(entry, dict), f"{DIFFERENCES.name} entry {index}: not a mapping"
        assert str(entry.get("reason", "")).strip(), f"{DIFFERENCES.name} entry {index}: no reason"
        loaded.append(Rule(**entry))
    return tuple(loaded)


@cache
def case_differences(case: Case) -> tuple[Difference, ...]:
    expected = documents(case.expected.read_text())
    return tuple(differences(expected, render(case)))


def explained(case: Case, diff: Difference) -> bool:
    return any(r.applies(case) and r.matches(diff) for r in rules())


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_render_matches_nvidia(case: Case) -> None:
    unexplained = [d for d in case_differences(case) if not explained(case, d)]
    assert not unexplained, (
        f"{case.name}: {len(unexplained)} differences from NVIDIA's objects that no rule of "
        f"{DIFFERENCES.relative_to(REPO_DIR.parents[2])} explains (fix the templates, or add a rule "
        "with its reason):\n  " + "\n  ".join(map(str, unexplained))
    )


def test_every_deliberate_difference_is_still_needed() -> None:
    every = list({c.name: c for c in cases_in(REPO_DIR) + CASES}.values())
    # A rule for any case is needed when it explains a difference of NVIDIA's golden driver renders too.
    drivers = [d for case in DRIVER_CASES for d in driver_case_differences(case)]
    drivers += [d for case in GPUCLUSTER_CASES for d in gpucluster_case_differences(case.name)]
    stale = [
        str(rule)
        for rule in rules()
        if (applying := [c for c in every if rule.applies(c)])
        and not any(rule.matches(d) for c in applying for d in case_differences(c))
        and not (rule.when is None and any(rule.matches(d) for d in drivers))
    ]
    assert not stale, "rules that match no difference in any case (remove them):\n  " + "\n  ".join(stale)


def test_cases_cover_every_component() -> None:
    rendered = {
        o["metadata"]["name"] for case in cases_in(REPO_DIR) for o in documents(case.expected.read_text())
    }
    assert {c.daemonset for c in COMPONENTS} <= rendered


# --- empty lists and maps -------------------------------------------------------------------------

CHART_VALUES_VERBATIM = REPO_DIR.parent / "nvidia" / "chart-values-verbatim.yaml"
SPEC_SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _empty(schema: Mapping[str, Any]) -> Any:
    """The empty value of a nullable list or map field (None for any other field): NVIDIA's operator
    acts on these only when they have content. A field holding only such fields (resources) gets
    them all empty."""
    if not schema.get("nullable"):
        return None
    if schema.get("type") == "array":
        return []
    if schema.get("type") != "object":
        return None
    properties = schema.get("properties")
    if not properties:
        return {}
    inner = {name: _empty(prop) for name, prop in properties.items()}
    return inner if all(value in ([], {}) for value in inner.values()) else None


def with_empties(
    schema: Mapping[str, Any], value: Mapping[str, Any], path: str = "spec"
) -> tuple[Obj, list[str]]:
    """`value` with every list or map field it leaves out given empty, in every section it has."""
    result, added = dict(value), []
    for name, prop in (schema.get("properties") or {}).items():
        if name not in value:
            empty = _empty(prop)
            if empty is not None:
                result[name] = empty
                added.append(f"{path}.{name}")
        elif isinstance(value[name], Mapping) and prop.get("properties"):
            result[name], inner = with_empties(prop, value[name], f"{path}.{name}")
            added += inner
    return result, added


def case_with_policy(case: Case, policy: Mapping[str, Any], directory: Path) -> Case:
    """The same case (node, ConfigMaps, NVIDIA's objects) with another policy."""
    for name in ("nodes", "nvidia", "configmaps"):
        if (case.directory / name).exists():
            (directory / name).symlink_to(case.directory / name)
    (directory / "policies").mkdir()
    (directory / "policies" / f"{case.name.split('.')[0]}.yaml").write_text(yaml.safe_dump(dict(policy)))
    return Case(directory, case.name)


def test_nvidias_values_as_they_are_render_as_nvidias_chart_default(tmp_path: Path) -> None:
    case = Case(REPO_DIR, "b-chart-default.containerd")
    policy = yaml.safe_load(CHART_VALUES_VERBATIM.read_text())
    assert policy["spec"]["devicePlugin"]["args"] == [] and policy["spec"]["validator"]["args"] == []
    ours = case_with_policy(case, policy, tmp_path)
    assert differences(documents(case.expected.read_text()), render(ours)) == list(case_differences(case))


# One case per operand: every DaemonSet NVIDIA renders is in one of them.
EMPTY_CASES = ("b-chart-default.containerd", "c-dcgm-nse.containerd", "c-gds-gdrcopy.containerd")


@pytest.mark.parametrize("name", EMPTY_CASES)
def test_empty_lists_and_maps_render_as_if_unset(name: str, tmp_path: Path) -> None:
    case = Case(REPO_DIR, name)
    policy = yaml.safe_load(case.policy.read_text())
    policy["spec"], added = with_empties(SPEC_SCHEMA, policy["spec"])
    assert {"spec.devicePlugin.args", "spec.dcgm.args", "spec.daemonsets.annotations"} <= set(added)
    assert {"spec.gds.args", "spec.validator.resources", "spec.driver.manager.env"} <= set(added)
    ours = case_with_policy(case, policy, tmp_path)
    assert differences(documents(case.expected.read_text()), render(ours)) == list(case_differences(case))


# --- NVIDIADriver: NVIDIA's golden driver renders -------------------------------------------------

DRIVER_DIR = REPO_DIR / "nvidiadriver"
"""NVIDIA's golden files of internal/state/driver_test.go (golden/) and the spec of each (cases.yaml)."""


@dataclass(frozen=True, eq=False)
class DriverCase:
    name: str
    spec: Mapping[str, Any]
    variant: Variant
    injected: bool
    """NVIDIA's test adds volumes no spec field produces (explained by cases.yaml's `harness` rules)."""

    @property
    def expected(self) -> Path:
        return DRIVER_DIR / "golden" / f"{self.name}.yaml"


def _driver_cases() -> list[DriverCase]:
    data = yaml.safe_load((DRIVER_DIR / "cases.yaml").read_text())
    found = []
    for name, case in data["cases"].items():
        spec = case.get("spec") or {}
        if not case.get("replace"):
            spec = {**data["minimal"], **spec}
        pool = case.get("pool") or data["pool"]
        variant = Variant(
            pool["app"],
            "containerd",
            pool["os_tag"],
            pool.get("kernel"),
            node_selector=pool.get("node_selector") or {},
            app=pool["app"],
            account=pool["account"],
        )
        found.append(DriverCase(name, spec, variant, bool(case.get("injected"))))
    return found


DRIVER_CASES = _driver_cases()
DRIVER_NAMESPACE = "test-operator"


def render_driver_case(case: DriverCase) -> list[Obj]:
    spec = parse_driver_spec(case.spec)
    facts = ClusterFacts(namespace=DRIVER_NAMESPACE)
    # Through JSON, as the CLI prints it: the same values the API server would be sent.
    rendered: list[Obj] = json.loads(json.dumps(render_pools(spec, [case.variant], facts)))
    return rendered


def driver_case_differences(case: DriverCase) -> tuple[Difference, ...]:
    return _driver_differences(case.name)


@cache
def _driver_differences(name: str) -> tuple[Difference, ...]:
    case = next(c for c in DRIVER_CASES if c.name == name)
    return tuple(differences(documents(case.expected.read_text()), render_driver_case(case)))


@pytest.mark.parametrize("case", DRIVER_CASES, ids=[c.name for c in DRIVER_CASES])
def test_nvidiadriver_render_matches_nvidia(case: DriverCase) -> None:
    unexplained = [d for d in driver_case_differences(case) if not any(r.matches(d) for r in driver_rules())]
    assert not unexplained, (
        f"{case.name}: {len(unexplained)} differences from NVIDIA's golden render that no rule explains "
        "(fix the templates, or add a rule with its reason):\n  " + "\n  ".join(map(str, unexplained))
    )


@cache
def harness_rules() -> tuple[Rule, ...]:
    """cases.yaml's `harness`: what NVIDIA's Go tests put in the render data that no NVIDIADriver spec
    gives, so ours cannot render it; not differences of ours, kept apart from deliberate-differences.yaml."""
    entries = yaml.safe_load((DRIVER_DIR / "cases.yaml").read_text()).get("harness") or []
    for index, entry in enumerate(entries):
        assert str(entry.get("reason", "")).strip(), f"cases.yaml harness entry {index}: no reason"
    return tuple(Rule(**entry) for entry in entries)


def driver_rules() -> tuple[Rule, ...]:
    """The deliberate differences that hold for any case (`when` names ClusterPolicy fields), and the
    harness rules."""
    return tuple(r for r in rules() if r.when is None) + harness_rules()


def test_every_harness_rule_is_still_needed() -> None:
    every = [d for case in DRIVER_CASES for d in driver_case_differences(case)]
    stale = [str(rule) for rule in harness_rules() if not any(rule.matches(d) for d in every)]
    assert not stale, "harness rules that match no difference (remove them):\n  " + "\n  ".join(stale)


# --- GPUCluster: NVIDIA's golden DRA stack renders ------------------------------------------------

GPUCLUSTER_DIR = REPO_DIR / "gpucluster"
"""NVIDIA's golden files of internal/state/gpucluster_render_test.go (golden/) and the spec of each
(cases.yaml)."""


def _deep_merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> Obj:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@dataclass(frozen=True, eq=False)
class GPUClusterCase:
    name: str
    spec: Mapping[str, Any]
    states: tuple[str, ...]

    @property
    def expected(self) -> Path:
        return GPUCLUSTER_DIR / "golden" / f"{self.name}.yaml"


def _gpucluster_data() -> Obj:
    data: Obj = yaml.safe_load((GPUCLUSTER_DIR / "cases.yaml").read_text())
    return data


def _gpucluster_cases() -> list[GPUClusterCase]:
    data = _gpucluster_data()
    return [
        GPUClusterCase(name, _deep_merge(data["sample"], case.get("spec") or {}), tuple(case["states"]))
        for name, case in data["cases"].items()
    ]


GPUCLUSTER_CASES = _gpucluster_cases()


def render_gpucluster_case(case: GPUClusterCase) -> list[Obj]:
    data = _gpucluster_data()
    facts = ClusterFacts(namespace=data["namespace"], environ=data["environ"], service_monitor_crd=False)
    spec = parse_gpucluster_spec(case.spec)
    rendered: list[Obj] = json.loads(json.dumps(render_gpucluster(spec, facts, folders=case.states)))
    return rendered


def _affinity(objects: list[Obj]) -> Fields:
    """Where the GPUCluster's pods may run besides their node selector (the ClusterPolicy cases leave
    affinity out: NVIDIA's assets and ours place those pods by deploy labels alone)."""
    return {
        (f"{o['kind']}/{o['metadata']['name']}", "affinity"): o["spec"]["template"]["spec"].get(
            "affinity", ABSENT
        )
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment")
    }


@cache
def gpucluster_case_differences(name: str) -> tuple[Difference, ...]:
    case = next(c for c in GPUCLUSTER_CASES if c.name == name)
    expected, ours = documents(case.expected.read_text()), render_gpucluster_case(case)
    found = differences(expected, ours)
    theirs_affinity, our_affinity = _affinity(expected), _affinity(ours)
    for key in sorted(set(theirs_affinity) & set(our_affinity)):
        if theirs_affinity[key] != our_affinity[key]:
            found.append(Difference(key[0], "", key[1], theirs_affinity[key], our_affinity[key]))
    return tuple(found)


@pytest.mark.parametrize("case", GPUCLUSTER_CASES, ids=[c.name for c in GPUCLUSTER_CASES])
def test_gpucluster_render_matches_nvidia(case: GPUClusterCase) -> None:
    general = tuple(r for r in rules() if r.when is None)
    unexplained = [
        d for d in gpucluster_case_differences(case.name) if not any(r.matches(d) for r in general)
    ]
    assert not unexplained, (
        f"{case.name}: {len(unexplained)} differences from NVIDIA's golden render that no rule explains "
        "(fix the templates, or add a rule with its reason):\n  " + "\n  ".join(map(str, unexplained))
    )


def test_gpucluster_cases_cover_every_golden_file() -> None:
    golden = sorted(p.stem for p in (GPUCLUSTER_DIR / "golden").glob("*.yaml"))
    assert sorted(c.name for c in GPUCLUSTER_CASES) == golden
    assert {state for c in GPUCLUSTER_CASES for state in c.states} == set(GPUCLUSTER_FOLDERS)
