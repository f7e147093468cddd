"""Python client of dpledger, the per-example Renyi-DP privacy accountant.

``dpledger.Client`` covers every HTTP endpoint; ``dpledger.encoding`` is the
binary step encoding; ``dpledger.opacus`` (needs the ``opacus`` extra) trains
with Opacus while clipping each example at its dpledger threshold and reporting
every step.
"""

from .client import OPERATIONS, Client, Operation, RetryPolicy
from .encoding import decode_step, encode_step
from .errors import (
    ApiError,
    BadRequest,
    Conflict,
    DpledgerError,
    EncodingError,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServerError,
    TransportFailure,
    Unauthorized,
    UnsupportedMediaType,
)
from .types import *  # noqa: F401,F403
from .types import __all__ as _types_all

__version__ = "0.1.0"

__all__ = [
    "Client",
    "RetryPolicy",
    "Operation",
    "OPERATIONS",
    "encode_step",
    "decode_step",
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
] + list(_types_all)
