"""The binder's calls to the Kubernetes API, through lightkube's typed asyncio client.

Every write the binder makes is here: Bindings (with the GPU annotations the API server copies onto the pod in
the same write), the PodScheduled condition, Events, PodGroup status, evictions and the leader Lease.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import httpx2
import msgspec
from lightkube import ApiError, AsyncClient, KubeConfig, operators
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import DeleteOptions, ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Node, Pod, PodBinding, PodEviction, PodStatus
from lightkube.types import OnErrorAction, OnErrorResult, PatchType
from opentelemetry import trace

from kumiki.binder.adapters.lane import MERGE_PATCH, STRATEGIC_PATCH, ApiLane, ApiStatusError, pod_path
from kumiki.binder.core import POD_GROUP_API, SCHEDULER_NAME

log = logging.getLogger(__name__)
logging.getLogger("httpx2").setLevel(logging.WARNING)  # one INFO line per API request otherwise
PodGroup = create_namespaced_resource(POD_GROUP_API[0], POD_GROUP_API[1], "PodGroup", POD_GROUP_API[2], verbs=None)
PodGroupStatus = PodGroup.Status
FIELD_MANAGER = "kumiki-binder"
tracer = trace.get_tracer("kumiki.binder")
BINDING_TEMPLATE = "/api/v1/namespaces/{namespace}/pods/{name}/binding"
EVICTION_TEMPLATE = "/api/v1/namespaces/{namespace}/pods/{name}/eviction"


def server_of(config: KubeConfig) -> str:
    """The API server's URL in the kubeconfig's current context ('' when it has none)."""
    single = config.get()
    return single.cluster.server if single is not None else ""


def _status_of(error: BaseException) -> int | None:
    if isinstance(error, ApiStatusError):
        return error.code
    if isinstance(error, ApiError):
        return error.status.code
    return None


TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


def is_transient(error: BaseException) -> bool:
    """An answer worth asking again: the API server busy or starting ("storage is (re)initializing" is a 429
    while its watch cache fills, after a restart or a burst of writes), or the connection lost."""
    code = _status_of(error)
    if code is not None:
        return code in TRANSIENT_STATUS
    return isinstance(error, OSError | httpx2.TransportError)


def config_from(kubeconfig: Path | None) -> KubeConfig:
    """From a kubeconfig file, else the pod's service account (in a cluster)."""
    return KubeConfig.from_file(str(kubeconfig)) if kubeconfig else KubeConfig.from_service_account()


def client_from(kubeconfig: Path | None, config: KubeConfig | None = None) -> AsyncClient:
    config = config or config_from(kubeconfig)
    limits = httpx2.Timeout(30.0, read=None)  # watches stream for minutes; each request has its own deadline
    return AsyncClient(config=config, timeout=limits, field_manager=FIELD_MANAGER)


def kubeconfig_from_env(env: Mapping[str, str]) -> Path | None:
    path = env.get("KUMIKI_KUBECONFIG") or env.get("KUBECONFIG")
    return Path(path) if path else None


class KubeApi:
    """Thin, typed calls; errors other than the expected ones (409 already bound, 404 gone) propagate."""

    def __init__(self, client: AsyncClient, identity: str, lane: ApiLane | None = None, server: str = "") -> None:
        self.client = client
        self.identity = identity
        self.lane = lane  # the hot path (Bindings, patches, Events, watches); None: lightkube for everything
        parts = urlsplit(server or (lane.server if lane is not None else ""))
        self.server = parts.geturl()
        self.server_attributes: dict[str, str | int] = (
            {"server.address": parts.hostname or ""} if parts.hostname else {}
        )
        if parts.hostname:
            self.server_attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)

    @contextlib.contextmanager
    def _http_span(self, template: str, namespace: str, name: str, **more: str) -> Iterator[trace.Span]:
        """A CLIENT span for one write the API server answers (HTTP semantic conventions: `POST {url.template}`,
        the method, URL and response status; the pod as Kubernetes resource attributes). The Binding's and
        the Eviction's are what a gang's trace ends with: the consequence in the API server."""
        path = template.format(namespace=quote(namespace, safe=""), name=quote(name, safe=""))
        attributes: dict[str, str | int] = {
            "http.request.method": "POST",
            "url.template": template,
            "url.full": self.server + path,
            **self.server_attributes,
            "k8s.namespace.name": namespace,
            "k8s.pod.name": name,
            **more,
        }
        with tracer.start_as_current_span(
            f"POST {template}", kind=trace.SpanKind.CLIENT, attributes=attributes, record_exception=False
        ) as span:
            try:
                yield span
            except BaseException as error:
                status = _status_of(error)
                if status is not None:
                    span.set_attribute("http.response.status_code", status)
                span.set_attribute("error.type", str(status) if status is not None else type(error).__qualname__)
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(error)[:200]))
                raise

    async def close(self) -> None:
        await self.client.close()
        if self.lane is not None:
            await self.lane.close()

    # ---- reading -------------------------------------------------------------------------------------
    async def list_pods(self, others: bool = False) -> tuple[list[dict[str, Any]], str]:
        """Every pod with schedulerName kumiki (`others`: every bound pod of other schedulers instead), and the
        list's resourceVersion (to watch from)."""
        pods = self.client.list(Pod, namespace="*", fields=_pod_fields(others))
        out = [pod.to_dict() async for pod in pods]
        return out, pods.resourceVersion if out else ""

    async def watch_pods(
        self, resource_version: str = "", others: bool = False
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Pods with schedulerName kumiki: pending ones (spec.nodeName empty) and bound ones' phases (`others`:
        the bound pods of other schedulers, which pod affinity and topology spread count too).

        One server-side field selector on the scheduler name; lightkube re-opens the watch when the server
        closes it. The caller lists first, so nothing is missed between the list and the watch."""
        if self.lane is not None:
            selector = {"fieldSelector": _pod_field_selector(others)}
            async for kind, obj in self.lane.watch("/api/v1/pods", selector, resource_version):
                yield kind, obj
            return
        async for kind, pod in self.client.watch(
            Pod,
            namespace="*",
            fields=_pod_fields(others),
            resource_version=resource_version or None,
            on_error=_retry_watch,
        ):
            yield kind, pod.to_dict()

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        nodes = self.client.list(Node)
        out = [node.to_dict() async for node in nodes]
        return out, nodes.resourceVersion if out else ""

    async def watch_nodes(self, resource_version: str = "") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if self.lane is not None:
            async for kind, obj in self.lane.watch("/api/v1/nodes", None, resource_version):
                yield kind, obj
            return
        async for kind, node in self.client.watch(
            Node, resource_version=resource_version or None, on_error=_retry_watch
        ):
            yield kind, node.to_dict()

    async def list_podgroups(self) -> tuple[list[dict[str, Any]], str]:
        groups = self.client.list(PodGroup, namespace="*")
        out = [group.to_dict() async for group in groups]  # type: ignore[no-untyped-call]
        return out, groups.resourceVersion if out else ""

    async def watch_podgroups(self, resource_version: str = "") -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if self.lane is not None:
            path = f"/apis/{POD_GROUP_API[0]}/{POD_GROUP_API[1]}/{POD_GROUP_API[2]}"
            async for kind, obj in self.lane.watch(path, None, resource_version):
                yield kind, obj
            return
        async for kind, group in self.client.watch(
            PodGroup, namespace="*", resource_version=resource_version or None, on_error=_retry_watch
        ):
            yield kind, group.to_dict()  # type: ignore[no-untyped-call]

    async def podgroups_served(self) -> bool:
        try:
            async for _ in self.client.list(PodGroup, namespace="*", chunk_size=1):
                break
            return True
        except ApiError as error:
            if error.status.code == 404:
                return False
            raise
        except httpx2.HTTPStatusError as error:  # a 404 without a Status body (the group is not served)
            if error.response.status_code == 404:
                return False
            raise

    # ---- writing -------------------------------------------------------------------------------------
    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> bool:
        """Create the pod's Binding; False when it is already bound or gone (409/404: nothing to repair).

        The Binding's annotations land on the pod in the same write as spec.nodeName (the API server's
        binding storage copies them), so a device plugin never sees a bound pod without its GPUs."""
        if not trace.get_current_span().is_recording():
            return await self._bind(namespace, name, uid, node, annotations) == 201
        with self._http_span(BINDING_TEMPLATE, namespace, name, **{"k8s.node.name": node, "k8s.pod.uid": uid}) as span:
            status = await self._bind(namespace, name, uid, node, annotations)
            span.set_attribute("http.response.status_code", status)  # 404 / 409: gone or bound, not an error
            return status == 201

    async def _bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> int:
        """The Binding's HTTP status: 201 created, 404 / 409 nothing to do; any other error raises."""
        if self.lane is not None:
            metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations)}
            if uid:
                metadata["uid"] = uid
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            try:
                await self.lane.request("POST", pod_path(namespace, name, "binding"), body)
                return 201
            except ApiStatusError as error:
                if error.code in (404, 409):
                    return error.code
                raise
        binding = PodBinding(
            metadata=ObjectMeta(name=name, namespace=namespace, annotations=dict(annotations), uid=uid or None),
            target=ObjectReference(apiVersion="v1", kind="Node", name=node),
        )
        try:
            await self.client.create(binding, name=name, namespace=namespace)
            return 201
        except msgspec.ValidationError:  # the API answers 201 with a Status, which lightkube reads as a Binding
            return 201
        except ApiError as error:
            if error.status.code in (404, 409):
                return int(error.status.code)
            raise

    async def set_unschedulable(self, namespace: str, name: str, reason: str, message: str) -> None:
        """The PodScheduled=False condition kube-scheduler sets, with Placement's reason."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message[:1024],
                        "lastTransitionTime": now,
                        "lastProbeTime": None,
                    }
                ]
            }
        }
        with _unless_gone():
            if self.lane is not None:
                path = pod_path(namespace, name, "status")
                await self.lane.request("PATCH", path, patch, content_type=STRATEGIC_PATCH)
            else:
                await self.client.patch(PodStatus, name, patch, namespace=namespace, patch_type=PatchType.STRATEGIC)

    async def event(
        self,
        kind: str,
        api_version: str,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        type_: str = "Warning",
    ) -> None:
        """A core/v1 Event about an object (what `kubectl describe` shows)."""
        now = datetime.now(UTC)
        if self.lane is not None:
            stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            involved = {"kind": kind, "apiVersion": api_version, "namespace": namespace, "name": name}
            if uid:
                involved["uid"] = uid
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message[:1024],
                "type": type_,
                "source": {"component": SCHEDULER_NAME},
                "reportingComponent": SCHEDULER_NAME,
                "reportingInstance": self.identity,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                await self.lane.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)
            except (ApiStatusError, aiohttp.ClientError, TimeoutError) as error:  # best effort, as below
                log.warning("event not recorded", extra={"object": f"{namespace}/{name}", "reason": str(error)})
            return
        event = Event(
            metadata=ObjectMeta(generateName=f"{name}.", namespace=namespace),
            involvedObject=ObjectReference(
                kind=kind, apiVersion=api_version, namespace=namespace, name=name, uid=uid or None
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            source=EventSource(component=SCHEDULER_NAME),
            reportingComponent=SCHEDULER_NAME,
            reportingInstance=self.identity,
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        try:
            await self.client.create(event)
        except ApiError as error:  # an Event is best effort: never stop binding for one
            log.warning("event not recorded", extra={"object": f"{namespace}/{name}", "reason": str(error)})

    async def set_podgroup_phase(self, namespace: str, name: str, phase: str, scheduled: int, running: int) -> None:
        patch = {"status": {"phase": phase, "scheduled": scheduled, "running": running}}
        with _unless_gone():
            if self.lane is not None:
                group, version, plural = POD_GROUP_API
                path = f"/apis/{group}/{version}/namespaces/{quote(namespace, safe='')}/{plural}/{quote(name, safe='')}"
                await self.lane.request("PATCH", f"{path}/status", patch, content_type=MERGE_PATCH)
            else:
                await self.client.patch(PodGroupStatus, name, patch, namespace=namespace, patch_type=PatchType.MERGE)

    async def evict(self, namespace: str, name: str, grace_period_s: float = 0.0) -> tuple[bool, str]:
        """Ask the Eviction API (PodDisruptionBudgets apply): (True, "") when accepted or already gone,
        (False, why) when refused (429: a budget does not allow it now; the caller retries)."""
        if not trace.get_current_span().is_recording():
            return (await self._evict(namespace, name, grace_period_s))[1:]
        with self._http_span(EVICTION_TEMPLATE, namespace, name) as span:
            status, accepted, why = await self._evict(namespace, name, grace_period_s)
            span.set_attribute("http.response.status_code", status)
            if not accepted:  # a budget's 429 is the API's answer, retried: the span says so, it is no crash
                span.set_attribute("error.type", str(status))
            return accepted, why

    async def _evict(self, namespace: str, name: str, grace_period_s: float) -> tuple[int, bool, str]:
        """(HTTP status, accepted, why not)."""
        options = DeleteOptions(gracePeriodSeconds=int(grace_period_s)) if grace_period_s > 0 else None
        eviction = PodEviction(metadata=ObjectMeta(name=name, namespace=namespace), deleteOptions=options)
        try:
            await self.client.create(eviction, name=name, namespace=namespace)
            return 201, True, ""
        except msgspec.ValidationError:  # 201 with a Status body: accepted
            return 201, True, ""
        except ApiError as error:
            code = int(error.status.code or 0)
            if code == 404:
                return code, True, ""
            if code in (429, 500, 503):
                return code, False, f"{code} {error.status.reason}: {error.status.message}"
            raise

    # ---- leader election -----------------------------------------------------------------------------
    async def try_lease(self, namespace: str, name: str, duration_s: int) -> bool:
        """Take or renew the Lease; True when this instance holds it. Optimistic concurrency on the
        Lease's resourceVersion: of two binders racing, one update wins and the other gets 409."""
        now = datetime.now(UTC)
        try:
            lease = await self.client.get(Lease, name, namespace=namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            fresh = Lease(
                metadata=ObjectMeta(name=name, namespace=namespace),
                spec=LeaseSpec(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=duration_s,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=0,
                ),
            )
            try:
                await self.client.create(fresh)
                return True
            except ApiError as conflict:
                if conflict.status.code == 409:
                    return False
                raise
        spec = lease.spec or LeaseSpec()
        renewed = spec.renewTime
        renewed_at = renewed if isinstance(renewed, datetime) else None
        expired = renewed_at is None or renewed_at + timedelta(seconds=spec.leaseDurationSeconds or duration_s) < now
        if spec.holderIdentity != self.identity and not expired:
            return False
        if spec.holderIdentity != self.identity:
            spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
            spec.acquireTime = now
        spec.holderIdentity = self.identity
        spec.leaseDurationSeconds = duration_s
        spec.renewTime = now
        lease.spec = spec
        try:
            await self.client.replace(lease)
            return True
        except ApiError as error:
            if error.status.code == 409:
                return False
            raise

    async def release_lease(self, namespace: str, name: str) -> None:
        try:
            lease = await self.client.get(Lease, name, namespace=namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                lease.spec.renewTime = None
                await self.client.replace(lease)
        except ApiError as error:
            log.warning("lease not released", extra={"reason": str(error)})


def _retry_watch(error: Exception, count: int) -> OnErrorResult:
    """Keep a watch going across API server hiccups; lightkube starts over from the current state (ADDED for
    every object) when the version it had is too old (410)."""
    log.warning("watch interrupted; reopening", extra={"reason": str(error), "attempt": count})
    return OnErrorResult(OnErrorAction.RETRY, sleep=min(5.0, 0.2 * count))


def identity() -> str:
    return os.environ.get("KUMIKI_INSTANCE") or f"binder-{os.uname().nodename}-{os.getpid()}"


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    """A status write for an object deleted meanwhile has nothing left to say: its 404 is not an error."""
    try:
        yield
    except ApiStatusError as error:
        if error.code != 404:
            raise
    except ApiError as error:
        if error.status.code != 404:
            raise


def _pod_fields(others: bool) -> dict[str, Any]:
    """The field selector of the binder's pods (schedulerName kumiki), or of other schedulers' bound pods."""
    if not others:
        return {"spec.schedulerName": SCHEDULER_NAME}
    return {"spec.schedulerName": operators.not_equal(SCHEDULER_NAME), "spec.nodeName": operators.not_equal("")}


def _pod_field_selector(others: bool) -> str:
    if not others:
        return f"spec.schedulerName={SCHEDULER_NAME}"
    return f"spec.schedulerName!={SCHEDULER_NAME},spec.nodeName!="
