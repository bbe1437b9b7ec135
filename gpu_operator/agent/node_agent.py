"""`gpu-operator discover`: the node agent that keeps NFD's NVIDIA PCI labels on its own node.

The Helm chart runs it as a DaemonSet on every Linux node when `nodeDiscovery` is `auto` or
`builtin` (charts/gpu-operator/templates/node-discovery.yaml). What it labels and why is in
gpu_operator/agent/discovery.py; this module is its loop:

- a watch on its own Node (field selector `metadata.name`): a label removed by hand, a node object
  re-registered or NFD starting to label the node is acted on at once;
- in `auto` mode a watch on NFD's CRD by name: NFD installed or removed makes the agent idle or
  resume at once, without a `helm upgrade`;
- a rescan of sysfs every `--rescan-seconds` (default 60 s, as NFD's worker rescans): sysfs has no
  change notification for PCI devices, and PCI hotplug (or a GPU falling off the bus) is rare, so a
  minute is soon enough, and a scan costs a few hundred small file reads. Node events reuse the last
  scan; they cost no file reads.

It writes only when the node's labels differ from what it wants: zero writes at rest. On SIGTERM or
SIGINT it exits 0 leaving the labels as they are, so restarting or upgrading the agent never makes
a node lose its GPU labels (and with them its operands); they go only when the GPUs do.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from gpu_operator.agent.discovery import (
    FIELD_MANAGER,
    NFD_CRD,
    NFD_FEATURE_LABELS,
    PciDevice,
    ScanError,
    gpus,
    in_place,
    labelled_by_nfd,
    labels_to_apply,
    pci_labels,
    read_devices,
)
from gpu_operator.core.node_labels import owned_label_keys
from gpu_operator.runtime.client import ApiError, path
from gpu_operator.runtime.sync_client import SyncKube

log = logging.getLogger("gpu_operator.discover")

Mode = Literal["auto", "builtin"]
Store = Callable[[dict[str, Any] | None], None]
WATCH_SECONDS = 300
"""A server-side watch ends after this long and is resumed from its last resourceVersion."""
MAX_BACKOFF = 30.0
CRD_API = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NODE_API = ("v1", "Node")


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class Agent:
    """One node's agent. `run` blocks until `stop` is set (by a signal, or by a test)."""

    def __init__(
        self,
        kube: SyncKube,
        node_name: str,
        sysfs: Path,
        mode: Mode,
        rescan_seconds: float,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.sysfs = sysfs
        self.mode = mode
        self.rescan_seconds = rescan_seconds
        self.stop = threading.Event()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._node: dict[str, Any] | None = None
        self._nfd_crd: bool | None = None if mode == "auto" else False
        self.devices: list[PciDevice] | None = None
        """The last successful scan; None until one succeeded."""
        self.writes = 0
        self._said = ""

    # --- what the watches report -----------------------------------------------------------------

    def set_node(self, node: dict[str, Any] | None) -> None:
        with self._lock:
            self._node = node
        self.wake.set()

    def set_nfd_crd(self, crd: dict[str, Any] | None) -> None:
        with self._lock:
            self._nfd_crd = crd is not None
        self.wake.set()

    # --- one pass --------------------------------------------------------------------------------

    def scan(self) -> None:
        """Read sysfs; keep the last good result when it cannot be read (never "the GPUs are gone")."""
        try:
            devices = read_devices(self.sysfs)
        except ScanError as exc:
            self._say(logging.ERROR, f"{exc}; keeping the node's labels as they are")
            return
        found = gpus(devices)
        if self.devices is None or found != gpus(self.devices):
            listing = ", ".join(d.describe() for d in found)
            log.info("%d NVIDIA GPU(s) on %s%s", len(found), self.node_name, f": {listing}" if found else "")
        self.devices = devices

    def idle_reason(self) -> str:
        """Why NFD is in charge of this node's PCI labels (auto mode), or "" when the agent is."""
        if self.mode != "auto":
            return ""
        with self._lock:
            node, crd = self._node, self._nfd_crd
        if crd:
            return f"Node Feature Discovery is installed (CRD {NFD_CRD})"
        annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
        if labelled_by_nfd(annotations):
            return f"Node Feature Discovery labels this node (annotation {NFD_FEATURE_LABELS})"
        return ""

    def sync(self) -> None:
        """Bring the node's labels in line with the last scan; ApiError when the write fails."""
        with self._lock:
            node, crd_known = self._node, self._nfd_crd is not None
        if node is None or not crd_known or self.devices is None:
            return  # not listed yet (or deleted): nothing to compare with
        reason = self.idle_reason()
        if reason:
            self._say(logging.INFO, f"idle: {reason}; it keeps the PCI labels")
            return
        metadata = node.get("metadata") or {}
        labels: dict[str, str] = metadata.get("labels") or {}
        owned = owned_label_keys(metadata.get("managedFields") or (), FIELD_MANAGER)
        wanted = labels_to_apply(pci_labels(self.devices), labels, owned)
        if in_place(wanted, labels, owned):
            self._say(logging.INFO, f"labels in place: {sorted(wanted) or 'none'}")
            return
        # force=False: a label someone set since the watch last told us is a 409, never overwritten.
        updated = self.kube.apply_node_labels(
            self.node_name, wanted, str(metadata.get("uid") or ""), manager=FIELD_MANAGER, force=False
        )
        self.writes += 1
        with self._lock:  # the node as written, until the watch brings its own copy
            self._node = updated
        added = sorted(k for k in wanted if k not in owned or labels.get(k) != wanted[k])
        removed = sorted(k for k in owned if k in labels and k not in wanted)
        log.info("labelled node %s: added %s, removed %s", self.node_name, added or "none", removed or "none")

    def _say(self, level: int, message: str) -> None:
        """Log a state once, not once per pass."""
        if message != self._said:
            log.log(level, message)
            self._said = message

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        watches: list[tuple[tuple[str, str], str, Store]] = [(NODE_API, self.node_name, self.set_node)]
        if self.mode == "auto":
            watches.append((CRD_API, NFD_CRD, self.set_nfd_crd))
        for (api_version, kind), name, store in watches:
            thread = threading.Thread(
                target=self.follow, args=(api_version, kind, name, store), name=f"watch-{kind}", daemon=True
            )
            thread.start()
        next_scan = 0.0
        not_before = 0.0  # after a failed write, no new attempt before this, whatever wakes the loop
        backoff = 1.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                self.scan()
                next_scan = now + self.rescan_seconds
            if now >= not_before:
                try:
                    self.sync()
                except ApiError as exc:
                    # 409: someone set one of the labels meanwhile; the node watch brings it, and the
                    # next pass leaves it alone. Anything else (403 from RBAC or the admission policy,
                    # a connection error): the same retry, with backoff.
                    log.warning(
                        "could not label node %s (retrying in %.0fs): %s", self.node_name, backoff, exc
                    )
                    not_before = now + backoff
                    backoff = min(backoff * 2, MAX_BACKOFF)
                    self._said = ""
                else:
                    backoff = 1.0
            wake_at = next_scan if not_before <= now else min(next_scan, not_before)
            self.wake.wait(max(0.0, wake_at - time.monotonic()))
            self.wake.clear()
        log.info("stopped; the node's labels stay as they are")

    def follow(self, api_version: str, kind: str, name: str, store: Store) -> None:
        """List and watch one object by name, calling `store` with it (None: absent) on every change."""
        query = {"fieldSelector": f"metadata.name={name}"}
        backoff = 1.0
        while not self.stop.is_set():
            try:
                listed = self.kube.request("GET", path(api_version, kind), query=query)
                items = listed.get("items") or []
                store(items[0] if items else None)
                version = listed["metadata"]["resourceVersion"]
                backoff = 1.0
                while not self.stop.is_set():
                    watch = {**query, "resourceVersion": version, "allowWatchBookmarks": "true"}
                    for event in self.kube.watch(api_version, kind, watch, WATCH_SECONDS):
                        version = self._event(event, store) or version
            except _Expired:
                continue
            except Exception as exc:  # a dead watch thread would leave the agent blind: never let it end
                log.warning("watch of %s %s failed (retrying in %.0fs): %s", kind, name, backoff, exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    @staticmethod
    def _event(event: dict[str, Any], store: Store) -> str:
        """Apply one watch event; return its resourceVersion."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise _Expired()
            raise ApiError(int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message", "")))
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if kind in ("ADDED", "MODIFIED"):
            store(obj)
        elif kind == "DELETED":
            store(None)
        return version


def run(agent: Agent) -> None:
    """Run until SIGTERM or SIGINT."""

    def stop(signum: int, _frame: object) -> None:
        log.info("%s received, stopping", signal.Signals(signum).name)
        agent.stop.set()
        agent.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()
