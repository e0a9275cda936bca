"""The ``schema`` member of ``POST /v1/samples``: which feature schema the samples were measured with.

One shape is the schema's own, ``FeatureSchema.to_dict()``, as ``GET /v1/status`` and every model's
metadata report it (``version``, ``pod_class`` and the ``ttft`` and ``tpot`` feature lists), so a client
can post back what the status gave it. Its short form, ``FeatureSchema.key()`` (``version`` and
``pod_class`` alone, which decide the lists), is what the router's sink sends and is accepted too. Either
must be the server's own schema: a window never mixes samples whose features meant different things.
"""

from __future__ import annotations

import json
from typing import Any

from slorouter.http.errors import RequestError
from slorouter.predictor.features import MODEL_KINDS, FeatureSchema

_KEY = ("version", "pod_class")
_MEMBERS = (*_KEY, *MODEL_KINDS)
_REFUSED = "samples of another schema are refused: one window never mixes two"


def check_sample_schema(claimed: Any, schema: FeatureSchema) -> None:
    """Raise ``RequestError`` (400, its ``param`` the bad member) unless ``claimed`` is ``schema``, in its
    whole or its short form."""
    if claimed is None:
        raise RequestError(
            f'"schema" is required: the feature schema the samples were measured with, '
            f'{json.dumps(schema.key())} on this server (or the whole "schema" of GET /v1/status)',
            param="schema",
        )
    if not isinstance(claimed, dict):
        raise RequestError(
            f'"schema" must be an object such as {json.dumps(schema.key())}, got {type(claimed).__name__}',
            param="schema",
        )
    unknown = sorted(set(claimed) - set(_MEMBERS), key=str)
    if unknown:
        raise RequestError(
            f'"schema" has no member {unknown[0]!r} (it takes {", ".join(_MEMBERS)})', param="schema"
        )
    for name in _KEY:
        if name not in claimed:
            raise RequestError(f'"schema.{name}" is required', param=f"schema.{name}")
    version, pod_class = claimed["version"], claimed["pod_class"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise RequestError(f'"schema.version" must be an integer, got {version!r}', param="schema.version")
    if not isinstance(pod_class, bool):
        raise RequestError(
            f'"schema.pod_class" must be true or false, got {pod_class!r}', param="schema.pod_class"
        )
    if version != schema.version:
        raise RequestError(
            f'"schema.version" is {version}, but this server\'s feature schema is version {schema.version} '
            f"({_REFUSED})",
            param="schema.version",
        )
    if pod_class != schema.pod_class:
        raise RequestError(
            f'"schema.pod_class" is {json.dumps(pod_class)}, but this server\'s is '
            f"{json.dumps(schema.pod_class)} ({_REFUSED})",
            param="schema.pod_class",
        )
    given = [kind for kind in MODEL_KINDS if kind in claimed]
    if given and len(given) != len(MODEL_KINDS):
        missing = next(kind for kind in MODEL_KINDS if kind not in claimed)
        raise RequestError(
            f'"schema.{missing}" is required with "schema.{given[0]}" (send both feature lists, or neither)',
            param=f"schema.{missing}",
        )
    for kind in given:
        expected = list(schema.features(kind))
        if claimed[kind] != expected:
            raise RequestError(
                f'"schema.{kind}" must list this server\'s {kind} features, {json.dumps(expected)}; '
                f"got {json.dumps(claimed[kind])} ({_REFUSED})",
                param=f"schema.{kind}",
            )
