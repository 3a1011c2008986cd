"""The Tencent Cloud CVM instance metadata service: the one client of every reader.

What the service offers (https://www.tencentcloud.com/document/product/213/4934,
"Querying Instance Metadata"): plain-text values under
``http://metadata.tencentyun.com/latest/meta-data/``, a 404 for a resource
that does not exist. Two readers use it, both through ``HTTPTransport``:

- the platform poller (``trainmon.platform.poller``), through
  ``TencentMetadata`` below: the instance's identity and spot reclaim;
- the CAM role credentials and the region of the Tencent Cloud puller
  (``trainmon.tencent.credentials.MetadataService``): ``cam/security-credentials/``
  and ``placement/region``.

The paths ``TencentMetadata`` reads:

- ``instance-id`` (``ins-3g445roi``), ``placement/region`` (``ap-guangzhou``),
  ``placement/zone`` (``ap-guangzhou-3``), ``instance/instance-type``
  (the instance specification, e.g. ``GT4.41XLARGE948``);
- ``payment/charge-type``: the billing mode, the CVM API's
  ``InstanceChargeType`` (``PREPAID``, ``POSTPAID_BY_HOUR``, ``CDHPAID``,
  ``SPOTPAID``, ``CDCPAID``; the page's example is ``POSTPAID_BY_HOUR``).
  ``SPOTPAID`` is what makes ``trainmon_node_spot_instance`` 1;
- ``spot/termination-time``
  (https://www.tencentcloud.com/document/product/213/32487, "Querying the
  Repossession Status of a Spot Instance"): 404 while no reclaim is scheduled
  or on an instance that is not spot, else the time of the reclaim as
  ``2018-08-18 12:05:33``, "the OS time of the spot instance when it's
  terminated (in UTC+8)". ISO 8601 with ``Z`` or an offset is accepted too, in
  case the format is ever modernised.

Every value is checked against a strict pattern before it is believed: a
captive portal or an HTTP proxy between the node and the service answers 200
with an HTML page, and that page must never become an instance id or a
reclaim. Failures are ``MetadataError`` with a ``reason`` that is the label of
``trainmon_platform_metadata_errors_total``: ``timeout``, ``unreachable``,
``http_status`` (an answer other than 200, or than 404 where 404 means
"none"), ``invalid`` (an answer that fails its pattern, HTML, bytes that are
not ASCII text).

The HTTP layer is a ``MetadataTransport``; ``HTTPTransport`` is the real one
(``trainmon.outbound``: the whole request, connect to last body byte, within
its ``timeout``, however slowly the server trickles bytes; the service answers
in milliseconds on a CVM and does not exist anywhere else; the body read up to
``max_body_bytes``; no proxy, no redirect), and the demo plugs a simulated one
in below this module's validation (``trainmon.demo.cvm``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Literal, Protocol

from trainmon import outbound

ErrorReason = Literal["timeout", "unreachable", "http_status", "invalid"]
ERROR_REASONS: tuple[ErrorReason, ...] = ("timeout", "unreachable", "http_status", "invalid")

DEFAULT_METADATA_URL = "http://metadata.tencentyun.com"
#: Where the values are, under the service's URL; the paths below are relative to it.
BASE_PATH = "/latest/meta-data/"
INSTANCE_ID = "instance-id"
REGION = "placement/region"
ZONE = "placement/zone"
INSTANCE_TYPE = "instance/instance-type"
CHARGE_TYPE = "payment/charge-type"
TERMINATION_TIME = "spot/termination-time"
#: The CAM role bound to the instance (a listing); ``ROLES + name``: its temporary keys.
ROLES = "cam/security-credentials/"
SPOT_CHARGE_TYPE = "SPOTPAID"

#: Tencent's termination time is Beijing time (UTC+8), without a zone marker.
TENCENT_TIMEZONE = timezone(timedelta(hours=8))
#: A termination time this far in the past is not a reclaim of this running
#: instance (the instance stops at that time; a few minutes of clock skew or
#: of shutdown pass, an hour does not).
TERMINATION_PAST_LIMIT_SECONDS = 3600.0
#: Tencent announces a reclaim about two minutes ahead; a day ahead is absurd.
TERMINATION_FUTURE_LIMIT_SECONDS = 86400.0
#: The longest body ``TencentMetadata`` reads; its values are a few dozen bytes.
MAX_BODY_BYTES = 1024

_PATTERNS: dict[str, re.Pattern[str]] = {
    INSTANCE_ID: re.compile(r"ins-[0-9a-z]{8,32}"),
    REGION: re.compile(r"[a-z]{2}-[a-z]+(?:-[a-z]+)*"),
    ZONE: re.compile(r"[a-z]{2}-[a-z]+(?:-[a-z]+)*-[0-9]{1,3}"),
    INSTANCE_TYPE: re.compile(r"[A-Za-z][A-Za-z0-9]{0,15}\.[A-Za-z0-9]{1,32}"),
    CHARGE_TYPE: re.compile(r"[A-Z][A-Z_]{2,31}"),
}
_TENCENT_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:Z|[+-]\d{2}:\d{2})")


class MetadataError(Exception):
    """One metadata request failed; ``reason`` is the errors counter's label.

    ``cause``: how the HTTP request failed (``trainmon.outbound``'s reason), when it did.
    """

    def __init__(
        self, reason: ErrorReason, message: str, *, cause: outbound.OutboundReason | None = None
    ) -> None:
        super().__init__(message)
        self.reason: ErrorReason = reason
        self.cause = cause


@dataclass(frozen=True)
class MetadataReply:
    """One answer of the service: status, body (at most ``max_body_bytes`` over HTTP), type."""

    status: int
    body: bytes
    content_type: str = "text/plain"


class MetadataTransport(Protocol):
    """GETs one path under ``/latest/meta-data/``."""

    def get(self, path: str) -> MetadataReply:
        """The answer; raises ``MetadataError`` (timeout, unreachable) when there is none."""
        ...


class HTTPTransport:
    """The real service over HTTP: ``GET <base_url>/latest/meta-data/<path>``, ``timeout``
    seconds for each whole request, bodies read up to ``max_body_bytes``.

    ``fetch`` is the HTTP boundary (``trainmon.outbound.request``; tests may
    pass another with the same signature).
    """

    def __init__(
        self,
        base_url: str,
        timeout: float,
        fetch: outbound.Fetch = outbound.request,
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._fetch = fetch
        self._max_body_bytes = max_body_bytes

    def get(self, path: str) -> MetadataReply:
        url = f"{self.base_url}{BASE_PATH}{path}"
        try:
            response = self._fetch("GET", url, timeout=self.timeout,
                                   max_body_bytes=self._max_body_bytes)
        except outbound.OutboundError as error:
            if error.reason == "timeout":
                raise MetadataError(
                    "timeout", f"no answer within {self.timeout:g} s", cause=error.reason
                ) from None
            if error.reason == "too_large":
                raise MetadataError(
                    "invalid", f"{path}: answer longer than {self._max_body_bytes} bytes",
                    cause=error.reason,
                ) from None
            raise MetadataError(
                "unreachable", f"cannot read the answer ({error})", cause=error.reason
            ) from None
        return MetadataReply(
            response.status, response.body, response.header("Content-Type") or "text/plain"
        )


@dataclass(frozen=True)
class Identity:
    """The instance's identity, each value validated."""

    instance_id: str
    region: str
    zone: str
    #: ``None`` where the service has no such entry (404).
    instance_type: str | None
    charge_type: str | None

    @property
    def spot(self) -> bool | None:
        """True for ``SPOTPAID``, False for another billing mode, None if unknown."""
        return None if self.charge_type is None else self.charge_type == SPOT_CHARGE_TYPE


class TencentMetadata:
    """Typed, validated reads of the metadata values trainmon uses."""

    def __init__(
        self, transport: MetadataTransport, clock: Callable[[], float]
    ) -> None:
        self._transport = transport
        self._clock = clock

    def instance_id(self) -> str:
        value = self._value(INSTANCE_ID, missing_ok=False)
        assert value is not None
        return value

    def identity(self) -> Identity:
        """Every identity value; the first failure aborts (a slow service costs one timeout)."""
        instance_id = self.instance_id()
        region = self._value(REGION, missing_ok=False)
        zone = self._value(ZONE, missing_ok=False)
        assert region is not None and zone is not None
        if not zone.startswith(region + "-"):
            raise MetadataError("invalid", f"zone {zone!r} is not in region {region!r}")
        return Identity(
            instance_id=instance_id,
            region=region,
            zone=zone,
            instance_type=self._value(INSTANCE_TYPE, missing_ok=True),
            charge_type=self._value(CHARGE_TYPE, missing_ok=True),
        )

    def termination_time(self) -> float | None:
        """Unix seconds of the scheduled reclaim; ``None`` (404) when none is scheduled."""
        reply = self._transport.get(TERMINATION_TIME)
        if reply.status == 404:
            return None
        text = _text(TERMINATION_TIME, reply)
        return parse_termination_time(text, self._clock())

    def _value(self, path: str, *, missing_ok: bool) -> str | None:
        reply = self._transport.get(path)
        if reply.status == 404 and missing_ok:
            return None
        text = _text(path, reply)
        if not _PATTERNS[path].fullmatch(text):
            raise MetadataError("invalid", f"{path}: unexpected value {_shown(text)}")
        return text


def parse_termination_time(text: str, now: float) -> float:
    """Unix seconds of a ``spot/termination-time`` answer, checked to be plausible.

    ``2018-08-18 12:05:33`` is UTC+8 (Tencent's documented format); ISO 8601
    needs ``Z`` or an offset. Raises ``MetadataError("invalid")`` for anything
    else, and for a time more than ``TERMINATION_PAST_LIMIT_SECONDS`` ago or
    ``TERMINATION_FUTURE_LIMIT_SECONDS`` ahead of ``now``.
    """
    try:
        if _TENCENT_TIME.fullmatch(text):
            moment = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=TENCENT_TIMEZONE)
        elif _ISO_TIME.fullmatch(text):
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        else:
            raise MetadataError("invalid", f"termination time {_shown(text)} has no known format")
    except ValueError:  # a well-shaped but impossible date: 2024-13-45
        raise MetadataError("invalid", f"termination time {_shown(text)} is not a date") from None
    at = moment.timestamp()
    if not now - TERMINATION_PAST_LIMIT_SECONDS <= at <= now + TERMINATION_FUTURE_LIMIT_SECONDS:
        raise MetadataError(
            "invalid", f"termination time {text} is {at - now:+.0f} s from now: not plausible"
        )
    return at


def _text(path: str, reply: MetadataReply) -> str:
    """The body of a 200 answer as one stripped line of printable ASCII."""
    if reply.status != 200:
        raise MetadataError("http_status", f"{path}: HTTP {reply.status}")
    if "html" in reply.content_type.lower():
        raise MetadataError("invalid", f"{path}: an HTML page ({reply.content_type}), not a value")
    if len(reply.body) > MAX_BODY_BYTES:
        raise MetadataError("invalid", f"{path}: answer longer than {MAX_BODY_BYTES} bytes")
    try:
        text = reply.body.decode("ascii").strip()
    except UnicodeDecodeError:
        raise MetadataError("invalid", f"{path}: answer is not ASCII text") from None
    if not text or not text.isprintable():
        raise MetadataError("invalid", f"{path}: empty or multi-line answer {_shown(text)}")
    return text


def _shown(text: str) -> str:
    """A value for a log line: short, quoted, never a whole HTML page."""
    return repr(text[:40] + ("…" if len(text) > 40 else ""))
