"""The pods the operator's workloads run, as its templates render them, reduced to what a token that
may write those workloads could abuse: for the chart's admission policies `<fullname>-writes-daemonsets`
and `-deployments` (templates/admission-policy.yaml), through files/operand-rbac.yaml, which
hack/operand_rbac.py writes.

A workload's shape, by name: the pods' ServiceAccount, the host namespaces they may share (hostNetwork,
hostPID, hostIPC), the containers that may be privileged (or add capabilities), and the hostPath volumes
by name with their host paths. Images are not part of it (charts/gpu-operator/README.md, "RBAC", says
why).

The shapes are the union over the renders that differ in what changes a pod's shape: every component
on in both sandbox modes (the ClusterPolicies given, from tests/data/policies/everything.yaml), its
driver as given, compiled on the node (subscription files, GDS and GDRCopy sidecars) and precompiled,
on one OS of each family whose driver mounts differ, each first in a cluster of another container
runtime; NVIDIADriver pools of every driver type; the GPUCluster. Each is rendered twice more as a user
may turn it (`users_own`): every host path its models allow (HostDir, HostPath; and the toolkit's
runtime files, which its env names) moved below USER_PATH and the host namespaces shared; then also
every other switch the spec leaves unset on (NRI, the host's MOFED, ...). A volume whose path lies
below USER_PATH in some render is the user's: only its name is pinned, never its path, so that no valid
policy is refused.

Names the operator generates (a precompiled driver's per kernel and OS, an NVIDIADriver pool's per OS
and object) are pinned by the prefix all of them share: the rendered names of two objects and three
OSes tell it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gpu_operator.api import parse_spec
from gpu_operator.api.common import HostDir, HostPath
from gpu_operator.api.gpucluster import GPUClusterSpec, parse_gpucluster_spec
from gpu_operator.api.nvidiadriver import DriverType, NVIDIADriverSpec, parse_driver_spec
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS
from gpu_operator.core.container_runtime import PATH_ENV
from gpu_operator.core.driver_pool_plan import pool_variants
from gpu_operator.core.driver_pool_render import OS_VERSION_MAJOR_LABEL, render_pools
from gpu_operator.core.driver_pools import DriverObject
from gpu_operator.core.gpucluster_render import render_gpucluster
from gpu_operator.core.images import KERNEL_LABEL, OS_ID_LABEL, OS_VERSION_LABEL
from gpu_operator.core.node_labels import NodeInfo
from gpu_operator.core.ownership import COMPONENT_LABEL
from gpu_operator.core.render import ClusterFacts, render, runtimes_in_order

Obj = dict[str, Any]
Spec = dict[str, Any]

WORKLOADS = ("DaemonSet", "Deployment")
"""The kinds of the operator's objects that run pods."""
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
USER_PATH = "/path-from-the-spec"
"""Where `users_own` moves every host path a spec names."""


@dataclass(frozen=True)
class Node:
    """A GPU node of one OS family: its NFD labels, kernel and container runtime."""

    os_id: str
    version: str
    kernel: str
    runtime: str

    @property
    def tag(self) -> str:
        return self.os_id + self.version

    def info(self) -> NodeInfo:
        labels = {
            OS_ID_LABEL: self.os_id,
            OS_VERSION_LABEL: self.version,
            OS_VERSION_MAJOR_LABEL: self.version.split(".")[0],
            KERNEL_LABEL: self.kernel,
        }
        return NodeInfo(f"{self.os_id}-node", labels, runtime=self.runtime)


NODES = (
    Node("ubuntu", "22.04", "5.15.0-105-generic", "containerd"),
    Node("rhel", "9.4", "5.14.0-427.el9.x86_64", "docker"),
    Node("sles", "15.6", "6.4.0-150600.21-default", "crio"),
)
"""One OS of each family whose driver pods differ (Debian's; Red Hat's and SUSE's subscription files,
SUSE's host modules), each with another container runtime; the ClusterPolicy's renders put each first
in the cluster once (the toolkit's first DaemonSet is the first runtime's), the first with all three."""


# --- what a user may set -------------------------------------------------------------------------


def _members(hint: Any) -> tuple[Any, ...]:
    """The types of a field's annotation: a union's members, else the annotation itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _model(hint: Any) -> type[BaseModel] | None:
    for member in _members(hint):
        if typing.get_origin(member) is typing.Annotated:
            member = typing.get_args(member)[0]
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


_KEEP = object()
Turn = Callable[[tuple[Any, ...], str, bool], Any]
"""A field's types, its path and whether the spec sets it → its new value, or _KEEP."""


def _walk(model: type[BaseModel], spec: Mapping[str, Any], turn: Turn, at: str = "") -> Spec:
    """`spec` (of `model`) with each field `turn` gives a value (else _KEEP), in the sections it has."""
    turned = dict(spec)
    hints = typing.get_type_hints(model, include_extras=True)
    for name in model.model_fields:
        where = f"{at}.{name}" if at else name
        value = turn(_members(hints[name]), where, name in spec)
        sub = _model(hints[name])
        if value is not _KEEP:
            turned[name] = value
        elif sub is not None and isinstance(turned.get(name), Mapping):
            turned[name] = _walk(sub, turned[name], turn, where)
    return turned


def moved(model: type[BaseModel], spec: Mapping[str, Any]) -> Spec:
    """`spec` with every host path its model's annotations allow (HostDir, HostPath) below USER_PATH,
    and every host namespace it leaves unset shared."""

    def turn(types_: tuple[Any, ...], where: str, given: bool) -> Any:
        if {HostDir, HostPath} & set(types_):
            return f"{USER_PATH}/{where}"
        return True if where.rpartition(".")[2] in HOST_NAMESPACES and not given else _KEEP

    return _walk(model, spec, turn)


def switched_on(model: type[BaseModel], spec: Mapping[str, Any]) -> Spec:
    """`spec` with every switch it leaves unset on (NRI, the host's MOFED, ...); those it sets stay."""
    return _walk(model, spec, lambda types_, _, given: True if bool in types_ and not given else _KEEP)


def users_own(model: type[BaseModel], spec: Mapping[str, Any]) -> list[Spec]:
    """`spec` as a user may turn it: its host paths moved and host namespaces shared, then every other
    switch on too (apart: some switches take workloads away, precompiled drivers the compiled one's
    mounts, NRI the runtime's). A switch the variants leave unset renders both ways."""
    paths = moved(model, spec)
    return [paths, switched_on(model, paths)]


def _runtime_paths(spec: Spec) -> Spec:
    """The toolkit's runtime files (PATH_ENV) named by the user, below USER_PATH."""
    toolkit = spec.get("toolkit") or {}
    env = [*(toolkit.get("env") or []), *({"name": n, "value": f"{USER_PATH}/{n}/file"} for n in PATH_ENV)]
    return {**spec, "toolkit": {**toolkit, "env": env}}


def _drivers(spec: Spec) -> list[Spec]:
    """`spec`, and its driver compiled on the node from its distribution's packages (no repoConfig: the
    subscription files, and the GDS and GDRCopy sidecars) and precompiled, both with RDMA against the
    host's MOFED or not (left unset: `users_own` switches it on)."""
    driver = {k: v for k, v in (spec.get("driver") or {}).items() if k != "repoConfig"}
    rdma = {"enabled": True}
    compiled = {**driver, "usePrecompiled": False, "rdma": rdma}
    precompiled = {**driver, "usePrecompiled": True, "rdma": rdma}
    return [
        spec,
        {**spec, "driver": compiled, "gds": {"enabled": True}, "gdrcopy": {"enabled": True}},
        {**spec, "driver": precompiled},
    ]


# --- the renders -----------------------------------------------------------------------------------


def _facts(namespace: str, policy: ClusterPolicySpec, first: Node) -> ClusterFacts:
    nodes = [first, *(n for n in NODES if n != first)] if first == NODES[0] else [first]
    config_maps = {name: ("any",) for c in COMPONENTS for _, name in c.config_maps(policy)}
    return ClusterFacts(
        namespace=namespace,
        os_tag=first.tag,
        kernels=tuple((n.kernel, n.tag) for n in nodes),
        runtimes=runtimes_in_order(n.runtime for n in nodes),
        config_maps=config_maps,
    )


Render = tuple[str | None, list[Obj]]
"""The family of the names a render generates (None: only fixed names) and its workloads."""


def _workloads(objects: Iterable[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in WORKLOADS]


def policy_renders(specs: Iterable[Spec], namespace: str) -> Iterator[Render]:
    """The ClusterPolicy's workloads: each spec as given and as built on the node, each also as the
    user may turn it, on each OS. A component split per kernel (a precompiled driver) generates names."""
    by_label = {c.component_label: c for c in COMPONENTS}
    for spec in specs:
        for built in _drivers(spec):
            for variant in (built, *users_own(ClusterPolicySpec, _runtime_paths(built))):
                policy = parse_spec(variant)
                for node in NODES:
                    for obj in _workloads(render(policy, _facts(namespace, policy, node))):
                        component = by_label.get(obj["metadata"]["labels"].get(COMPONENT_LABEL, ""))
                        generated = (
                            component is not None
                            and component.split == "kernel"
                            and obj["metadata"]["name"] != component.daemonset
                        )
                        yield (f"policy/{component.name}" if generated and component else None), [obj]


def pool_renders(spec: Spec, namespace: str) -> Iterator[Render]:
    """An NVIDIADriver's pool DaemonSets as the operator applies them, for each driver type, built on
    the node or precompiled, as given and as the user may turn it, for two objects on every OS."""
    facts = ClusterFacts(namespace=namespace)
    for driver_type in typing.get_args(DriverType):
        typed = {**spec, "driverType": driver_type}
        precompiled = {**typed, "usePrecompiled": True, "version": typed["version"].split(".")[0]}
        built = {**typed, "rdma": {"enabled": True}, "gds": {"enabled": True}, "gdrcopy": {"enabled": True}}
        for each in (built, precompiled):
            turned = [(each, "/"), *((t, f"{USER_PATH}/root") for t in users_own(NVIDIADriverSpec, each))]
            for variant, host_root in turned:
                parsed = parse_driver_spec(variant)
                for name, uid in (("alpha", "uid-alpha"), ("beta", "uid-beta")):
                    found = pool_variants(DriverObject(name, uid, parsed), [n.info() for n in NODES])
                    objects = render_pools(parsed, found, facts, host_root)
                    yield f"pool/{driver_type}", _workloads(objects)


def gpucluster_renders(spec: Spec, facts: ClusterFacts) -> Iterator[Render]:
    """The GPUCluster's workloads, as given and as the user may turn it."""
    for variant in (spec, *users_own(GPUClusterSpec, spec)):
        yield None, _workloads(render_gpucluster(parse_gpucluster_spec(variant), facts))


# --- shapes ------------------------------------------------------------------------------------------


@dataclass
class Shape:
    """What the renders of one name (or generated prefix) hold, together."""

    accounts: set[str] = field(default_factory=set)
    host: set[str] = field(default_factory=set)
    privileged: set[str] = field(default_factory=set)
    paths: dict[str, set[str]] = field(default_factory=dict)

    def add(self, pod: Mapping[str, Any]) -> None:
        self.accounts.add(pod.get("serviceAccountName", ""))
        self.host |= {h for h in HOST_NAMESPACES if pod.get(h)}
        self.privileged |= {c["name"] for c in containers(pod) if privileged(c)}
        for volume in pod.get("volumes") or []:
            if "hostPath" in volume:
                self.paths.setdefault(volume["name"], set()).add(volume["hostPath"]["path"])

    def data(self, where: str) -> Obj:
        if len(self.accounts) != 1:
            raise ValueError(f"{where}: pods under several ServiceAccounts {sorted(self.accounts)}")
        return {
            "account": next(iter(self.accounts)),
            "hostNamespaces": sorted(self.host),
            "privileged": sorted(self.privileged),
            "hostPaths": {
                name: [] if any(p.startswith(USER_PATH + "/") for p in paths) else sorted(paths)
                for name, paths in sorted(self.paths.items())
            },
        }


def containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Its init containers and containers (their names are unique across both)."""
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def privileged(container: Mapping[str, Any]) -> bool:
    """Privileged, or with capabilities added."""
    context = container.get("securityContext") or {}
    return bool(context.get("privileged") or (context.get("capabilities") or {}).get("add"))


def _prefix(names: set[str], family: str) -> str:
    """The prefix of a family's generated names, up to the last '-' all of them share."""
    if len(names) < 2:
        raise ValueError(f"{family}: one name rendered ({sorted(names)}), no prefix to tell")
    # The common prefix of a set of strings is that of its first and last in sorted order.
    first, last = min(names), max(names)
    common = next((first[:i] for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), first)
    prefix = common[: common.rfind("-") + 1]
    if not prefix.strip("-") or prefix.count("-") < 2:
        raise ValueError(f"{family}: names {sorted(names)} share no prefix")
    return prefix


def shapes(renders: Iterable[Render]) -> dict[str, Obj]:
    """Per workload kind: `shapes`, name (or generated prefix) → shape data, and `prefixes`, the
    generated names' prefixes, longest first (the admission policy takes the first that matches)."""
    fixed: dict[str, dict[str, Shape]] = {kind: {} for kind in WORKLOADS}
    families: dict[tuple[str, str], list[Obj]] = {}
    for family, objects in renders:
        for obj in objects:
            if family is None:
                shape = fixed[obj["kind"]].setdefault(obj["metadata"]["name"], Shape())
                shape.add(obj["spec"]["template"]["spec"])
            else:
                families.setdefault((obj["kind"], family), []).append(obj)
    found: dict[str, Obj] = {}
    for kind in WORKLOADS:
        generated: dict[str, Shape] = {}
        for (of_kind, family), objects in families.items():
            if of_kind != kind:
                continue
            prefix = _prefix({o["metadata"]["name"] for o in objects}, family)
            if prefix in generated:
                raise ValueError(f"{family}: prefix {prefix!r} shared with another family")
            shape = generated[prefix] = Shape()
            for obj in objects:
                shape.add(obj["spec"]["template"]["spec"])
        every = {**fixed[kind], **generated}
        found[kind] = {
            "prefixes": sorted(generated, key=lambda p: (-len(p), p)),
            "shapes": {name: every[name].data(f"{kind} {name}") for name in sorted(every)},
        }
    return found


def key_of(data: Mapping[str, Any], name: str) -> str | None:
    """The shape a workload of this name is held to (the admission policy's `key`), if any."""
    if name in data["shapes"]:
        return name
    return next((p for p in data["prefixes"] if name.startswith(p)), None)
