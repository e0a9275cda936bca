"""The predictor servers' bodies: the training server's samples, the prediction server's bulk rows (JSON and
binary). Regressions of the defects the fuzzing found (docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import pytest

from slorouter.http.errors import RequestError
from slorouter.http.json_bodies import parse_json


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000, b'{"rows": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001],
    ids=["arrays", "objects"],
)
def test_a_body_nested_too_deeply_is_a_400_not_a_crash(raw):
    with pytest.raises(RequestError, match="nested too deeply") as info:
        parse_json(raw)
    assert info.value.status == 400
