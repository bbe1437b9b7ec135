"""Built-in GPU node discovery: reading fake sysfs trees, the NFD labels, add-if-absent, the agent's passes.

The fake trees are laid out as the kernel lays out sysfs: `bus/pci/devices/<address>` is a symlink into
`devices/pci0000:00/<address>`, whose `driver` is a symlink to `bus/pci/drivers/<name>`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from builders import label_owner, node_body

from gpu_operator import cli
from gpu_operator.agent.discovery import (
    FIELD_MANAGER,
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
from gpu_operator.agent.node_agent import Agent
from gpu_operator.core.node_labels import PCI_LABELS, NodeInfo
from gpu_operator.runtime.client import ApiError

VENDOR_ONLY, CLASS_0302, CLASS_0300 = (
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)

# (vendor, device, class, driver or None) by PCI address, as the files hold them.
Tree = Mapping[str, tuple[str, str, str, str | None]]

H100 = ("0x10de", "0x2330", "0x030200", "nvidia")
H100_VFIO = ("0x10de", "0x2330", "0x030200", "vfio-pci")
RTX_VGA = ("0x10de", "0x2684", "0x030000", "nvidia")
RTX_AUDIO = ("0x10de", "0x22ba", "0x040300", "snd_hda_intel")
NVSWITCH = ("0x10de", "0x22a3", "0x068000", None)
AMD_VGA = ("0x1002", "0x744c", "0x030000", "amdgpu")
INTEL_VGA = ("0x8086", "0x46a6", "0x030000", "i915")
HOST_BRIDGE = ("0x8086", "0x09a2", "0x060000", None)
MELLANOX = ("0x15b3", "0x101d", "0x020000", "mlx5_core")


def write_sysfs(root: Path, tree: Tree) -> Path:
    """A sysfs tree at `root` with these devices (existing devices not in `tree` are removed)."""
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    for link in devices.iterdir():
        if link.name not in tree:
            link.unlink()
    for address, (vendor, device, pci_class, driver) in tree.items():
        real = root / "devices" / "pci0000:00" / address
        real.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (real / name).write_text(value + "\n")
        if driver:
            (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../bus/pci/drivers/{driver}", real / "driver")
        if not (devices / address).is_symlink():
            os.symlink(f"../../../devices/pci0000:00/{address}", devices / address)
    return root


def labels_for(tmp_path: Path, tree: Tree) -> dict[str, str]:
    return pci_labels(read_devices(write_sysfs(tmp_path, tree)))


# --- reading sysfs and the labels NFD would set -----------------------------------------------------


def test_nvidia_gpus_give_the_vendor_and_class_labels(tmp_path: Path) -> None:
    tree = {"0000:00:00.0": HOST_BRIDGE, "0000:3b:00.0": H100, "0000:86:00.0": H100, "0000:17:00.0": MELLANOX}
    devices = read_devices(write_sysfs(tmp_path, tree))
    assert [d.address for d in devices] == sorted(tree)
    assert gpus(devices) == [
        PciDevice("0000:3b:00.0", "10de", "2330", "0302", "nvidia"),
        PciDevice("0000:86:00.0", "10de", "2330", "0302", "nvidia"),
    ]
    assert pci_labels(devices) == {VENDOR_ONLY: "true", CLASS_0302: "true"}


def test_no_gpu_gives_no_label(tmp_path: Path) -> None:
    assert labels_for(tmp_path, {"0000:00:00.0": HOST_BRIDGE, "0000:17:00.0": MELLANOX}) == {}
    assert labels_for(tmp_path / "empty", {}) == {}


def test_other_vendors_gpus_give_no_label(tmp_path: Path) -> None:
    assert labels_for(tmp_path, {"0000:03:00.0": AMD_VGA, "0000:00:02.0": INTEL_VGA}) == {}


def test_nvidia_functions_that_are_not_gpus_give_no_label(tmp_path: Path) -> None:
    """The HDMI audio function of a graphics card (0403) and NVSwitch (0680) are NVIDIA devices, not GPUs."""
    assert labels_for(tmp_path, {"0000:01:00.1": RTX_AUDIO, "0000:c1:00.0": NVSWITCH}) == {}


def test_a_graphics_card_gives_the_vga_class_label(tmp_path: Path) -> None:
    tree = {"0000:01:00.0": RTX_VGA, "0000:01:00.1": RTX_AUDIO, "0000:00:02.0": INTEL_VGA}
    assert labels_for(tmp_path, tree) == {VENDOR_ONLY: "true", CLASS_0300: "true"}


def test_vfio_bound_gpus_are_labelled_and_reported_as_passthrough(tmp_path: Path) -> None:
    """NFD labels by vendor and class whatever the driver; the agent does the same and says so."""
    tree = {"0000:3b:00.0": H100_VFIO, "0000:86:00.0": H100}
    devices = read_devices(write_sysfs(tmp_path, tree))
    assert pci_labels(devices) == {VENDOR_ONLY: "true", CLASS_0302: "true"}
    vfio, bound = gpus(devices)
    assert vfio.passthrough and not bound.passthrough
    assert vfio.describe() == "0000:3b:00.0 10de:2330 3D controller (vfio-pci: passthrough)"
    assert bound.describe() == "0000:86:00.0 10de:2330 3D controller (nvidia)"


def test_every_label_is_one_the_operator_reads(tmp_path: Path) -> None:
    labels = labels_for(tmp_path, {"0000:01:00.0": RTX_VGA, "0000:3b:00.0": H100})
    assert set(labels) == set(PCI_LABELS)
    for key in labels:
        assert NodeInfo("n", {key: "true"}).is_gpu


def test_a_device_that_cannot_be_read_is_left_out(tmp_path: Path) -> None:
    write_sysfs(tmp_path, {"0000:3b:00.0": H100, "0000:86:00.0": H100})
    (tmp_path / "devices" / "pci0000:00" / "0000:86:00.0" / "class").unlink()
    assert [d.address for d in read_devices(tmp_path)] == ["0000:3b:00.0"]


def test_an_unreadable_sysfs_is_an_error_not_an_empty_node(tmp_path: Path) -> None:
    with pytest.raises(ScanError, match=r"cannot list .*bus/pci/devices: No such file or directory"):
        read_devices(tmp_path)


# --- add if absent ----------------------------------------------------------------------------------

FOUND = {VENDOR_ONLY: "true", CLASS_0302: "true"}


def test_absent_labels_are_added() -> None:
    assert labels_to_apply(FOUND, {}, frozenset()) == FOUND


def test_labels_someone_else_set_are_never_taken_over_whatever_their_value() -> None:
    """NFD (or a person) set the vendor label, even to false: the agent adds only the other one."""
    for value in ("true", "false"):
        assert labels_to_apply(FOUND, {VENDOR_ONLY: value}, frozenset()) == {CLASS_0302: "true"}


def test_own_labels_are_kept_while_the_gpus_are_there_and_dropped_after() -> None:
    own = frozenset(FOUND)
    assert labels_to_apply(FOUND, FOUND, own) == FOUND
    assert labels_to_apply({}, FOUND, own) == {}


def test_in_place_compares_only_the_agents_own_labels() -> None:
    assert in_place(FOUND, FOUND, frozenset(FOUND))
    assert in_place({CLASS_0302: "true"}, FOUND, frozenset({CLASS_0302}))  # the other is NFD's
    assert not in_place(FOUND, {}, frozenset())
    assert not in_place({}, FOUND, frozenset(FOUND))  # the GPUs are gone: remove ours
    assert in_place({}, {VENDOR_ONLY: "true"}, frozenset())  # not ours: nothing to do


def test_nfd_is_recognised_by_its_annotation() -> None:
    assert labelled_by_nfd({NFD_FEATURE_LABELS: "cpu-cpuid.ADX,pci-10de.present"})
    assert labelled_by_nfd({f"network.{NFD_FEATURE_LABELS}": ""})  # nfd-master -instance=network
    assert not labelled_by_nfd({"node.alpha.kubernetes.io/ttl": "0"})


# --- the agent's passes, against an API server that does server-side apply of labels ----------------


class FakeNodeApi:
    """One node and server-side apply of its labels: a label belongs to the managers that set it."""

    def __init__(
        self, name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
    ):
        self.name = name
        self.labels = dict(labels or {})
        self.owners: dict[str, set[str]] = {key: {"nfd-master"} for key in self.labels}
        self.annotations = dict(annotations or {})
        self.applied: list[dict[str, str]] = []

    def body(self) -> dict[str, Any]:
        managers = sorted({m for owners in self.owners.values() for m in owners})
        managed = [
            label_owner(
                [k for k, o in self.owners.items() if manager in o],
                manager,
                "Apply" if manager == FIELD_MANAGER else "Update",
            )
            for manager in managers
        ]
        uid = f"uid-{self.name}"
        return node_body(
            self.name, self.labels, uid=uid, annotations=self.annotations, managed_fields=managed
        )

    def set_by_nfd(self, key: str, value: str) -> None:
        self.labels[key] = value
        self.owners[key] = {"nfd-master"}

    def apply_node_labels(
        self, node: str, labels: dict[str, str], uid: str, manager: str, force: bool
    ) -> dict[str, Any]:
        # The uid is the precondition that keeps the write from creating a Node deleted meanwhile.
        assert node == self.name and uid == f"uid-{self.name}" and manager == FIELD_MANAGER and not force
        for key, value in labels.items():
            if key in self.labels and self.labels[key] != value and self.owners[key] - {manager}:
                raise ApiError(409, "Conflict", f"conflict with nfd-master: .metadata.labels.{key}")
        self.applied.append(dict(labels))
        for key in [k for k, o in self.owners.items() if manager in o and k not in labels]:
            self.owners[key].discard(manager)
            if not self.owners[key]:
                del self.owners[key], self.labels[key]
        for key, value in labels.items():
            self.labels[key] = value
            self.owners.setdefault(key, set()).add(manager)
        return self.body()


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    return write_sysfs(tmp_path, {"0000:3b:00.0": H100, "0000:00:00.0": HOST_BRIDGE})


def agent_for(api: FakeNodeApi, sysfs: Path, mode: str = "builtin", nfd_crd: bool = False) -> Agent:
    agent = Agent(api, api.name, sysfs, mode, 60.0)  # type: ignore[arg-type]
    agent.set_node(api.body())
    agent.set_nfd_crd({"metadata": {"name": "nodefeatures.nfd.k8s-sigs.io"}} if nfd_crd else None)
    return agent


def sync(agent: Agent, api: FakeNodeApi, scan: bool = True) -> None:
    """One pass of the agent's loop: the watch has delivered the node as the fake server has it."""
    if scan:
        agent.scan()
    agent.set_node(api.body())
    agent.sync()


def test_agent_adds_the_labels_once_and_then_writes_nothing(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0")
    agent = agent_for(api, sysfs)
    sync(agent, api)
    assert api.labels == FOUND
    assert api.owners == {VENDOR_ONLY: {FIELD_MANAGER}, CLASS_0302: {FIELD_MANAGER}}
    for _ in range(3):
        sync(agent, api)
    assert agent.writes == 1, api.applied


def test_agent_removes_its_labels_when_the_gpus_go_and_restores_a_removed_one(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0")
    agent = agent_for(api, sysfs)
    sync(agent, api)
    del api.labels[CLASS_0302], api.owners[CLASS_0302]  # `kubectl label node gpu-0 ...pci-0302_10de.present-`
    sync(agent, api, scan=False)  # the node watch's event alone brings it back
    assert api.labels == FOUND
    write_sysfs(sysfs, {"0000:00:00.0": HOST_BRIDGE})
    sync(agent, api)
    assert api.labels == {}
    assert agent.writes == 3


def test_agent_never_overwrites_nor_removes_what_nfd_set(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0", {VENDOR_ONLY: "false"})
    agent = agent_for(api, sysfs)
    sync(agent, api)
    assert api.labels == {VENDOR_ONLY: "false", CLASS_0302: "true"}
    assert api.owners[VENDOR_ONLY] == {"nfd-master"}
    write_sysfs(sysfs, {})
    sync(agent, api)
    assert api.labels == {VENDOR_ONLY: "false"}


def test_agent_loses_a_race_with_nfd_without_overwriting(sysfs: Path) -> None:
    """NFD sets a label between the node watch's last event and the agent's write: a 409, no change."""
    api = FakeNodeApi("gpu-0")
    agent = agent_for(api, sysfs)
    agent.scan()
    api.set_by_nfd(CLASS_0302, "false")  # the agent has not seen this yet
    with pytest.raises(ApiError, match="409"):
        agent.sync()
    assert api.labels == {CLASS_0302: "false"}
    sync(agent, api, scan=False)  # the watch event arrives: the agent leaves that label alone
    assert api.labels == {CLASS_0302: "false", VENDOR_ONLY: "true"}


def test_an_unreadable_sysfs_keeps_the_labels(sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    api = FakeNodeApi("gpu-0")
    agent = agent_for(api, sysfs)
    sync(agent, api)
    agent.sysfs = sysfs / "not-mounted"
    sync(agent, api)
    assert api.labels == FOUND and agent.writes == 1
    assert "cannot list" in caplog.text and "keeping the node's labels" in caplog.text


def test_auto_mode_idles_while_nfd_is_installed_or_labels_the_node(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0")
    agent = agent_for(api, sysfs, mode="auto", nfd_crd=True)
    sync(agent, api)
    assert agent.writes == 0 and "CRD nodefeatures.nfd.k8s-sigs.io" in agent.idle_reason()
    api.annotations[NFD_FEATURE_LABELS] = "pci-10de.present"
    agent.set_nfd_crd(None)
    sync(agent, api)
    assert agent.writes == 0 and NFD_FEATURE_LABELS in agent.idle_reason()
    api.annotations.clear()  # NFD uninstalled (its garbage collector removes the annotation)
    sync(agent, api)
    assert api.labels == FOUND and agent.idle_reason() == ""


def test_auto_mode_waits_until_it_knows_whether_nfd_is_installed(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0")
    agent = Agent(api, api.name, sysfs, "auto", 60.0)  # type: ignore[arg-type]
    sync(agent, api)
    assert agent.writes == 0
    agent.set_nfd_crd(None)
    sync(agent, api)
    assert agent.writes == 1


def test_builtin_mode_labels_even_with_nfd(sysfs: Path) -> None:
    api = FakeNodeApi("gpu-0", annotations={NFD_FEATURE_LABELS: "cpu-cpuid.ADX"})
    agent = agent_for(api, sysfs, mode="builtin", nfd_crd=True)
    sync(agent, api)
    assert api.labels == FOUND


# --- the watch: list, then events, relist on 410 ----------------------------------------------------


class ScriptedWatchApi:
    """`request` lists (one node or none), `watch` replays one script per call; stops the agent at the end."""

    def __init__(
        self, agent_stop: Any, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]]]
    ):
        self.stop = agent_stop
        self.lists = lists
        self.watches = watches
        self.calls: list[str] = []

    def request(self, method: str, url: str, query: dict[str, str]) -> dict[str, Any]:
        self.calls.append(f"list {query['fieldSelector']}")
        return {"metadata": {"resourceVersion": "10"}, "items": self.lists.pop(0)}

    def watch(
        self, api_version: str, kind: str, query: dict[str, str], timeout: int
    ) -> Iterator[dict[str, Any]]:
        self.calls.append(f"watch from {query['resourceVersion']}")
        if not self.watches:
            self.stop.set()
            return
        yield from self.watches.pop(0)


def node(version: str, **labels: str) -> dict[str, Any]:
    """The agent's node gpu-0 at resourceVersion `version` (a shorthand of builders.node_body for the
    scripted listings and watch events below)."""
    return node_body("gpu-0", labels, resource_version=version)


def test_follow_lists_watches_resumes_and_relists_when_expired(sysfs: Path) -> None:
    agent = Agent(None, "gpu-0", sysfs, "builtin", 60.0)  # type: ignore[arg-type]
    seen: list[Any] = []
    api = ScriptedWatchApi(
        agent.stop,
        lists=[[node("10")], []],
        watches=[
            [{"type": "MODIFIED", "object": node("11", a="1")}, {"type": "BOOKMARK", "object": node("12")}],
            [{"type": "DELETED", "object": node("13")}, {"type": "ERROR", "object": {"code": 410}}],
        ],
    )
    agent.kube = api  # type: ignore[assignment]
    agent.follow("v1", "Node", "gpu-0", seen.append)
    assert [s and s["metadata"]["resourceVersion"] for s in seen] == ["10", "11", None, None]
    assert api.calls == [
        "list metadata.name=gpu-0",
        "watch from 10",
        "watch from 12",  # resumed after the server ended the first watch, from the bookmark
        "list metadata.name=gpu-0",  # 410 Gone: list again
        "watch from 10",
    ]


# --- the command line -------------------------------------------------------------------------------


def test_dry_run_prints_the_gpus_and_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_sysfs(tmp_path, {"0000:3b:00.0": H100_VFIO, "0000:01:00.1": RTX_AUDIO})
    assert cli.main(["discover", "--sysfs", str(tmp_path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "# 0000:3b:00.0 10de:2330 3D controller (vfio-pci: passthrough)",
        f"{VENDOR_ONLY}=true",
        f"{CLASS_0302}=true",
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dry-run", "--sysfs", "/nonexistent"], "discover: cannot list /nonexistent/bus/pci/devices"),
        (["--node-name", ""], "discover: no node name: give --node-name or set NODE_NAME"),
        (["--rescan-seconds", "0"], "must be more than 0"),
        (["--rescan-seconds", "soon"], "not a number: 'soon'"),
        (["--mode", "nfd"], "invalid choice: 'nfd'"),
    ],
)
def test_discover_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(["discover", *argv]) == 2
    assert message in capsys.readouterr().err
