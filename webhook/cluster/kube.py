"""The only importer of `kubernetes`: API clients, the live inventory caches, and one-shot reads.

- `api_client(kubeconfig, environ)`: credentials found the way kubectl finds them (`--kubeconfig`, then
  `$KUBECONFIG`, then `~/.kube/config`, else the in-cluster ServiceAccount).
- `ClusterInventory`: background list+watch caches of Nodes, Namespaces, RuntimeClasses,
  ResourceClaimTemplates, and (the DRA inventory, `webhook.policy.dra_inventory`) ResourceSlices, DeviceClasses and
  ResourceClaims (resource.k8s.io v1, else v1beta2, else v1beta1; absent or forbidden: empty). A watch that drops
  is resumed from the last resourceVersion; `410 Gone` (an HTTP status or an ERROR event with reason `Expired`) means
  a relist; every `resync_seconds` it relists anyway. `snapshot()` never waits on the API server: it
  returns the last state, with `synced` False until every initial list has succeeded or when the API server
  has not answered for longer than `stale_seconds`.
- `list_all`, `describe_error`, `sources`: what the one-shot reads of `audit` and `doctor` (`webhook.cluster.reads`)
  share with the inventory.

The watch loop is written here rather than with `kubernetes.watch.Watch`: that helper retries a 410 once
from the same stale resourceVersion and, with `deserialize=False`, fails on ERROR events; this one relists.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

from webhook.policy import dra_inventory, inventory, node_index
from webhook.policy.dra_inventory import DraIndex, DraView
from webhook.policy.inventory import Snapshot
from webhook.policy.node_index import NodeIndex, NodeView

log = logging.getLogger("webhook.cluster.kube")

Clock = Callable[[], float]
Json = dict[str, Any]
ListCall = Callable[..., Any]

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
PAGE = 500
NETWORK_ERRORS = (urllib3.exceptions.HTTPError, OSError, ValueError)


class KubeError(Exception):
    """An API call that failed, in words for a person (what, where, and what to do)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------------------------- clients


def api_client(kubeconfig: str | None = None, environ: Mapping[str, str] | None = None,
               context: str | None = None) -> k8s.ApiClient:
    """An ApiClient configured like kubectl: --kubeconfig, $KUBECONFIG, ~/.kube/config, else in-cluster."""
    env = os.environ if environ is None else environ
    path = kubeconfig_path(kubeconfig, env)
    configuration = k8s.Configuration()
    try:
        if path is not None:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration, persist_config=False)
        elif env.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            raise KubeError("no kubeconfig found (tried --kubeconfig, $KUBECONFIG and ~/.kube/config) and not "
                            "running in a cluster; pass --kubeconfig FILE")
    except (ConfigException, OSError) as err:
        where = path or "in-cluster configuration"
        raise KubeError(f"cannot load {where}: {err}") from None
    return k8s.ApiClient(configuration)


def kubeconfig_path(kubeconfig: str | None, environ: Mapping[str, str]) -> str | None:
    """--kubeconfig, else $KUBECONFIG (a list, as kubectl merges it), else ~/.kube/config when it exists."""
    path = kubeconfig or environ.get("KUBECONFIG") or None
    default = Path(environ.get("HOME", str(Path.home()))) / ".kube" / "config"
    if path is None and default.is_file():
        path = str(default)
    return path


def context_namespace(kubeconfig: str | None = None, context: str | None = None,
                      environ: Mapping[str, str] | None = None) -> str:
    """The namespace of the kubeconfig's (current or named) context, else the ServiceAccount's, else default."""
    env = os.environ if environ is None else environ
    path = kubeconfig_path(kubeconfig, env)
    if path is not None:
        try:
            contexts, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=path)
        except (ConfigException, OSError):
            return "default"
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
        namespace = ((chosen or {}).get("context") or {}).get("namespace")
        return str(namespace or "default")
    service_account_ns = IN_CLUSTER_TOKEN.parent / "namespace"
    if env.get("KUBERNETES_SERVICE_HOST") and service_account_ns.is_file():
        return service_account_ns.read_text().strip() or "default"
    return "default"


def describe_error(err: BaseException, host: str = "") -> KubeError:
    """An API or network error as a KubeError a person can act on."""
    if isinstance(err, KubeError):
        return err
    if isinstance(err, ApiException):
        detail = err.reason or ""
        try:
            body = json.loads(err.body) if err.body else {}
            detail = body.get("message") or detail
        except (ValueError, AttributeError):
            pass
        hint = {401: " (check the credentials of the kubeconfig)",
                403: " (the identity lacks read access: see docs/cluster.md, RBAC)"}.get(err.status or 0, "")
        return KubeError(f"API server answered {err.status}: {detail}{hint}", err.status)
    return KubeError(f"cannot reach the API server{' at ' + host if host else ''}: {type(err).__name__}: {err}")


def json_call(call: ListCall, **kwargs: Any) -> Json:
    """Call an API function without the client's models and return the JSON body."""
    response = call(_preload_content=False, _request_timeout=(CONNECT_TIMEOUT, READ_TIMEOUT), **kwargs)
    try:
        data = json.loads(response.data)
    finally:
        response.release_conn()
    return data if isinstance(data, dict) else {}


def list_all(call: ListCall, kind: str, api_version: str, *, parse: Callable[[Json], Any] | None = None,
             **kwargs: Any) -> tuple[list[Any], str]:
    """Every item of a (paginated) list, with kind and apiVersion set, and the list's resourceVersion.

    `parse`: each item is parsed as its page arrives, and only what it returns is kept (a relist of 100,000
    Nodes then holds one page of JSON at a time, not all of them)."""
    items: list[Any] = []
    token: str | None = None
    while True:
        page = json_call(call, limit=PAGE, **({"_continue": token} if token else {}), **kwargs)
        for item in page.get("items") or []:
            if isinstance(item, dict):
                item = {"kind": kind, "apiVersion": api_version, **item}
                items.append(parse(item) if parse is not None else item)
        meta = page.get("metadata") or {}
        token = meta.get("continue") or None
        if not token:
            return items, str(meta.get("resourceVersion") or "")


# --------------------------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    """One watched collection: how to list it (one call per API version, newest first) and key its items."""

    name: str
    kind: str
    versions: tuple[tuple[str, ListCall], ...]  # (apiVersion, list function)
    parse: Callable[[Mapping[str, Any]], Any]
    optional: bool = False  # absent or forbidden: treated as empty (DRA on clusters without it)


# The list parameters the watches pass, as the API server spells them in the query.
_QUERY_NAMES = {"watch": "watch", "resource_version": "resourceVersion", "allow_watch_bookmarks": "allowWatchBookmarks",
                "timeout_seconds": "timeoutSeconds", "limit": "limit", "_continue": "continue"}


def collection(api: k8s.ApiClient, path: str) -> ListCall:
    """A list (or, with watch=True, watch) of the collection at `path` with the ApiClient's host, credentials and
    TLS, without the client's generated API classes.

    The watches read raw JSON (`_preload_content=False`), so the classes' models and validators are never used,
    but building CoreV1Api alone loads about 18 MiB of them into every worker. The call goes through the same
    `param_serialize` and `call_api` the generated method uses, and raises ApiException on a non-2xx answer as
    the generated method does for a raw response."""
    def call(*, _preload_content: bool = False, _request_timeout: Any = None, **params: Any) -> Any:
        if _preload_content:
            raise ValueError("a collection call returns the raw response only (_preload_content=False)")
        query = [(_QUERY_NAMES[name], value) for name, value in params.items() if value is not None]
        request = api.param_serialize(method="GET", resource_path=path, query_params=query,
                                      header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        response = api.call_api(*request, _request_timeout=_request_timeout)
        if not 200 <= response.status <= 299:
            response.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        return response.response

    return call


DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # of resource.k8s.io, newest first


def _dra(api: k8s.ApiClient, plural: str) -> tuple[tuple[str, ListCall], ...]:
    """A cluster-wide `resource.k8s.io` collection, newest version first."""
    return tuple((f"resource.k8s.io/{version}", collection(api, f"/apis/resource.k8s.io/{version}/{plural}"))
                 for version in DRA_VERSIONS)


def sources(api: k8s.ApiClient) -> tuple[Source, ...]:
    claims = _dra(api, "resourceclaimtemplates")
    return (
        Source("nodes", "Node", (("v1", collection(api, "/api/v1/nodes")),), inventory.node_from_api),
        Source("namespaces", "Namespace", (("v1", collection(api, "/api/v1/namespaces")),),
               inventory.namespace_from_api),
        Source("runtimeclasses", "RuntimeClass",
               (("node.k8s.io/v1", collection(api, "/apis/node.k8s.io/v1/runtimeclasses")),),
               inventory.runtime_class_from_api),
        Source("resourceclaimtemplates", "ResourceClaimTemplate", claims, inventory.claim_template_from_api,
               optional=True),
        # The DRA inventory: held in its index (`_Cache.dra`), not in `items`.
        Source("resourceslices", "ResourceSlice", _dra(api, "resourceslices"), dra_inventory.slice_from_api,
               optional=True),
        Source("deviceclasses", "DeviceClass", _dra(api, "deviceclasses"), dra_inventory.device_class_from_api,
               optional=True),
        Source("resourceclaims", "ResourceClaim", _dra(api, "resourceclaims"), dra_inventory.resource_claim_from_api,
               optional=True),
    )


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


@dataclass
class _Cache:
    """One source's items and progress; changed only by its reflector thread, under the inventory's lock."""

    source: Source
    items: dict[tuple[str, str], Any] = field(default_factory=dict)
    resource_version: str = ""
    listed: bool = False
    absent: str | None = None
    last_contact: float | None = None
    error: str | None = None
    refused: bool = False  # the last error was the API server's 401 or 403 (credentials, RBAC)
    relists: int = 0
    response: Any = None  # the open watch, shut down by stop()
    call: ListCall | None = None  # the list function of the API version that answered
    index: NodeIndex | None = None  # Nodes: held in the node index instead of `items`
    dra: DraIndex | None = None  # ResourceSlices, DeviceClasses, ResourceClaims: held in the DRA index (shared)

    def count(self) -> int:
        if self.dra is not None:
            return self.dra.count(self.source.name)
        return len(self.index) if self.index is not None else len(self.items)


class ClusterInventory:
    """Background list+watch caches of what the inventory checks need; `snapshot()` never blocks on the API.

    `clock` is monotonic seconds (a test passes its own); `stale_seconds` must exceed `watch_seconds`, the
    longest a healthy idle watch stays silent before the server ends it.
    """

    def __init__(self, api: k8s.ApiClient, *, clock: Clock = time.monotonic, watch_seconds: int = 60,
                 resync_seconds: float = 600.0, stale_seconds: float = 180.0,
                 backoff: tuple[float, float] = (0.5, 30.0), source_list: tuple[Source, ...] | None = None) -> None:
        self._api = api
        self._clock = clock
        self.watch_seconds = watch_seconds
        self.resync_seconds = resync_seconds
        self.stale_seconds = stale_seconds
        self._backoff = backoff
        self._dra = DraIndex()
        self._caches = [_Cache(s, index=NodeIndex() if s.name == "nodes" else None,
                               dra=self._dra if s.name in dra_inventory.KINDS else None)
                        for s in (source_list or sources(api))]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._version = 0  # of everything but the Nodes (those are versioned by their index's view)
        self._parts: tuple[int, dict[str, list[Any]]] | None = None
        self._cached: tuple[tuple[int, NodeView | None, DraView, bool, str], Snapshot] | None = None

    # ----------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start one daemon thread per source; returns at once (the first lists happen in the background)."""
        if self._threads:
            return
        self._stop.clear()
        for cache in self._caches:
            thread = threading.Thread(target=self._run, args=(cache,), name=f"inventory-{cache.source.name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads: open watches are shut down so that no thread waits on the network."""
        self._stop.set()
        for cache in self._caches:
            response = cache.response
            if response is not None:
                with contextlib.suppress(Exception):  # already closed, or never opened
                    response.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        self._threads = []

    # ----------------------------------------------------------------------------------------- reading

    @property
    def synced(self) -> bool:
        """Every source listed and heard from within `stale_seconds` (for a gauge and for /readyz)."""
        return self._health()[0]

    def snapshot(self) -> Snapshot:
        """The caches now, as one frozen Snapshot. Its nodes are the node index's current view, handed over as
        they are (no copy, whatever the cluster's size); the other collections are rebuilt only when they
        changed. A review that asked a new question of the nodes makes the index track it from here on."""
        synced, reason = self._health()
        with self._lock:
            nodes = next((c.index for c in self._caches if c.index is not None), None)
            view = nodes.view() if nodes is not None else None
            dra = self._dra.view()
            key = (self._version, view, dra, synced, reason)
            cached = self._cached
            if cached is not None and cached[0][0] == self._version and cached[0][1] is view \
                    and cached[0][2] is dra and cached[0][3:] == key[3:]:
                return cached[1]
            if self._parts is None or self._parts[0] != self._version:
                self._parts = (self._version, {c.source.name: list(c.items.values()) for c in self._caches
                                               if c.index is None and c.dra is None})
            parts = self._parts[1]
            snapshot = inventory.snapshot_of(
                view.node_list if view is not None else (), parts.get("runtimeclasses", []),
                parts.get("namespaces", []), parts.get("resourceclaimtemplates", []), dra=dra, synced=synced,
                reason=reason)
            self._cached = (key, snapshot)
            return snapshot

    def status(self) -> dict[str, Any]:
        """Per source: listed, item count, seconds since the API server last answered, relists, last error."""
        now = self._clock()
        with self._lock:
            return {
                c.source.name: {
                    "listed": c.listed, "items": c.count(), "relists": c.relists, "error": c.error,
                    "absent": c.absent,
                    "seconds_since_contact": None if c.last_contact is None else round(now - c.last_contact, 1),
                }
                for c in self._caches
            }

    def _health(self) -> tuple[bool, str]:
        now = self._clock()
        with self._lock:
            for cache in self._caches:
                name = cache.source.name
                if not cache.listed:
                    if cache.refused:
                        return False, f"{inventory.REFUSED_AT_START} {name}: {cache.error}"
                    if not cache.error:
                        return False, f"{inventory.FIRST_LIST_UNANSWERED} {name}"
                    return False, f"initial list of {name} pending: {cache.error}"
                # An absent collection (not served, or forbidden) is asked again only at the resync: not stale.
                if cache.absent is None and cache.last_contact is not None \
                        and now - cache.last_contact > self.stale_seconds:
                    why = f": {cache.error}" if cache.error else ""
                    return False, f"no answer from the API server for {name} in over {self.stale_seconds:g}s{why}"
        return True, ""

    # ----------------------------------------------------------------------------------------- reflector

    def _run(self, cache: _Cache) -> None:
        delay = self._backoff[0]
        while not self._stop.is_set():
            try:
                self._relist(cache)
                delay = self._backoff[0]
                if cache.absent is not None:
                    self._stop.wait(self.resync_seconds)
                    continue
                self._watch_until_resync(cache)
            except _Expired:
                log.info("watch of %s expired (410 Gone): relisting", cache.source.name)
            except (ApiException, *NETWORK_ERRORS) as err:
                if self._stop.is_set():
                    break
                described = describe_error(err)
                message = str(described)
                with self._lock:
                    cache.error = message
                    cache.refused = described.status in (401, 403)
                log.warning("inventory %s: %s; retrying in %.1fs", cache.source.name, message, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])

    def _relist(self, cache: _Cache) -> None:
        with node_index.bulk_load() if cache.index is not None else contextlib.nullcontext():
            self._relist_source(cache)

    def _relist_source(self, cache: _Cache) -> None:
        source = cache.source
        for api_version, call in source.versions:
            try:
                items, resource_version = list_all(call, source.kind, api_version, parse=source.parse)
            except ApiException as err:
                if source.optional and err.status in (403, 404):
                    if err.status == 403 or api_version == source.versions[-1][0]:
                        self._replace(cache, [], "", absent=str(describe_error(err)))
                        return
                    continue
                raise
            self._replace(cache, items, resource_version, watch_call=call)
            return

    def _replace(self, cache: _Cache, parsed: list[Any], resource_version: str, absent: str | None = None,
                 watch_call: ListCall | None = None) -> None:
        """A full list replaces the cache. Nodes: a new index is built beside the one reviews read (tracking the
        same queries), and swapped in at once."""
        if cache.index is not None:
            with self._lock:
                queries = cache.index.queries()
            fresh_index = NodeIndex.build(parsed, queries)
        fresh = {_key(p): p for p in parsed} if cache.index is None and cache.dra is None else {}
        with self._lock:
            if cache.index is not None:
                cache.index = fresh_index
            elif cache.dra is not None:
                cache.dra.replace(cache.source.name, parsed, absent=absent is not None)  # type: ignore[arg-type]
            elif fresh != cache.items or not cache.listed:
                self._version += 1
            cache.items = fresh
            cache.resource_version = resource_version
            cache.listed = True
            cache.absent = absent
            cache.error = None
            cache.relists += 1
            cache.last_contact = self._clock()
            cache.call = watch_call

    def _watch_until_resync(self, cache: _Cache) -> None:
        """Watch from the list's resourceVersion until the resync is due; a dropped stream is resumed."""
        call = cache.call
        if call is None:
            return
        deadline = self._clock() + self.resync_seconds
        delay = self._backoff[0]
        while not self._stop.is_set() and self._clock() < deadline:
            response = call(watch=True, resource_version=cache.resource_version, allow_watch_bookmarks=True,
                            timeout_seconds=self.watch_seconds, _preload_content=False,
                            _request_timeout=(CONNECT_TIMEOUT, self.watch_seconds + READ_TIMEOUT))
            cache.response = response
            self._touch(cache)
            try:
                for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                    if self._stop.is_set():
                        return
                    if line:
                        self._apply(cache, json.loads(line))
                self._touch(cache)  # the server ended the watch after timeout_seconds: resume it
                delay = self._backoff[0]
            except (urllib3.exceptions.HTTPError, OSError) as err:
                if self._stop.is_set():
                    return
                log.info("watch of %s dropped (%s): resuming from resourceVersion %s", cache.source.name,
                         type(err).__name__, cache.resource_version)
                self._stop.wait(delay)
                delay = min(delay * 2, self._backoff[1])
            finally:
                cache.response = None
                response.release_conn()

    def _apply(self, cache: _Cache, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        if kind == "ERROR":
            if obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"):
                raise _Expired
            raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
        resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or cache.resource_version)
        parsed = cache.source.parse(obj) if kind in ("ADDED", "MODIFIED") else None  # outside the lock
        with self._lock:
            cache.resource_version = resource_version
            cache.last_contact = self._clock()
            cache.error = None
            if kind in ("ADDED", "MODIFIED"):
                if cache.index is not None:
                    cache.index.put(parsed)  # the index's next view has it
                    return
                if cache.dra is not None and parsed is not None:
                    cache.dra.put(parsed)
                    return
                key = _key(parsed)
                if cache.items.get(key) != parsed:
                    cache.items[key] = parsed
                    self._version += 1
            elif kind == "DELETED":
                if cache.index is not None:
                    cache.index.remove(inventory.object_key(obj)[1])
                elif cache.dra is not None:
                    cache.dra.remove(cache.source.name, inventory.object_key(obj))
                elif cache.items.pop(inventory.object_key(obj), None) is not None:
                    self._version += 1

    def _touch(self, cache: _Cache) -> None:
        with self._lock:
            cache.last_contact = self._clock()


def _key(parsed: Any) -> tuple[str, str]:
    return (str(getattr(parsed, "namespace", "") or ""), str(parsed.name))


def inventory_from_env(environ: Mapping[str, str] | None = None, kubeconfig: str | None = None,
                       **options: Any) -> ClusterInventory:
    """A ClusterInventory for the server (not started): in-cluster credentials, or kubectl's when outside."""
    return ClusterInventory(api_client(kubeconfig, environ), **options)


def host_of(api: k8s.ApiClient) -> str:
    """The API server's address, for messages."""
    return str(getattr(api.configuration, "host", ""))
