"""A lean gRPC server over cleartext HTTP/2 (h2c, prior knowledge), for bidirectional streaming methods.

grpcio's asyncio server spends most of an ext_proc picker's CPU in its own machinery: about 70 µs per
message a stream carries, which a streamed reply pays once per token. A data plane sends its messages in
bursts over a few long-lived connections, so one ``asyncio.Protocol`` per connection that parses the frames
of each read in one pass, answers synchronously what needs no waiting, and writes every answer of that read
at once costs a small fraction of it. What is here is what such a peer needs: the connection preface and
SETTINGS, HEADERS (+ CONTINUATION, padding and priority) decoded with ``hpack``, DATA carrying
length-prefixed gRPC messages, flow control both ways (the peer's windows respected, ours replenished as
messages are consumed), PING, RST_STREAM, GOAWAY for a graceful close, and trailers with the gRPC status.
A violation of HTTP/2 ends the connection with GOAWAY and the error's code; a bad RPC ends its stream with
a gRPC status; nothing a peer sends raises out of the protocol.

Each RPC gets a ``RpcHandler`` from the method's factory. ``on_message`` answers with the serialized
replies at once, or with an awaitable of them (the messages that follow wait, in order, until it is done);
``finished`` tells the server to end the RPC with OK after those replies; ``on_close`` is called exactly
once, when the RPC ends for any reason. The factory also gets the RPC's ``Push``, which sends replies that
answer no message (a timer's), after those already sent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast

import hpack

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers.
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
MAX_HEADER_LIST_SIZE = 6

# Error codes (RFC 9113 §7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, SETTINGS_TIMEOUT, STREAM_CLOSED = range(6)
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 6, 7, 8, 9
ENHANCE_YOUR_CALM = 0xB

# gRPC status codes.
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT = 0, 1, 2, 3
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = (1 << 31) - 1
# Our receive windows: large, so that a peer streaming many small messages never waits for an update.
STREAM_WINDOW = 1 << 24
CONNECTION_WINDOW = 1 << 30
# Streams taken on a connection whose client has not yet acknowledged our SETTINGS (and their limit).
UNACKNOWLEDGED_STREAMS = 10_000

_FRAME_HEADER = struct.Struct(">HBBBL")  # length as 16 + 8 bits, type, flags, stream id (with R bit)
_U32 = struct.Struct(">L")
_GRPC_PREFIX = struct.Struct(">BL")


class RpcError(Exception):
    """Ends an RPC with a gRPC status other than OK."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


Replies = list[bytes]


class RpcHandler(Protocol):
    """One RPC (one HTTP/2 stream) of a bidirectional streaming method."""

    @property
    def finished(self) -> bool:
        """True once the RPC should end (with OK) after the replies already returned."""
        ...

    def on_message(self, payload: bytes) -> Replies | Awaitable[Replies]: ...

    def on_close(self, reason: str | None) -> None:
        """The RPC ended: None when it ended normally (OK after the client's half-close or ``finished``),
        else why (cancelled, reset, the connection lost, an error status)."""
        ...


# Sends replies on an RPC on the handler's own initiative (not answering a message); nothing once it ended.
Push = Callable[[Replies], None]
# Makes the handler of a new RPC from its request header fields (custom metadata included: a data plane can
# say there what role the RPC plays) and its ``Push``.
HandlerFactory = Callable[[Mapping[bytes, bytes], Push], RpcHandler]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _FRAME_HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first``'s high bits set in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as an HPACK literal without indexing, new name, no Huffman coding (§6.2.2): valid
    whatever the peer's dynamic table holds, so the server keeps no encoder state."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


_STATUS_200 = b"\x88"  # indexed: static table entry 8, ":status: 200"
_RESPONSE_HEADERS = _STATUS_200 + literal(b"content-type", b"application/grpc")
_OK_TRAILERS = literal(b"grpc-status", b"0")


def _percent_encoded(message: str) -> bytes:
    """A grpc-message value: printable ASCII but '%' as is, anything else percent-encoded (UTF-8)."""
    out = bytearray()
    for byte in message.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def _status_fields(code: int, message: str) -> bytes:
    fields = literal(b"grpc-status", str(code).encode())
    if message:
        fields += literal(b"grpc-message", _percent_encoded(message[:1024]))
    return fields


def grpc_message(payload: bytes) -> bytes:
    """``payload`` with the gRPC length prefix (not compressed)."""
    return _GRPC_PREFIX.pack(0, len(payload)) + payload


@dataclass(frozen=True)
class ServerSettings:
    max_message_bytes: int = 4 << 20  # a longer gRPC message ends its RPC with RESOURCE_EXHAUSTED
    max_concurrent_streams: int = 1000  # advertised; a peer opens another connection past it
    max_header_list_bytes: int = 64 << 10
    max_buffered_bytes: int = 64 << 20  # written and not yet taken by the peer: reading pauses past it


class _Stream:
    __slots__ = (
        "buffer",
        "closed",
        "handler",
        "headers_sent",
        "id",
        "pending",
        "queue",
        "received",
        "remote_ended",
        "send_queue",
        "send_window",
    )

    def __init__(self, stream_id: int, handler: RpcHandler | None, send_window: int) -> None:
        self.id = stream_id
        self.handler = handler
        self.buffer = bytearray()  # the gRPC bytes not yet forming a whole message
        self.queue: collections.deque[bytes] = collections.deque()  # messages behind a pending answer
        self.pending: asyncio.Future[Replies] | None = None
        self.send_window = send_window
        # What the windows held back: (frame type, payload), DATA or the closing HEADERS (trailers).
        self.send_queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self.received = 0  # DATA bytes received and not yet given back in a stream WINDOW_UPDATE
        self.remote_ended = False
        self.headers_sent = False
        self.closed = False


class GrpcServer:
    """Listens on one address; ``methods`` maps a gRPC path ("/package.Service/Method") to the handler
    factory of its RPCs."""

    def __init__(self, methods: dict[str, HandlerFactory], settings: ServerSettings | None = None) -> None:
        self.methods = methods
        self.settings = settings or ServerSettings()
        self.connections: set[GrpcConnection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GrpcConnection(self), host, port, reuse_port=reuse_port or None, backlog=1024
        )
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    def refuse_new_streams(self) -> None:
        """Graceful close, first half: GOAWAY on every open connection, so that clients open their new
        streams elsewhere; the streams already open go on. A connection made later is served as usual (its
        method handlers decide what a new RPC gets): one answered only with GOAWAY would be retried."""
        for connection in list(self.connections):
            connection.go_away()

    async def close(self, grace_s: float = 0.5) -> None:
        """Stop listening; after ``grace_s`` the connections still open are dropped."""
        self.refuse_new_streams()
        if self._server is not None:
            self._server.close()
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort("the server closed")
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


class _DecodedBlocks:
    """HPACK decoding with a memory of the header blocks that left the dynamic table as it was.

    A data plane's gRPC client sends nearly the same header block for every stream; once its fields are
    in the dynamic table, the block is the same bytes each time, and decoding it (Huffman included) was the
    largest share of a stream's cost. Such a block means the same fields for as long as the table does not
    change, so its fields are remembered until a block changes the table.
    """

    __slots__ = ("_decoder", "_known")
    _LIMIT = 64

    def __init__(self, decoder: hpack.Decoder) -> None:
        self._decoder = decoder
        self._known: dict[bytes, dict[bytes, bytes]] = {}

    def decode(self, block: bytes) -> dict[bytes, bytes]:
        """The block's fields by name (the last value of a repeated one); ``hpack.HPACKError`` if bad."""
        known = self._known.get(block)
        if known is not None:
            return known
        table = self._decoder.header_table
        entries = table.dynamic_entries
        # What changes whenever the dynamic table does: an insertion makes a new newest entry, compared by
        # identity and held while the block is decoded (an id alone could be reused by the entry that
        # replaces it when it is evicted), a resize or an eviction changes the size or the count.
        newest, count, maxsize = (entries[0] if entries else None), len(entries), table.maxsize
        fields = {bytes(name): bytes(value) for name, value in self._decoder.decode(block, raw=True)}
        entries = table.dynamic_entries
        if (
            (entries[0] if entries else None) is not newest
            or len(entries) != count
            or table.maxsize != maxsize
        ):
            self._known.clear()  # a remembered block may refer to entries that moved
        elif len(self._known) < self._LIMIT:
            self._known[block] = fields
        return fields


class GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection of a gRPC client."""

    def __init__(self, server: GrpcServer) -> None:
        self._server = server
        self._settings = server.settings
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._preface_seen = False
        self._out: list[bytes] = []
        self._streams: dict[int, _Stream] = {}
        self._last_stream_id = 0
        self._decoder = hpack.Decoder(max_header_list_size=self._settings.max_header_list_bytes)
        self._decoded = _DecodedBlocks(self._decoder)
        self._continuation: tuple[int, int, bytearray] | None = None  # stream, flags, block so far
        self._peer_window = DEFAULT_WINDOW  # for each new stream
        self._peer_frame_size = DEFAULT_FRAME_SIZE
        self._connection_send_window = DEFAULT_WINDOW
        self._connection_received = 0
        self._going_away = False
        self._settings_acknowledged = False
        self._flush_scheduled = False
        self._closed = False

    # --- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        with contextlib.suppress(OSError, AttributeError):
            self._transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)
        settings = self._settings
        self._out.append(
            frame(
                SETTINGS,
                0,
                0,
                b"".join(
                    struct.pack(">HL", key, value)
                    for key, value in (
                        (MAX_CONCURRENT_STREAMS, settings.max_concurrent_streams),
                        (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                        (MAX_HEADER_LIST_SIZE, settings.max_header_list_bytes),
                        (ENABLE_PUSH, 0),
                    )
                ),
            )
        )
        self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW)))
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        buffer = self._buffer + data if self._buffer else data
        offset = 0
        try:
            if not self._preface_seen:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(buffer):
                        raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    self._buffer = buffer
                    return
                if not buffer.startswith(PREFACE):
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                offset = len(PREFACE)
                self._preface_seen = True
            end = len(buffer)
            while end - offset >= 9 and not self._closed:
                high, low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(buffer, offset)
                length = (high << 8) | low
                if length > DEFAULT_FRAME_SIZE:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - offset - 9 < length:
                    break
                start = offset + 9
                offset = start + length
                self._frame(kind, flags, stream_id & MAX_WINDOW, buffer[start:offset])
            self._buffer = buffer[offset:] if offset < end else b""
        except _ConnectionError as exc:
            self._buffer = b""
            self._fail(exc.code, str(exc))
            return
        self._replenish_connection()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        reason = f"the connection was lost ({exc})" if exc else "the connection was closed"
        for stream in list(self._streams.values()):
            self._close_stream(stream, reason)
        self._streams.clear()

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.resume_reading()

    # --- closing --------------------------------------------------------------------------------------
    def go_away(self) -> None:
        """No new streams (GOAWAY, NO_ERROR); the connection closes once the open ones are done."""
        if self._going_away or self._closed:
            return
        self._going_away = True
        self._out.append(frame(GOAWAY, 0, 0, _U32.pack(self._last_stream_id) + _U32.pack(NO_ERROR)))
        self._flush()
        self._close_if_idle()

    def abort(self, reason: str) -> None:
        for stream in list(self._streams.values()):
            self._close_stream(stream, reason)
        self._streams.clear()
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, code: int, message: str) -> None:
        log.warning("gRPC connection error: %s (HTTP/2 error code %d)", message, code)
        self._out.append(
            frame(GOAWAY, 0, 0, _U32.pack(self._last_stream_id) + _U32.pack(code) + message.encode()[:256])
        )
        self._flush()
        for stream in list(self._streams.values()):
            self._close_stream(stream, f"HTTP/2 connection error: {message}")
        self._streams.clear()
        self._closed = True
        if self._transport is not None:
            self._transport.close()

    def _close_if_idle(self) -> None:
        if self._going_away and not self._streams and self._transport is not None and not self._closed:
            self._closed = True
            self._transport.close()

    # --- frames ---------------------------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a frame other than CONTINUATION inside a header block")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation_frame(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._settings_frame(flags, stream_id, payload)
        elif kind == PING:
            if stream_id or len(payload) != 8:
                raise _ConnectionError(FRAME_SIZE_ERROR if stream_id == 0 else PROTOCOL_ERROR, "a bad PING")
            if not flags & ACK:
                self._out.append(frame(PING, ACK, 0, bytes(payload)))
        elif kind == RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise _ConnectionError(PROTOCOL_ERROR, "a bad RST_STREAM")
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                code = _U32.unpack(payload)[0]
                self._close_stream(stream, f"the client reset the stream (HTTP/2 error code {code})")
                self._close_if_idle()
            elif stream_id > self._last_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        elif kind == GOAWAY:
            if stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            self._going_away = True
            self._close_if_idle()
        elif kind == PRIORITY:
            if stream_id == 0 or len(payload) != 5:
                raise _ConnectionError(PROTOCOL_ERROR, "a bad PRIORITY frame")
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Unknown frame types are ignored (RFC 9113 §4.1).

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        self._connection_received += len(payload)
        stream = self._streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we ended: its bytes are dropped, and counted for the connection window
        if stream.closed:
            return  # we ended the RPC and wait to send its last bytes: what the client still sends is dropped
        if stream.remote_ended:
            self._reset(stream, STREAM_CLOSED, "DATA after the end of the stream")
            return
        if flags & PADDED:
            payload = _unpad(payload)
        stream.received += len(payload)
        if stream.received > STREAM_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR, "the client sent past the stream's window")
            return
        if payload:
            self._messages(stream, payload)
        if flags & END_STREAM and not stream.closed:
            stream.remote_ended = True
            self._maybe_finish(stream)
        if not stream.closed and stream.received >= STREAM_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.received)))
            stream.received = 0

    def _messages(self, stream: _Stream, payload: bytes) -> None:
        """The whole gRPC messages of the stream's bytes so far, delivered (or queued) in order."""
        if stream.buffer:
            stream.buffer += payload
            data: bytes | bytearray = stream.buffer
        else:
            data = payload
        offset = 0
        size = len(data)
        limit = self._settings.max_message_bytes
        while size - offset >= 5 and not stream.closed:
            compressed, length = _GRPC_PREFIX.unpack_from(data, offset)
            if compressed:
                self._end_rpc(stream, UNIMPLEMENTED, "compressed messages are not supported")
                return
            if length > limit:
                self._end_rpc(stream, RESOURCE_EXHAUSTED, f"a message of {length} bytes (limit {limit})")
                return
            if size - offset - 5 < length:
                break
            message = bytes(data[offset + 5 : offset + 5 + length])
            offset += 5 + length
            if stream.pending is not None or stream.queue:
                stream.queue.append(message)
            else:
                self._deliver(stream, message)
        if stream.closed:
            return
        if offset >= size:
            stream.buffer = bytearray()
        elif data is stream.buffer:
            del stream.buffer[:offset]
        else:
            stream.buffer = bytearray(data[offset:])

    def _deliver(self, stream: _Stream, payload: bytes) -> None:
        handler = stream.handler
        assert handler is not None
        try:
            result = handler.on_message(payload)
        except RpcError as exc:
            self._end_rpc(stream, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("gRPC handler failed")
            self._end_rpc(stream, INTERNAL, f"handler error: {exc.__class__.__name__}: {exc}")
            return
        if isinstance(result, list):
            self._replies(stream, result)
            return
        future = asyncio.ensure_future(result)
        stream.pending = future
        future.add_done_callback(lambda done: self._answered(stream, done))

    def _answered(self, stream: _Stream, future: asyncio.Future[Replies]) -> None:
        stream.pending = None
        if stream.closed:
            if not future.cancelled():
                future.exception()  # retrieved: the stream is gone, its answer with it
            return
        if future.cancelled():
            self._end_rpc(stream, CANCELLED, "the handler was cancelled")
        elif (exc := future.exception()) is not None:
            if isinstance(exc, RpcError):
                self._end_rpc(stream, exc.code, exc.message)
            else:
                log.error("gRPC handler failed", exc_info=exc)
                self._end_rpc(stream, INTERNAL, f"handler error: {exc.__class__.__name__}: {exc}")
        else:
            self._replies(stream, future.result())
        while stream.queue and stream.pending is None and not stream.closed:
            self._deliver(stream, stream.queue.popleft())
        if not stream.closed:
            self._maybe_finish(stream)
        self._flush_soon()

    def _replies(self, stream: _Stream, replies: Replies) -> None:
        if replies:
            if not stream.headers_sent:
                stream.headers_sent = True
                self._out.append(frame(HEADERS, END_HEADERS, stream.id, _RESPONSE_HEADERS))
            for reply in replies:
                self._send_data(stream, grpc_message(reply))
        handler = stream.handler
        assert handler is not None
        if handler.finished:
            self._end_rpc(stream, OK, "")

    def _push(self, stream: _Stream, replies: Replies) -> None:
        """Replies the handler sends on its own: written after the answers already sent (an answer still
        pending goes after them), then the RPC ends if the handler is finished."""
        if stream.closed or stream.handler is None:
            return
        self._replies(stream, replies)
        self._flush_soon()

    def _maybe_finish(self, stream: _Stream) -> None:
        """The client half-closed: the RPC ends (OK) once every message it sent has been answered."""
        if stream.remote_ended and stream.pending is None and not stream.queue and not stream.closed:
            self._end_rpc(stream, OK, "")

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a HEADERS frame too short for its priority")
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(flags, stream_id, bytes(payload))
        else:
            self._continuation = (stream_id, flags, bytearray(payload))

    def _continuation_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "an unexpected CONTINUATION frame")
        _, first_flags, block = self._continuation
        block += payload
        if len(block) > self._settings.max_header_list_bytes:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "a header block over the header list limit")
        if flags & END_HEADERS:
            self._continuation = None
            self._header_block(first_flags, stream_id, bytes(block))

    def _header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        try:
            fields = self._decoded.decode(block)
        except hpack.HPACKError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, f"the header block cannot be decoded: {exc}") from None
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they end its side
            if not flags & END_STREAM:
                self._reset(stream, PROTOCOL_ERROR, "a second header block without END_STREAM")
                return
            stream.remote_ended = True
            self._maybe_finish(stream)
            return
        if stream_id <= self._last_stream_id:
            if stream_id % 2 == 0:
                raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, not client-initiated")
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(STREAM_CLOSED)))
            return
        if stream_id % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"a client stream with the even id {stream_id}")
        self._last_stream_id = stream_id
        if self._going_away:  # a stream above our GOAWAY's last id: the client may retry it elsewhere
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        # Until the client acknowledges our SETTINGS it may not know the limit yet (RFC 9113 §6.5.3): the
        # streams it opened meanwhile are taken, up to a hard bound.
        limit = (
            self._settings.max_concurrent_streams if self._settings_acknowledged else UNACKNOWLEDGED_STREAMS
        )
        if len(self._streams) >= limit:
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(REFUSED_STREAM)))
            return
        stream = _Stream(stream_id, None, self._peer_window)
        self._streams[stream_id] = stream
        if fields.get(b":method") != b"POST":
            self._end_rpc(stream, UNIMPLEMENTED, "gRPC takes POST")
            return
        content_type = fields.get(b"content-type", b"")
        if not content_type.startswith(b"application/grpc"):
            self._reset(stream, PROTOCOL_ERROR, "not a gRPC request (content-type)")
            return
        encoding = fields.get(b"grpc-encoding", b"identity")
        if encoding != b"identity":
            self._end_rpc(
                stream, UNIMPLEMENTED, f"grpc-encoding {encoding.decode('latin-1')} is not supported"
            )
            return
        path = fields.get(b":path", b"").decode("latin-1")
        factory = self._server.methods.get(path)
        if factory is None:
            self._end_rpc(stream, UNIMPLEMENTED, f"unknown method {path}")
            return
        try:
            stream.handler = factory(fields, lambda replies: self._push(stream, replies))
        except RpcError as exc:
            self._end_rpc(stream, exc.code, exc.message)
            return
        if flags & END_STREAM:
            stream.remote_ended = True
            self._maybe_finish(stream)

    def _settings_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            self._settings_acknowledged = True
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame whose length is not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                change = value - self._peer_window
                self._peer_window = value
                for stream in self._streams.values():
                    stream.send_window += change
                if change > 0:
                    self._drain_sends()
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._peer_frame_size = value
            elif key == ENABLE_PUSH and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            elif key == HEADER_TABLE_SIZE:
                pass  # our header blocks use no dynamic table (see ``literal``)
        self._out.append(frame(SETTINGS, ACK, 0))

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not of 4 bytes")
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self._connection_send_window += increment
            if self._connection_send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection window grew past 2^31-1")
            self._drain_sends()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if increment == 0:
            self._reset(stream, PROTOCOL_ERROR, "a stream WINDOW_UPDATE of 0")
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR, "the stream window grew past 2^31-1")
            return
        self._drain_sends()

    # --- sending --------------------------------------------------------------------------------------
    def _send_data(self, stream: _Stream, data: bytes) -> None:
        if stream.send_queue:
            stream.send_queue.append((DATA, data))
        else:
            self._write_data(stream, data)

    def _write_data(self, stream: _Stream, data: bytes) -> bool:
        """Write what the windows allow and queue the rest in front. True when all of it went out."""
        frame_size = self._peer_frame_size
        while True:
            allowed = min(stream.send_window, self._connection_send_window, frame_size)
            if len(data) <= allowed:
                self._out.append(frame(DATA, 0, stream.id, data))
                stream.send_window -= len(data)
                self._connection_send_window -= len(data)
                return True
            if allowed <= 0:
                stream.send_queue.appendleft((DATA, data))
                return False
            self._out.append(frame(DATA, 0, stream.id, data[:allowed]))
            stream.send_window -= allowed
            self._connection_send_window -= allowed
            data = data[allowed:]

    def _drain_sends(self) -> None:
        for stream in list(self._streams.values()):
            queue = stream.send_queue
            while queue:
                kind, data = queue.popleft()
                if kind == HEADERS:
                    self._out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, data))
                    self._finish_closed(stream)
                    break
                if not self._write_data(stream, data):
                    break

    def _end_rpc(self, stream: _Stream, code: int, message: str) -> None:
        """Trailers (or a trailers-only answer) with the status; the stream is then done on our side."""
        if stream.closed:
            return
        fields = _status_fields(code, message) if code != OK else _OK_TRAILERS
        if stream.headers_sent:
            trailers = fields
        else:
            stream.headers_sent = True
            trailers = _RESPONSE_HEADERS + fields
        self._close_stream(stream, None if code == OK else f"gRPC status {code}: {message}")
        if stream.send_queue:  # the trailers go after the queued DATA
            stream.send_queue.append((HEADERS, trailers))
            return
        self._out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, trailers))
        self._finish_closed(stream)

    def _finish_closed(self, stream: _Stream) -> None:
        # No RST_STREAM(NO_ERROR) for a client still sending (RFC 9113 §8.1 makes it optional): grpcio's
        # client can take it, arriving with the trailers, for a failure. What it still sends is dropped.
        self._streams.pop(stream.id, None)
        self._close_if_idle()

    def _reset(self, stream: _Stream, code: int, reason: str) -> None:
        self._out.append(frame(RST_STREAM, 0, stream.id, _U32.pack(code)))
        self._streams.pop(stream.id, None)
        self._close_stream(stream, reason)
        self._close_if_idle()

    def _close_stream(self, stream: _Stream, reason: str | None) -> None:
        if stream.closed and stream.handler is None:
            return
        stream.closed = True
        stream.queue.clear()
        if stream.pending is not None:
            stream.pending.cancel()
        handler, stream.handler = stream.handler, None
        if handler is not None:
            try:
                handler.on_close(reason)
            except Exception:
                log.exception("gRPC handler's on_close failed")

    def _replenish_connection(self) -> None:
        if self._connection_received >= CONNECTION_WINDOW // 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._connection_received)))
            self._connection_received = 0

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(self._out) if len(self._out) > 1 else self._out[0])
        self._out.clear()

    def _flush_soon(self) -> None:
        """Write at the end of this turn of the event loop: the answers of every handler that finished in
        it go out in one write."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _ConnectionError(PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1 : len(payload) - pad]
