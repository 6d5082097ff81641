"""The one-shot reads of `audit` and `doctor`: lists and gets through the API server, returned as plain JSON (kind and
apiVersion set on list items) or a parsed Snapshot, for the pure `webhook.cluster.audit` and `webhook.cluster.doctor`.
Errors come out as `KubeError` (`webhook.cluster.kube.describe_error`): what failed, where, and what to do.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from webhook.cluster.doctor import Facts
from webhook.cluster.kube import (
    DRA_VERSIONS,
    NETWORK_ERRORS,
    Json,
    ListCall,
    collection,
    describe_error,
    host_of,
    json_call,
    list_all,
    sources,
)
from webhook.policy import dra_inventory, inventory
from webhook.policy.dra_inventory import DraIndex
from webhook.policy.inventory import Snapshot

WORKLOADS: tuple[tuple[str, str, str], ...] = (
    # (kind, apiVersion, API class method suffix)
    ("Pod", "v1", "pod"),
    ("Deployment", "apps/v1", "deployment"),
    ("StatefulSet", "apps/v1", "stateful_set"),
    ("DaemonSet", "apps/v1", "daemon_set"),
    ("ReplicaSet", "apps/v1", "replica_set"),
    ("Job", "batch/v1", "job"),
    ("CronJob", "batch/v1", "cron_job"),
)
_SUFFIXES = {kind: suffix for kind, _, suffix in WORKLOADS}


def _api_for(api: k8s.ApiClient, api_version: str) -> Any:
    return {"v1": k8s.CoreV1Api, "apps/v1": k8s.AppsV1Api, "batch/v1": k8s.BatchV1Api}[api_version](api)


def _lister(api: k8s.ApiClient, api_version: str, suffix: str, namespace: str | None) -> ListCall:
    client_api = _api_for(api, api_version)
    if namespace is None:
        call: ListCall = getattr(client_api, f"list_{suffix}_for_all_namespaces")
        return call
    namespaced: ListCall = getattr(client_api, f"list_namespaced_{suffix}")
    return lambda **kwargs: namespaced(namespace, **kwargs)


def read_snapshot(api: k8s.ApiClient) -> Snapshot:
    """Nodes, runtime classes, namespaces, claim templates and the DRA objects, listed once (for `audit` and
    `doctor`), each page parsed as it arrives; the nodes and the DRA objects indexed as the server's are."""
    lists: dict[str, list[Any]] = {}
    served: set[str] = set()
    try:
        for source in sources(api):
            lists[source.name] = []
            for api_version, call in source.versions:
                try:
                    lists[source.name] = list_all(call, source.kind, api_version, parse=source.parse)[0]
                    served.add(source.name)
                    break
                except ApiException as err:
                    if not (source.optional and err.status in (403, 404)):
                        raise
    except (ApiException, *NETWORK_ERRORS) as err:
        raise describe_error(err, host_of(api)) from None
    dra = DraIndex()
    for kind in dra_inventory.KINDS:
        dra.replace(kind, lists[kind], absent=kind not in served)
    return inventory.snapshot_of(lists["nodes"], lists["runtimeclasses"], lists["namespaces"],
                                 lists["resourceclaimtemplates"], dra=dra.view())


def read_claims(api: k8s.ApiClient, namespace: str | None) -> tuple[list[Json], list[str]]:
    """ResourceClaimTemplates and ResourceClaims of one namespace (or all), as JSON with kind and apiVersion
    (`resource.k8s.io` v1, else v1beta2, else v1beta1), for `audit`; and a note for each kind the API server does
    not serve or does not let this identity read (those are then not judged)."""
    found: list[Json] = []
    notes: list[str] = []
    where = f"namespaces/{namespace}/" if namespace is not None else ""
    for kind, plural in (("ResourceClaimTemplate", "resourceclaimtemplates"), ("ResourceClaim", "resourceclaims")):
        refused: list[ApiException] = []
        for version in DRA_VERSIONS:
            call = collection(api, f"/apis/resource.k8s.io/{version}/{where}{plural}")
            try:
                found.extend(list_all(call, kind, f"resource.k8s.io/{version}")[0])
                break
            except ApiException as err:
                if err.status not in (403, 404):
                    raise describe_error(err, host_of(api)) from None
                refused.append(err)
            except NETWORK_ERRORS as err:
                raise describe_error(err, host_of(api)) from None
        else:  # no version served or readable: a refusal (403) says more than "not served" (404)
            said = next((e for e in refused if e.status == 403), refused[0])
            notes.append(f"{plural} not judged: {describe_error(said, host_of(api))}")
    return found, notes


def read_workloads(api: k8s.ApiClient, namespace: str | None) -> list[Json]:
    """Pods and workload objects of one namespace (or all), as JSON with kind and apiVersion."""
    found: list[Json] = []
    try:
        for kind, api_version, suffix in WORKLOADS:
            found.extend(list_all(_lister(api, api_version, suffix, namespace), kind, api_version)[0])
    except (ApiException, *NETWORK_ERRORS) as err:
        raise describe_error(err, host_of(api)) from None
    return found


def _read(api: k8s.ApiClient, kind: str, api_version: str, namespace: str, name: str) -> Json | None:
    call = getattr(_api_for(api, api_version), f"read_namespaced_{_SUFFIXES[kind]}")
    try:
        obj = json_call(call, name=name, namespace=namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return {"kind": kind, "apiVersion": api_version, **obj}


def _events(api: k8s.ApiClient, namespace: str, kind: str, name: str) -> list[Json]:
    core = k8s.CoreV1Api(api)
    return list_all(lambda **kw: core.list_namespaced_event(namespace, **kw), "Event", "v1",
                    field_selector=f"involvedObject.kind={kind},involvedObject.name={name}")[0]


OWNER_VERSIONS = {kind: api_version for kind, api_version, _ in WORKLOADS if kind != "Pod"}


def read_doctor_facts(api: k8s.ApiClient, namespace: str, name: str) -> Facts | None:
    """Everything `doctor` looks at for one Pod, or None when the Pod does not exist."""
    try:
        pod = _read(api, "Pod", "v1", namespace, name)
        if pod is None:
            return None
        owners: list[Json] = []
        current: Json = pod
        for _ in range(3):  # Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob
            ref = next((r for r in (current.get("metadata") or {}).get("ownerReferences") or []
                        if r.get("controller") and r.get("kind") in OWNER_VERSIONS), None)
            if ref is None:
                break
            owner = _read(api, ref["kind"], OWNER_VERSIONS[ref["kind"]], namespace, ref["name"])
            if owner is None:
                break
            owners.append(owner)
            current = owner
        events = _events(api, namespace, "Pod", name)
        for owner in owners:
            events.extend(_events(api, namespace, owner["kind"], owner["metadata"]["name"]))
        apps = k8s.AppsV1Api(api)
        daemonsets = list_all(apps.list_daemon_set_for_all_namespaces, "DaemonSet", "apps/v1")[0]
        core = k8s.CoreV1Api(api)
        running = list_all(core.list_pod_for_all_namespaces, "Pod", "v1",
                           field_selector="status.phase!=Succeeded,status.phase!=Failed")[0]
        snapshot = read_snapshot(api)
    except (ApiException, *NETWORK_ERRORS) as err:
        raise describe_error(err, host_of(api)) from None
    return Facts(pod=pod, owners=tuple(owners), events=tuple(events), daemonsets=tuple(daemonsets),
                 pods=tuple(running), snapshot=snapshot)
