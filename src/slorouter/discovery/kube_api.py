"""The Kubernetes API through ``kubernetes_asyncio``: credentials (kubeconfig or the pod's service account),
requests, and the watch stream's decoding. Its results are turned into the typed ``source`` records here,
and all of its failures into ``ApiError``, so nothing else in discovery touches the library's untyped API.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, get_args

import aiohttp
from kubernetes_asyncio import client as kube_client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException
from kubernetes_asyncio.watch import Watch

from slorouter.discovery.source import ApiError, EventType, ListResult, WatchEvent
from slorouter.pool.config import KubernetesPoolConfig

INFERENCE_POOL_GROUP = "inference.networking.k8s.io"
INFERENCE_POOL_VERSION = "v1"
INFERENCE_POOL_PLURAL = "inferencepools"
EVENT_TYPES: frozenset[str] = frozenset(get_args(EventType))
# Transport failures of the library's aiohttp session.
TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


class KubernetesConfigError(ValueError):
    """The credentials could not be loaded (no kubeconfig, a broken one, not inside a pod)."""


def format_selector(match_labels: dict[str, str]) -> str:
    """``{"app": "vllm", "tier": "a"}`` → ``app=vllm,tier=a`` (a ``labelSelector`` query value)."""
    return ",".join(f"{key}={value}" for key, value in sorted(match_labels.items()))


async def load_configuration(config: KubernetesPoolConfig) -> Any:
    """The client's ``Configuration``: ``config.kubeconfig``; else the service account inside a pod; else
    ``$KUBECONFIG`` or ``~/.kube/config``."""
    configuration = kube_client.Configuration()
    path = config.kubeconfig
    try:
        if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kube_config.load_incluster_config(client_configuration=configuration)
            return configuration
        if path is None:
            path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube/config")
        if not Path(path).expanduser().is_file():
            raise KubernetesConfigError(
                f"kubeconfig {path} does not exist (not in a pod either: KUBERNETES_SERVICE_HOST is unset)"
            )
        await kube_config.load_kube_config(
            config_file=str(Path(path).expanduser()),
            context=config.context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, KubernetesConfigError):
            raise
        where = path or "the in-cluster service account"
        raise KubernetesConfigError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    return configuration


def _status_message(status: int, body: bytes) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, else the start of the body."""
    try:
        decoded = json.loads(body)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return body[:200].decode("utf-8", "replace") or f"HTTP {status}"


def _api_error(exc: ApiException) -> ApiError:
    status = exc.status if isinstance(exc.status, int) else 0
    body = exc.body if isinstance(exc.body, bytes) else str(exc.body or exc.reason or "").encode()
    return ApiError(status, _status_message(status, body))


def _event(raw: Any) -> WatchEvent:
    if not isinstance(raw, dict):
        raise ApiError(0, f"the watch sent a line that is not a watch event: {str(raw)[:200]!r}")
    kind = raw.get("type")
    obj = raw.get("raw_object")
    if kind not in EVENT_TYPES:
        raise ApiError(0, f"the watch sent an event of unknown type {kind!r}")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if not isinstance(version, str) or not version:
        raise ApiError(0, f"a {kind} watch event has no metadata.resourceVersion")
    return WatchEvent(kind, obj, version)


class ApiSource:
    """One list/watch endpoint of the API (a ``ResourceSource``): ``method`` is the client's list method,
    called with ``args`` and ``params``."""

    def __init__(
        self,
        description: str,
        method: Callable[..., Any],
        args: tuple[str, ...],
        params: dict[str, str],
        request_timeout_s: float,
        watch_timeout_s: float,
    ) -> None:
        self.description = description
        self._method = method
        self._args = args
        self._params = params
        self._request_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._watch_timeout_s = max(1, math.ceil(watch_timeout_s))
        # A watch the server keeps open longer than it said, without a byte, is a dead connection.
        self._watch_read_timeout = aiohttp.ClientTimeout(
            sock_connect=request_timeout_s, sock_read=self._watch_timeout_s + request_timeout_s
        )

    async def list(self) -> ListResult:
        try:
            response = await self._method(
                *self._args, **self._params, _preload_content=False, _request_timeout=self._request_timeout
            )
            try:
                body = await response.read()
                status = response.status
            finally:
                response.release()
        except ApiException as exc:
            raise _api_error(exc) from None
        except TRANSPORT_ERRORS as exc:
            raise ApiError(0, f"cannot reach the API server: {type(exc).__name__}: {exc}") from None
        if not 200 <= status < 300:
            raise ApiError(status, _status_message(status, body))
        try:
            decoded = json.loads(body)
        except ValueError:
            raise ApiError(0, f"the list answer is not JSON: {body[:200]!r}") from None
        items = decoded.get("items") if isinstance(decoded, dict) else None
        meta = decoded.get("metadata") if isinstance(decoded, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if not isinstance(items, list) or not isinstance(version, str) or not version:
            raise ApiError(0, "the list answer has no items or no metadata.resourceVersion")
        return ListResult(items, version)

    async def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        async with Watch(return_type="object") as watch:
            stream = watch.stream(
                self._method,
                *self._args,
                **self._params,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _request_timeout=self._watch_read_timeout,
            )
            try:
                async for raw in stream:
                    yield _event(raw)
            except ApiException as exc:
                raise _api_error(exc) from None
            except TRANSPORT_ERRORS as exc:
                raise ApiError(0, f"the watch broke: {type(exc).__name__}: {exc}") from None
            except ApiError:
                raise
            except Exception as exc:
                # The library raises plain Exception for a malformed event (and ValueError for a line
                # beyond aiohttp's buffer): the stream cannot be trusted past it, so it is restarted.
                raise ApiError(0, f"the watch sent a malformed event: {exc}") from None


class KubeApi:
    """A connection to one cluster; ``close()`` it."""

    def __init__(self, configuration: Any, request_timeout_s: float, watch_timeout_s: float) -> None:
        self._client = kube_client.ApiClient(configuration=configuration)
        self._core = kube_client.CoreV1Api(self._client)
        self._custom = kube_client.CustomObjectsApi(self._client)
        self._timeouts = (request_timeout_s, watch_timeout_s)

    @classmethod
    async def connect(cls, config: KubernetesPoolConfig) -> KubeApi:
        configuration = await load_configuration(config)
        return cls(configuration, config.request_timeout_s, config.watch_timeout_s)

    def pods(self, namespace: str, match_labels: dict[str, str]) -> ApiSource:
        selector = format_selector(match_labels)
        return ApiSource(
            f"pods {selector} in {namespace}",
            self._core.list_namespaced_pod,
            (namespace,),
            {"label_selector": selector},
            *self._timeouts,
        )

    def inference_pool(self, namespace: str, name: str) -> ApiSource:
        """The one InferencePool ``name``, as a list/watch narrowed by ``metadata.name``."""
        return ApiSource(
            f"InferencePool {namespace}/{name}",
            self._custom.list_namespaced_custom_object,
            (INFERENCE_POOL_GROUP, INFERENCE_POOL_VERSION, namespace, INFERENCE_POOL_PLURAL),
            {"field_selector": f"metadata.name={name}"},
            *self._timeouts,
        )

    async def close(self) -> None:
        await self._client.close()
