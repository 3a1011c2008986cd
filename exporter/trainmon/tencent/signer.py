"""TC3-HMAC-SHA256: the request signature of Tencent Cloud API 3.0.

Source: "Signature v3" in the Tencent Cloud API documentation
(every product documents it, e.g.
https://www.tencentcloud.com/document/api/1084/39391). A request is signed in
four steps:

1. the canonical request — method, ``/``, the query string (empty for POST),
   the signed headers as ``name:value`` lines (``content-type`` and ``host``),
   the list of signed header names and the hex SHA-256 of the body;
2. the string to sign — algorithm, the request timestamp (Unix seconds), the
   credential scope ``<UTC date>/<service>/tc3_request`` and the hex SHA-256 of
   the canonical request;
3. the signing key — HMAC-SHA256 chained over the UTC date, the service and
   ``tc3_request``, starting from ``"TC3" + SecretKey``;
4. the ``Authorization`` header carrying the SecretId, the scope, the signed
   header names and the hex signature.

The date in the scope is the **UTC** date of the timestamp (a local date breaks
every request around midnight). The server rejects timestamps more than five
minutes away from its own clock (``AuthFailure.SignatureExpire``).

Only the standard library is used; the function of every step is public so the
tests can check each intermediate value of Tencent's published example.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import datetime, timezone

ALGORITHM = "TC3-HMAC-SHA256"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
SIGNED_HEADERS = "content-type;host"


def sha256_hex(data: bytes) -> str:
    """Lower-case hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def utc_date(timestamp: int) -> str:
    """``YYYY-MM-DD`` of a Unix timestamp in UTC, as the credential scope wants."""
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%d")


def credential_scope(timestamp: int, service: str) -> str:
    """``<UTC date>/<service>/tc3_request``."""
    return f"{utc_date(timestamp)}/{service}/tc3_request"


def canonical_request(
    *, method: str, query: str, content_type: str, host: str, payload: bytes
) -> str:
    """Step 1: the canonical request over ``content-type`` and ``host``."""
    canonical_headers = (
        f"content-type:{content_type.strip().lower()}\nhost:{host.strip().lower()}\n"
    )
    return "\n".join(
        [method.upper(), "/", query, canonical_headers, SIGNED_HEADERS, sha256_hex(payload)]
    )


def string_to_sign(*, timestamp: int, scope: str, canonical: str) -> str:
    """Step 2: algorithm, timestamp, scope and the hash of the canonical request."""
    return "\n".join([ALGORITHM, str(timestamp), scope, sha256_hex(canonical.encode("utf-8"))])


def signing_key(secret_key: str, date: str, service: str) -> bytes:
    """Step 3a: the derived key, HMAC-SHA256 chained from ``"TC3" + secret_key``."""
    key = _hmac(("TC3" + secret_key).encode("utf-8"), date)
    key = _hmac(key, service)
    return _hmac(key, "tc3_request")


def signature(secret_key: str, date: str, service: str, to_sign: str) -> str:
    """Step 3b: the hex signature of the string to sign."""
    return hmac.new(
        signing_key(secret_key, date, service), to_sign.encode("utf-8"), hashlib.sha256
    ).hexdigest()


def authorization(
    *,
    secret_id: str,
    secret_key: str,
    service: str,
    host: str,
    payload: bytes,
    timestamp: int,
    content_type: str = JSON_CONTENT_TYPE,
    method: str = "POST",
    query: str = "",
) -> str:
    """Step 4: the complete ``Authorization`` header value for one request."""
    scope = credential_scope(timestamp, service)
    canonical = canonical_request(
        method=method, query=query, content_type=content_type, host=host, payload=payload
    )
    to_sign = string_to_sign(timestamp=timestamp, scope=scope, canonical=canonical)
    hex_signature = signature(secret_key, utc_date(timestamp), service, to_sign)
    return (
        f"{ALGORITHM} Credential={secret_id}/{scope}, "
        f"SignedHeaders={SIGNED_HEADERS}, Signature={hex_signature}"
    )


def signed_headers(
    *,
    secret_id: str,
    secret_key: str,
    token: str | None,
    service: str,
    host: str,
    action: str,
    version: str,
    region: str | None,
    payload: bytes,
    timestamp: int,
) -> Mapping[str, str]:
    """All headers of a signed JSON POST: the common parameters plus ``Authorization``.

    ``token`` is the session token of temporary credentials (CVM role, STS); it
    travels as ``X-TC-Token`` and is not part of the signature.
    """
    headers = {
        "Authorization": authorization(
            secret_id=secret_id,
            secret_key=secret_key,
            service=service,
            host=host,
            payload=payload,
            timestamp=timestamp,
        ),
        "Content-Type": JSON_CONTENT_TYPE,
        "Host": host,
        "X-TC-Action": action,
        "X-TC-Version": version,
        "X-TC-Timestamp": str(timestamp),
    }
    if region:
        headers["X-TC-Region"] = region
    if token:
        headers["X-TC-Token"] = token
    return headers


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()
