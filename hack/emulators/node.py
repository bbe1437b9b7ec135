"""What lives on one emulated node: its host files, loaded driver, MIG layout and advertised devices.

The images communicate through the host more than through the API: the validator writes
``/run/nvidia/validations/*-ready``, the driver container puts its root filesystem under
``/run/nvidia/driver`` and loads the kernel module, the toolkit writes a containerd drop-in and
restarts containerd, mig-manager repartitions the GPUs, the device plugin registers resources with
the kubelet. :class:`NodeState` holds all of that as a small host filesystem (a dict of paths) plus
the few things that are not files (the module version, the MIG layout, the runtime handlers
containerd has loaded, the device plugins' resources).

The state is mirrored to a ConfigMap per node (namespace :data:`HOSTS_NAMESPACE`, named after the
node, owned by it), written at most every :data:`FLUSH_DELAY` seconds per node, so tests and people
can read it (``kubectl -n gpu-operator-sim get configmap NODE -o yaml``) and an emulator restart
recovers it (:meth:`NodeState.restore`). Not on the Node itself: a real host's files never touch the
Node object, and annotations written there moved its resourceVersion several times a second while
operands started, so the operator's label writes (which carry it) were refused as stale where the
images would never have caused it (bench/README.md, "2026-12-04, late night").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .gpus import COUNT_ANNOTATION, MODEL_ANNOTATION, MODELS, GpuModel

HOSTS_NAMESPACE = "gpu-operator-sim"
HOST_LABEL = "gpu-operator.sim/host"
"""On the mirror ConfigMaps: the emulators' own ConfigMap watch leaves them out."""
FILES_KEY = "host-files"
DRIVER_KEY = "driver"
MIG_KEY = "mig"
HANDLERS_KEY = "runtime-handlers"
VALIDATIONS_KEY = "validations"
TOOLKIT_KEY = "toolkit"
FLUSH_DELAY = 0.2

VALIDATIONS = "/run/nvidia/validations"
DRIVER_ROOT = "/run/nvidia/driver"
MODULE_REFCNT = "/sys/module/nvidia/refcnt"
MODULE_VERSION = "/proc/driver/nvidia/version"
"""Written by the driver container when it loads the modules (open or proprietary); gone with them."""
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CRIO_SOCKET = "/var/run/crio/crio.sock"


@dataclass(frozen=True)
class Symlink:
    target: str


Entry = str | Symlink


@dataclass
class MigGpu:
    """One GPU's MIG mode and the MIG devices on it (profile names, one per device)."""

    enabled: bool = False
    devices: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "devices": self.devices}


def _baseline(model: GpuModel | None, runtime: str) -> dict[str, Entry]:
    """Files a freshly installed GPU node has before any operand ran."""
    files: dict[str, Entry] = {
        "/etc/os-release": 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\n',
        "/sys/class/dmi/id/product_name": (model.machine if model else "Standard PC") + "\n",
        "/var/lib/kubelet/device-plugins/kubelet.sock": "",
        "/var/lib/kubelet/pod-resources/kubelet.sock": "",
        "/dev/log": "",
        "/sys/module/firmware_class/parameters/path": "\n",
        "/sys/devices/system/memory/auto_online_blocks": "online\n",
    }
    if runtime == "cri-o":
        files["/etc/crio/crio.conf"] = "[crio]\n"
        files[CRIO_SOCKET] = ""
    else:
        # containerd 1.7's default config is version 2 (fidelity reference B4).
        files[CONTAINERD_CONFIG] = "version = 2\n"
        files[CONTAINERD_SOCKET] = ""
    return files


# Host directories that exist on any node (hostPath type checks and `stat` of a directory). The
# simulated GPU nodes are VM hosts too (IOMMU on, the vfio modules of their kernel): /dev/vfio and the
# kernel's modules, which the VFIO and vGPU managers mount as Directory.
BASE_DIRS = frozenset(
    {"/", "/etc", "/run", "/sys", "/dev", "/dev/char", "/var", "/var/log", "/var/run", "/usr", "/usr/local"}
    | {"/lib", "/lib/modules", "/sys/fs", "/sys/fs/cgroup", "/sys/module", "/dev/vfio"}
)


class NodeState:
    """One node's emulated host. Methods that change it call :meth:`changed`."""

    def __init__(
        self, name: str, on_dirty: Callable[[NodeState], None], saved: SavedHost | None = None
    ) -> None:
        self.name = name
        self._on_dirty = on_dirty
        self.saved = saved
        """The mirror an earlier emulator left (restored if it belongs to this very Node)."""
        self.mirrored: dict[str, str] = {}
        """The mirror as last written (or restored): a flush writes only what differs."""
        self.uid = ""
        self.labels: dict[str, str] = {}
        self.annotations: dict[str, str] = {}
        self.unschedulable = False
        self.host_ip = ""
        self.runtime = "containerd"
        self.capacity: dict[str, str] = {}
        self.model: GpuModel | None = None
        self.gpu_count = 0
        self.files: dict[str, Entry] = {}
        self.baseline: dict[str, Entry] = {}
        self.driver: str | None = None
        """Version of the loaded kernel module (None: not loaded)."""
        self.mig: list[MigGpu] = []
        self.runtime_handlers: set[str] = set()
        """Runtime handlers containerd loaded at its last (re)start."""
        self.resources: dict[str, int] = {}
        """Extended resources the device plugins registered (the kubelet's device manager)."""
        self.plugin_resources: dict[str, dict[str, int]] = {}
        """The same per plugin: a plugin that goes withdraws its own resources, not another's."""
        self.known_resources: set[str] = set()
        """Resource names ever advertised here: the kubelet keeps them, at 0, when a plugin goes."""
        self.restored = False
        self._changed = asyncio.Event()
        self.deleted = False

    # --- from the API ---------------------------------------------------------------------------

    def observe(self, body: Mapping[str, Any]) -> bool:
        """Take the node object's current labels, status and hardware; True if relevant fields changed."""
        metadata = body.get("metadata") or {}
        status = body.get("status") or {}
        before = (self.labels, self.unschedulable, self.host_ip, self.capacity, self.gpu_count)
        self.uid = str(metadata.get("uid") or "")
        self.labels = dict(metadata.get("labels") or {})
        self.annotations = dict(metadata.get("annotations") or {})
        self.unschedulable = bool((body.get("spec") or {}).get("unschedulable"))
        addresses = status.get("addresses") or []
        self.host_ip = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), self.host_ip)
        runtime = ((status.get("nodeInfo") or {}).get("containerRuntimeVersion") or "containerd://").split(
            ":"
        )[0]
        self.runtime = "cri-o" if runtime == "cri-o" else "containerd"
        self.capacity = {
            k: str(v) for k, v in (status.get("capacity") or {}).items() if k.startswith("nvidia.com/")
        }
        self.model = MODELS.get(self.annotations.get(MODEL_ANNOTATION, ""))
        try:
            self.gpu_count = int(self.annotations.get(COUNT_ANNOTATION, "0"))
        except ValueError:
            self.gpu_count = 0
        if self.model is None and self.gpu_count:
            self.model = MODELS["L4"]
        if not self.restored:
            self.restore()
        after = (self.labels, self.unschedulable, self.host_ip, self.capacity, self.gpu_count)
        if after != before:
            self.notify()
        return after != before

    def restore(self) -> None:
        """Rebuild the host from its mirror (an emulator restart), or start a fresh node: also when the
        mirror is of an earlier Node of the same name (deleted and created again)."""
        self.restored = True
        found = self.saved or SavedHost("", {})
        saved = found.data if found.node_uid == self.uid else {}
        self.saved = None
        self.mirrored = dict(found.data)  # what the ConfigMap says now: a fresh host's first flush resets it
        self.baseline = _baseline(self.model, self.runtime)
        self.files = dict(self.baseline)
        files = saved.get(FILES_KEY)
        if files:
            for path, value in json.loads(files).items():
                self.files[path] = Symlink(value["symlink"]) if isinstance(value, dict) else value
        self.driver = saved.get(DRIVER_KEY) or None
        if self.driver:
            self.files[MODULE_REFCNT] = "0\n"
        self.runtime_handlers = set(filter(None, saved.get(HANDLERS_KEY, "").split(",")))
        mig = saved.get(MIG_KEY)
        self.mig = [MigGpu(g["enabled"], list(g["devices"])) for g in json.loads(mig)] if mig else []
        if len(self.mig) != self.gpu_count:
            self.mig = [MigGpu() for _ in range(self.gpu_count)]
        self.known_resources = {
            k for k in self.capacity if k == "nvidia.com/gpu" or k.startswith("nvidia.com/")
        }

    # --- change notification --------------------------------------------------------------------

    def notify(self) -> None:
        """Wake everything waiting on this node (an image polling a file, a kubelet waiting on a runtime)."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    def changed(self) -> None:
        """The emulated host changed: wake waiters and schedule the mirror."""
        self.notify()
        self._on_dirty(self)

    async def wait_change(self, timeout: float | None = None) -> None:
        # asyncio.timeout, not wait_for: wait_for can swallow a cancellation that races the event.
        event = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    # --- the host filesystem --------------------------------------------------------------------

    def read(self, path: str) -> Entry | None:
        return self.files.get(posixpath.normpath(path))

    def exists(self, path: str) -> bool:
        return self.read(path) is not None or self.is_dir(path)

    def is_dir(self, path: str) -> bool:
        path = posixpath.normpath(path)
        if path in BASE_DIRS:
            return True
        prefix = path.rstrip("/") + "/"
        return any(p.startswith(prefix) for p in self.files)

    def listdir(self, path: str) -> list[str]:
        prefix = posixpath.normpath(path).rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/")[0] for p in self.files if p.startswith(prefix)})

    def write(self, path: str, content: Entry) -> None:
        path = posixpath.normpath(path)
        if self.files.get(path) != content:
            self.files[path] = content
            self.changed()

    def remove(self, paths: Iterable[str]) -> None:
        gone = [p for p in (posixpath.normpath(p) for p in paths) if p in self.files]
        for path in gone:
            del self.files[path]
        if gone:
            self.changed()

    def remove_tree(self, root: str) -> None:
        prefix = posixpath.normpath(root).rstrip("/") + "/"
        self.remove([p for p in self.files if p.startswith(prefix) or p == root])

    def validation(self, name: str) -> bool:
        return f"{VALIDATIONS}/{name}" in self.files

    # --- what is not a file ---------------------------------------------------------------------

    def set_driver(self, version: str | None) -> None:
        if self.driver != version:
            self.driver = version
            if version:
                self.files[MODULE_REFCNT] = "0\n"
            else:
                self.files.pop(MODULE_REFCNT, None)
                self.files.pop(MODULE_VERSION, None)
            self.changed()

    def set_handlers(self, handlers: set[str]) -> None:
        if handlers != self.runtime_handlers:
            self.runtime_handlers = set(handlers)
            self.changed()

    def set_mig(self, layout: list[MigGpu]) -> None:
        if [g.as_json() for g in layout] != [g.as_json() for g in self.mig]:
            self.mig = layout
            self.changed()

    def set_resources(self, resources: Mapping[str, int], plugin: str = "nvidia-device-plugin") -> None:
        """The resources `plugin` registers now (its earlier ones, absent here, go)."""
        self.plugin_resources[plugin] = dict(resources)
        merged = {k: v for found in self.plugin_resources.values() for k, v in found.items()}
        if merged != self.resources:
            self.resources = merged
            self.known_resources |= set(resources)
            self.changed()

    # --- the mirror ------------------------------------------------------------------------------

    def mirror(self) -> dict[str, str]:
        """The data of the ConfigMap describing this host."""
        extra = {
            path: ({"symlink": value.target} if isinstance(value, Symlink) else value)
            for path, value in sorted(self.files.items())
            if self.baseline.get(path) != value and path != MODULE_REFCNT
        }
        validations = sorted(p.rsplit("/", 1)[1] for p in self.files if p.startswith(VALIDATIONS + "/"))
        toolkit = "installed" if any(p.startswith("/usr/local/nvidia/toolkit/") for p in self.files) else None
        wanted: dict[str, str | None] = {
            FILES_KEY: json.dumps(extra, sort_keys=True) if extra else None,
            DRIVER_KEY: self.driver,
            HANDLERS_KEY: ",".join(sorted(self.runtime_handlers)) or None,
            MIG_KEY: json.dumps([g.as_json() for g in self.mig])
            if any(g.enabled for g in self.mig)
            else None,
            VALIDATIONS_KEY: ",".join(validations) or None,
            TOOLKIT_KEY: toolkit,
        }
        return {k: v for k, v in wanted.items() if v is not None}


@dataclass(frozen=True)
class SavedHost:
    """A mirror ConfigMap found at start-up: the Node it was written for, and its data."""

    node_uid: str
    data: Mapping[str, str]

    @classmethod
    def of(cls, config_map: Mapping[str, Any]) -> SavedHost:
        owners = (config_map.get("metadata") or {}).get("ownerReferences") or []
        uid = next((str(o.get("uid") or "") for o in owners if o.get("kind") == "Node"), "")
        return cls(uid, dict(config_map.get("data") or {}))


def mirror_config_map(node: NodeState, data: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap to apply for `node`'s mirror: owned by the Node, so it goes with it."""
    metadata: dict[str, Any] = {
        "name": node.name,
        "namespace": HOSTS_NAMESPACE,
        "labels": {HOST_LABEL: "true"},
    }
    if node.uid:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
        ]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": dict(data)}
