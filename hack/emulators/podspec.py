"""The parts of a pod the emulators read, parsed once from the API object into small records.

Only what a kubelet and the images act on is kept (containers, env, mounts, volumes, probes, the
service account, owner references), so 9000 pods stay small in memory and the emulators never
depend on fields they did not look at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]

COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-operator"
APP_LABEL = "app"
NVIDIA_OPERANDS: Mapping[str, str] = {
    "nvidia-driver-daemonset": "nvidia-driver",
    "nvidia-container-toolkit-daemonset": "container-toolkit",
    "nvidia-operator-validator": "operator-validator",
    "nvidia-device-plugin-daemonset": "device-plugin",
    "nvidia-device-plugin-mps-control-daemon": "mps-control-daemon",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgm-exporter",
    "gpu-feature-discovery": "gpu-feature-discovery",
    "nvidia-mig-manager": "mig-manager",
    "nvidia-node-status-exporter": "node-status-exporter",
    "nvidia-vgpu-manager-daemonset": "vgpu-manager",
    "nvidia-vgpu-device-manager": "vgpu-device-manager",
    "nvidia-sandbox-validator": "sandbox-validator",
    "nvidia-sandbox-device-plugin-daemonset": "sandbox-device-plugin",
    "nvidia-kata-sandbox-device-plugin-daemonset": "kata-sandbox-device-plugin",
}
"""The `app` label of NVIDIA's operator's operand pods (its assets' DaemonSet templates at v26.7.0,
assets/state-*/) → the component ours labels the same operand with: NVIDIA's carry neither label,
and the side-by-side bench runs them here too."""
VALIDATION_WORKLOADS = ("nvidia-cuda-validator", "nvidia-device-plugin-validator")
"""The `app` label of the pods the validator itself creates to run vectorAdd (validator/manifests/
{cuda,plugin}-workload-validation.yaml at v26.7.0), for either operator: emulated too, so kwok plays no
pod of a rollout (a replay of its watch would play them twice)."""
OPERAND_PODS_SELECTOR = APP_LABEL
"""The emulators' pod watch: every pod with an `app` label (ours carry it too); `emulated` keeps the
operand pods of either operator, kwok runs the rest."""


@dataclass(frozen=True)
class Mount:
    volume: str
    path: str
    sub_path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class Volume:
    name: str
    kind: str
    """hostPath, configMap, emptyDir, secret, projected, ... (the volume source's key)."""
    source: str = ""
    """hostPath: the host path; configMap/secret: the object's name."""
    host_type: str = ""
    items: tuple[tuple[str, str], ...] = ()
    """configMap/secret items: (key, path)."""
    optional: bool = False


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str | None = None
    field_path: str | None = None
    config_map: tuple[str, str, bool] | None = None
    """(name, key, optional) of a configMapKeyRef."""
    secret: tuple[str, str, bool] | None = None


@dataclass(frozen=True)
class Probe:
    command: tuple[str, ...]
    """exec command; empty for tcpSocket/httpGet probes."""
    initial_delay: float = 0.0
    period: float = 10.0


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    env_from: tuple[tuple[str, str, bool], ...] = ()
    """envFrom: (kind configMap/secret, name, optional)."""
    mounts: tuple[Mount, ...] = ()
    startup_probe: Probe | None = None
    readiness_probe: Probe | None = None
    pre_stop: tuple[str, ...] = ()
    resources: Mapping[str, str] = field(default_factory=dict)
    """limits and requests together (name → quantity)."""
    sidecar: bool = False
    """An init container with restartPolicy Always (a native sidecar): started, not completed."""

    @property
    def argv(self) -> tuple[str, ...]:
        return self.command + self.args


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    node: str
    service_account: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_references: tuple[JSON, ...]
    init_containers: tuple[Container, ...]
    containers: tuple[Container, ...]
    volumes: Mapping[str, Volume]
    runtime_class: str = ""
    host_network: bool = False
    share_process_namespace: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    automount_token: bool = True
    restart_policy: str = "Always"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def component(self) -> str:
        return self.labels.get(COMPONENT_LABEL) or NVIDIA_OPERANDS.get(self.app, "")

    @property
    def app(self) -> str:
        return self.labels.get("app", "")

    def all_containers(self) -> tuple[Container, ...]:
        return self.init_containers + self.containers


def emulated(body: Mapping[str, Any]) -> bool:
    """Operand pods, ours or NVIDIA's operator's, and the validator's workload pods are the emulators' to
    run; kwok keeps running everything else (hack/kwok/stages.yaml leaves out the same pods)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    app = labels.get(APP_LABEL, "")
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY or app in NVIDIA_OPERANDS or app in VALIDATION_WORKLOADS


def _probe(body: Mapping[str, Any] | None) -> Probe | None:
    if not body:
        return None
    command = tuple((body.get("exec") or {}).get("command") or ())
    return Probe(
        command=command,
        initial_delay=float(body.get("initialDelaySeconds") or 0),
        period=float(body.get("periodSeconds") or 10),
    )


def _env(item: Mapping[str, Any]) -> EnvVar:
    source = item.get("valueFrom") or {}
    if "fieldRef" in source:
        return EnvVar(item["name"], field_path=source["fieldRef"].get("fieldPath", ""))
    if "configMapKeyRef" in source:
        ref = source["configMapKeyRef"]
        return EnvVar(
            item["name"], config_map=(ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional")))
        )
    if "secretKeyRef" in source:
        ref = source["secretKeyRef"]
        return EnvVar(
            item["name"], secret=(ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional")))
        )
    return EnvVar(item["name"], value=str(item.get("value") or ""))


def _container(body: Mapping[str, Any], *, init: bool) -> Container:
    resources = body.get("resources") or {}
    quantities = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    env_from = []
    for source in body.get("envFrom") or ():
        for kind in ("configMapRef", "secretRef"):
            if kind in source:
                ref = source[kind]
                env_from.append((kind.removesuffix("Ref"), ref.get("name", ""), bool(ref.get("optional"))))
    pre_stop = ((body.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}
    return Container(
        name=body["name"],
        image=body.get("image") or "",
        command=tuple(body.get("command") or ()),
        args=tuple(str(a) for a in body.get("args") or ()),
        env=tuple(_env(e) for e in body.get("env") or ()),
        env_from=tuple(env_from),
        mounts=tuple(
            Mount(
                volume=m["name"],
                path=m["mountPath"].rstrip("/") or "/",
                sub_path=m.get("subPath") or "",
                read_only=bool(m.get("readOnly")),
            )
            for m in body.get("volumeMounts") or ()
        ),
        startup_probe=_probe(body.get("startupProbe")),
        readiness_probe=_probe(body.get("readinessProbe")),
        pre_stop=tuple(pre_stop.get("command") or ()),
        resources={k: str(v) for k, v in quantities.items()},
        sidecar=init and body.get("restartPolicy") == "Always",
    )


_VOLUME_KINDS = ("hostPath", "configMap", "emptyDir", "secret", "projected", "downwardAPI")


def _volume(body: Mapping[str, Any]) -> Volume:
    kind = next((k for k in _VOLUME_KINDS if k in body), "other")
    source = body.get(kind) or {}
    if kind == "hostPath":
        return Volume(body["name"], kind, source=source.get("path", ""), host_type=source.get("type") or "")
    if kind in ("configMap", "secret"):
        name = source.get("name") if kind == "configMap" else source.get("secretName")
        items = tuple((i["key"], i["path"]) for i in source.get("items") or ())
        return Volume(
            body["name"], kind, source=name or "", items=items, optional=bool(source.get("optional"))
        )
    return Volume(body["name"], kind)


def parse(body: Mapping[str, Any]) -> Pod:
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return Pod(
        uid=metadata.get("uid", ""),
        namespace=metadata.get("namespace", ""),
        name=metadata.get("name", ""),
        node=spec.get("nodeName") or "",
        service_account=spec.get("serviceAccountName") or "default",
        labels=dict(metadata.get("labels") or {}),
        annotations=dict(metadata.get("annotations") or {}),
        owner_references=tuple(metadata.get("ownerReferences") or ()),
        init_containers=tuple(_container(c, init=True) for c in spec.get("initContainers") or ()),
        containers=tuple(_container(c, init=False) for c in spec.get("containers") or ()),
        volumes={v["name"]: _volume(v) for v in spec.get("volumes") or ()},
        runtime_class=spec.get("runtimeClassName") or "",
        host_network=bool(spec.get("hostNetwork")),
        share_process_namespace=bool(spec.get("shareProcessNamespace")),
        node_selector=dict(spec.get("nodeSelector") or {}),
        automount_token=spec.get("automountServiceAccountToken") is not False,
        restart_policy=spec.get("restartPolicy") or "Always",
    )
