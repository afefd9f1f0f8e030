"""The `Calls` stream's method table (proto: Visenv.Calls), declared once for both of its
ends: the client's `Channel` (channel.py) looks a method's call field up in `STREAMED`,
the server (env_server/api/grpc_server.py) the method of a call field in `STREAMED_CALLS`."""

from __future__ import annotations

from visenv.v1 import visenv_pb2 as pb


def _streamed() -> dict[str, tuple[str, str]]:
    """Each unary method a `Calls` stream carries -> (its field in CallRequest's `call`,
    its reply's field in CallResponse's `result`), read from the proto: a call is the
    field whose message is the method's request, its reply the one whose message is the
    method's response."""
    service = pb.DESCRIPTOR.services_by_name["Visenv"]
    calls = pb.CallRequest.DESCRIPTOR.oneofs_by_name["call"].fields
    replies = pb.CallResponse.DESCRIPTOR.oneofs_by_name["result"].fields
    return {
        m.name: (
            next(f.name for f in calls if f.message_type is m.input_type),
            next(f.name for f in replies if f.message_type is m.output_type),
        )
        for m in service.methods
        if any(f.message_type is m.input_type for f in calls)
    }


# the unary methods a `Calls` stream carries: method -> (call field, reply field)
STREAMED: dict[str, tuple[str, str]] = _streamed()
# the same table read the other way: call field -> (method, reply field)
STREAMED_CALLS: dict[str, tuple[str, str]] = {
    field: (method, reply) for method, (field, reply) in STREAMED.items()
}
