"""Generated inputs for every parser a peer can reach, and the property each one must keep.

Each parser family has one strategy of *cases* and one ``check_*`` function that runs a case through the
parser and raises ``AssertionError`` when the property is broken: a valid input works; an invalid one gets
the parser's own error (a 4xx ``RequestError``, a ``ParseError``, a ``ConfigError``, ...) whose message names
the problem; nothing else is raised. The tests in this folder run a bounded number of examples of each;
``benchmarks/fuzz.py`` runs the same pairs for as many inputs as it is asked.

A case is ``(valid, input)``: ``valid`` is True when the strategy built an input the parser must accept, False
when it built one it must refuse, and None when it may do either (random mutations, random text).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

# --- shared pieces -------------------------------------------------------------------------------------

# Text with everything a peer may send: any code point (lone surrogates, NUL, RTL marks, emoji) included.
ANY_TEXT = st.text(st.characters(codec=None), max_size=40)
SHORT_TEXT = st.text(max_size=12)
# Integers beyond every machine type, and the ones next to their limits.
HUGE_INTS = st.one_of(
    st.integers(),
    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**400]),
)
ODD_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, -0.0, 1.7976931348623157e308]),
)
JSON_SCALARS = st.one_of(st.none(), st.booleans(), HUGE_INTS, ODD_FLOATS, ANY_TEXT)
JSON_FINITE_SCALARS = st.one_of(
    st.none(), st.booleans(), HUGE_INTS, st.floats(allow_nan=False, allow_infinity=False), ANY_TEXT
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SHORT_TEXT, inner, max_size=4),
    max_leaves=12,
)


def json_bytes(value: Any, ascii_only: bool) -> bytes:
    """``value`` as a JSON body: NaN and infinities as Python's json writes them (not JSON, but sent);
    without ``ascii_only``, lone surrogates become the invalid UTF-8 bytes a careless client sends."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def nested(depth: int, leaf: str = "0") -> bytes:
    """A JSON value nested ``depth`` arrays deep."""
    return b"[" * depth + leaf.encode() + b"]" * depth


@st.composite
def hostile_json(draw: st.DrawFn, valid_body: Any) -> bytes:
    """A body a hostile or careless client sends: the valid one with a field replaced, deleted or added,
    a deep nest or huge number spliced in, the bytes cut or flipped, or not JSON at all."""
    body = draw(valid_body)
    kind = draw(st.integers(0, 7))
    if kind == 0 and isinstance(body, dict) and body:  # a field gets another type or value
        key = draw(st.sampled_from(sorted(body)))
        body = {**body, key: draw(JSON_VALUES)}
    elif kind == 1 and isinstance(body, dict) and body:
        key = draw(st.sampled_from(sorted(body)))
        body = {k: v for k, v in body.items() if k != key}
    elif kind == 2:
        body = draw(JSON_VALUES)
    if kind == 3:  # a deep nest where a value goes
        depth = draw(st.sampled_from([10, 100, 1000, 5000, 100_000]))
        raw = json_bytes(body, True)
        return (
            raw.replace(b"}", b', "x": ' + nested(depth) + b"}", 1) if raw.endswith(b"}") else nested(depth)
        )
    if kind == 4:  # a number with thousands of digits
        digits = draw(st.sampled_from([20, 400, 4300, 4301, 10_000]))
        raw = json_bytes(body, True)
        number = b"1" * digits + draw(st.sampled_from([b"", b".5", b"e5", b"e400"]))
        return raw.replace(b"}", b', "big": ' + number + b"}", 1) if raw.endswith(b"}") else number
    raw = json_bytes(body, draw(st.booleans()))
    if kind == 5 and raw:  # truncated
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == 6 and raw:  # a byte flipped
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    if kind == 7 and draw(st.booleans()):
        return draw(st.binary(max_size=64))
    return raw


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        self.records.append(text)


@contextlib.contextmanager
def logged_errors() -> Iterator[list[str]]:
    """The ERROR records the package logs meanwhile: a hook whose exception is caught and logged is still
    a failure of the property."""
    recorder = _Recorder()
    logger = logging.getLogger("slorouter")
    logger.addHandler(recorder)
    try:
        yield recorder.records
    finally:
        logger.removeHandler(recorder)


def _message_of(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)


def assert_names_problem(exc: BaseException) -> None:
    message = _message_of(exc)
    assert message and message.strip(), f"{type(exc).__name__} without a message"
    assert len(message) < 20_000, f"an error message of {len(message)} characters"


# --- the OpenAI request parser -------------------------------------------------------------------------

MODELS = st.text(min_size=1, max_size=20).filter(str.strip)
TOKEN_IDS = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20)
PROMPTS = st.one_of(
    st.text(st.characters(codec=None), min_size=1, max_size=60),
    st.lists(st.text(st.characters(codec=None), min_size=1, max_size=20), min_size=1, max_size=4),
    TOKEN_IDS,
    st.lists(TOKEN_IDS, min_size=1, max_size=3),  # a batch of token-id prompts
)
ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
TEXT_PART = st.builds(lambda t: {"type": "text", "text": t}, ANY_TEXT)
OTHER_PARTS = st.sampled_from(
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "refusal", "refusal": "I can't help with that."},
        {"type": "file", "file": {"file_id": "file-abc"}},
    ]
)
CONTENT = st.one_of(
    ANY_TEXT,
    st.none(),
    st.lists(TEXT_PART, max_size=3),
    st.lists(TEXT_PART | OTHER_PARTS, min_size=1, max_size=3),
)


@st.composite
def chat_messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(ROLES)
    message: dict[str, Any] = {"role": role, "content": draw(CONTENT)}
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = [
            {
                "id": draw(st.text(min_size=1, max_size=8)),
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": draw(ANY_TEXT)})},
            }
        ]
    if role == "tool":
        message["tool_call_id"] = draw(st.text(min_size=1, max_size=8))
    if draw(st.booleans()):
        message["name"] = draw(SHORT_TEXT)
    return message


_OPTIONAL_BOOL = st.none() | st.booleans()


@st.composite
def _common_fields(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(MODELS)}
    stream = draw(_OPTIONAL_BOOL)
    if stream is not None:
        body["stream"] = stream
        if stream and draw(st.booleans()):
            body["stream_options"] = {"include_usage": draw(st.booleans())}
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(1, 2**31 - 1))
    if draw(st.booleans()):
        body["n"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        body["cache_salt"] = draw(ANY_TEXT)
    if draw(st.booleans()):
        body["temperature"] = draw(st.floats(0, 2))
    if draw(st.booleans()):
        body["user"] = draw(ANY_TEXT)
    return body


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    return {**draw(_common_fields()), "prompt": draw(PROMPTS)}


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = {**draw(_common_fields()), "messages": draw(st.lists(chat_messages(), min_size=1, max_size=5))}
    if draw(st.booleans()):
        body["tools"] = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    if "max_tokens" in body and draw(st.booleans()):
        body["max_completion_tokens"] = body.pop("max_tokens")
    return body


# Invalid on purpose: each with the parameter its error must name.
INVALID_FIELDS: dict[str, Any] = {
    "model": st.sampled_from([None, "", "   ", 3, ["m"], {"m": 1}, "m\ud800", "\udfff"]),
    "stream": st.sampled_from(["true", 1, 0, [], {}]),
    "stream_options": st.sampled_from(["x", 1, [], True]),
    "max_tokens": st.one_of(
        st.integers(max_value=0), st.integers(min_value=2**31), st.sampled_from([1.5, "16", True, [], {}])
    ),
    "n": st.one_of(
        st.integers(max_value=0), st.integers(min_value=2**31), st.sampled_from([1.5, "2", False])
    ),
    "cache_salt": st.sampled_from([1, [], {}, True]),
}
INVALID_PROMPTS = st.sampled_from(
    [None, "", [], [[]], [1, "a"], [True], [1.5], {"text": "x"}, 3, [[1], "a"], [-1], [2**32], [[2**40]]]
)
INVALID_MESSAGES = st.sampled_from(
    [
        None,
        [],
        "hi",
        [1],
        [{"content": "hi"}],
        [{"role": 1, "content": "hi"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [1]}],
        [{"role": "user", "content": [{"type": "text"}]}],
        [{"role": "user", "content": [{"type": "text", "text": 1}]}],
        [{"role": "user", "content": [{"text": "x"}]}],
    ]
)


@dataclass(frozen=True)
class OpenAICase:
    path: str  # /v1/completions or /v1/chat/completions
    raw: bytes
    valid: bool | None
    body: Any = None  # the body the bytes hold, when the case was built from one
    param: str | None = None  # what the error must name, for an invalid case


@st.composite
def _valid_openai(draw: st.DrawFn) -> OpenAICase:
    chat = draw(st.booleans())
    body = draw(chat_bodies() if chat else completion_bodies())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return OpenAICase(path, json_bytes(body, draw(st.booleans())), True, body)


@st.composite
def _invalid_openai(draw: st.DrawFn) -> OpenAICase:
    chat = draw(st.booleans())
    body = draw(chat_bodies() if chat else completion_bodies())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    main = "messages" if chat else "prompt"
    key = draw(st.sampled_from([*INVALID_FIELDS, main]))
    bad = draw((INVALID_MESSAGES if chat else INVALID_PROMPTS) if key == main else INVALID_FIELDS[key])
    body = {**body, key: bad}
    if key == "max_tokens" and chat:
        body.pop("max_completion_tokens", None)
    if bad is None and key in ("stream", "stream_options", "max_tokens", "n", "cache_salt"):
        return OpenAICase(path, json_bytes(body, True), True, body)  # null means "not given"
    return OpenAICase(path, json_bytes(body, True), False, body, key)


@st.composite
def _mutated_openai(draw: st.DrawFn) -> OpenAICase:
    chat = draw(st.booleans())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    return OpenAICase(path, draw(hostile_json(chat_bodies() if chat else completion_bodies())), None)


OPENAI_CASES = st.one_of(_valid_openai(), _invalid_openai(), _mutated_openai())


class Pipeline:
    """A Director over three idle endpoints with the default (heuristic, prefix-aware) pipeline: a parsed
    request must schedule, dispatch and complete, leaving no in-flight load behind."""

    ADDRESSES = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")

    def __init__(self) -> None:
        from slorouter.clock import ManualClock
        from slorouter.director import Director
        from slorouter.pool.inflight import InFlightTracker
        from slorouter.pool.state import Endpoint, MetricsSnapshot, PoolState
        from slorouter.scheduling.loader import build_scheduler_setup
        from slorouter.scheduling.plugin import PluginContext

        self.clock = ManualClock(100.0)
        self.pool = PoolState([Endpoint(a) for a in self.ADDRESSES])
        for address in self.ADDRESSES:
            self.pool.set_metrics(
                address, MetricsSnapshot(kv_usage=0.1, block_size=16, num_gpu_blocks=1000), 100.0
            )
        context = PluginContext(clock=self.clock, rng=np.random.default_rng(0), pool=self.pool)
        self.director = Director(
            self.pool, build_scheduler_setup(None, context), InFlightTracker(self.pool), self.clock
        )
        self.ids = 0

    def run(self, request: Any) -> None:
        from slorouter.metrics import GatewayMetrics
        from slorouter.serving.outcome import OutcomeRecorder

        with logged_errors() as errors:
            result = self.director.schedule(request)
            lifecycle = self.director.dispatch(request, result)
            self.clock.advance(0.01)
            lifecycle.on_headers(200, request.stream)
            lifecycle.on_tokens(1)
            lifecycle.on_reply_text("Hello, \u00e9\U0001f600 world")
            lifecycle.end(usage={"prompt_tokens": request.prompt_tokens, "completion_tokens": 2})
            metrics = GatewayMetrics(self.pool)  # the request's outcome, as the front-ends record it
            OutcomeRecorder(metrics, e2e_as_ttft=False).record(lifecycle, "/v1/completions")
            metrics.render()  # what GET /metrics answers next
        assert not errors, f"errors logged while serving it: {errors[0][:100]} | {errors}"
        inflight = {
            name: int(self.pool.columns[name].sum())
            for name in self.pool.columns
            if name.startswith("inflight")
        }
        assert not any(inflight.values()), f"in-flight load left behind | {inflight}"


_PIPELINE: Pipeline | None = None


def pipeline() -> Pipeline:
    global _PIPELINE
    if _PIPELINE is None:
        _PIPELINE = Pipeline()
    return _PIPELINE


def check_openai(case: OpenAICase) -> None:
    from slorouter.api.routing_headers import RoutingHints
    from slorouter.http.errors import RequestError
    from slorouter.serving.requests import INFERENCE_PARSERS, inference_request

    try:
        parsed = INFERENCE_PARSERS[case.path](case.raw)
    except RequestError as exc:
        assert case.valid is not True, f"a valid body refused: {exc.message[:70]} | {case.raw[:300]!r}"
        assert 400 <= exc.status < 500, exc.status
        assert_names_problem(exc)
        if case.param is not None:
            assert exc.param == case.param or case.param in exc.message, (case.param, exc.param, exc.message)
        return
    assert case.valid is not False, f"an invalid body accepted (bad {case.param}) | {case.raw[:300]!r}"
    if case.body is not None and isinstance(case.body, dict):
        body = case.body
        assert parsed.model == body["model"]
        assert parsed.stream == bool(body.get("stream"))
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is not None:
            assert parsed.max_tokens == limit
    assert 1 <= parsed.max_tokens < 2**31, parsed.max_tokens
    assert parsed.prompt_tokens >= 1
    p = pipeline()
    p.ids += 1
    p.run(inference_request(parsed, RoutingHints(), {}, f"fuzz-{p.ids}", p.clock.now()))


# --- the routing headers ----------------------------------------------------------------------------

ROUTING_NAMES = (
    "x-slo-ttft-ms",
    "x-llm-d-slo-ttft-ms",
    "x-slo-tpot-ms",
    "x-llm-d-slo-tpot-ms",
    "x-gateway-inference-objective",
    "x-llm-d-inference-objective",
    "x-prediction-based-scheduling",
    "x-prediction-based-scheduling-off",
)
OBJECTIVES = {"premium": 10, "standard": 0, "batch": -1}
HEADER_TEXT = st.one_of(
    st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=30),  # as the gateway decodes them
    ANY_TEXT,  # as ext_proc hands over a header's ``value``
    st.sampled_from(
        ["nan", "-inf", "inf", "1e400", "0", "-0", "1e-400", "  250  ", "1_000", "0x10", "3600000", "3600001",
         "true", "FALSE", "Yes", "2", "", " ", "premium", "Premium", " premium ", "\u0661\u0662\u0663"]
    ),
)  # fmt: skip


@dataclass(frozen=True)
class HeadersCase:
    headers: dict[str, str]
    valid: bool | None
    by_default: bool


@st.composite
def _valid_headers(draw: st.DrawFn) -> HeadersCase:
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers[draw(st.sampled_from(ROUTING_NAMES[:2]))] = repr(draw(st.floats(1e-3, 3_600_000)))
    if draw(st.booleans()):
        headers[draw(st.sampled_from(ROUTING_NAMES[2:4]))] = str(draw(st.integers(1, 3_600_000)))
    if draw(st.booleans()):
        headers[draw(st.sampled_from(ROUTING_NAMES[4:6]))] = draw(st.sampled_from(sorted(OBJECTIVES)))
    if draw(st.booleans()):
        headers[ROUTING_NAMES[6]] = draw(
            st.sampled_from(["true", "false", "1", "0", "yes", "no", "on", "OFF"])
        )
    if draw(st.booleans()):
        headers[ROUTING_NAMES[7]] = draw(HEADER_TEXT)  # its presence is what counts
    for name in draw(st.lists(st.text(min_size=1, max_size=10), max_size=3)):
        headers.setdefault(name.lower(), draw(HEADER_TEXT))
    return HeadersCase(headers, True, draw(st.booleans()))


@st.composite
def _random_headers(draw: st.DrawFn) -> HeadersCase:
    names = st.sampled_from(ROUTING_NAMES) | st.text(max_size=10)
    headers = draw(st.dictionaries(names, HEADER_TEXT, max_size=6))
    return HeadersCase(headers, None, draw(st.booleans()))


HEADERS_CASES = st.one_of(_valid_headers(), _random_headers())


def check_headers(case: HeadersCase) -> None:
    from slorouter.api.routing_headers import MAX_SLO_MS, parse_routing_headers
    from slorouter.http.errors import RequestError

    try:
        hints = parse_routing_headers(case.headers, OBJECTIVES, prediction_by_default=case.by_default)
    except RequestError as exc:
        assert case.valid is not True, f"valid routing headers refused: {exc.message[:80]} | {case.headers!r}"
        assert exc.status == 400 and exc.param in case.headers, (exc.status, exc.param)
        assert exc.param in exc.message, exc.message
        return
    for slo in (hints.slo_ttft_ms, hints.slo_tpot_ms):
        assert slo is None or (math.isfinite(slo) and 0 < slo <= MAX_SLO_MS), f"SLO out of range | {slo!r}"
    assert hints.priority == OBJECTIVES.get(hints.objective or "", 0)
    if "x-prediction-based-scheduling-off" in case.headers:
        assert not hints.use_prediction


# --- the Prometheus text parser ------------------------------------------------------------------------

REQUIRED_METRICS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
LABEL_VALUES = st.sampled_from(["m", 'a\\"b', "x,y}", "back\\\\slash", "new\\nline", "", "é"])
SAMPLE_VALUES = st.one_of(
    st.integers(0, 10_000).map(str),
    st.floats(0, 1).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "-1e308", "1e300", "9007199254740993", "0x1p3", "1_0"]),
)


_SAMPLE_OR_TEXT = SAMPLE_VALUES | ANY_TEXT


@dataclass(frozen=True)
class TextCase:
    """A text input: a /metrics page or a YAML configuration file."""

    text: str
    valid: bool | None


@st.composite
def _valid_page(draw: st.DrawFn) -> TextCase:
    lines = []
    for name in (
        "vllm:num_requests_waiting_by_reason",
        *REQUIRED_METRICS,
        "vllm:e2e_request_latency_seconds",
    ):
        lines += [f"# HELP {name} help mentioning {name}", f"# TYPE {name} gauge"]
        for engine in range(draw(st.integers(1, 3))):
            value = repr(draw(st.floats(0, 1))) if "kv" in name else str(draw(st.integers(0, 500)))
            labels = f'engine="{engine}",model_name="{draw(LABEL_VALUES)}"'
            stamp = draw(st.sampled_from(["", " 1700000000000"]))
            lines.append(f"{name}{{{labels}}} {value}{stamp}")
    for engine in range(draw(st.integers(0, 2))):
        blocks = draw(st.integers(0, 100_000) | st.just("None"))
        lines.append(
            f'vllm:cache_config_info{{block_size="16",engine="{engine}",num_gpu_blocks="{blocks}"}} 1.0'
        )
    end = draw(st.sampled_from(["\n", "\r\n"]))
    return TextCase(end.join(lines) + end, True)


@st.composite
def _hostile_page(draw: st.DrawFn) -> TextCase:
    lines = draw(_valid_page()).text.splitlines()
    kind = draw(st.integers(0, 5))
    if kind == 0:  # a sample's value replaced
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = lines[at].rsplit(" ", 1)[0] + " " + draw(_SAMPLE_OR_TEXT)
    elif kind == 1:  # a line cut anywhere
        at = draw(st.integers(0, len(lines) - 1))
        lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
    elif kind == 2:  # random lines spliced in
        for _ in range(draw(st.integers(1, 4))):
            name = draw(st.sampled_from([*REQUIRED_METRICS, "vllm:cache_config_info"]))
            rest = draw(st.sampled_from(["", " ", "{", "}", '{a="', '{a="1"}', "{=}", '{a="1",}']))
            lines.insert(
                draw(st.integers(0, len(lines))),
                name + rest + draw(st.sampled_from(["", " "])) + draw(_SAMPLE_OR_TEXT),
            )
        if draw(st.booleans()):
            lines.insert(
                0,
                'vllm:cache_config_info{block_size="'
                + draw(SAMPLE_VALUES)
                + '",num_gpu_blocks="'
                + draw(SAMPLE_VALUES)
                + '"} 1',
            )
    elif kind == 3:  # lines dropped
        lines = [line for line in lines if draw(st.booleans())]
    elif kind == 4:  # random text
        return TextCase(draw(st.text(max_size=200)), None)
    else:  # a huge number of label sets
        value = draw(SAMPLE_VALUES)
        lines += [f'vllm:num_requests_waiting{{e="{i}"}} {value}' for i in range(draw(st.integers(1, 50)))]
    return TextCase("\n".join(lines) + draw(st.sampled_from(["", "\n"])), None)


METRICS_CASES = st.one_of(_valid_page(), _hostile_page())


def check_metrics(case: TextCase) -> None:
    from slorouter.pool.metrics_parser import MAX_VALUE, ParseError, parse_metrics
    from slorouter.pool.state import Endpoint, PoolState

    try:
        snapshot = parse_metrics(case.text)
    except ParseError as exc:
        assert case.valid is not True, f"a valid page refused: {exc} | {case.text[:300]!r}"
        assert "vllm" in str(exc) or "sglang" in str(exc), str(exc)
        assert_names_problem(exc)
        return
    assert 0 <= snapshot.waiting <= MAX_VALUE and 0 <= snapshot.running <= MAX_VALUE
    assert 0.0 <= snapshot.kv_usage <= 1.0
    assert 0 <= snapshot.block_size <= MAX_VALUE and 0 <= snapshot.num_gpu_blocks <= MAX_VALUE
    pool = PoolState([Endpoint("10.0.0.1:8000")])
    pool.set_metrics("10.0.0.1:8000", snapshot, at=0.0)  # what the scraper does with it next


# --- the configuration loader ------------------------------------------------------------------------

_VALID_CONFIG: dict[str, Any] = {
    "gateway": {"host": "127.0.0.1", "port": 8080, "max_body_bytes": 1 << 20, "api_keys": ["k"]},
    "pool": {"endpoints": ["10.0.0.1:8000", "10.0.0.2:8000"], "scrape_interval_ms": 50},
    "objectives": {"premium": {"priority": 10}, "batch": {"priority": -1}},
    "seed": 7,
}
PLUGIN_TYPES = st.sampled_from(
    ["queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer", "max-score-picker",
     "random-picker", "single-profile-handler", "token-load-scorer", "least-queue-filter", "no-such-plugin"]
)  # fmt: skip


@st.composite
def _scheduler_config(draw: st.DrawFn) -> dict[str, Any]:
    plugins = draw(st.lists(PLUGIN_TYPES, min_size=1, max_size=4, unique=True))
    specs: list[dict[str, Any]] = []
    for plugin in plugins:
        spec: dict[str, Any] = {"type": plugin}
        if draw(st.booleans()):
            spec["parameters"] = draw(
                st.dictionaries(
                    st.sampled_from(["maxNumOfEndpoints", "blockSize", "x"]), JSON_SCALARS, max_size=2
                )
            )
        specs.append(spec)
    refs = [
        {"pluginRef": p} | ({"weight": draw(st.integers(-2, 5) | ODD_FLOATS)} if draw(st.booleans()) else {})
        for p in plugins
    ]
    return {"plugins": specs, "schedulingProfiles": [{"name": "default", "plugins": refs}]}


@st.composite
def _config_cases(draw: st.DrawFn) -> TextCase:
    import yaml

    data: Any = json.loads(json.dumps(_VALID_CONFIG))
    kind = draw(st.integers(0, 5))
    valid: bool | None = True
    if kind == 1:  # a value replaced somewhere
        section = draw(st.sampled_from(sorted(data)))
        if isinstance(data[section], dict) and data[section]:
            data[section][draw(st.sampled_from(sorted(data[section])))] = draw(JSON_VALUES)
        else:
            data[section] = draw(JSON_VALUES)
        valid = None
    elif kind == 2:  # an unknown key
        data[draw(st.sampled_from(sorted(data)))] = (
            {"unknown_key_x": 1} if draw(st.booleans()) else data["pool"] | {"bogus": 1}
        )
        valid = False
    elif kind == 3:  # a scheduler section
        data["scheduler"] = draw(_scheduler_config())
        valid = None
    elif kind == 4:  # random YAML-looking text
        return TextCase(
            draw(st.text(st.sampled_from(list("ab:-[]{}&*!|>'\"#%@ \n\t0123456789.,?~")), max_size=80)), None
        )
    elif kind == 5:  # the valid text, cut or with a byte changed
        text = yaml.safe_dump(data)
        at = draw(st.integers(0, len(text)))
        return TextCase(
            text[:at]
            + draw(
                st.sampled_from(
                    ["", "\x00", "\t", ": :", "&a", "*b", "!!python/object:os.system ''", "\ud800"]
                )
            )
            + text[at:],
            None,
        )
    dump = yaml.safe_dump(data, allow_unicode=draw(st.booleans()))
    return TextCase(dump, valid)


CONFIG_CASES = _config_cases()


def check_config(case: TextCase) -> None:
    from slorouter.clock import ManualClock
    from slorouter.config import ConfigError, parse_config
    from slorouter.pool.state import Endpoint, PoolState
    from slorouter.scheduling.config_schema import SchedulerConfigError
    from slorouter.scheduling.loader import build_scheduler_setup
    from slorouter.scheduling.plugin import PluginContext
    from slorouter.yamlfile import YAMLFileError, parse_yaml_mapping

    try:
        data = parse_yaml_mapping(case.text, "fuzz.yaml", "serve config")
        config = parse_config(data, "fuzz.yaml")
    except (YAMLFileError, ConfigError) as exc:
        assert case.valid is not True, f"a valid config refused: {exc} | {case.text[:300]!r}"
        assert str(exc).startswith("fuzz.yaml"), str(exc)
        assert_names_problem(exc)
        return
    assert case.valid is not False, f"an invalid config accepted | {case.text[:300]!r}"
    pool = PoolState([Endpoint("10.0.0.1:8000")])
    context = PluginContext(clock=ManualClock(0.0), rng=np.random.default_rng(0), pool=pool)
    try:
        build_scheduler_setup(config.scheduler, context)
    except SchedulerConfigError as exc:
        assert "scheduler" in str(exc), str(exc)
        assert_names_problem(exc)


# --- the training server's samples -------------------------------------------------------------------


_COUNT_VALUES = st.integers(0, 10**6) | st.floats(0, 1e6)
_LATENCIES = st.floats(1e-3, 1e6) | st.integers(1, 10**6)


def _feature_value(name: str) -> st.SearchStrategy[Any]:
    return st.floats(0, 1) if name in ("kv_cache_percentage", "prefix_cache_score") else _COUNT_VALUES


@st.composite
def feature_row(draw: st.DrawFn, names: tuple[str, ...]) -> dict[str, Any]:
    from slorouter.predictor.features import DERIVED_FEATURES

    row = {
        name: draw(_feature_value(name))
        for name in names
        if name not in DERIVED_FEATURES or draw(st.booleans())
    }
    if draw(st.booleans()):
        row["extra"] = draw(JSON_FINITE_SCALARS)  # extra keys are ignored (NaN would make it not JSON)
    return row


BAD_COUNTS = [None, "1", True, [], {}, -1, -0.5, 1e16, 10**30, float("nan"), float("inf"), 2**64]
BAD_FEATURE_VALUES = st.sampled_from(BAD_COUNTS)
BAD_FRACTIONS = st.sampled_from([*BAD_COUNTS, 1.5, 1.0000001])
BAD_LATENCIES = st.sampled_from([None, "1", True, [], {}, -1, 0, 0.0, float("nan"), float("inf"), -1e308])


def bad_value(name: str) -> st.SearchStrategy[Any]:
    """Values the feature ``name`` must refuse."""
    return BAD_FRACTIONS if name in ("kv_cache_percentage", "prefix_cache_score") else BAD_FEATURE_VALUES


@dataclass(frozen=True)
class SamplesCase:
    raw: bytes
    valid: bool | None
    count: int = 0


@st.composite
def _valid_samples(draw: st.DrawFn) -> dict[str, Any]:
    from slorouter.predictor.features import DEFAULT_SCHEMA, TPOT_FEATURES, TTFT_FEATURES

    samples = []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["ttft", "tpot"]))
        names = TTFT_FEATURES if kind == "ttft" else TPOT_FEATURES
        samples.append({"model": kind, "features": draw(feature_row(names)),
                        "latency_ms": draw(_LATENCIES)})  # fmt: skip
    body: dict[str, Any] = {"schema": DEFAULT_SCHEMA.key(), "samples": samples}
    if draw(st.booleans()):
        pairs = draw(st.lists(st.tuples(st.integers(1, 64), st.integers(1, 10**6)), max_size=3))
        body["pool_shape"] = {"kv_caches": [{"block_size": b, "num_gpu_blocks": n} for b, n in pairs]}
    return body


@st.composite
def _samples_cases(draw: st.DrawFn) -> SamplesCase:
    body = draw(_valid_samples())
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return SamplesCase(json_bytes(body, True), True, len(body["samples"]))
    if kind == 1 and body["samples"]:  # one field of one sample made bad
        sample = draw(st.sampled_from(body["samples"]))
        where = draw(st.sampled_from(["model", "latency_ms", "features", "feature"]))
        if where == "feature":
            sample["features"][draw(st.sampled_from(sorted(sample["features"])))] = draw(BAD_FEATURE_VALUES)
            return SamplesCase(json_bytes(body, True), None)  # the extra key and derived ones may take it
        bad = (
            BAD_LATENCIES
            if where == "latency_ms"
            else BAD_FEATURE_VALUES | st.sampled_from(["ttft ", "TPOT"])
        )
        sample[where] = draw(bad)
        return SamplesCase(json_bytes(body, True), False)
    if kind == 2:
        key = draw(st.sampled_from(["schema", "samples", "pool_shape"]))
        body[key] = draw(JSON_VALUES)
        return SamplesCase(json_bytes(body, True), None)
    return SamplesCase(draw(hostile_json(_valid_samples())), None)


SAMPLES_CASES = _samples_cases()


def check_samples(case: SamplesCase) -> None:
    from slorouter.http.errors import RequestError
    from slorouter.http.json_bodies import parse_json
    from slorouter.predictor.features import DEFAULT_SCHEMA
    from slorouter.predictor.training_server import parse_samples

    try:
        batch = parse_samples(parse_json(case.raw), schema=DEFAULT_SCHEMA, max_samples=1000)
    except RequestError as exc:
        assert case.valid is not True, f"valid samples refused: {exc.message[:80]} | {case.raw[:300]!r}"
        assert 400 <= exc.status < 500
        assert_names_problem(exc)
        return
    assert case.valid is not False, f"invalid samples accepted | {case.raw[:300]!r}"
    stored = 0
    for kind, (matrix, latencies) in batch.rows.items():
        assert matrix.shape == (len(latencies), len(DEFAULT_SCHEMA.features(kind))), matrix.shape
        assert np.isfinite(matrix).all() and (latencies > 0).all() and np.isfinite(latencies).all()
        stored += len(latencies)
    if case.valid:
        assert stored == case.count


# --- the prediction server's bulk API (JSON and binary) ----------------------------------------------


@dataclass(frozen=True)
class BulkCase:
    binary: bool
    raw: bytes
    header: bytes | None  # X-Feature-Names, for a binary body
    valid: bool | None
    expected: Any = None  # the float32 union matrix a valid body must give


@st.composite
def _bulk_cases(draw: st.DrawFn) -> BulkCase:
    from slorouter.predictor.features import ALL_FEATURES, DERIVED_FEATURES, EFFECTIVE_INPUT_TOKENS
    from slorouter.predictor.wire import RowEncoder

    n = draw(st.integers(1, 8))
    columns = []
    for name in ALL_FEATURES:
        if name in ("kv_cache_percentage", "prefix_cache_score"):
            columns.append(draw(st.lists(st.floats(0, 1, width=32), min_size=n, max_size=n)))
        else:
            columns.append(draw(st.lists(st.integers(0, 2**20).map(float), min_size=n, max_size=n)))
    union = np.array(columns, dtype=np.float32).T.copy()
    encoder = RowEncoder()
    binary = draw(st.booleans())
    kind = draw(st.integers(0, 3))
    if binary:
        header = ",".join(encoder.names).encode()
        body = encoder.encode_binary(union)
        if kind == 0:
            return BulkCase(True, body, header, True, union)
        if kind == 1:  # a value out of range, or NaN
            flat = bytearray(body)
            at = draw(st.integers(0, len(flat) // 4 - 1)) * 4
            flat[at : at + 4] = np.array(
                [draw(st.sampled_from([np.nan, -1.0, 2e15, np.inf]))], dtype="<f4"
            ).tobytes()
            return BulkCase(True, bytes(flat), header, None)
        if kind == 2:  # the header wrong
            names = list(encoder.names)
            change = draw(st.integers(0, 3))
            if change == 0:
                names.pop(draw(st.integers(0, len(names) - 1)))
            elif change == 1:
                names.append(names[0])
            elif change == 2:
                names = [n.upper() for n in names]
            else:
                return BulkCase(True, body, draw(st.none() | st.binary(max_size=40)), None)
            return BulkCase(True, body, ",".join(names).encode(), None)
        return BulkCase(
            True, body[: draw(st.integers(0, len(body)))] + draw(st.binary(max_size=7)), header, None
        )
    raw = encoder.encode(union)
    if kind == 0:
        return BulkCase(False, raw, None, True, union)
    rows = json.loads(raw)["rows"]
    if kind == 1:
        row = draw(st.sampled_from(rows))
        key = draw(st.sampled_from(sorted(row)))
        row[key] = draw(bad_value(key))
        valid = None if key in DERIVED_FEATURES and row[key] is None else False
        return BulkCase(False, json_bytes({"rows": rows}, True), None, valid)
    if kind == 2:
        return BulkCase(
            False,
            json_bytes(
                draw(st.sampled_from([{"rows": []}, {"rows": {}}, {"rows": [1]}, [], {"x": rows}])), True
            ),
            None,
            False,
        )
    del EFFECTIVE_INPUT_TOKENS
    return BulkCase(False, draw(hostile_json(st.just({"rows": rows}))), None, None)


BULK_CASES = _bulk_cases()
_BULK_SERVER: Any = None


def _bulk_server() -> Any:
    global _BULK_SERVER
    if _BULK_SERVER is None:
        import tempfile

        from slorouter.predictor.model_sources import make_source
        from slorouter.predictor.prediction_server import PredictionServer

        _BULK_SERVER = PredictionServer(
            make_source(model_dir=tempfile.mkdtemp(prefix="fuzz-models-")), max_rows=1000
        )
    return _BULK_SERVER


def check_bulk(case: BulkCase) -> None:
    """What ``PredictionServer._handle_bulk`` runs before the model: body decoding and validation (the
    model itself is not needed to find what the decoding accepts)."""
    from slorouter.http.errors import RequestError
    from slorouter.http.json_bodies import parse_json
    from slorouter.predictor.features import DEFAULT_SCHEMA, FeatureError, rows_to_matrices

    server = _bulk_server()
    try:
        if case.binary:
            matrix = server._binary_rows(case.raw, case.header, server.max_rows)
        else:
            rows = server._rows(parse_json(case.raw))
            matrix = server._json_rows(rows)
            x_ttft, x_tpot = rows_to_matrices(rows, schema=DEFAULT_SCHEMA)  # what predict_rows validates
            if matrix is not None:  # the fast path accepts only what the library accepts, and agrees
                assert np.array_equal(matrix[:, DEFAULT_SCHEMA.union_columns("ttft")], x_ttft)
            else:
                matrix = np.empty((len(rows), len(DEFAULT_SCHEMA.all_features())), dtype=np.float32)
                matrix[:, DEFAULT_SCHEMA.union_columns("ttft")] = x_ttft
                matrix[:, DEFAULT_SCHEMA.union_columns("tpot")] = x_tpot
    except (RequestError, FeatureError) as exc:
        assert case.valid is not True, f"a valid bulk body refused: {str(exc)[:80]} | {case.raw[:200]!r}"
        assert getattr(exc, "status", 400) in (400, 413)
        assert_names_problem(exc)
        return
    assert case.valid is not False, f"an invalid bulk body accepted | {case.raw[:300]!r}"
    assert matrix.dtype == np.float32 and np.isfinite(matrix).all()
    if case.expected is not None:
        assert np.array_equal(matrix, case.expected), "decoded rows differ from the encoded ones"


# --- the ext_proc messages (one Envoy stream through the picker) ---------------------------------------

SSE_BODIES = st.one_of(
    st.just(b'data: {"choices": [{"text": "hi", "index": 0}]}\n\ndata: {"choices": [], "usage": '
            b'{"prompt_tokens": 3, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'),
    st.just(b'data: {"choices": [{"delta": {"content": "\\ud800x"}}]}\n\n'),
    st.just(b'{"choices": [{"text": "a reply", "message": {"content": "hi"}}], '
            b'"usage": {"completion_tokens": 9}}'),
    st.just(b'{"choices": [{"message": {"content": null}}], "usage": {"completion_tokens": 1e400}}'),
    st.just(b'{"usage": {"completion_tokens": ' + b"9" * 5000 + b"}}"),
    st.just(b"data: " + b"[" * 5000 + b"\n\n"),
    st.binary(max_size=80),
    st.builds(lambda v: b"data: " + json_bytes(v, True) + b"\n\n", JSON_VALUES),
)  # fmt: skip


@dataclass(frozen=True)
class ExtProcCase:
    steps: tuple[Any, ...]  # ProcessingRequest messages, in the order Envoy sends them
    valid: bool | None  # True: a well-formed request that must be routed

    def __repr__(self) -> str:
        from google.protobuf import text_format

        steps = " / ".join(text_format.MessageToString(step, as_one_line=True)[:400] for step in self.steps)
        return f"ExtProcCase(valid={self.valid}, steps: {steps})"


def _header_map(headers: dict[str, str], as_value: bool) -> Any:
    from envoy.config.core.v3 import base_pb2

    if as_value:  # Envoy configured to send ``value`` (a UTF-8 string: no lone surrogates) not ``raw_value``
        utf8 = {
            k.encode("utf-8", "replace").decode(): v.encode("utf-8", "replace").decode()
            for k, v in headers.items()
        }
        return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, value=v) for k, v in utf8.items()])
    values = [
        base_pb2.HeaderValue(key=k, raw_value=v.encode("latin-1", "replace")) for k, v in headers.items()
    ]
    return base_pb2.HeaderMap(headers=values)


@st.composite
def _extproc_cases(draw: st.DrawFn) -> ExtProcCase:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from google.protobuf import struct_pb2

    from slorouter.extproc import messages

    modes = [messages.BUFFERED, messages.FULL_DUPLEX_STREAMED]
    clean = draw(st.booleans())  # half the streams are well-formed requests, which must be routed
    openai = draw(_valid_openai() if clean else OPENAI_CASES)
    route_headers = draw(_valid_headers() if clean else HEADERS_CASES)
    method = "POST" if clean else draw(st.sampled_from(["POST"] * 6 + ["GET", "PUT", ""]))
    paths = [openai.path] * 6 + [openai.path + "?x=1", "/v1/models", "/nope", ""]
    path = openai.path if clean else draw(st.sampled_from(paths))
    request_mode = draw(
        st.sampled_from(modes if clean else [*modes, *modes, messages.STREAMED, messages.NONE])
    )
    headers = {**route_headers.headers, ":method": method, ":path": path, "content-type": "application/json"}
    if draw(st.booleans()):
        headers["x-request-id"] = draw(HEADER_TEXT)
    no_body = not clean and draw(st.integers(0, 9)) == 0
    start = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=_header_map(headers, draw(st.booleans())), end_of_stream=no_body
        )
    )
    start.protocol_config.CopyFrom(
        pb.ProtocolConfiguration(
            request_body_mode=request_mode,
            response_body_mode=draw(st.sampled_from([*modes, messages.NONE, messages.STREAMED])),
        )
    )
    hints = st.lists(st.sampled_from((*Pipeline.ADDRESSES, "10.0.0.1", "10.9.9.9:1")))
    subset = None if clean else draw(st.none() | JSON_VALUES | hints)
    if subset is not None:
        hint = struct_pb2.Struct()
        try:
            hint.update({messages.SUBSET_KEY: subset})
        except (ValueError, TypeError, OverflowError):  # what protobuf cannot carry, Envoy cannot send
            subset = None
        else:
            start.metadata_context.filter_metadata[messages.SUBSET_NAMESPACE].CopyFrom(hint)
    steps = [start]
    body = openai.raw
    # BUFFERED: Envoy sends the whole body in one message; FULL_DUPLEX_STREAMED: in chunks.
    cuts = (
        []
        if request_mode == messages.BUFFERED
        else sorted(draw(st.lists(st.integers(0, len(body)), max_size=2)))
    )
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    for i, chunk in enumerate(chunks):
        steps.append(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=i == len(chunks) - 1))
        )
    if draw(st.booleans()):
        steps.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
    status = draw(st.sampled_from(["200"] * 5 + ["500", "429", "abc", "", "-1", "99999"]))
    content_type = draw(st.sampled_from(["application/json", "text/event-stream", "text/plain"]))
    steps.append(
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=_header_map({":status": status, "content-type": content_type}, False),
                end_of_stream=draw(st.integers(0, 9)) == 0,
            )
        )
    )
    reply = draw(SSE_BODIES)
    cut = draw(st.integers(0, len(reply)))
    steps.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=reply[:cut], end_of_stream=False)))
    steps.append(pb.ProcessingRequest(response_body=pb.HttpBody(body=reply[cut:], end_of_stream=True)))
    if draw(st.booleans()):
        steps.append(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    valid = (
        openai.valid is True and route_headers.valid is True and method == "POST" and path == openai.path
        and request_mode in modes and subset is None and not start.request_headers.end_of_stream
    )  # fmt: skip
    if not clean and draw(st.integers(0, 3)) == 0:  # out of order, duplicated or empty messages
        steps = draw(st.permutations(steps))
        if draw(st.booleans()):
            steps.insert(
                draw(st.integers(0, len(steps))), draw(st.sampled_from([*steps, pb.ProcessingRequest()]))
            )
        valid = None
    return ExtProcCase(tuple(steps), True if valid else None)


EXTPROC_CASES = _extproc_cases()
_LOOP: Any = None
_CONFIG: Any = None


def check_extproc(case: ExtProcCase) -> None:
    import asyncio

    from slorouter.config import GatewayConfig
    from slorouter.extproc.stream import Picker, PickerStream, ProtocolError
    from slorouter.metrics import GatewayMetrics

    global _LOOP, _CONFIG
    p = pipeline()
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
        _CONFIG = GatewayConfig(max_body_bytes=1 << 20)
    picker = Picker(p.director, GatewayMetrics(p.pool), _CONFIG, OBJECTIVES, False)
    stream = PickerStream(picker)
    routed = False
    rejected: list[tuple[int, str]] = []

    async def play() -> None:
        nonlocal routed
        for step in case.steps:
            if stream.closed:
                break
            try:
                responses = await stream.handle(step)
            except ProtocolError as exc:  # the servicer answers INVALID_ARGUMENT and ends the stream
                assert_names_problem(exc)
                break
            for response in responses:
                kind = response.WhichOneof("response")
                assert kind is not None, "an empty ProcessingResponse"
                if kind == "immediate_response":
                    rejected.append(
                        (response.immediate_response.status.code, response.immediate_response.body.decode())
                    )
                    json.loads(response.immediate_response.body)  # the gateway's OpenAI error body
                elif response.HasField("dynamic_metadata"):
                    routed = True

    with logged_errors() as errors:
        try:
            _LOOP.run_until_complete(play())
        finally:
            stream.close("the stream ended")
        picker.metrics.render()  # what GET /metrics answers next
    assert not errors, f"errors logged while serving it: {errors[0][:100]} | {errors}"
    if case.valid:
        assert routed and not rejected, f"a valid request not routed: {rejected[:1]} | {case.steps[:2]!r}"
    for status, _ in rejected:
        assert 400 <= status < 600, status
    inflight = int(p.pool.columns["inflight_requests"].sum())
    assert inflight == 0, f"in-flight load left behind | {inflight}"


# --- the families, for benchmarks/fuzz.py -----------------------------------------------------------------

PARSERS: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]] = {
    "openai": (OPENAI_CASES, check_openai),
    "routing-headers": (HEADERS_CASES, check_headers),
    "metrics": (METRICS_CASES, check_metrics),
    "config": (CONFIG_CASES, check_config),
    "training-samples": (SAMPLES_CASES, check_samples),
    "bulk-rows": (BULK_CASES, check_bulk),
    "extproc": (EXTPROC_CASES, check_extproc),
}
