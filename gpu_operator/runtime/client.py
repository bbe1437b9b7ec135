"""The only module that talks to the API server: server-side apply, delete, node labels, status, events.

A small generic async client over kubernetes_asyncio's ApiClient (its configuration, credentials and
aiohttp connection pool), the one client library of the project: one code path for every kind, no
discovery round trips at start-up (the operator only handles the kinds in RESOURCES), plain dicts in
and out. Requests go through the public `ApiClient.call_api` with `_preload_content=False`, which
hands back the raw response: bodies are decoded by `safe_json.loads` (no depth of nesting makes it
raise), never by the library's model classes. The operator's informers, writes, lease and drain
watches run on this client in its event loop; what has no event loop of its own (`doctor`, the Helm
cleanup hook, the node agent, the bench and the tests' helpers) calls it through
gpu_operator/runtime/sync_client.py.

Why kubernetes_asyncio: it is the async twin of the official client (same configuration and
kubeconfig loaders: exec plugins, OIDC, in-cluster token refresh), maintained, and already what the
informers needed; its ApiClient accepts any path and a raw body, which is all a generic client
needs. lightkube would bring httpx and a second model layer for the same requests.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from gpu_operator.core.answers import Failure
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
    ("nvidia.com/v1alpha1", "NVIDIADriver"): ("nvidiadrivers", False),
    ("nvidia.com/v1alpha1", "GPUCluster"): ("gpuclusters", False),
    # The GPUCluster's DRA stack (core/gpucluster_render.py).
    ("apps/v1", "Deployment"): ("deployments", True),
    ("resource.k8s.io/v1", "DeviceClass"): ("deviceclasses", False),
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ("resourceclaimtemplates", True),
    ("resource.k8s.io/v1", "ResourceSlice"): ("resourceslices", False),
    ("resource.k8s.io/v1", "ResourceClaim"): ("resourceclaims", True),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): ("validatingadmissionpolicies", False),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (
        "validatingadmissionpolicybindings",
        False,
    ),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
}


APPLY_PATCH = "application/apply-patch+yaml; charset=utf-8"


def _verb(method: str, content_type: str) -> str:
    if method == "PATCH":
        return "apply" if content_type == APPLY_PATCH else "patch"
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

    @property
    def failure(self) -> Failure:
        """The answer as the core reads it (gpu_operator/core/answers.py decides what it means)."""
        return Failure(self.status, self.reason, self.message, self.causes)


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


ConfigException = config.ConfigException
"""Raised by `connect` when neither in-cluster credentials nor a kubeconfig work."""


async def connect(
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    user_agent: str = "",
    pool_size: int | None = None,
) -> client.ApiClient:
    """A client with its own configuration (never the package's global one, so several can live in one
    process): the kubeconfig when one is given, else in-cluster credentials when running in a pod, else
    $KUBECONFIG or ~/.kube/config. `pool_size`: connections at once (a watch holds one the whole
    time; None: no limit). Raises ConfigException (or OSError) when none works. The library's own
    refresh hooks re-read an in-cluster token or an exec plugin's credentials when they are due."""
    configuration = client.Configuration()
    try:
        if kubeconfig is not None or context is not None:
            raise config.ConfigException("a kubeconfig was asked for")
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        files = kubeconfig_files(kubeconfig)
        if not any(os.path.isfile(each) for each in files):
            # Said here, in one line: the loader would log a warning of its own first.
            raise config.ConfigException(
                f"no kubeconfig at {os.pathsep.join(files)}, and not running in a cluster"
            ) from None
        await config.load_kube_config(
            config_file=os.pathsep.join(files), context=context, client_configuration=configuration
        )
    configuration.connection_pool_maxsize = pool_size or 0  # aiohttp's 0: no limit
    if configuration.proxy is None:
        configuration.proxy = environment_proxy(configuration.host or "")
    api = client.ApiClient(configuration)
    if user_agent:
        api.user_agent = user_agent
    # The library opens its session with trust_env: every request then looks up ~/.netrc and the proxy
    # environment, each on a worker thread, for settings that do not change (measured:
    # bench/README.md). The same connector under a session that reads neither; the environment's
    # proxy, read once above, is the configuration's.
    library_session = api.rest_client.pool_manager
    connector = library_session.connector
    library_session.detach()
    api.rest_client.pool_manager = aiohttp.ClientSession(connector=connector, read_bufsize=2**21)
    return api


def kubeconfig_files(kubeconfig: str | Path | None) -> list[str]:
    """The kubeconfig files to read: the one asked for, else $KUBECONFIG's (a path list), else
    ~/.kube/config."""
    listed = str(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG", "")
    return [os.path.expanduser(each) for each in listed.split(os.pathsep) if each] or [
        os.path.expanduser("~/.kube/config")
    ]


def environment_proxy(host: str) -> str | None:
    """The proxy $HTTPS_PROXY / $HTTP_PROXY name for the API server at `host`, unless $NO_PROXY
    exempts it; None for none."""
    url = urllib.parse.urlsplit(host)
    if not url.hostname or urllib.request.proxy_bypass(url.hostname):
        return None
    return urllib.request.getproxies().get(url.scheme)


DEFAULT_TIMEOUT: Timeout = (5.0, 30.0)
FAILED_CONNECTIONS = (aiohttp.ClientError, TimeoutError, OSError)
"""What a request that got no answer raises: connection refused or reset, TLS, timeouts."""


class NotLeader(ApiError):
    """A write refused before it was sent: this replica does not hold the leader lease."""

    def __init__(self) -> None:
        super().__init__(0, "NotLeader", "this replica does not hold the leader lease; it writes nothing")


async def _always() -> bool:
    return True


def _unanswered(exc: BaseException) -> ApiError:
    return ApiError(0, "ConnectionError", str(exc) or type(exc).__name__)


@dataclass
class Kube:
    api: client.ApiClient
    timeout: Timeout = DEFAULT_TIMEOUT
    """Every call's connect and read timeout, so that no call waits forever on a silent connection."""
    may_write: Callable[[], Awaitable[bool]] = _always
    """Awaited before every write; False refuses it with NotLeader (a standby replica writes nothing)."""

    async def _call(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        kind: str = "",
        accept: str = "application/json",
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """The raw response, its body not read yet; ApiError for anything but a 2xx status. Writes
        (anything but GET) count in the metrics by `kind`."""
        if method != "GET" and not await self.may_write():
            raise NotLeader()
        connect, read = self.timeout
        status = 0
        try:
            response: aiohttp.ClientResponse = await self.api.call_api(
                url,
                method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": accept},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                # Not `connect`, which counts the wait for a free connection of the pool too.
                _request_timeout=timeout or aiohttp.ClientTimeout(sock_connect=connect, sock_read=read),
            )
            status = response.status
        except FAILED_CONNECTIONS as exc:
            # Connection refused, TLS failure, timeout: reported like an API error, retried the same way.
            raise _unanswered(exc) from None
        finally:
            _observe(method, content_type, query, kind, status)
        if not 200 <= status < 300:
            raise _refusal(status, await self._read(response))
        return response

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except FAILED_CONNECTIONS as exc:
            raise _unanswered(exc) from None
        finally:
            response.release()

    async def close(self) -> None:
        """Close every connection this client keeps."""
        await self.api.close()

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        kind: str = "",
        accept: str = "application/json",
    ) -> dict[str, Any]:
        """One API call; the JSON response."""
        data = await self._read(await self._call(method, url, body, query, content_type, kind, accept))
        # A ClusterPolicy's status patch returns the whole object, whatever its spec holds.
        return safe_json.loads(data) if data else {}

    async def watch(
        self, api_version: str, kind: str, query: Mapping[str, str], timeout_seconds: int
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events (`{"type": ..., "object": ...}`) of a watch of a kind's collection, until the
        server ends it after `timeout_seconds`. A connection that goes quiet for longer raises
        ApiError(0, ...)."""
        params = {**query, "watch": "true", "timeoutSeconds": str(timeout_seconds)}
        # The server ends the watch after timeout_seconds; a read timeout above that catches a connection
        # that went silent (a black hole), which no server-side timeout can.
        silent = aiohttp.ClientTimeout(sock_connect=self.timeout[0], sock_read=timeout_seconds + 30)
        response = await self._call("GET", path(api_version, kind), query=params, timeout=silent)
        try:
            buffer = b""
            # Chunks, not the reader's lines: it refuses a line longer than its buffer (a large Node).
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield safe_json.loads(line)
        except FAILED_CONNECTIONS as exc:
            raise _unanswered(exc) from None
        finally:
            response.close()

    async def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        return await self.request("GET", path(api_version, kind, namespace, name))

    async def metadata(
        self, api_version: str, kind: str, name: str, namespace: str = ""
    ) -> dict[str, Any] | None:
        """An object's metadata alone (`{"metadata": ...}`), None when there is no such object."""
        try:
            return await self.request(
                "GET", path(api_version, kind, namespace, name), accept=PARTIAL_METADATA
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list_at(
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
            page = await self.request("GET", path(api_version, kind, namespace), query=query)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion") or "")
            query["continue"] = metadata["continue"]

    async def list(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Every object of a kind (all namespaces when `namespace` is empty), fetched in pages."""
        return (await self.list_at(api_version, kind, namespace, label_selector))[0]

    async def pod_log(
        self, namespace: str, name: str, container: str, lines: int, previous: bool = False
    ) -> str:
        """The last `lines` lines of a container's log (of its previous run when `previous`)."""
        query = {"container": container, "tailLines": str(lines)}
        if previous:
            query["previous"] = "true"
        return await self.text(path("v1", "Pod", namespace, name, "log"), query)

    async def text(self, url: str, query: Mapping[str, str] | None = None) -> str:
        """A GET whose answer is text (logs, /readyz)."""
        data = await self._read(await self._call("GET", url, query=query, accept="text/plain"))
        return data.decode(errors="replace")

    async def apply(
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
        # renderer's YAML-safe JSON instead, which keeps every such character as UTF-8. The client sends
        # a bytes body as it is only under a content type it does not encode itself: hence the charset,
        # which the API server drops before it reads the patch type.
        query = {"fieldManager": manager, "force": str(force).lower()}
        if dry_run:
            query["dryRun"] = "All"
        return await self.request(
            "PATCH",
            url,
            body=tojson(body).encode(),
            query=query,
            content_type=APPLY_PATCH,
            kind=body["kind"],
        )

    async def delete(self, key: ObjectKey, propagation: str = "Background") -> None:
        """DELETE an object (gone already is no error); `propagation`: what the garbage collector does
        with its dependents (Background: deletes them; Orphan: leaves them, their ownerReference
        removed)."""
        api_version, kind, namespace, name = key
        try:
            await self.request(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"propagationPolicy": propagation},
                kind=kind,
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def apply_node_labels(
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
        mismatch"), so a write never brings back a Node deleted meanwhile (core.answers.changed_since_read).
        With `resource_version` the write also fails with 409 if the node changed since."""
        return await self.apply(
            preconditioned("v1", "Node", node, labels, uid, resource_version), manager, force
        )

    async def rewrite_labels(
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
            return await self.request(
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

    async def patch_node(
        self, name: str, body: Mapping[str, Any], manager: str = FIELD_MANAGER
    ) -> dict[str, Any]:
        """A JSON merge patch of a Node (never creates one: a node that is gone is a 404)."""
        return await self.request(
            "PATCH",
            path("v1", "Node", name=name),
            body=dict(body),
            query={"fieldManager": manager},
            content_type="application/merge-patch+json",
            kind="Node",
        )

    async def evict(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """POST an Eviction: the API server deletes the pod unless a PodDisruptionBudget forbids it
        (429), which is an ApiError like any refusal."""
        await self.request(
            "POST", path("v1", "Pod", namespace, name, "eviction"), body=dict(body), kind="Eviction"
        )

    async def delete_pod(self, namespace: str, name: str, options: Mapping[str, Any]) -> None:
        """DELETE a pod with DeleteOptions (a UID precondition: 409 when the name is another pod's now)."""
        await self.request("DELETE", path("v1", "Pod", namespace, name), body=dict(options), kind="Pod")

    async def patch_status(
        self, name: str, status: Mapping[str, Any], kind: tuple[str, str] = ("nvidia.com/v1", "ClusterPolicy")
    ) -> dict[str, Any]:
        """A merge patch of the status of a cluster-scoped object of ours (`kind`: apiVersion, kind)."""
        return await self.request(
            "PATCH",
            path(kind[0], kind[1], name=name, subresource="status"),
            body={"status": dict(status)},
            content_type="application/merge-patch+json",
            kind=kind[1],
        )

    async def patch_driver_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """An NVIDIADriver's status, as patch_status writes a ClusterPolicy's."""
        return await self.patch_status(name, status, ("nvidia.com/v1alpha1", "NVIDIADriver"))

    async def set_finalizers(
        self, kind: tuple[str, str], name: str, finalizers: Sequence[str], resource_version: str
    ) -> dict[str, Any]:
        """Replace the finalizers of a cluster-scoped object of ours, on the version read (a merge patch
        replaces the list whole: a stale write conflicts instead of dropping another's finalizer)."""
        return await self.request(
            "PATCH",
            path(kind[0], kind[1], name=name),
            body={"metadata": {"finalizers": list(finalizers), "resourceVersion": resource_version}},
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
            kind=kind[1],
        )

    async def add_labels(self, kind: tuple[str, str], name: str, labels: Mapping[str, str]) -> dict[str, Any]:
        """Add labels to a cluster-scoped object (a merge patch: the others stay as they are)."""
        return await self.request(
            "PATCH",
            path(kind[0], kind[1], name=name),
            body={"metadata": {"labels": dict(labels)}},
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
            kind=kind[1],
        )

    async def post_event(
        self,
        policy: Mapping[str, str],
        type_: str,
        reason: str,
        message: str,
        now: str,
        kind: tuple[str, str] = ("nvidia.com/v1", "ClusterPolicy"),
    ) -> None:
        """An Event on the (cluster-scoped) ClusterPolicy, or on another cluster-scoped object of `kind`
        (a Node, an NVIDIADriver), where `kubectl describe` finds it. The API server requires Events
        about cluster-scoped objects to live in `default`."""
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
        await self.request("POST", path("v1", "Event", namespace), body=body, kind="Event")
