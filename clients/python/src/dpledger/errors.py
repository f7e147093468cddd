"""Errors raised by the client. Every refusal by the server is an :class:`ApiError`
carrying the RFC 9457 problem document it answered (``type``, ``title``,
``status``, ``detail`` and, when one field was at fault, ``field``)."""

from __future__ import annotations

from typing import Dict, Optional, Type

from .types import BudgetRefusal, Problem

__all__ = [
    "DpledgerError",
    "ApiError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "UnsupportedMediaType",
    "ServerError",
    "TransportFailure",
    "EncodingError",
]


class DpledgerError(Exception):
    """Base class of every error of this package."""


class ApiError(DpledgerError):
    """The server answered with an error status."""

    def __init__(self, status: int, problem: Optional[Problem], body: str, operation: str):
        self.status = status
        self.problem = problem
        self.body = body
        self.operation = operation
        #: How many attempts were made (the client sets it).
        self.attempts = 1
        if problem is not None:
            where = f" (field {problem.field})" if problem.field else ""
            message = f"{operation}: {status} {problem.title}: {problem.detail}{where}"
        else:
            message = f"{operation}: HTTP {status}: {body[:500]}"
        super().__init__(message)

    @property
    def type(self) -> Optional[str]:
        """The problem type URN (``urn:dpledger:problem:...``)."""
        return self.problem.type if self.problem else None

    @property
    def detail(self) -> Optional[str]:
        return self.problem.detail if self.problem else None

    @property
    def field(self) -> Optional[str]:
        return self.problem.field if self.problem else None


class BadRequest(ApiError):
    """400: the request is malformed; nothing changed."""


class Unauthorized(ApiError):
    """401: no valid bearer token."""


class Forbidden(ApiError):
    """403: the token does not cover this object."""


class NotFound(ApiError):
    """404: no such dataset, example or endpoint."""


class Conflict(ApiError):
    """409: the request contradicts the ledger (out-of-order or conflicting step,
    archived dataset, existing id, a release over its budget or without one)."""

    @property
    def budget(self) -> Optional[BudgetRefusal]:
        """For a release refused by its budget: ``rho_spent``, ``rho_requested``
        and ``rho_budget`` (``None`` when no budget is set); ``None`` for every
        other conflict."""
        return self.problem.budget if self.problem else None


class PayloadTooLarge(ApiError):
    """413: the body exceeds the server's limit."""


class UnsupportedMediaType(ApiError):
    """415: wrong Content-Type."""


class ServerError(ApiError):
    """5xx: the server could not do its part (nothing was acknowledged)."""


_BY_STATUS: Dict[int, Type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
}


def error_class(status: int) -> Type[ApiError]:
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, ApiError)


class TransportFailure(DpledgerError):
    """The request could not be completed (connection refused, reset, timeout)
    after every permitted attempt. The original error is ``__cause__``."""

    def __init__(self, operation: str, attempts: int, cause: BaseException):
        self.operation = operation
        self.attempts = attempts
        super().__init__(f"{operation}: no answer after {attempts} attempt(s): {cause!r}")


class EncodingError(DpledgerError, ValueError):
    """Bytes that are not a valid ``DPLS`` step payload."""
