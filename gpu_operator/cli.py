"""`gpu-operator run | render | validate | crd | discover | doctor | cleanup | kubeconfig`.

Data goes to stdout, diagnostics to stderr, one line each, prefixed with the file they concern. Exit
status: 0 fine (warnings allowed), 2 bad input (unreadable file, invalid YAML, invalid policy) or bad
usage, 1 an unexpected failure while rendering. No input, however broken, produces a traceback:
`validate` and `render` are what people run in CI on hand-written YAML.

`validate`, `render` and `crd` never import Kopf or the Kubernetes client; `run` imports the operator
lazily; `discover` (the node agent, gpu_operator/agent/node_agent.py), `cleanup` (the chart's pre-delete hook)
and `kubeconfig` the Kubernetes client.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml
from pydantic import BaseModel

from gpu_operator import __version__
from gpu_operator.api import KIND, FieldError, PolicyError, parse_document
from gpu_operator.api.gpucluster import KIND as GPUCLUSTER_KIND
from gpu_operator.api.gpucluster import GPUClusterSpec, parse_gpucluster_document
from gpu_operator.api.nvidiadriver import KIND as DRIVER_KIND
from gpu_operator.api.nvidiadriver import NVIDIADriverSpec, parse_driver_document
from gpu_operator.api.spec import ClusterPolicySpec
from gpu_operator.core.components import COMPONENTS

if TYPE_CHECKING:
    from gpu_operator.core.render import ClusterFacts
    from gpu_operator.runtime.sync_client import SyncKube

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2

DEFAULT_NAMESPACE = "gpu-operator"
DEFAULT_RESCAN_SECONDS = 60.0
"""How often the discovery agent reads sysfs again (gpu_operator/agent/node_agent.py says why a minute)."""
DEFAULT_LISTEN = "0.0.0.0:8080"


class InputError(Exception):
    """A file that cannot be used; every line is printed as `FILE: line`."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        super().__init__("; ".join(lines))


@dataclass(frozen=True)
class Policy:
    """One valid ClusterPolicy from a file."""

    name: str
    spec: ClusterPolicySpec


@dataclass(frozen=True)
class Driver:
    """One valid NVIDIADriver from a file."""

    name: str
    spec: NVIDIADriverSpec
    uid: str = ""
    """metadata.uid when the document has one (`kubectl get -o yaml`): the DaemonSets' names hash it."""

    def __str__(self) -> str:
        return f"nvidiadriver/{self.name}"


@dataclass(frozen=True)
class Cluster:
    """One valid GPUCluster from a file."""

    name: str
    spec: GPUClusterSpec

    def __str__(self) -> str:
        return f"gpucluster/{self.name}"


Resource = Policy | Driver | Cluster
KINDS = (KIND, DRIVER_KIND, GPUCLUSTER_KIND)


# --- reading files -------------------------------------------------------------------------------


def _display(path: str) -> str:
    return "<stdin>" if path == "-" else path


def read_text(path: str, stdin: TextIO | None = None) -> str:
    """The file's text (`-` is stdin); InputError for anything that is not readable UTF-8 text."""
    try:
        if path == "-":
            stream = stdin if stdin is not None else sys.stdin
            data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode()
        else:
            data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(["no such file"]) from None
    except IsADirectoryError:
        raise InputError(["is a directory, not a file"]) from None
    except OSError as exc:
        raise InputError([f"cannot read: {exc.strerror or exc}"]) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError([f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"]) from None


YAML_NODES_MAX = 1_000_000
"""The most values a document may stand for once its aliases are expanded: a ClusterPolicy is a few
hundred, a node list a few thousand per node; a "billion laughs" document (aliases of lists of aliases)
stands for billions, and every walk over it would take as long."""


def _too_large(root: yaml.Node, limit: int) -> yaml.Node | None:
    """The first (innermost) node that stands for more than `limit` values with every alias expanded
    (an alias counts its whole target again), found without expanding anything; None if there is none."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # on the current path: an alias back to one of them is a cycle, counted once
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes or (not children_done and id(node) in open_):
            continue
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            sizes[id(node)] = 1
            continue
        if not children_done:
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_.discard(id(node))
        sizes[id(node)] = 1 + sum(sizes.get(id(child), 1) for child in children)
        if sizes[id(node)] > limit:
            return node
    return None


class YAMLTooLarge(yaml.constructor.ConstructorError):
    """Well-formed YAML that stands for more than anything here reads."""


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader with two bounds, each reported with its line and column: a document that stands
    for more than YAML_NODES_MAX values (alias bombs), and an integer Python cannot read (more than 4300
    digits: int() raises ValueError)."""

    def construct_document(self, node: yaml.Node) -> Any:
        culprit = _too_large(node, YAML_NODES_MAX)
        if culprit is not None:
            raise YAMLTooLarge(
                None,
                None,
                f"stands for more than {YAML_NODES_MAX} values once its aliases are expanded",
                culprit.start_mark,
            )
        return super().construct_document(node)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = len(str(node.value))
            message = f"an integer of {digits} digits is larger than any field takes"
            raise YAMLTooLarge(None, None, message, node.start_mark) from None


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def load_documents(text: str) -> list[Any]:
    """The non-empty YAML documents of `text`; a `kind: List` contributes its items."""
    try:
        raw = list(yaml.load_all(text, Loader=_BoundedLoader))
    except YAMLTooLarge as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise InputError([f"{where}not usable YAML: {exc.problem}"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        if exc.problem and exc.context and exc.context_mark and exc.context_mark is not mark:
            context = exc.context_mark
            problem += f" ({exc.context} at line {context.line + 1}, column {context.column + 1})"
        raise InputError([f"{where}not valid YAML: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise InputError([f"not valid YAML: {exc}"]) from None
    except RecursionError:
        raise InputError(["not usable YAML: nested too deeply"]) from None
    documents: list[Any] = []
    for doc in raw:
        if doc is None:
            continue  # `---` separators around nothing, as kubectl skips them
        if isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            items = doc.get("items")
            if not isinstance(items, list):
                raise InputError([f"{doc.get('kind')}: items must be a list"])
            documents.extend(items)
        else:
            documents.append(doc)
    if not documents:
        raise InputError(["empty: no YAML document in it"])
    return documents


def _parse(doc: Any) -> tuple[str, ClusterPolicySpec | NVIDIADriverSpec | GPUClusterSpec]:
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    if kind == DRIVER_KIND:
        return kind, parse_driver_document(doc)
    if kind == GPUCLUSTER_KIND:
        return kind, parse_gpucluster_document(doc)
    return KIND, parse_document(doc)


def load_resources(path: str, stdin: TextIO | None = None) -> list[Resource]:
    """Every ClusterPolicy, NVIDIADriver and GPUCluster in the file, validated; InputError lists every
    problem of every document. A document is an NVIDIADriver or a GPUCluster when its kind says so, else
    a ClusterPolicy."""
    documents = load_documents(read_text(path, stdin))
    several = len(documents) > 1
    found: list[Resource] = []
    problems: list[str] = []
    for index, doc in enumerate(documents, start=1):
        prefix = f"document {index}: " if several else ""
        kind = doc.get("kind") if isinstance(doc, Mapping) else None
        if several and isinstance(doc, Mapping) and kind not in KINDS:
            expected = f"{', '.join(KINDS[:-1])} or {KINDS[-1]}"
            problems.append(f"{prefix}a {kind or 'document without kind'}, not a {expected}")
            continue
        try:
            _, spec = _parse(doc)
        except PolicyError as exc:
            problems.extend(f"{prefix}{error}" for error in exc.errors)
            continue
        name = str(doc["metadata"]["name"])
        uid = str(doc["metadata"].get("uid") or "")
        if isinstance(spec, NVIDIADriverSpec):
            found.append(Driver(name, spec, uid))
        elif isinstance(spec, GPUClusterSpec):
            found.append(Cluster(name, spec))
        else:
            found.append(Policy(name, spec))
    if problems:
        raise InputError(problems)
    return found


# --- what validate reports beyond errors ----------------------------------------------------------


def deprecated_fields(model: BaseModel, prefix: str = "spec") -> list[FieldError]:
    """Fields the user set that are deprecated (pydantic `deprecated=` or a 'Deprecated' description)."""
    found: list[FieldError] = []
    for name, info in type(model).model_fields.items():
        if name not in model.model_fields_set:
            continue
        path = f"{prefix}.{info.alias or name}"
        description = (info.description or "").strip()
        if info.deprecated or description.lower().startswith("deprecated"):
            found.append(FieldError(path, description or "deprecated"))
        value = model.__dict__.get(name)  # not getattr: that warns for deprecated fields
        children = value if isinstance(value, list) else [value]
        for i, child in enumerate(children):
            if isinstance(child, BaseModel):
                found.extend(deprecated_fields(child, f"{path}[{i}]" if isinstance(value, list) else path))
    return found


def enabled_components(spec: ClusterPolicySpec) -> list[str]:
    return [c.name for c in COMPONENTS if c.enabled(spec)]


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def summary(policy: Policy) -> str:
    enabled = enabled_components(policy.spec)
    parts = [f"{', '.join(enabled)} enabled" if enabled else "no component enabled"]
    deprecated = deprecated_fields(policy.spec)
    if deprecated:
        parts.append(
            f"{_plural(len(deprecated), 'deprecated field')}: {', '.join(d.path for d in deprecated)}"
        )
    unsupported = policy.spec.unsupported_enabled()
    if unsupported:
        parts.append(f"{_plural(len(unsupported), 'unsupported section')} enabled: {', '.join(unsupported)}")
    return f"{policy.name}: valid ({'; '.join(parts)})"


def warnings_for(policy: Resource) -> list[str]:
    # An NVIDIADriver's (or GPUCluster's) lines name it: a file often holds several, and a ClusterPolicy.
    who = f"{policy}: " if isinstance(policy, Driver | Cluster) else ""
    lines = [f"warning: {who}{d.path} is deprecated: {d.message}" for d in deprecated_fields(policy.spec)]
    if isinstance(policy, Driver | Cluster):
        lines.extend(f"warning: {who}accepted but not acted on: {f}" for f in policy.spec.ignored_fields())
        return lines
    lines.extend(
        f"warning: spec.{name} is enabled, but {policy.spec.UNSUPPORTED[name]}; it is ignored"
        for name in policy.spec.unsupported_enabled()
    )
    lines.extend(f"warning: accepted but not acted on: {field}" for field in policy.spec.ignored_fields())
    return lines


def driver_summary(driver: Driver) -> str:
    """What a valid NVIDIADriver deploys where, in one line."""
    spec = driver.spec
    image = spec.version or spec.image
    parts = [f"{spec.driverType} driver {image}{', precompiled' if spec.usePrecompiled else ''}"]
    if spec.default:
        parts.append("default: every GPU node no other NVIDIADriver selects")
    elif spec.nodeSelector:
        parts.append("GPU nodes with " + ", ".join(f"{k}={v}" for k, v in spec.nodeSelector.items()))
    else:
        parts.append("every GPU node")
    deprecated = deprecated_fields(spec)
    if deprecated:
        parts.append(
            f"{_plural(len(deprecated), 'deprecated field')}: {', '.join(d.path for d in deprecated)}"
        )
    return f"{driver}: valid ({'; '.join(parts)})"


def gpucluster_summary(cluster: Cluster) -> str:
    """What a valid GPUCluster deploys where, in one line."""
    spec = cluster.spec
    dra = spec.draDriver
    image = dra.version or dra.image or "the default image"
    parts = [f"DRA driver {image}" + (" with computeDomains" if dra.compute_domains_enabled() else "")]
    extras = [
        name for name, on in (("DCGM", spec.dcgm_enabled()), ("DCGM exporter", spec.exporter_enabled())) if on
    ]
    if extras:
        parts.append(" and ".join(extras))
    if spec.nodeSelector:
        parts.append("GPU nodes with " + ", ".join(f"{k}={v}" for k, v in spec.nodeSelector.items()))
    else:
        parts.append("every GPU node")
    return f"{cluster}: valid ({'; '.join(parts)})"


def several_defaults(drivers: Sequence[Driver]) -> list[str]:
    """NVIDIA's operator reconciles no NVIDIADriver while more than one is the default
    (ErrMultipleDefaultNVIDIADrivers, internal/validator/validator.go): a file that has two says so."""
    defaults = [str(driver) for driver in drivers if driver.spec.default]
    if len(defaults) < 2:
        return []
    return [
        f"{', '.join(defaults)}: more than one NVIDIADriver is the default (spec.default: true); NVIDIA's "
        "operator then deploys none of them"
    ]


# --- commands -------------------------------------------------------------------------------------


def _report(path: str, lines: Sequence[str], err: TextIO) -> None:
    for line in lines:
        print(f"{_display(path)}: {line}", file=err)


def cmd_validate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        resources = load_resources(args.file)
    except InputError as exc:
        _report(args.file, exc.lines, err)
        return EXIT_INVALID
    code = EXIT_OK
    for resource in resources:
        _report(args.file, warnings_for(resource), err)
        unpullable = resource.spec.images_without_registry()
        if unpullable:
            # Valid to the API server (NVIDIA's operator accepts them), but the pods would never start.
            name = resource if isinstance(resource, Driver | Cluster) else resource.name
            _report(args.file, [f"{name}: {found}" for found in unpullable], err)
            code = EXIT_INVALID
        elif isinstance(resource, Driver):
            print(driver_summary(resource), file=out)
        elif isinstance(resource, Cluster):
            print(gpucluster_summary(resource), file=out)
        else:
            print(summary(resource), file=out)
    conflicts = several_defaults([r for r in resources if isinstance(r, Driver)])
    if conflicts:
        _report(args.file, conflicts, err)
        code = EXIT_INVALID
    return code


def load_nodes(path: str) -> list[dict[str, Any]]:
    """Nodes from a NodeList/List, or from one or several Node documents (`kubectl get nodes -o yaml`)."""
    nodes: list[dict[str, Any]] = []
    problems: list[str] = []
    documents = load_documents(read_text(path))
    for index, doc in enumerate(documents, start=1):
        if not isinstance(doc, Mapping) or doc.get("kind", "Node") != "Node":
            what = doc.get("kind") if isinstance(doc, Mapping) else type(doc).__name__
            problems.append(f"item {index}: a {what}, not a Node")
        elif not isinstance(doc.get("metadata", {}), Mapping):
            problems.append(f"item {index}: metadata must be a mapping")
        else:
            nodes.append(dict(doc))
    if problems:
        raise InputError(problems)
    return nodes


def load_config_maps(path: str) -> dict[str, tuple[str, ...]]:
    """ConfigMap name → keys, from `kubectl get configmaps -o yaml` (or ConfigMap documents)."""
    from gpu_operator.core.observed import config_map_keys

    found: dict[str, tuple[str, ...]] = {}
    problems: list[str] = []
    for index, doc in enumerate(load_documents(read_text(path)), start=1):
        metadata = doc.get("metadata") if isinstance(doc, Mapping) else None
        if (
            not isinstance(doc, Mapping)
            or doc.get("kind") != "ConfigMap"
            or not isinstance(metadata, Mapping)
        ):
            what = doc.get("kind") if isinstance(doc, Mapping) else type(doc).__name__
            problems.append(f"item {index}: a {what}, not a ConfigMap")
        else:
            found[str(metadata.get("name"))] = config_map_keys(doc)
    if problems:
        raise InputError(problems)
    return found


def with_pools(
    objects: list[dict[str, Any]],
    policy: Policy,
    drivers: list[Driver],
    nodes: list[dict[str, Any]],
    facts: ClusterFacts,
    report: Callable[[list[str]], None],
) -> list[dict[str, Any]]:
    """`objects` with the NVIDIADrivers' DaemonSets in place of the ClusterPolicy's driver, as the operator
    deploys them on `nodes` (core/driver_pool_plan.py), when the policy delegates its driver to them."""
    from gpu_operator.core.caches import Caches
    from gpu_operator.core.driver_pool_plan import is_on, plan_pools
    from gpu_operator.core.node_labels import node_info
    from gpu_operator.core.observed import DriverRef, component_of

    if not is_on(policy.spec, crd=True):
        if not drivers:
            return objects
        report(
            [
                f"warning: {d} is valid but not rendered: the {KIND} does not delegate its driver (driver."
                "useNvidiaDriverCRD is false, or the driver is disabled)"
                for d in drivers
            ]
        )
        return objects
    refs = tuple(DriverRef(d.name, d.uid, 1, d.spec) for d in drivers)
    found = {n.name: n for n in map(node_info, nodes)}
    pools = plan_pools(True, refs, found, {}, {}, frozenset(), facts, policy.spec.hostPaths.rootFS, Caches())
    if not drivers:
        report(
            [f"warning: the driver is the {DRIVER_KIND}s' (driver.useNvidiaDriverCRD), none is in this file"]
        )
    elif not nodes:
        report(
            [
                f"warning: no --nodes: the {DRIVER_KIND}s' DaemonSets (one per OS of their nodes) are "
                "not rendered"
            ]
        )
    held = {n: o.claimants for n, o in pools.assignment.nodes.items() if o.held}
    report(
        [
            f"warning: node {n} is held by {', '.join(c)} (a conflict): no driver rendered for it"
            for n, c in held.items()
        ]
    )
    unowned = [n for n, o in pools.assignment.nodes.items() if o.owner is None and not o.held]
    if unowned:
        report([f"warning: no {DRIVER_KIND} selects GPU nodes {', '.join(unowned)}: they get no driver"])
    kept = [o for o in objects if not (o["kind"] == "DaemonSet" and component_of(o["metadata"]) == "driver")]
    return [*kept, *pools.objects]


def cmd_render(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # Imported here so that `validate` and `crd` work without the renderer's templates.
    from gpu_operator.core.node_labels import cluster_facts
    from gpu_operator.core.render import missing_inputs, render
    from gpu_operator.core.yaml_text import to_yaml

    try:
        resources = load_resources(args.file)
    except InputError as exc:
        _report(args.file, exc.lines, err)
        return EXIT_INVALID
    policies = [r for r in resources if isinstance(r, Policy)]
    drivers = [r for r in resources if isinstance(r, Driver)]
    clusters = [r for r in resources if isinstance(r, Cluster)]
    if len(clusters) > 1:
        _report(
            args.file, [f"render takes at most one {GPUCLUSTER_KIND}, this file has {len(clusters)}"], err
        )
        return EXIT_INVALID
    if clusters and not policies and not drivers:
        return render_gpucluster_only(args, clusters[0], out, err)
    if drivers and not policies:
        # The driver DaemonSet of an NVIDIADriver takes its namespace settings, host paths, validator and
        # runtime from the ClusterPolicy that delegates to it: there is nothing to render without one.
        _report(args.file, [f"render needs the {KIND} too: an {DRIVER_KIND} is rendered with it"], err)
        return EXIT_INVALID
    if len(policies) != 1:
        _report(args.file, [f"render takes one {KIND}, this file has {len(policies)}"], err)
        return EXIT_INVALID
    current = ""
    try:
        current = args.nodes or ""
        nodes = load_nodes(args.nodes) if args.nodes else []
        current = args.config_maps or ""
        config_maps = load_config_maps(args.config_maps) if args.config_maps else {}
    except InputError as exc:
        _report(current, exc.lines, err)
        return EXIT_INVALID
    policy = policies[0]
    _report(args.file, warnings_for(policy), err)
    _report(args.file, [f"warning: {found}" for found in policy.spec.images_without_registry()], err)
    try:
        facts = replace(
            cluster_facts(nodes, args.namespace, os.environ, policy.spec.operator.defaultRuntime),
            service_monitor_crd=args.service_monitor_crd,
            config_maps=config_maps,
        )
        for component in COMPONENTS:
            if component.enabled(policy.spec):
                _report(
                    args.file,
                    [
                        f"warning: {m}; {component.daemonset} is left out"
                        for m in missing_inputs(component, policy.spec, facts)
                    ],
                    err,
                )
        objects = render(policy.spec, facts)
        if drivers or policy.spec.driver.useNvidiaDriverCRD:
            objects = with_pools(
                objects, policy, drivers, nodes, facts, lambda lines: _report(args.file, lines, err)
            )
        if clusters:
            objects = [*objects, *gpucluster_objects(clusters[0], facts, args.file, err)]
        text = to_yaml(objects)
    except PolicyError as exc:
        _report(args.file, [str(e) for e in exc.errors], err)
        return EXIT_INVALID
    except Exception as exc:  # a bug, not bad input; still one line, as promised above
        _report(args.file, [f"cannot render: {type(exc).__name__}: {exc}"], err)
        return EXIT_FAILED
    out.write(text)
    return EXIT_OK


def gpucluster_objects(cluster: Cluster, facts: ClusterFacts, path: str, err: TextIO) -> list[dict[str, Any]]:
    """The GPUCluster's DRA stack as the operator renders it (on every node it selects; which nodes those
    are, and what the ClusterPolicy keeps off them, is decided per node at run time)."""
    from gpu_operator.core.gpucluster_render import render_gpucluster

    _report(path, warnings_for(cluster), err)
    _report(path, [f"warning: {cluster}: {found}" for found in cluster.spec.images_without_registry()], err)
    return render_gpucluster(cluster.spec, facts)


def render_gpucluster_only(args: argparse.Namespace, cluster: Cluster, out: TextIO, err: TextIO) -> int:
    from gpu_operator.core.render import ClusterFacts
    from gpu_operator.core.yaml_text import to_yaml

    facts = ClusterFacts(
        namespace=args.namespace, environ=os.environ, service_monitor_crd=args.service_monitor_crd
    )
    try:
        text = to_yaml(gpucluster_objects(cluster, facts, args.file, err))
    except Exception as exc:  # a bug, not bad input; still one line, as promised above
        _report(args.file, [f"cannot render: {type(exc).__name__}: {exc}"], err)
        return EXIT_FAILED
    out.write(text)
    return EXIT_OK


CRD_NAMES = ("clusterpolicy", "nvidiadriver", "gpucluster")
"""What `gpu-operator crd NAME` prints: the keys of gpu_operator.api.crd.SHIPPED (kept here so that the
parser does not import the models)."""


def cmd_crd(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.api.crd import SHIPPED, definition_yaml

    out.write(definition_yaml(SHIPPED[args.name]))
    return EXIT_OK


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.main import run  # Kopf is imported only when the operator runs
    from gpu_operator.runtime.server import ServerError
    from gpu_operator.runtime.settings import Settings

    settings = Settings(
        namespace=args.namespace,
        environ=os.environ,
        listen=args.listen,
        log_format=args.log_format,
        verbose=args.verbose,
        create_crd=args.create_crd,
        leader_election=args.leader_election,
        lease_name=args.lease_name,
        identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
    )
    try:
        run(settings)
    except ServerError as exc:
        print(f"gpu-operator run: {exc}", file=err)
        return EXIT_INVALID
    return EXIT_OK


def cmd_discover(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.agent.discovery import ScanError, gpus, pci_labels, read_devices

    if args.dry_run:
        try:
            devices = read_devices(Path(args.sysfs))
        except ScanError as exc:
            print(f"discover: {exc}", file=err)
            return EXIT_INVALID
        for device in gpus(devices):
            print(f"# {device.describe()}", file=out)
        for key, value in pci_labels(devices).items():
            print(f"{key}={value}", file=out)
        return EXIT_OK
    if not args.node_name:
        print("discover: no node name: give --node-name or set NODE_NAME (the chart sets it)", file=err)
        return EXIT_INVALID
    from gpu_operator.agent.node_agent import Agent, run

    kube = _client("discover", err)
    if kube is None:
        return EXIT_INVALID
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        stream=err,
    )
    run(Agent(kube, args.node_name, Path(args.sysfs), args.mode, args.rescan_seconds))
    return EXIT_OK


def _client(command: str, err: TextIO, kubeconfig: str | None = None) -> SyncKube | None:
    """A SyncKube for the in-cluster credentials or the kubeconfig; None (after one line on `err`) if
    neither works."""
    from gpu_operator.runtime.client import ConfigException
    from gpu_operator.runtime.sync_client import SyncKube

    try:
        return SyncKube.connect(kubeconfig)
    except (ConfigException, OSError) as exc:
        print(f"{command}: no credentials (in-cluster or kubeconfig): {exc}", file=err)
        return None


def cmd_cleanup(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.runtime.cleanup import cleanup

    kube = _client("cleanup", err)
    if kube is None:
        return EXIT_INVALID
    try:
        return cleanup(kube, args.policy, args.timeout, out, args.gpucluster)
    finally:
        kube.close()


def cmd_kubeconfig(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.runtime.client import ApiError
    from gpu_operator.runtime.kubeconfig import write_service_account_kubeconfig

    namespace, _, name = args.service_account.partition("/")
    source = args.kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    cluster_of = Path(source) if source else Path.home() / ".kube" / "config"
    kube = _client("kubeconfig", err, str(cluster_of))
    if kube is None:
        return EXIT_INVALID
    try:
        write_service_account_kubeconfig(
            kube, cluster_of, namespace, name, Path(args.output), int(args.duration)
        )
    except (ApiError, OSError, KeyError, StopIteration) as exc:
        print(f"kubeconfig: cannot write a kubeconfig for {args.service_account}: {exc}", file=err)
        return EXIT_INVALID
    finally:
        kube.close()
    print(args.output, file=out)
    return EXIT_OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 86400, not {text}")
    return value


def cmd_doctor(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from gpu_operator.doctor import EXIT_BAD_INPUT, DoctorError, run
    from gpu_operator.doctor.state import Scope

    try:
        return run(
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=args.namespace,
            scope=Scope(node=args.node or "", pod=args.pod or ""),
            output=args.output,
            log_lines=args.log_lines,
            state_file=args.from_state,
            save=args.save_state,
            out=out,
        )
    except DoctorError as exc:
        one_line = " ".join(str(exc).split())  # YAML and API messages span lines; the promise is one
        print(f"gpu-operator doctor: {one_line}", file=err)
        return EXIT_BAD_INPUT


# --- the parser -----------------------------------------------------------------------------------


def _pod_ref(value: str) -> str:
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"{value!r} is not NAMESPACE/NAME")
    return value


def _non_negative(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a number >= 0")
    return int(value)


def _dns_label(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a DNS-1123 label (a Lease name)")
    return value


def _listen_address(value: str) -> str:
    from gpu_operator.runtime.server import parse_address

    if value:
        try:
            parse_address(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-operator",
        description="Deploys the NVIDIA GPU software stack from one nvidia.com/v1 ClusterPolicy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the operator (in the cluster or against $KUBECONFIG)")
    run.add_argument(
        "--namespace",
        default=environ.get("OPERATOR_NAMESPACE") or DEFAULT_NAMESPACE,
        help="namespace of the operands (env OPERATOR_NAMESPACE; default %(default)s)",
    )
    run.add_argument(
        "--log-format", choices=("plain", "full", "json"), default="plain", help="log format (default plain)"
    )
    run.add_argument(
        "--listen",
        default=environ.get("GPU_OPERATOR_LISTEN", DEFAULT_LISTEN),
        type=_listen_address,
        metavar="HOST:PORT",
        help="HTTP address of /metrics, /healthz and /readyz (env GPU_OPERATOR_LISTEN; default "
        "%(default)s; port 0 picks a free one; empty disables the server)",
    )
    run.add_argument(
        "--create-crd",
        action=argparse.BooleanOptionalAction,
        default=environ.get("GPU_OPERATOR_CREATE_CRD", "true").lower() != "false",
        help="create the ClusterPolicy CRD when it is absent (env GPU_OPERATOR_CREATE_CRD; default on); "
        "it is kept at the operator's schema either way",
    )
    run.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reconcile only while holding the Lease --lease-name in --namespace (default on; off: "
        "run one replica only)",
    )
    run.add_argument(
        "--lease-name",
        default=environ.get("GPU_OPERATOR_LEASE") or "gpu-operator",
        type=_dns_label,
        help="the leader election Lease (env GPU_OPERATOR_LEASE; default %(default)s)",
    )
    run.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    run.set_defaults(handler=cmd_run)

    render = commands.add_parser("render", help="print the objects the operator would apply for a policy")
    render.add_argument(
        "-f",
        "--file",
        required=True,
        help="ClusterPolicy YAML file (NVIDIADrivers and a GPUCluster too; or a GPUCluster alone), or - "
        "for stdin",
    )
    render.add_argument(
        "--namespace",
        default=environ.get("OPERATOR_NAMESPACE") or DEFAULT_NAMESPACE,
        help="namespace of the operands (default %(default)s)",
    )
    render.add_argument(
        "--nodes",
        metavar="NODES.yaml",
        help="nodes (kubectl get nodes -o yaml): their OS, kernels and runtimes shape the DaemonSets",
    )
    render.add_argument(
        "--config-maps",
        metavar="CONFIGMAPS.yaml",
        help="ConfigMaps the policy names (kubectl get configmaps -o yaml), whose files the driver mounts",
    )
    render.add_argument(
        "--no-servicemonitor-crd",
        dest="service_monitor_crd",
        action="store_false",
        help="render for a cluster without the Prometheus operator's ServiceMonitor CRD",
    )
    render.set_defaults(handler=cmd_render)

    validate = commands.add_parser(
        "validate", help="check ClusterPolicy, NVIDIADriver and GPUCluster files; exit 2 if one is invalid"
    )
    validate.add_argument(
        "-f",
        "--file",
        required=True,
        help="ClusterPolicy, NVIDIADriver and/or GPUCluster YAML file, or - for stdin",
    )
    validate.set_defaults(handler=cmd_validate)

    crd = commands.add_parser("crd", help="print a CustomResourceDefinition (ClusterPolicy by default)")
    crd.add_argument(
        "name",
        nargs="?",
        choices=CRD_NAMES,
        default="clusterpolicy",
        help="which CRD: %(choices)s (default %(default)s); `make crd` writes each to crds/NAME.yaml",
    )
    crd.set_defaults(handler=cmd_crd)

    discover = commands.add_parser(
        "discover", help="node agent: keep NFD's NVIDIA PCI labels on this node (when NFD is not installed)"
    )
    discover.add_argument(
        "--node-name",
        default=environ.get("NODE_NAME", ""),
        help="the node this runs on (env NODE_NAME; the chart sets it from spec.nodeName)",
    )
    discover.add_argument("--sysfs", default="/sys", help="where the host's sysfs is (default %(default)s)")
    discover.add_argument(
        "--mode",
        choices=("auto", "builtin"),
        default="auto",
        help="auto (default): stay idle while Node Feature Discovery is installed; builtin: always label",
    )
    discover.add_argument(
        "--rescan-seconds",
        type=_seconds,
        default=DEFAULT_RESCAN_SECONDS,
        metavar="N",
        help="how often sysfs is read again (default %(default).0f)",
    )
    discover.add_argument(
        "--dry-run",
        action="store_true",
        help="print the GPUs and the labels they give, talk to no API server",
    )
    discover.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    discover.set_defaults(handler=cmd_discover)

    doctor = commands.add_parser(
        "doctor",
        help="find what keeps GPU pods from running, and what to run next (read only)",
        description="Walks the GPU troubleshooting checklist over the cluster (or one node or pod) with "
        "your kubeconfig, read only. Exit 0: nothing wrong, 1: problems found, 2: bad input or no access.",
    )
    where = doctor.add_mutually_exclusive_group()
    where.add_argument("--node", metavar="NAME", help="only what concerns this node")
    where.add_argument("--pod", metavar="NAMESPACE/NAME", type=_pod_ref, help="only what concerns this pod")
    doctor.add_argument("-o", "--output", choices=("table", "json"), default="table", help="default table")
    doctor.add_argument("--kubeconfig", help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    doctor.add_argument("--context", help="kubeconfig context (default the current one)")
    doctor.add_argument(
        "--namespace",
        default="",
        help="namespace of the operands (default: the ClusterPolicy's status.namespace, else gpu-operator)",
    )
    doctor.add_argument(
        "--log-lines",
        type=_non_negative,
        default=10,
        metavar="N",
        help="log lines to read of each failing operand container (default %(default)s; 0: read no logs)",
    )
    doctor.add_argument("--save-state", metavar="FILE", help="also write what was read, as JSON")
    doctor.add_argument(
        "--from-state", metavar="FILE", help="diagnose a state saved by --save-state instead of the cluster"
    )
    doctor.set_defaults(handler=cmd_doctor)

    cleanup = commands.add_parser(
        "cleanup",
        help="the chart's pre-delete hook: delete the ClusterPolicy, wait until its node labels are gone",
    )
    cleanup.add_argument("--policy", required=True, help="the ClusterPolicy to delete")
    cleanup.add_argument(
        "--gpucluster",
        default="",
        metavar="NAME",
        help="a GPUCluster to delete first, waiting until the operator has drained it and it is gone",
    )
    cleanup.add_argument(
        "--timeout",
        type=_seconds,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the operator to remove its node labels (default %(default).0f)",
    )
    cleanup.set_defaults(handler=cmd_cleanup)

    kubeconfig = commands.add_parser(
        "kubeconfig",
        help="write a kubeconfig that logs in as a ServiceAccount (run the operator with the chart's RBAC)",
    )
    kubeconfig.add_argument(
        "--service-account", required=True, type=_pod_ref, metavar="NAMESPACE/NAME", help="whose token"
    )
    kubeconfig.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write it (0600)")
    kubeconfig.add_argument(
        "--kubeconfig", help="the cluster and the credentials that create the token (default $KUBECONFIG)"
    )
    kubeconfig.add_argument(
        "--duration",
        type=_seconds,
        default=7200.0,
        metavar="SECONDS",
        help="how long the token is valid (default %(default).0f, at most 86400)",
    )
    kubeconfig.set_defaults(handler=cmd_kubeconfig)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(os.environ)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse has already printed
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    try:
        code: int = args.handler(args, sys.stdout, sys.stderr)
        sys.stdout.flush()
    except BrokenPipeError:
        # `gpu-operator render ... | head`: stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())
