"""An ext_proc server that does nothing a picker does: every request goes to the first endpoint given, with
constant answers, on the picker's own gRPC server. Envoy + this is the floor of any endpoint picker behind
Envoy's ext_proc filter on the machine (its protocol's messages, hops and Envoy's own work), which
``bench_extproc.py`` reports beside the real picker.

    python benchmarks/_null_picker.py PORT ENDPOINT
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping

import uvloop

from slorouter.extproc import messages
from slorouter.http.grpc_server import GrpcServer, ServerSettings

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class NullStream:
    """Answers each message at once; an observer's messages (observability mode) are not answered."""

    finished = False

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint
        self._duplex = False
        self._body = b""

    def on_message(self, payload: bytes) -> list[bytes]:
        message = messages.ProcessingRequest.FromString(payload)
        if message.observability_mode:
            return []
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            self._duplex = message.protocol_config.request_body_mode == messages.FULL_DUPLEX_STREAMED
            return [] if self._duplex else [messages.serialized(messages.continue_request_headers())]
        if kind == "request_body":
            if self._duplex:
                self._body += message.request_body.body
                if not message.request_body.end_of_stream:
                    return []
                answers = [
                    messages.routed_headers([self._endpoint]),
                    *messages.streamed_body(self._body, request=True),
                ]
            else:
                answers = [messages.routed_body([self._endpoint])]
            return [answer.SerializeToString() for answer in answers]
        if kind == "response_headers":
            return [messages.response_headers([]).SerializeToString()]
        if kind == "response_body":
            return [messages.serialized(messages.continue_response_body())]
        return [messages.serialized(messages.continue_trailers(request=kind == "request_trailers"))]

    def on_close(self, reason: str | None) -> None:
        pass


async def serve(port: int, endpoint: str) -> None:
    def open_stream(fields: Mapping[bytes, bytes]) -> NullStream:
        return NullStream(endpoint)

    server = GrpcServer({PROCESS: open_stream}, ServerSettings(max_message_bytes=17 << 20))
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), sys.argv[2]))
