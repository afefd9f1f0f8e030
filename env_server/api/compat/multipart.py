"""VAGEN's multipart wire: a JSON part named `data`, then raw PNG parts (no base64).

    data = await parse_data_part(content_type, body)   # multipart/form-data (or JSON) in
    body, media_type = mixed_reply(data, [png, ...])   # multipart/mixed out

Parsing uses the standard library's MIME parser (email, with the HTTP policy); a body
over OFFLOAD_BYTES is parsed in a thread (an 80,000-part body takes seconds), so that the
event loop goes on serving every other session meanwhile.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import secrets
from typing import Any

from env_server.service.models import ServiceError, json_problem

OFFLOAD_BYTES = 16 * 1024


def _bad(message: str) -> ServiceError:
    return ServiceError("INVALID_ARGUMENT", message, "data")


def read_data_part(content_type: str, body: bytes) -> dict[str, Any]:
    """The JSON object of the `data` part (or the whole body when it is JSON)."""
    if content_type.split(";")[0].strip().lower() == "application/json":
        raw = body
    elif content_type.lower().startswith("multipart/"):
        head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
        if not message.is_multipart():
            raise _bad("the multipart body could not be parsed (boundary missing or wrong)")
        parts = [
            p for p in message.iter_parts() if p.get_param("name", header="content-disposition")
        ]
        named = [p for p in parts if p.get_param("name", header="content-disposition") == "data"]
        if not named:
            raise _bad("the multipart body has no part named 'data' (the JSON request)")
        raw = named[0].get_payload(decode=True) or b""
    else:
        raise _bad(
            f"content type {content_type or 'none'!r}: expected multipart/form-data "
            "with a JSON part named 'data'"
        )
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"the 'data' part is not valid JSON: {exc}") from None
    except RecursionError:
        raise _bad("the 'data' part is nested too deep to parse") from None
    if not isinstance(data, dict):
        raise _bad("the 'data' part must be a JSON object")
    problem = json_problem(data, "data")  # nesting, finite numbers, valid Unicode
    if problem is not None:
        raise _bad(problem)
    return data


async def parse_data_part(content_type: str, body: bytes) -> dict[str, Any]:
    """`read_data_part`, in a thread when the body is over OFFLOAD_BYTES."""
    if len(body) <= OFFLOAD_BYTES:
        return read_data_part(content_type, body)
    return await asyncio.to_thread(read_data_part, content_type, body)


def mixed_reply(data: dict[str, Any], images: list[bytes]) -> tuple[bytes, str]:
    """(body, media type) of a multipart/mixed reply: the JSON part, then one image/png part
    per image (`filename="{i}.png"`), as VAGEN's remote client reads it."""
    boundary = f"visenv-{secrets.token_hex(12)}"
    dash = f"--{boundary}\r\n".encode()
    chunks = [
        dash,
        b'Content-Disposition: form-data; name="data"; filename="data.json"\r\n'
        b"Content-Type: application/json; charset=utf-8\r\n\r\n",
        json.dumps(data, ensure_ascii=False).encode("utf-8", "backslashreplace"),
        b"\r\n",
    ]
    for i, png in enumerate(images):
        chunks += [
            dash,
            f'Content-Disposition: form-data; name="images"; filename="{i}.png"\r\n'.encode(),
            b"Content-Type: image/png\r\n\r\n",
            png,
            b"\r\n",
        ]
    chunks.append(f"--{boundary}--\r\n".encode())
    return b"".join(chunks), f'multipart/mixed; boundary="{boundary}"'
