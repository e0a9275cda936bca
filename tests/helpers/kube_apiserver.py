"""An in-test Kubernetes API server for pods and InferencePools, speaking the real list/watch protocol.

What it does as the real one does (kube-apiserver with its watch cache):

- one resourceVersion counter across all objects, increasing with every write; lists carry the counter's
  value in ``metadata.resourceVersion``, every object the version of its last write;
- ``GET .../pods`` and ``GET .../inferencepools`` list, ``?watch=true`` (Go's ParseBool spellings) watches:
  without ``resourceVersion`` (or with ``0``) a watch starts with a synthetic ADDED per existing object,
  with ``resourceVersion=N`` it replays every change after N, then streams live changes as JSON lines;
- ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!`` not exists) and
  ``fieldSelector`` on ``metadata.name`` / ``metadata.namespace``; a watch with a selector sees an object
  that starts matching as ADDED and one that stops matching as DELETED;
- ``allowWatchBookmarks=true``: BOOKMARK events (``send_bookmarks()``) with the current version;
  ``timeoutSeconds``: the watch ends cleanly after that long;
- ``compact()``: the change log up to now is gone; a watch or an exact list from an older version gets
  ``410 Gone`` (as an ERROR event with a Status of code 410 on a watch, or as the HTTP status when
  ``watch_expiry_as_http`` is set, as some servers and proxies do); ``compact(expire_watches=True)`` also
  ends the open watches with that ERROR event;
- ``drop_watches()`` cuts the open watch connections mid-stream; ``stop()`` / ``start()`` take the server
  away and bring it back on the same port;
- Bearer-token authentication (401 otherwise), ``Accept`` must allow JSON (406), only GET (405), unknown
  paths 404, unknown or malformed query parameters 400, each with a ``Status`` body.

What it does not do is listed in docs/deploy.md ("What the fake API server does not cover").
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# resource plural → (apiVersion, kind, list kind)
RESOURCES: dict[str, tuple[str, str, str]] = {
    "pods": ("v1", "Pod", "PodList"),
    "inferencepools": ("inference.networking.k8s.io/v1", "InferencePool", "InferencePoolList"),
}
LIST_PARAMS = {
    "labelSelector",
    "fieldSelector",
    "resourceVersion",
    "resourceVersionMatch",
    "timeoutSeconds",
    "watch",
    "allowWatchBookmarks",
    "pretty",
}
TRUE = {"1", "t", "T", "TRUE", "true", "True"}
FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class StatusError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


# --- selectors ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # "!=", "notin"


def _split_requirements(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def parse_label_selector(text: str) -> list[Requirement]:
    """The apimachinery label-selector syntax; a malformed one is a 400 as on the real server."""
    if not text.strip():
        return []
    requirements = []
    for part in _split_requirements(text):
        part = part.strip()
        match = re.fullmatch(r"(\S+?)\s+(in|notin)\s+\(([^()]*)\)", part)
        if match:
            key, op, values = match.group(1), match.group(2), [v.strip() for v in match.group(3).split(",")]
        elif part.startswith("!"):
            key, op, values = part[1:].strip(), "!", []
        elif "!=" in part:
            key, _, value = part.partition("!=")
            key, op, values = key.strip(), "!=", [value.strip()]
        elif "==" in part or "=" in part:
            key, _, value = part.partition("==") if "==" in part else part.partition("=")
            key, op, values = key.strip(), "=", [value.strip()]
        else:
            key, op, values = part, "exists", []
        if not _LABEL_KEY.fullmatch(key) or any(not _LABEL_VALUE.fullmatch(v) for v in values):
            raise StatusError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        requirements.append(Requirement(key, op, frozenset(values)))
    return requirements


def parse_field_selector(text: str) -> list[tuple[str, bool, str]]:
    """(field, equal, value) terms; only the fields every resource supports."""
    terms = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        negate = "!=" in part
        name, _, value = (
            part.partition("!=")
            if negate
            else (part.partition("==") if "==" in part else part.partition("="))
        )
        if not _ or name not in ("metadata.name", "metadata.namespace"):
            raise StatusError(400, "BadRequest", f'field label not supported: "{name}"')
        terms.append((name, not negate, value))
    return terms


@dataclass(frozen=True)
class Selection:
    labels: list[Requirement]
    fields: list[tuple[str, bool, str]]

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj["metadata"]
        if not all(r.matches(meta.get("labels") or {}) for r in self.labels):
            return False
        return all((meta[name.split(".")[1]] == value) == equal for name, equal, value in self.fields)


# --- the server ----------------------------------------------------------------------------------------
@dataclass
class Change:
    version: int
    resource: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict[str, Any]
    previous: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str
    selection: Selection
    bookmarks: bool
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    request: web.Request | None = None


@dataclass
class RequestRecord:
    path: str
    query: dict[str, str]

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in TRUE


class FakeKubeApiServer:
    def __init__(self, token: str = "test-token", *, watch_expiry_as_http: bool = False) -> None:
        self.token = token
        self.watch_expiry_as_http = watch_expiry_as_http
        self.version = 1000
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.changes: list[Change] = []
        self.compacted = self.version  # changes at or before this version are gone
        self.watchers: set[Watcher] = set()
        self.requests: list[RequestRecord] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._uids = (str(uuid.UUID(int=i)) for i in itertools.count(1))

    # --- lifecycle ----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        """Take the server away (connections refused) until ``start()``; open watches are cut."""
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, namespace: str = "default") -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "router", "user": {"token": self.token}}],
                "contexts": [
                    {"name": "fake", "context": {"cluster": "fake", "user": "router", "namespace": namespace}}
                ],
                "current-context": "fake",
            }
        )

    # --- writes (what a controller or kubectl would do) --------------------------------------------
    def _write(self, resource: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        meta = obj["metadata"]
        key = (resource, meta["namespace"], meta["name"])
        previous = self.objects.get(key)
        if kind == "ADDED" and previous is not None:
            raise ValueError(f"{key} exists")
        if kind != "ADDED" and previous is None:
            raise ValueError(f"{key} does not exist")
        self.version += 1
        stored = copy.deepcopy(obj)
        api_version, object_kind, _ = RESOURCES[resource]
        stored["apiVersion"], stored["kind"] = api_version, object_kind
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"].setdefault("uid", previous["metadata"]["uid"] if previous else next(self._uids))
        stored["metadata"].setdefault("creationTimestamp", "2026-12-01T00:00:00Z")
        if kind == "DELETED":
            del self.objects[key]
        else:
            self.objects[key] = stored
        change = Change(self.version, resource, meta["namespace"], kind, stored, previous)
        self.changes.append(change)
        for watcher in list(self.watchers):
            event = self._event_for(watcher, change)
            if event is not None:
                watcher.queue.put_nowait(event)
        return copy.deepcopy(stored)

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._write(resource, obj, "ADDED")

    def update(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._write(resource, obj, "MODIFIED")

    def delete(self, resource: str, namespace: str, name: str) -> None:
        self._write(resource, self.objects[(resource, namespace, name)], "DELETED")

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.objects[(resource, namespace, name)])

    def compact(self, *, expire_watches: bool = False) -> None:
        """Forget the change log up to the current version (etcd compaction plus a watch-cache restart)."""
        self.compacted = self.version
        self.changes.clear()
        if expire_watches:
            for watcher in list(self.watchers):
                watcher.queue.put_nowait(self._expired_event(self.version - 1))
                watcher.queue.put_nowait(None)

    def drop_watches(self) -> None:
        """Cut every open watch connection without ending the chunked stream."""
        for watcher in list(self.watchers):
            transport = watcher.request.transport if watcher.request is not None else None
            if transport is not None:
                transport.abort()
            watcher.queue.put_nowait(None)

    def send_bookmarks(self) -> int:
        """A BOOKMARK with the current version to every watch that asked for them; returns how many."""
        sent = 0
        for watcher in self.watchers:
            if watcher.bookmarks:
                api_version, kind, _ = RESOURCES[watcher.resource]
                watcher.queue.put_nowait(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind,
                            "apiVersion": api_version,
                            "metadata": {"resourceVersion": str(self.version)},
                        },
                    }
                )
                sent += 1
        return sent

    def open_watches(self, resource: str | None = None) -> int:
        return sum(1 for w in self.watchers if resource is None or w.resource == resource)

    # --- protocol -----------------------------------------------------------------------------------
    def _expired_event(self, version: int) -> dict[str, Any]:
        message = f"too old resource version: {version} ({self.compacted + 1})"
        return {"type": "ERROR", "object": status_body(410, "Expired", message)}

    def _event_for(self, watcher: Watcher, change: Change) -> dict[str, Any] | None:
        if change.resource != watcher.resource or change.namespace != watcher.namespace:
            return None
        now = watcher.selection.matches(change.obj)
        before = change.previous is not None and watcher.selection.matches(change.previous)
        if change.type == "DELETED":
            kind = "DELETED" if before else None
        elif change.type == "ADDED":
            kind = "ADDED" if now else None
        else:
            kind = {(True, True): "MODIFIED", (True, False): "DELETED", (False, True): "ADDED"}.get(
                (before, now)
            )
        return None if kind is None else {"type": kind, "object": copy.deepcopy(change.obj)}

    def _route(self, path: str) -> tuple[str, str, str | None]:
        """(resource, namespace, name) of a known path; 404 otherwise."""
        core = re.fullmatch(r"/api/v1/namespaces/([^/]+)/(pods)(?:/([^/]+))?", path)
        custom = re.fullmatch(
            r"/apis/inference\.networking\.k8s\.io/v1/namespaces/([^/]+)/(inferencepools)(?:/([^/]+))?", path
        )
        match = core or custom
        if match is None:
            raise StatusError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return match.group(2), match.group(1), match.group(3)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(RequestRecord(request.path, query))
        try:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                raise StatusError(401, "Unauthorized", "Unauthorized")
            accept = request.headers.get("Accept", "*/*")
            if "application/json" not in accept and "*/*" not in accept:
                raise StatusError(406, "NotAcceptable", f"only application/json is served, not {accept!r}")
            if request.method != "GET":
                raise StatusError(405, "MethodNotAllowed", f"the fake serves GET only, not {request.method}")
            resource, namespace, name = self._route(request.path)
            unknown = set(query) - LIST_PARAMS
            if unknown:
                raise StatusError(400, "BadRequest", f"unknown query parameters {sorted(unknown)}")
            if name is not None:
                if set(query) - {"pretty", "resourceVersion"}:
                    raise StatusError(400, "BadRequest", "a get takes no selectors and cannot watch")
                obj = self.objects.get((resource, namespace, name))
                if obj is None:
                    raise StatusError(404, "NotFound", f'{resource} "{name}" not found')
                return web.json_response(obj)
            watch = self._bool(query, "watch")
            selection = Selection(
                parse_label_selector(query.get("labelSelector", "")),
                parse_field_selector(query.get("fieldSelector", "")),
            )
            if watch:
                return await self._watch(request, resource, namespace, selection, query)
            return self._list(resource, namespace, selection, query)
        except StatusError as exc:
            return web.json_response(status_body(exc.code, exc.reason, exc.message), status=exc.code)

    @staticmethod
    def _bool(query: dict[str, str], key: str) -> bool:
        value = query.get(key)
        if value is None:
            return False
        if value in TRUE:
            return True
        if value in FALSE:
            return False
        raise StatusError(400, "BadRequest", f"{key}: invalid boolean {value!r}")

    def _version_param(self, query: dict[str, str]) -> int | None:
        text = query.get("resourceVersion")
        if text in (None, "", "0"):
            return None
        assert text is not None
        if not text.isdigit():
            raise StatusError(400, "BadRequest", f"invalid resource version {text!r}")
        return int(text)

    def _matching(self, resource: str, namespace: str, selection: Selection) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj)
            for (res, ns, _), obj in sorted(self.objects.items())
            if res == resource and ns == namespace and selection.matches(obj)
        ]

    def _list(
        self, resource: str, namespace: str, selection: Selection, query: dict[str, str]
    ) -> web.Response:
        version = self._version_param(query)
        match = query.get("resourceVersionMatch")
        if match not in (None, "NotOlderThan", "Exact"):
            raise StatusError(400, "BadRequest", f"resourceVersionMatch: unsupported value {match!r}")
        if match is not None and version is None:
            raise StatusError(400, "BadRequest", "resourceVersionMatch needs a resourceVersion")
        if version is not None and version > self.version:
            raise StatusError(
                504, "Timeout", f"Too large resource version: {version}, current: {self.version}"
            )
        if match == "Exact" and version is not None and version != self.version:
            if version <= self.compacted:
                raise StatusError(410, "Expired", f"too old resource version: {version} ({self.compacted})")
            raise StatusError(400, "BadRequest", "the fake lists exactly at the current version only")
        items = self._matching(resource, namespace, selection)
        api_version, _, list_kind = RESOURCES[resource]
        if resource == "pods":  # typed lists carry no kind in their items
            for item in items:
                del item["kind"], item["apiVersion"]
        return web.json_response(
            {
                "kind": list_kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _watch(
        self,
        request: web.Request,
        resource: str,
        namespace: str,
        selection: Selection,
        query: dict[str, str],
    ) -> web.StreamResponse:
        version = self._version_param(query)
        timeout_text = query.get("timeoutSeconds", "1800")
        if not timeout_text.isdigit():
            raise StatusError(400, "BadRequest", f"timeoutSeconds: invalid integer {timeout_text!r}")
        if version is not None and version < self.compacted:
            if self.watch_expiry_as_http:
                raise StatusError(410, "Expired", self._expired_event(version)["object"]["message"])
            backlog = [self._expired_event(version)]
            expired = True
        elif version is None:
            backlog = [{"type": "ADDED", "object": o} for o in self._matching(resource, namespace, selection)]
            for event in backlog:
                api_version, kind, _ = RESOURCES[resource]
                event["object"]["apiVersion"], event["object"]["kind"] = api_version, kind
            expired = False
        else:
            if version > self.version:
                raise StatusError(504, "Timeout", f"Too large resource version: {version}")
            watcher_probe = Watcher(resource, namespace, selection, False)
            backlog = [
                event
                for change in self.changes
                if change.version > version
                for event in [self._event_for(watcher_probe, change)]
                if event is not None
            ]
            expired = False
        watcher = Watcher(resource, namespace, selection, self._bool(query, "allowWatchBookmarks"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        watcher.request = request
        for event in backlog:
            await response.write(json.dumps(event).encode() + b"\n")
        if expired:
            await response.write_eof()
            return response
        self.watchers.add(watcher)
        try:
            async with asyncio.timeout(int(timeout_text)):
                while True:
                    event = await watcher.queue.get()
                    if event is None:
                        break
                    await response.write(json.dumps(event).encode() + b"\n")
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self.watchers.discard(watcher)
        if request.transport is not None and not request.transport.is_closing():
            await response.write_eof()
        return response


# --- objects --------------------------------------------------------------------------------------------
def pod(
    name: str,
    ip: str | None = "10.0.0.1",
    *,
    ready: bool = True,
    labels: dict[str, str] | None = None,
    namespace: str = "default",
    phase: str = "Running",
) -> dict[str, Any]:
    """A pod as the kubelet reports it (the fields discovery reads, and the usual ones around them)."""
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
            {"type": "ContainersReady", "status": "True" if ready else "False"},
            {"type": "PodScheduled", "status": "True"},
        ],
    }
    if ip is not None:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {"app": "vllm"})},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest"}]},
        "status": status,
    }


def inference_pool(
    name: str,
    match_labels: dict[str, str] | None = None,
    ports: list[int] | None = None,
    *,
    namespace: str = "default",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(match_labels or {"app": "vllm"})},
            "targetPorts": [{"number": p} for p in (ports or [8000])],
            "endpointPickerRef": {
                "name": f"{name}-epp",
                "port": {"number": 9002},
                "failureMode": "FailClose",
            },
        },
    }
