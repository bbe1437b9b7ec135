"""The pool rules: which NVIDIADriver owns each GPU node, and the conflicts (core/driver_pools.py)."""

from __future__ import annotations

from typing import Any

from builders import gpu_node

from gpu_operator.api.nvidiadriver import OWNER_LABEL, NVIDIADriverSpec
from gpu_operator.core.driver_pools import Assignment, Conflict, DriverObject, assign
from gpu_operator.core.node_labels import GPU_PRESENT, NodeInfo

H100 = {"pool": "h100"}
L4 = {"pool": "l4"}


def driver(name: str, selector: dict[str, str] | None = None, **spec: Any) -> DriverObject:
    deleting = spec.pop("deleting", False)
    body = {"version": "595.91.07", **spec}
    if selector is not None:
        body["nodeSelector"] = selector
    return DriverObject(name, f"uid-{name}", NVIDIADriverSpec.model_validate(body), deleting=deleting)


def default(name: str = "fallback") -> DriverObject:
    return driver(name, default=True)


def owners(result: Assignment) -> dict[str, str | None]:
    return {name: owner.owner for name, owner in result.nodes.items()}


def test_a_node_belongs_to_the_driver_whose_selector_it_matches() -> None:
    nodes = [gpu_node("a", H100), gpu_node("b", L4), gpu_node("c", {**H100, "zone": "z1"})]
    result = assign([driver("h100", H100), driver("l4", L4)], nodes)
    assert owners(result) == {"a": "h100", "b": "l4", "c": "h100"}
    assert result.drivers["h100"].nodes == ("a", "c")
    assert result.drivers["l4"].nodes == ("b",)
    assert result.drivers["h100"].uid == "uid-h100"
    assert not result.held()
    assert all(pool.state is None and pool.conditions() == () for pool in result.drivers.values())


def test_every_label_of_the_selector_must_match() -> None:
    result = assign([driver("zoned", {**H100, "zone": "z1"})], [gpu_node("a", H100)])
    assert owners(result) == {"a": None}
    assert result.unowned() == ("a",)


def test_no_selector_or_an_empty_one_selects_every_gpu_node() -> None:
    # GetNodeSelector: nvidia.com/gpu.present=true, which the operator writes on every GPU node in the
    # same pass, so a node it has not labelled yet is selected too.
    nodes = [gpu_node("a"), gpu_node("b", {GPU_PRESENT: "true"})]
    assert owners(assign([driver("all")], nodes)) == {"a": "all", "b": "all"}
    assert owners(assign([driver("all", {})], nodes)) == {"a": "all", "b": "all"}


def test_a_selector_on_gpu_present_follows_what_the_node_carries() -> None:
    # Someone else wrote gpu.present=false: the operator leaves it, and the selector sees it.
    result = assign([driver("present", {GPU_PRESENT: "true"})], [gpu_node("a", {GPU_PRESENT: "false"})])
    assert owners(result) == {"a": None}


def test_the_default_takes_the_gpu_nodes_no_other_selects() -> None:
    nodes = [gpu_node("a", H100), gpu_node("b", L4), gpu_node("c")]
    result = assign([driver("h100", H100), default()], nodes)
    assert owners(result) == {"a": "h100", "b": "fallback", "c": "fallback"}
    assert result.drivers["fallback"].nodes == ("b", "c")
    assert result.drivers["fallback"].state is None
    assert not result.unowned()


def test_the_default_alone_takes_every_gpu_node() -> None:
    nodes = [gpu_node("a", H100), gpu_node("b")]
    result = assign([default()], nodes)
    assert owners(result) == {"a": "fallback", "b": "fallback"}
    assert result.drivers["fallback"].nodes == ("a", "b")


def test_without_a_default_nodes_no_driver_selects_get_no_driver() -> None:
    result = assign([driver("h100", H100)], [gpu_node("a", H100), gpu_node("b", {OWNER_LABEL: "gone"})])
    assert owners(result) == {"a": "h100", "b": None}
    # The label of a driver that is no more goes: no NVIDIADriver wants a driver there.
    assert result.nodes["b"].label is None and result.nodes["b"].moves
    assert result.unowned() == ("b",)


def test_two_defaults_hold_the_nodes_left_to_them_and_fail_both() -> None:
    nodes = [gpu_node("a", H100), gpu_node("b", {OWNER_LABEL: "old"}), gpu_node("c")]
    result = assign([driver("h100", H100), default("old"), default("new")], nodes)
    # The node a selector takes is not in question; the others keep what runs on them.
    assert owners(result) == {"a": "h100", "b": None, "c": None}
    assert result.held() == ("b", "c")
    assert result.nodes["b"].label == "old" and not result.nodes["b"].moves
    assert result.nodes["c"].label is None and not result.nodes["c"].moves
    assert result.nodes["b"].claimants == ("new", "old")
    conflict = Conflict(("new", "old"), ("b", "c"), "ReconcileFailed")
    for name in ("old", "new"):
        pool = result.drivers[name]
        assert pool.nodes == ()
        assert pool.conflicts == (conflict,)
        assert pool.state == "notReady"
        assert pool.conditions() == (
            ("Ready", "False", "Error", ""),
            ("Error", "True", "ReconcileFailed", pool.message),
        )
        assert pool.message.startswith("multiple default NVIDIADrivers found: [new old]")
        assert "2 nodes: b, c" in pool.message
    assert result.drivers["h100"].conflicts == () and result.drivers["h100"].nodes == ("a",)


def test_two_defaults_are_a_conflict_before_any_node_is_left_to_them() -> None:
    result = assign([driver("h100", H100), default("one"), default("two")], [gpu_node("a", H100)])
    assert result.drivers["one"].state == "notReady"
    assert result.drivers["two"].conflicts == (Conflict(("one", "two"), (), "ReconcileFailed"),)
    assert "no GPU node is concerned yet" in result.drivers["two"].message
    assert owners(result) == {"a": "h100"}


def test_overlapping_selectors_hold_the_shared_nodes_and_name_each_other() -> None:
    nodes = [
        gpu_node("both-1", {**H100, "canary": "true", OWNER_LABEL: "h100"}),
        gpu_node("both-2", {**H100, "canary": "true"}),
        gpu_node("only-h100", H100),
        gpu_node("other", L4),
    ]
    drivers = [driver("h100", H100), driver("canary", {"canary": "true"}), driver("l4", L4), default()]
    result = assign(drivers, nodes)
    assert owners(result) == {"both-1": None, "both-2": None, "only-h100": "h100", "other": "l4"}
    # Held: the owner label stays (the h100 driver keeps running on both-1), and both-2, which had none,
    # gets none: neither is given to the default either.
    assert [(n.label, n.moves) for n in (result.nodes["both-1"], result.nodes["both-2"])] == [
        ("h100", False),
        (None, False),
    ]
    assert result.nodes["both-1"].claimants == ("canary", "h100")
    conflict = Conflict(("canary", "h100"), ("both-1", "both-2"), "ConflictingNodeSelector")
    for name in ("h100", "canary"):
        pool = result.drivers[name]
        assert pool.conflicts == (conflict,)
        assert pool.state == "notReady"
        assert pool.conditions()[1][:3] == ("Error", "True", "ConflictingNodeSelector")
        assert "[canary h100]" in pool.message and "2 nodes: both-1, both-2" in pool.message
    # Uninvolved drivers go on (NVIDIA's validator would fail them too: a deliberate difference).
    assert result.drivers["l4"].state is None and result.drivers["fallback"].state is None
    assert result.drivers["h100"].nodes == ("only-h100",)
    assert result.drivers["fallback"].nodes == ()


def test_one_driver_in_two_conflicts_reports_both() -> None:
    nodes = [gpu_node("x", {"a": "1", "b": "1"}), gpu_node("y", {"a": "1", "c": "1"})]
    result = assign([driver("a", {"a": "1"}), driver("b", {"b": "1"}), driver("c", {"c": "1"})], nodes)
    assert [c.drivers for c in result.drivers["a"].conflicts] == [("a", "b"), ("a", "c")]
    assert [c.drivers for c in result.drivers["b"].conflicts] == [("a", "b")]
    message = result.drivers["a"].message
    assert "[a b]" in message and "[a c]" in message and "1 node: x" in message and "1 node: y" in message


def test_three_drivers_on_one_node_are_one_conflict() -> None:
    result = assign([driver(n, {"gpu": "1"}) for n in "abc"], [gpu_node("x", {"gpu": "1"})])
    assert {pool.conflicts for pool in result.drivers.values()} == {
        (Conflict(("a", "b", "c"), ("x",), "ConflictingNodeSelector"),)
    }


def test_a_long_conflict_names_a_few_nodes_and_counts_the_rest() -> None:
    nodes = [gpu_node(f"n{i:02}", H100) for i in range(12)]
    result = assign([driver("a", H100), driver("b", H100)], nodes)
    assert "12 nodes: n00, n01, n02, n03, n04 and 7 more" in result.drivers["a"].message


def test_a_relabelled_node_leaves_its_pool_for_the_one_it_matches() -> None:
    drivers = [driver("h100", H100), driver("l4", L4), default()]
    before = assign(drivers, [gpu_node("a", {**H100, OWNER_LABEL: "h100"})])
    assert before.owner("a") == "h100" and not before.nodes["a"].moves

    # The owner label does not pin a node: its labels decide.
    moved = assign(drivers, [gpu_node("a", {**L4, OWNER_LABEL: "h100"})])
    assert moved.owner("a") == "l4"
    assert moved.nodes["a"].current == "h100" and moved.nodes["a"].label == "l4" and moved.nodes["a"].moves
    assert moved.drivers["h100"].nodes == () and moved.drivers["l4"].nodes == ("a",)

    # Its pool label removed: the default takes it.
    fell_back = assign(drivers, [gpu_node("a", {OWNER_LABEL: "l4"})])
    assert fell_back.owner("a") == "fallback" and fell_back.nodes["a"].moves


def test_a_relabelled_node_that_joins_a_conflict_keeps_its_driver() -> None:
    drivers = [driver("h100", H100), driver("canary", {"canary": "true"})]
    result = assign(drivers, [gpu_node("a", {**H100, "canary": "true", OWNER_LABEL: "h100"})])
    assert result.owner("a") is None and result.nodes["a"].label == "h100" and not result.nodes["a"].moves


def test_non_gpu_nodes_are_ignored() -> None:
    cpu = NodeInfo("cpu-1", {**H100})
    result = assign([driver("h100", H100), driver("also", H100), default()], [cpu, gpu_node("a", L4)])
    # The CPU node matches both selectors: not a conflict, not anybody's, not even listed.
    assert set(result.nodes) == {"a"}
    assert result.drivers["h100"].conflicts == () and result.drivers["also"].conflicts == ()
    assert result.owner("cpu-1") is None


def test_a_node_advertising_gpus_is_a_gpu_node() -> None:
    result = assign([driver("h100", H100)], [NodeInfo("a", H100, gpu_allocatable=8)])
    assert owners(result) == {"a": "h100"}


def test_a_driver_being_deleted_takes_no_node() -> None:
    nodes = [gpu_node("a", {**H100, OWNER_LABEL: "h100"}), gpu_node("b", {**H100, "canary": "true"})]
    drivers = [driver("h100", H100, deleting=True), driver("canary", {"canary": "true"}), default()]
    result = assign(drivers, nodes)
    assert owners(result) == {"a": "fallback", "b": "canary"}
    assert result.drivers["h100"].nodes == () and result.drivers["h100"].conflicts == ()
    # Nor is a deleted default counted twice.
    assert assign([default("one"), driver("two", default=True, deleting=True)], nodes).owner("a") == "one"


def test_the_nodes_of_a_driver_whose_spec_does_not_parse_are_held() -> None:
    broken = DriverObject("h100", "uid-h100", None)
    nodes = [gpu_node("a", {**H100, OWNER_LABEL: "h100"}), gpu_node("b", H100)]
    result = assign([broken, default()], nodes)
    assert result.nodes["a"].held and result.nodes["a"].label == "h100" and not result.nodes["a"].moves
    assert result.nodes["a"].claimants == ("h100",)
    # A node it did not own goes by the rules of the others.
    assert result.owner("b") == "fallback"
    assert result.drivers["h100"].nodes == () and result.drivers["h100"].state is None


def test_the_result_does_not_depend_on_the_order_given() -> None:
    drivers = [driver("h100", H100), driver("l4", L4), driver("canary", {"canary": "true"}), default()]
    nodes = [gpu_node("a", H100), gpu_node("b", {**L4, "canary": "true"}), gpu_node("c")]
    forward = assign(drivers, nodes)
    backward = assign(reversed(drivers), reversed(nodes))
    assert forward == backward
    assert list(forward.nodes) == ["a", "b", "c"]
