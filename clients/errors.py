"""Typed exceptions for every error a visenv server (or the way to it) can give.

Every exception derives from `VisenvError` and carries the wire `code`, a `message` a
person can act on, and the request `field` at fault when there is one. There is one class
per wire code (`visenv.wire.ERROR_CODES`, docs/wire.md); `DEADLINE_EXCEEDED` (a call ran
past its timeout) is the client's own, and `UNAVAILABLE` is also a server that cannot be
reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from visenv.wire import Error


class VisenvError(Exception):
    """Base of all visenv client errors."""

    code: str = "INTERNAL"
    error_id: str | None = None  # an INTERNAL error's id, as the server's log carries it

    def __init__(self, message: str, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        where = f" (field {self.field})" if self.field else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, field={self.field!r})"

    def __reduce__(self):  # keep code/field/error_id when pickled (multiprocessing, Ray)
        return (_rebuild, (self.code, self.message, self.field, self.error_id))


class InvalidArgument(VisenvError):
    code = "INVALID_ARGUMENT"


class NotFound(VisenvError):
    code = "NOT_FOUND"


class SessionLost(VisenvError):
    """The session is gone: its worker died or its server can no longer be reached."""

    code = "SESSION_LOST"


class CapacityError(VisenvError):
    code = "CAPACITY"


class PayloadTooLarge(VisenvError):
    code = "PAYLOAD_TOO_LARGE"


class FailedPrecondition(VisenvError):
    """Wrong step_index, or a step after the episode ended."""

    code = "FAILED_PRECONDITION"


class Unavailable(VisenvError):
    """An environment cannot run on the server, or the server cannot be reached."""

    code = "UNAVAILABLE"


class Unauthenticated(VisenvError):
    code = "UNAUTHENTICATED"


class DeadlineExceeded(VisenvError):
    code = "DEADLINE_EXCEEDED"


class InternalError(VisenvError):
    code = "INTERNAL"


ERRORS_BY_CODE: dict[str, type[VisenvError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        SessionLost,
        CapacityError,
        PayloadTooLarge,
        FailedPrecondition,
        Unavailable,
        Unauthenticated,
        DeadlineExceeded,
        InternalError,
    )
}


def error_from_code(code: str, message: str, field: str | None = None) -> VisenvError:
    """The typed exception for a wire error code (unknown codes give a plain VisenvError)."""
    cls = ERRORS_BY_CODE.get(code, VisenvError)
    return cls(message, code=code, field=field)


def error_from_wire(err: Error) -> VisenvError:
    """The typed exception of a wire `Error` (a batch item's, or a whole call's)."""
    error = error_from_code(err.code, err.message, err.field)
    error.error_id = err.error_id
    return error


def _rebuild(
    code: str, message: str, field: str | None, error_id: str | None = None
) -> VisenvError:
    error = error_from_code(code, message, field)
    error.error_id = error_id
    return error


class ConnectionFailure(Exception):
    """Internal: the request never got a reply because the connection failed.

    Only this is retried; the client turns it into `Unavailable` or `SessionLost`
    once the retries are spent. `sent` tells whether the request may have reached
    the server (a reply lost on the way back) or surely did not (connect refused).
    """

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
