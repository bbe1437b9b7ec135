"""The only module that talks to the API server: server-side apply, delete, node labels, status, events.

A small generic client over the `kubernetes` package's ApiClient (its configuration, credentials and
connection pool): one code path for every kind, no discovery round trips at start-up (the operator
only handles the kinds in RESOURCES), plain dicts in and out. Sync on purpose: it runs in worker
threads, never on the event loop. The operator's informers read with kubernetes_asyncio
(gpu_operator/runtime/informer.py); everything else of the project (the operator's writes, its node
agent, `doctor`, the Helm cleanup hook, the bench and the tests' helpers) uses this client.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config

from gpu_operator.core.observed import ObjectKey
from gpu_operator.core.ownership import FIELD_MANAGER
from gpu_operator.core.yaml_text import tojson
from gpu_operator.runtime import metrics, safe_json

EVENTS_NAMESPACE = "default"
LIST_PAGE = 500
Timeout = tuple[float, float]
"""(connect, read) seconds."""

# (apiVersion, kind) → (plural, namespaced)
RESOURCES: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("v1", "Pod"): ("pods", True),
    ("v1", "Event"): ("events", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("v1", "ResourceQuota"): ("resourcequotas", True),
    ("v1", "Node"): ("nodes", False),
    ("v1", "Namespace"): ("namespaces", False),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("node.k8s.io/v1", "RuntimeClass"): ("runtimeclasses", False),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("priorityclasses", False),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("servicemonitors", True),
    ("nvidia.com/v1", "ClusterPolicy"): ("clusterpolicies", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
}


def _verb(method: str, content_type: str) -> str:
    if method == "PATCH":
        return "apply" if content_type == "application/apply-patch+yaml" else "patch"
    return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method.lower())


class ApiError(Exception):
    """A failed API call, with the server's status code, message and, for a refused object, the fields
    it names (`details.causes` of the Status: (field path, message) pairs)."""

    def __init__(
        self, status: int, reason: str, message: str, causes: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes
        super().__init__(f"{status} {reason}: {message}")


def _causes(details: Any) -> tuple[tuple[str, str], ...]:
    causes = (details or {}).get("causes") if isinstance(details, dict) else None
    if not isinstance(causes, list):
        return ()
    return tuple(
        (str(c.get("field") or ""), str(c.get("message") or "")) for c in causes if isinstance(c, dict)
    )


PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
"""Accept header for an object's metadata alone: a Secret looked up this way never sends its data."""


def _refusal(status: int, data: bytes) -> ApiError:
    """The ApiError of an answer that is not a 2xx, from its Status body when it has one."""
    try:
        details = safe_json.loads(data)
        return ApiError(
            status, details.get("reason", ""), details.get("message", ""), _causes(details.get("details"))
        )
    except (ValueError, AttributeError):
        return ApiError(status, "", data.decode(errors="replace")[:300])


def _observe(method: str, content_type: str, query: Mapping[str, str] | None, kind: str, status: int) -> None:
    """Count a write (anything but GET) in the metrics by `kind`, a dry run apart."""
    if (query or {}).get("dryRun"):
        metrics.observe_dry_run(kind, status)
    elif method != "GET":
        metrics.observe_write(_verb(method, content_type), kind, status)


def path(api_version: str, kind: str, namespace: str = "", name: str = "", subresource: str = "") -> str:
    """The URL path; a namespaced kind without a namespace is its list across all namespaces."""
    plural, namespaced = RESOURCES[(api_version, kind)]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespaced and namespace:
        prefix += f"/namespaces/{namespace}"
    result = f"{prefix}/{plural}"
    if name:
        result += f"/{name}"
    if subresource:
        result += f"/{subresource}"
    return result


def preconditioned(
    api_version: str,
    kind: str,
    name: str,
    labels: Mapping[str, str],
    uid: str,
    resource_version: str = "",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """An apply body for metadata of an existing cluster-scoped object, which can never create it."""
    if not uid:
        raise ValueError(f"{kind} {name}: a metadata write needs the object's uid (it must never create it)")
    metadata: dict[str, Any] = {"name": name, "uid": uid, "labels": dict(labels)}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata}


def gone_or_changed(exc: ApiError) -> bool:
    """Whether a preconditioned write failed only because its object is not as last seen: changed
    since (409), deleted (409 "uid mismatch ... no existing object"), or deleted and created anew
    under the same name (422 on the immutable metadata.uid). The next pass decides again."""
    return exc.status == 409 or (exc.status == 422 and "metadata.uid" in exc.message)


def load_api_client(
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    user_agent: str = "",
    pool_size: int | None = None,
) -> client.ApiClient:
    """A client with its own configuration (never the package's global one, so several can live in one
    process): the kubeconfig when one is given, else in-cluster credentials when running in a pod, else
    $KUBECONFIG or ~/.kube/config. `pool_size`: connections kept per host, at least the number of
    threads that use the client at once. Raises config.ConfigException (or OSError) when none works."""
    configuration = client.Configuration()
    # No retries inside urllib3: its default (3) turns one silent connection into four read timeouts
    # (2 minutes) before a caller hears of it; every caller has its own retry with back-off.
    configuration.retries = 0
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    try:
        if kubeconfig is not None or context is not None:
            raise config.ConfigException("a kubeconfig was asked for")
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=None if kubeconfig is None else str(kubeconfig),
            context=context,
            client_configuration=configuration,
        )
    hook = configuration.refresh_api_key_hook
    if hook is not None:
        configuration.refresh_api_key_hook = throttled(hook, AUTH_REFRESH_SECONDS)
    api = client.ApiClient(configuration)
    if user_agent:
        api.user_agent = user_agent
    return api


AUTH_REFRESH_SECONDS = 1.0
"""How often a request runs the config loader's refresh hook (see `throttled`)."""


def throttled(
    hook: Callable[[Any], None], seconds: float, clock: Callable[[], float] = time.monotonic
) -> Callable[[Any], None]:
    """The credentials' refresh hook, run at most once every `seconds`.

    Both config loaders (kubernetes/config/incluster_config.py and kube_config.py `_set_config`) install
    a hook that the client runs before every request, and it sets `configuration.host` again, whose
    setter reads the proxy settings from the whole environment (`urllib.request.getproxies`): a large
    share of the client's CPU per request (measured: bench/README.md), paid by every write of a
    rollout and every request of the vetting, for settings that do not change between requests. The
    loaders themselves re-read a token only when it is due (incluster_config.py: the token file once a
    minute; kube_config.py: an exec or OIDC token 5 minutes before it expires), so a second's delay
    never sends an expired one."""
    last: float | None = None

    def refresh(configuration: Any) -> None:
        nonlocal hook, last
        now = clock()
        if last is not None and now - last < seconds:
            return
        last = now
        hook(configuration)
        # The loaders' hook installs a new copy of itself each time it runs: keep it behind this one.
        replacement = configuration.refresh_api_key_hook
        if replacement is not None and replacement is not refresh:
            hook = replacement
            configuration.refresh_api_key_hook = refresh

    return refresh


DEFAULT_TIMEOUT: Timeout = (5.0, 30.0)


class NotLeader(ApiError):
    """A write refused before it was sent: this replica does not hold the leader lease."""

    def __init__(self) -> None:
        super().__init__(0, "NotLeader", "this replica does not hold the leader lease; it writes nothing")


def _always() -> bool:
    return True


@dataclass
class Kube:
    api: client.ApiClient
    timeout: Timeout = DEFAULT_TIMEOUT
    """Every call's connect and read timeout, so that no call waits forever on a silent connection."""
    may_write: Callable[[], bool] = _always
    """Asked before every write; False refuses it with NotLeader (a standby replica writes nothing)."""

    def fork(self) -> Kube:
        """A client with the same credentials and a connection pool of its own (for a long watch in a
        thread of its own, which would otherwise hold one of the writers' connections); the same
        timeouts, and writes gated on the same leader lease."""
        api = client.ApiClient(self.api.configuration)
        api.user_agent = self.api.user_agent
        return replace(self, api=api)

    def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        kind: str = "",
        accept: str = "application/json",
        timeout: float | Timeout | None = None,
    ) -> Any:
        """The raw response of the ApiClient, its body not read yet; ApiError for anything but a 2xx
        status. Writes (anything but GET) count in the metrics by `kind`."""
        if method != "GET" and not self.may_write():
            raise NotLeader()
        method_, full_url, headers, payload, _ = self.api.param_serialize(
            method=method,
            resource_path=url,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": accept},
            body=body,
            auth_settings=["BearerToken"],
        )
        status = 0
        try:
            response = self.api.call_api(
                method_,
                full_url,
                header_params=headers,
                body=payload,
                _request_timeout=timeout or self.timeout,
            )
            status = response.status
        except urllib3.exceptions.HTTPError as exc:
            # Connection refused, TLS failure, timeout: reported like an API error, retried the same way.
            raise ApiError(0, "ConnectionError", str(exc)) from None
        finally:
            _observe(method, content_type, query, kind, status)
        if not 200 <= response.status < 300:
            raise _refusal(response.status, response.read())  # type: ignore[no-untyped-call]
        return response

    def _read(self, response: Any) -> bytes:
        try:
            data: bytes = response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise ApiError(0, "ConnectionError", str(exc)) from None
        return data

    def close(self) -> None:
        """Close every connection this client keeps."""
        self.api.close()  # type: ignore[no-untyped-call]

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        kind: str = "",
        accept: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One API call; the JSON response."""
        data = self._read(self._call(method, url, body, query, content_type, kind, accept, timeout))
        # A ClusterPolicy's status patch returns the whole object, whatever its spec holds.
        return safe_json.loads(data) if data else {}

    def watch(
        self, api_version: str, kind: str, query: Mapping[str, str], timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch (`{"type": ..., "object": ...}`) of a kind's collection."""
        return self.stream(path(api_version, kind), query, timeout_seconds)

    def stream(self, url: str, query: Mapping[str, str], timeout_seconds: int) -> Iterator[dict[str, Any]]:
        """The events of a watch of the collection at `url`, until the server ends it after
        `timeout_seconds`. A connection that goes quiet for longer raises ApiError(0, ...)."""
        params = {**query, "watch": "true", "timeoutSeconds": str(timeout_seconds)}
        # The server ends the watch after timeout_seconds; a read timeout above that catches a connection
        # that went silent (a black hole), which no server-side timeout can.
        response = self._call("GET", url, query=params, timeout=(self.timeout[0], timeout_seconds + 30))
        try:
            buffer = b""
            for chunk in response.response.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield safe_json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "ConnectionError", str(exc)) from None
        finally:
            response.response.release_conn()

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        return self.request("GET", path(api_version, kind, namespace, name))

    def metadata(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """An object's metadata alone (`{"metadata": ...}`), None when there is no such object."""
        try:
            return self.request("GET", path(api_version, kind, namespace, name), accept=PARTIAL_METADATA)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list_at(
        self,
        api_version: str,
        kind: str,
        namespace: str = "",
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[dict[str, Any]], str]:
        """`list` (narrowed by a field selector too), and the resourceVersion to watch from."""
        items: list[dict[str, Any]] = []
        query = {"limit": str(LIST_PAGE)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        while True:
            page = self.request("GET", path(api_version, kind, namespace), query=query)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion") or "")
            query["continue"] = metadata["continue"]

    def list(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Every object of a kind (all namespaces when `namespace` is empty), fetched in pages."""
        return self.list_at(api_version, kind, namespace, label_selector)[0]

    def pod_log(self, namespace: str, name: str, container: str, lines: int, previous: bool = False) -> str:
        """The last `lines` lines of a container's log (of its previous run when `previous`)."""
        query = {"container": container, "tailLines": str(lines)}
        if previous:
            query["previous"] = "true"
        return self.text(path("v1", "Pod", namespace, name, "log"), query)

    def text(self, url: str, query: Mapping[str, str] | None = None) -> str:
        """A GET whose answer is text (logs, /readyz)."""
        data = self._read(self._call("GET", url, query=query, accept="text/plain"))
        return data.decode(errors="replace")

    def apply(
        self,
        body: Mapping[str, Any],
        manager: str = FIELD_MANAGER,
        force: bool = True,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply, by default under the operator's field manager taking over conflicting
        fields (drift repair); with force=False a field another manager set to another value is a
        409 Conflict instead. With `dry_run` the API server checks everything it would check (schema,
        validation, admission) and answers with the object it would store, but stores nothing."""
        metadata = body["metadata"]
        url = path(body["apiVersion"], body["kind"], metadata.get("namespace", ""), metadata["name"])
        # The body is YAML to the API server. The client's json.dumps would escape an emoji as a UTF-16
        # surrogate pair, which YAML refuses ("invalid Unicode character escape code"): send the
        # renderer's YAML-safe JSON instead, which keeps every such character as UTF-8.
        query = {"fieldManager": manager, "force": str(force).lower()}
        if dry_run:
            query["dryRun"] = "All"
        return self.request(
            "PATCH",
            url,
            body=tojson(body).encode(),
            query=query,
            content_type="application/apply-patch+yaml",
            kind=body["kind"],
        )

    def delete(self, key: ObjectKey) -> None:
        api_version, kind, namespace, name = key
        try:
            self.request(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"propagationPolicy": "Background"},
                kind=kind,
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    def apply_node_labels(
        self,
        node: str,
        labels: Mapping[str, str],
        uid: str,
        resource_version: str = "",
        manager: str = FIELD_MANAGER,
        force: bool = True,
    ) -> dict[str, Any]:
        """Own exactly `labels` on the node: labels the manager owned and leaves out are removed, others
        untouched. The node's `uid` is a precondition: server-side apply creates an object that does
        not exist, whatever `resourceVersion` says, but not one whose uid it is told (409 "uid
        mismatch"), so a write never brings back a Node deleted meanwhile; see `gone_or_changed`. With
        `resource_version` the write also fails with 409 if the node changed since."""
        return self.apply(preconditioned("v1", "Node", node, labels, uid, resource_version), manager, force)

    def rewrite_labels(
        self, kind: str, name: str, changes: Mapping[str, tuple[str, str | None]]
    ) -> dict[str, Any] | None:
        """Change labels of a cluster-scoped core object (Node, Namespace) whoever owns them: label →
        (the value it must still have, its new value or None to remove it). One JSON patch, test before
        each change, so all or nothing; a label changed meanwhile (422) or an object gone (404) leaves
        nothing to do (the watch brings the new state). Returns the object as written, None then."""
        operations: list[dict[str, str]] = []
        for key, (expected, new) in changes.items():
            pointer = "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")
            operations.append({"op": "test", "path": pointer, "value": expected})
            operations.append(
                {"op": "remove", "path": pointer}
                if new is None
                else {"op": "replace", "path": pointer, "value": new}
            )
        try:
            return self.request(
                "PATCH",
                path("v1", kind, name=name),
                body=operations,
                query={"fieldManager": FIELD_MANAGER},
                content_type="application/json-patch+json",
            )
        except ApiError as exc:
            if exc.status not in (404, 422):
                raise
            return None

    def patch_node(self, name: str, body: Mapping[str, Any], manager: str = FIELD_MANAGER) -> dict[str, Any]:
        """A JSON merge patch of a Node (never creates one: a node that is gone is a 404)."""
        return self.request(
            "PATCH",
            path("v1", "Node", name=name),
            body=dict(body),
            query={"fieldManager": manager},
            content_type="application/merge-patch+json",
            kind="Node",
        )

    def evict(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """POST an Eviction: the API server deletes the pod unless a PodDisruptionBudget forbids it
        (429), which is an ApiError like any refusal."""
        self.request("POST", path("v1", "Pod", namespace, name, "eviction"), body=dict(body), kind="Eviction")

    def delete_pod(self, namespace: str, name: str, options: Mapping[str, Any]) -> None:
        """DELETE a pod with DeleteOptions (a UID precondition: 409 when the name is another pod's now)."""
        self.request("DELETE", path("v1", "Pod", namespace, name), body=dict(options), kind="Pod")

    def patch_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        return self.request(
            "PATCH",
            path("nvidia.com/v1", "ClusterPolicy", name=name, subresource="status"),
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
            kind="ClusterPolicy",
        )

    def post_event(
        self,
        policy: Mapping[str, str],
        type_: str,
        reason: str,
        message: str,
        now: str,
        kind: tuple[str, str] = ("nvidia.com/v1", "ClusterPolicy"),
    ) -> None:
        """An Event on the (cluster-scoped) ClusterPolicy, or on another cluster-scoped object of `kind`
        (a Node), where `kubectl describe` finds it. The API server requires Events about cluster-scoped
        objects to live in `default`."""
        namespace = EVENTS_NAMESPACE
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{policy['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": kind[0],
                "kind": kind[1],
                "name": policy["name"],
                "uid": policy["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
        }
        self.request("POST", path("v1", "Event", namespace), body=body, kind="Event")
