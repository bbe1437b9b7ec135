"""Decoding that no input can crash (gpu_operator/runtime/safe_json.py), and the request body kube.py
sends."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpu_operator.core import observed
from gpu_operator.core.upgrade import facts
from gpu_operator.runtime import safe_json
from gpu_operator.runtime.client import Kube

WATCH_EVENTS = Path(__file__).resolve().parents[2] / "bench" / "data" / "watch-events.jsonl.gz"
"""Pod and node watch events recorded from a 10-node rollout (bench/watch_cost.py)."""

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
)


@given(JSON, st.sampled_from([None, 0, 2]))
def test_iterative_parser_reads_what_json_reads(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    assert safe_json.parse_iteratively(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", "[1,]", '{"a"}', '{"a":1,}', "[1 2]", "tru", "{} x", "{1:2}", "-"])
def test_iterative_parser_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        safe_json.parse_iteratively(text)


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict | list) and value:
        value = value["a"] if isinstance(value, dict) else value[0]
        depth += 1
    return depth


@pytest.mark.parametrize("opener, closer", [('{"a":', "}"), ("[", "]")])
def test_deep_documents_decode_truncated(opener: str, closer: str) -> None:
    text = opener * 20000 + "1" + closer * 20000
    with pytest.raises(RecursionError):
        json.loads(text)
    value = safe_json.loads(text.encode())
    assert depth_of(value) == safe_json.MAX_DEPTH  # the innermost kept container holds None


def test_shallow_documents_take_the_fast_path() -> None:
    assert safe_json.loads(b'{"kind": "Pod", "x": [1, 2.5, "\\ud83d\\ude00"]}') == {
        "kind": "Pod",
        "x": [1, 2.5, "\U0001f600"],
    }


def test_what_orjson_refuses_decodes_as_json_does() -> None:
    text = '{"a": "\\ud800 lone surrogate"}'  # orjson refuses it; the API server may store it
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    assert safe_json.loads(text) == json.loads(text)
    assert safe_json.loads(text.encode()) == json.loads(text)


def test_truncated_keeps_order_and_shallow_values() -> None:
    value = {"b": [1, {"c": {"d": {"e": 1}}}], "a": "s"}
    assert safe_json.truncated(value, 3) == {"b": [1, {"c": None}], "a": "s"}
    assert list(safe_json.truncated(value, 3)) == ["b", "a"]
    assert safe_json.truncated(value) == value
    deep: Any = 1
    for _ in range(50000):
        deep = {"a": deep}
    assert depth_of(safe_json.truncated(deep, 10)) == 10


def event_line(
    kind: str,
    managed: list[dict[str, Any]] | None,
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> bytes:
    """A watch event as the API server writes it: ObjectMeta's fields in Go order, managedFields last."""
    metadata: dict[str, Any] = {
        "name": "p",
        "namespace": "gpu-operator",
        "labels": {"app": ']},"spec":{"x":1}', **(labels or {})},  # a value like the end, before it
    }
    if managed is not None:
        metadata["managedFields"] = managed
    body = {"kind": kind, "apiVersion": "v1", "metadata": metadata, "spec": spec or {"nodeName": "n1"}}
    body["status"] = {}
    return json.dumps({"type": "MODIFIED", "object": body}, separators=(",", ":")).encode()


def pod_spec(init: dict[str, Any] | None = None, container: dict[str, Any] | None = None) -> dict[str, Any]:
    """A PodSpec in Go field order, with what the operator reads (nodeName, affinity) after
    restartPolicy and strings that look like the keys around the cut."""
    env = [{"name": "A", "value": '"restartPolicy":"Never"},"spec":{'}]
    return {
        "volumes": [{"name": "run", "hostPath": {"path": "/run/nvidia"}}],
        "initContainers": [{"name": "wait", "image": "i", "env": env, "resources": {}, **(init or {})}],
        "containers": [{"name": "main", "image": "m", "resources": {}, **(container or {})}],
        "restartPolicy": "Always",
        "nodeName": "n1",
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
    }


MANAGED = [
    {
        "manager": 'tricky]},"spec":{"name',  # escaped quotes: never the structural end
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {'k:{"name":"spec"}': {".": {}}, "f:containers": {}}, "f:status": {}},
    },
    {"manager": "kwok", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}},
]


def without_managed_fields(line: bytes) -> Any:
    """The event decoded whole, less the pod's managedFields: what loads_event keeps at the least."""
    whole = json.loads(line)
    del whole["object"]["metadata"]["managedFields"]
    return whole


def test_a_pod_events_managed_fields_are_left_out_and_nothing_else() -> None:
    line = event_line("Pod", MANAGED)
    whole = without_managed_fields(line)
    assert safe_json.loads_event(line) == whole
    assert safe_json.loads_event(line + b"\n") == whole


def test_an_operand_pods_containers_and_volumes_are_left_out_and_nothing_else() -> None:
    line = event_line("Pod", MANAGED, pod_spec())
    whole = without_managed_fields(line)
    for key in ("volumes", "initContainers", "containers"):
        del whole["object"]["spec"][key]
    assert safe_json.loads_event(line) == whole
    assert safe_json.loads_event(event_line("Pod", None, pod_spec())) == json.loads(
        event_line("Pod", None, pod_spec())
    ), "no managedFields: an unusual layout, decoded whole"


@pytest.mark.parametrize(
    ("labels", "init", "container"),
    [
        ({"app.kubernetes.io/component": "nvidia-driver"}, None, None),  # its DRIVER_CONFIG_DIGEST is read
        ({}, {"restartPolicy": "Always"}, None),  # a sidecar: an init container's restartPolicy first
        ({}, None, {"resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]}),
    ],
)
def test_a_driver_pod_or_a_restart_policy_in_a_container_keeps_the_containers(
    labels: dict[str, str], init: dict[str, Any] | None, container: dict[str, Any] | None
) -> None:
    line = event_line("Pod", MANAGED, pod_spec(init, container), labels)
    whole = without_managed_fields(line)
    assert safe_json.loads_event(line) == whole


def test_what_the_store_keeps_of_real_pod_events_is_the_same_decoded_slim() -> None:
    """Every pod event recorded from a 10-node rollout (bench/data): the slim decoding leaves out only
    the managed fields and (but for driver pods) the volumes and containers, and the Store's records
    of the pod are the same."""
    events = [
        line
        for line in gzip.decompress(WATCH_EVENTS.read_bytes()).splitlines()
        if json.loads(line)["object"]["kind"] == "Pod"
    ]
    components = set()
    for line in events:
        whole = json.loads(line)["object"]
        slim = safe_json.loads_event(line)["object"]
        component = observed.component_of(whole["metadata"])
        components.add(component)
        del whole["metadata"]["managedFields"]
        if component != "driver":
            for key in ("volumes", "initContainers", "containers", "ephemeralContainers"):
                whole["spec"].pop(key, None)
        assert slim == whole
        assert observed.pod_info(slim) == observed.pod_info(whole)
        assert facts.driver_pod(slim) == facts.driver_pod(whole)
        assert facts.validator_pod(slim) == facts.validator_pod(whole)
    assert {"driver", "container-toolkit", "device-plugin", "operator-validator"} <= components


def test_other_kinds_and_other_layouts_decode_whole() -> None:
    node = event_line("Node", MANAGED)  # a node's field managers say which labels are the operator's
    assert safe_json.loads_event(node) == json.loads(node)
    bare = event_line("Pod", None)
    assert safe_json.loads_event(bare) == json.loads(bare)
    # No spec after the metadata (never so from an API server): the cut would not decode, all is decoded.
    odd = (
        b'{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p","managedFields":[]},'
        b'"status":{"m":{"n":[]},"spec":1}}}'
    )
    assert odd.find(b']},"spec":') > odd.find(b',"managedFields":[') > 0
    assert safe_json.loads_event(odd) == json.loads(odd)


class RecordingApi:
    """Just enough of kubernetes_asyncio's ApiClient to see the bytes Kube sends."""

    def __init__(self) -> None:
        self.sent: Any = None

    async def call_api(
        self, resource_path: str, method: str, header_params: dict[str, str], body: Any, **_: Any
    ) -> Any:
        self.sent = (header_params["Content-Type"], body)
        answer = body if isinstance(body, bytes) else b"{}"

        class Response:
            status = 200

            async def read(self) -> bytes:
                return answer

            def release(self) -> None:
                pass

        return Response()


@pytest.mark.parametrize(
    "value", ["\U0001f600 gpu", "del\x7f c1\x85\x9f", "ls\u2028ps\u2029", "bom\ufeff\ufffe", "\x00"]
)
def test_apply_body_is_yaml_that_keeps_every_character(value: str) -> None:
    api = RecordingApi()
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "n"},
        "data": {"v": value},
    }
    asyncio.run(Kube(api).apply(body))  # type: ignore[arg-type]
    content_type, sent = api.sent
    # The charset keeps kubernetes_asyncio from encoding the body itself (json.dumps) under this type.
    assert content_type == "application/apply-patch+yaml; charset=utf-8"
    assert isinstance(sent, bytes)
    text = sent.decode("utf-8")
    # UTF-16 surrogate escapes are what the API server's YAML decoder refuses.
    assert "\\ud8" not in text.lower() and "\\ud" not in text.lower()
    assert yaml.safe_load(text) == body
    assert json.loads(text) == body
