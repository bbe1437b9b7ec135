"""nfd-master, as far as GFD needs it: NodeFeature objects become node labels.

GFD v0.20 does not label nodes itself: it creates or updates a NodeFeature
``nvidia-features-for-<node>`` in its namespace (k8s-device-plugin v0.20.0 internal/lm/output.go:115-172)
and NFD's nfd-master copies ``spec.labels`` of every NodeFeature labelled
``nfd.node.kubernetes.io/node-name=<node>`` to that node. nfd-master remembers which labels it set in
the node annotation ``nfd.node.kubernetes.io/feature-labels`` and removes those that no NodeFeature
asks for any more (a NodeFeature deleted with its DaemonSet takes its labels with it).

Labels nfd-master did not set (the simulated nodes start with NFD worker's PCI and OS labels) are
never touched. Writes use the admin identity: nfd-master is part of the cluster, not an operand.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .api import ApiError
from .node import NodeState

if TYPE_CHECKING:
    from .emulator import Emulator

log = logging.getLogger("emulators")

JSON = dict[str, Any]
NODEFEATURES = "/apis/nfd.k8s-sigs.io/v1alpha1/nodefeatures"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
FEATURE_LABELS_ANNOTATION = "nfd.node.kubernetes.io/feature-labels"
DEFAULT_NS = "feature.node.kubernetes.io/"


def _short(label: str) -> str:
    """nfd-master lists labels of its default namespace without the prefix."""
    return label.removeprefix(DEFAULT_NS)


def _full(name: str) -> str:
    return name if "/" in name else DEFAULT_NS + name


class NfdMaster:
    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.features: dict[str, tuple[str, dict[str, str]]] = {}
        """NodeFeature (namespace/name) → (node, labels)."""
        self.synced = False
        self._by_node: dict[str, set[str]] = {}

    def on_node_feature(self, kind: str, body: JSON) -> None:
        if kind == "SYNC":
            before = {node for node, _ in self.features.values()}
            self.features, self._by_node = {}, {}
            for item in body["items"]:
                self._record(item)
            self.synced = True
            for node in before | {node for node, _ in self.features.values()}:
                self._reconcile(node)
            return
        key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
        old = self.features.pop(key, None)
        if old is not None:
            self._by_node.get(old[0], set()).discard(key)
        if kind != "DELETED":
            self._record(body)
        for node in {old[0] if old else "", self.features.get(key, ("", {}))[0]} - {""}:
            self._reconcile(node)

    def _record(self, body: JSON) -> None:
        node = ((body.get("metadata") or {}).get("labels") or {}).get(NODE_NAME_LABEL, "")
        labels = dict((body.get("spec") or {}).get("labels") or {})
        if node:
            key = f"{body['metadata'].get('namespace')}/{body['metadata']['name']}"
            self.features[key] = (node, labels)
            self._by_node.setdefault(node, set()).add(key)

    def desired(self, node: str) -> dict[str, str]:
        labels: dict[str, str] = {}
        for name in sorted(self._by_node.get(node, ())):
            labels.update(self.features[name][1])
        return labels

    def node_changed(self, node: NodeState) -> None:
        """A node event: relabel if its labels drifted from what NodeFeatures ask for."""
        if self.synced:
            self._reconcile(node.name)

    def resync(self) -> None:
        for name in list(self.emu.nodes):
            self._reconcile(name)

    def _reconcile(self, name: str) -> None:
        node = self.emu.nodes.get(name)
        if node is None or not self.synced:
            return
        want = self.desired(name)
        ours = {_full(n) for n in node.annotations.get(FEATURE_LABELS_ANNOTATION, "").split(",") if n}
        patch: dict[str, str | None] = {k: v for k, v in want.items() if node.labels.get(k) != v}
        patch.update({k: None for k in ours - set(want) if k in node.labels})
        annotation = ",".join(sorted(_short(k) for k in want)) or None
        if not patch and annotation == node.annotations.get(FEATURE_LABELS_ANNOTATION):
            return
        body = {"metadata": {"labels": patch, "annotations": {FEATURE_LABELS_ANNOTATION: annotation}}}
        # What we wrote, so the next node event does not write it again.
        for key, value in patch.items():
            if value is None:
                node.labels.pop(key, None)
            else:
                node.labels[key] = value
        if annotation is None:
            node.annotations.pop(FEATURE_LABELS_ANNOTATION, None)
        else:
            node.annotations[FEATURE_LABELS_ANNOTATION] = annotation
        self.emu.spawn(self._write(name, body), f"nfd {name}")

    async def _write(self, name: str, body: JSON) -> None:
        try:
            await self.emu.api.patch(f"/api/v1/nodes/{name}", body)
            log.info("nfd-master: node %s labels %s", name, body["metadata"]["labels"])
        except ApiError as exc:
            if not exc.not_found:
                log.warning("nfd-master: node %s: %s", name, exc)
