"""Tencent Cloud API 3.0 client: signed JSON POSTs, error envelopes, retries.

Every action is a ``POST /`` with a JSON body, the common parameters in
``X-TC-*`` headers and a TC3-HMAC-SHA256 ``Authorization`` (``signer``). The
answer is always HTTP 200 with ``{"Response": {...}}``; a failure carries
``Response.Error.Code`` and ``.Message`` and a ``RequestId``.

Retry policy (``is_retryable``): only what can succeed on a second try is
retried, with jittered exponential backoff and a fresh token from the shared
bucket for every attempt —

* ``RequestLimitExceeded*`` (the account is over its rate), ``InternalError*``;
* network errors, timeouts, HTTP 5xx and unparsable bodies (a proxy or a
  truncated answer).

Everything else fails fast, in particular ``AuthFailure.*`` (wrong key, clock
skew, expired token), ``UnauthorizedOperation*`` (the CAM policy lacks the
action) and ``InvalidParameter*``: retrying those only burns quota.
``AuthFailure.SignatureExpire`` is reported with the clock offset measured from
the response's ``Date`` header, because the fix is NTP, not the key.

Each attempt is one ``trainmon.outbound`` request: connect to last body byte
within ``timeout`` seconds (``tencent.request_timeout_seconds``), however
slowly the server trickles bytes, and at most ``MAX_RESPONSE_BYTES`` of body
(a longer answer is ``ResponseTooLarge``, not retried). One TLS connection per
attempt; through the proxy ``HTTPS_PROXY`` names unless ``NO_PROXY`` exempts
the host (``outbound.environment_proxy``, as ``requests`` did).

Every attempt is counted in ``APIStats`` (requests, errors by code, latency
histogram, last success), which the collector exports as self-metrics.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

from trainmon import outbound
from trainmon.tencent import signer
from trainmon.tencent.credentials import CredentialProvider, CredentialsUnavailable
from trainmon.tencent.ratelimit import TokenBucket

log = logging.getLogger(__name__)

#: Upper bounds (seconds) of the request latency histogram.
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RETRYABLE_PREFIXES = ("RequestLimitExceeded", "InternalError")
#: Codes made up by this client for failures that never reached an envelope.
TRANSPORT_RETRYABLE = ("Timeout", "NetworkError", "MalformedResponse")
#: Longest answer body read, bytes: a GetMonitorData answer for 10 objects of
#: 8 GPUs over 1440 points is ~3 MiB; past this the answer is not believed.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Service:
    """A Tencent Cloud product API: its signing name and version."""

    name: str
    version: str


MONITOR = Service("monitor", "2018-07-24")
CVM = Service("cvm", "2017-03-12")
CBS = Service("cbs", "2017-03-12")


class APIError(Exception):
    """One failed action after the retry policy gave up.

    ``code`` is Tencent's error code (``AuthFailure.SignatureFailure``...) or
    one of ours: ``Timeout``, ``NetworkError``, ``MalformedResponse``,
    ``ResponseTooLarge``, ``HTTP<status>``, ``CredentialsUnavailable``.
    """

    def __init__(
        self, action: str, code: str, message: str, request_id: str | None = None
    ) -> None:
        super().__init__(f"{action} failed: {code}: {message}")
        self.action = action
        self.code = code
        self.message = message
        self.request_id = request_id

    @property
    def retryable(self) -> bool:
        return is_retryable(self.code)

    @property
    def is_auth_failure(self) -> bool:
        """The account or key is wrong: every further call will fail the same way."""
        return self.code.startswith(("AuthFailure", "CredentialsUnavailable"))


def is_retryable(code: str) -> bool:
    """Whether a second attempt can succeed (see the module docstring)."""
    return (
        code.startswith(RETRYABLE_PREFIXES)
        or code in TRANSPORT_RETRYABLE
        or (code.startswith("HTTP5") and len(code) == 7)
    )


@dataclass
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))
    count: int = 0
    total: float = 0.0


@dataclass(frozen=True)
class StatsSnapshot:
    """A consistent copy of ``APIStats`` for one scrape."""

    requests: Mapping[str, int]
    errors: Mapping[tuple[str, str], int]
    #: action → (cumulative bucket counts, count, sum)
    durations: Mapping[str, tuple[tuple[int, ...], int, float]]
    last_success: float | None
    clock_skew: float | None


class APIStats:
    """Thread-safe counters of every API attempt (the self-metrics' source)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._durations: dict[str, _Histogram] = {}
        self._last_success: float | None = None
        self._clock_skew: float | None = None

    def attempt(self, action: str) -> None:
        with self._lock:
            self._requests[action] += 1

    def observe(self, action: str, seconds: float) -> None:
        with self._lock:
            histogram = self._durations.setdefault(action, _Histogram())
            histogram.count += 1
            histogram.total += seconds
            for index, bound in enumerate(DURATION_BUCKETS):
                if seconds <= bound:
                    histogram.buckets[index] += 1

    def error(self, action: str, code: str) -> None:
        with self._lock:
            self._errors[(action, code)] += 1

    def success(self, timestamp: float) -> None:
        with self._lock:
            self._last_success = timestamp

    def skew(self, seconds: float) -> None:
        with self._lock:
            self._clock_skew = seconds

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(
                requests=dict(self._requests),
                errors=dict(self._errors),
                durations={
                    action: (tuple(h.buckets), h.count, h.total)
                    for action, h in self._durations.items()
                },
                last_success=self._last_success,
                clock_skew=self._clock_skew,
            )


def service_url(endpoint: str, service: Service) -> str:
    """The URL of ``service`` next to the configured monitor ``endpoint``.

    ``https://monitor.tencentcloudapi.com`` → ``https://cvm.tencentcloudapi.com``;
    the same for ``monitor.internal.…`` and regional ``monitor.<region>.…``
    hosts. Any other host (a proxy, the test fake) serves every product.
    """
    parts = urlsplit(endpoint)
    host = parts.netloc
    if host.startswith("monitor."):
        host = f"{service.name}.{host[len('monitor.'):]}"
    return f"{parts.scheme}://{host}/"


class TencentAPI:
    """Calls actions of any product with the shared bucket, stats and credentials.

    ``timeout`` bounds each whole attempt (seconds). ``fetch`` is the HTTP
    boundary (``trainmon.outbound.request``).
    """

    def __init__(
        self,
        endpoint: str,
        credentials: CredentialProvider,
        *,
        limiter: TokenBucket,
        stats: APIStats,
        fetch: outbound.Fetch = outbound.request,
        timeout: float = 10.0,
        max_retries: int = 2,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        backoff_base: float = 0.5,
        backoff_cap: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.credentials = credentials
        self._limiter = limiter
        self.stats = stats
        self._fetch = fetch
        self._timeout = timeout
        self._max_retries = max_retries
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap

    def call(
        self, service: Service, action: str, params: Mapping[str, object], region: str | None
    ) -> Mapping[str, object]:
        """Run ``action`` and return its ``Response`` object; raises APIError."""
        url = service_url(self.endpoint, service)
        host = urlsplit(url).netloc
        payload = json.dumps(params, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        attempt = 0
        while True:
            self._limiter.acquire()
            try:
                return self._attempt(service, action, region, url, host, payload)
            except APIError as error:
                self.stats.error(action, error.code)
                if error.is_auth_failure:
                    self.credentials.invalidate()
                if not error.retryable or attempt >= self._max_retries:
                    raise
                delay = self._backoff(attempt, error.code)
                log.debug("%s: %s, retry %d in %.2fs", action, error.code, attempt + 1, delay)
                self._sleep(delay)
                attempt += 1

    def _attempt(
        self,
        service: Service,
        action: str,
        region: str | None,
        url: str,
        host: str,
        payload: bytes,
    ) -> Mapping[str, object]:
        try:
            credential = self.credentials.credential()
        except CredentialsUnavailable as error:
            raise APIError(action, "CredentialsUnavailable", str(error)) from None
        timestamp = int(self._clock())
        headers = signer.signed_headers(
            secret_id=credential.secret_id,
            secret_key=credential.secret_key,
            token=credential.token,
            service=service.name,
            host=host,
            action=action,
            version=service.version,
            region=region,
            payload=payload,
            timestamp=timestamp,
        )
        self.stats.attempt(action)
        started = self._monotonic()
        try:
            response = self._fetch("POST", url, body=payload, headers=dict(headers),
                                   timeout=self._timeout, max_body_bytes=MAX_RESPONSE_BYTES,
                                   proxy=outbound.environment_proxy(url))
        except outbound.OutboundError as error:
            if error.reason == "timeout":
                self.stats.observe(action, self._monotonic() - started)
                raise APIError(action, "Timeout", f"no answer within {self._timeout:g}s") from None
            if error.reason == "too_large":
                raise APIError(action, "ResponseTooLarge",
                               f"answer over {MAX_RESPONSE_BYTES} bytes") from None
            raise APIError(action, "NetworkError", str(error)) from None  # host:port: cause
        self.stats.observe(action, self._monotonic() - started)
        skew = self._measure_skew(response)
        if response.status != 200:
            raise APIError(action, f"HTTP{response.status}", response.reason or "")
        try:
            body = json.loads(response.body)
        except ValueError:  # not JSON, not UTF-8
            raise APIError(action, "MalformedResponse", "the body is not JSON") from None
        answer = body.get("Response") if isinstance(body, dict) else None
        if not isinstance(answer, dict):
            raise APIError(action, "MalformedResponse", "no Response object in the body")
        envelope = answer.get("Error")
        if isinstance(envelope, dict):
            code = str(envelope.get("Code", "UnknownError"))
            message = str(envelope.get("Message", ""))
            if code == "AuthFailure.SignatureExpire":
                message = _skew_message(message, skew)
            raise APIError(action, code, message, _str_or_none(answer.get("RequestId")))
        self.stats.success(self._clock())
        return answer

    def _measure_skew(self, response: outbound.Response) -> float | None:
        """Server clock minus ours, from the ``Date`` header (1 s resolution)."""
        date = response.header("Date")
        if not date:
            return None
        try:
            server = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return None
        skew = float(server - self._clock())
        self.stats.skew(skew)
        return skew

    def _backoff(self, attempt: int, code: str) -> float:
        """Full-jitter exponential backoff; at least a second after throttling."""
        ceiling = min(self._backoff_cap, self._backoff_base * 2.0**attempt)
        delay = ceiling * (0.5 + random.random() / 2)
        if code.startswith("RequestLimitExceeded"):
            delay = max(delay, 1.0)
        return delay


def _skew_message(message: str, skew: float | None) -> str:
    hint = (
        "synchronise this host's clock (NTP): Tencent Cloud rejects requests signed "
        "more than 5 minutes off its clock"
    )
    if skew is None:
        return f"{message} — {hint}"
    direction = "behind" if skew > 0 else "ahead of"
    return f"{message} — the local clock is {abs(skew):.0f}s {direction} Tencent Cloud's; {hint}"


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
