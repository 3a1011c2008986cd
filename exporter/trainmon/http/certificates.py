"""The server's TLS certificate, read again when its files change (rotation).

cert-manager renews a certificate weeks before it expires, certbot on a timer, a
Kubernetes Secret volume swaps its files behind a symlink: the files change under a
running daemon. ``CertificateKeeper`` holds the server's ``ssl.SSLContext`` and, at
most once per ``CHECK_INTERVAL_SECONDS``, when a connection arrives (on the selector
thread) or on a reload, looks at the certificate, key and client CA files (device,
inode, size, modification time: a swapped symlink counts). When they changed it makes
a new context from them; connections accepted from then on get it, those already open
keep theirs. A new set that does not load (a key that does not match the certificate,
a file half written) keeps the one being served, logs one warning and is counted; it is
tried again when the files change again.

Exported (``collect``, with the HTTP server's own families):

- ``trainmon_http_tls_certificate_reloads_total{result}``: ``ok``, ``failed``;
- ``trainmon_http_tls_certificate_expiry_timestamp_seconds``: the served
  certificate's notAfter (the first certificate of ``cert_file``), read from its DER
  by ``not_after`` below; absent when it cannot be read.

The TLS settings themselves (file paths, versions, client authentication) change only
at a restart (docs/deploy.md, "Reloading the configuration").
"""

from __future__ import annotations

import base64
import binascii
import calendar
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainmon.core.families import CounterMetricFamily, GaugeMetricFamily, Metric
from trainmon.http.webconfig import TLSSettings
from trainmon.section import ConfigError

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

#: The files are looked at no more often than this (a connection arrives, a reload).
CHECK_INTERVAL_SECONDS = 1.0
#: A certificate file is read for its expiry up to this size (a chain of a few
#: certificates is some kilobytes; ``load_cert_chain`` reads the file itself).
MAX_CERTIFICATE_FILE_BYTES = 1 << 20

_PEM_BEGIN = b"-----BEGIN CERTIFICATE-----"
_PEM_END = b"-----END CERTIFICATE-----"
_SEQUENCE, _EXPLICIT_VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0xA0, 0x17, 0x18

#: What identifies a file's content without reading it: device, inode, size, mtime.
FileSignature = tuple[int, int, int, int] | None


class CertificateKeeper:
    """``CertificateKeeper(settings).context()``: the context to wrap a new connection
    with, made again from ``settings``' files once they change (module docstring).
    Raises ``ConfigError`` when the files do not load at the start."""

    def __init__(self, settings: TLSSettings, *,
                 check_interval_seconds: float = CHECK_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._interval = check_interval_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._signature = self._signatures()
        self._context = settings.context()
        self._expiry = not_after_of_file(settings.cert_file)
        self._next_look = clock() + check_interval_seconds
        self._reloads = {"ok": 0, "failed": 0}

    def context(self) -> ssl.SSLContext:
        """The context for a connection accepted now (files looked at, when due)."""
        if self._clock() >= self._next_look:
            self.check()
        return self._context

    def check(self) -> None:
        """Look at the files now, and load them if they changed."""
        with self._lock:
            self._next_look = self._clock() + self._interval
            signature = self._signatures()
            if signature == self._signature:
                return
            self._signature = signature
            try:
                context = self._settings.context()
            except ConfigError as error:
                self._reloads["failed"] += 1
                log.warning("the TLS files changed but do not load (%s); the certificate "
                            "loaded before is served until they do", error)
                return
            self._context = context
            self._expiry = not_after_of_file(self._settings.cert_file)
            self._reloads["ok"] += 1
            log.info("TLS certificate %s loaded again (it changed)", self._settings.cert_file)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            reloads, expiry = dict(self._reloads), self._expiry
        counter = CounterMetricFamily(
            "trainmon_http_tls_certificate_reloads_total",
            "Times the web config's TLS files (certificate, key, client CA) changed on disk "
            "and were loaded again (ok), or did not load and the certificate loaded before "
            "is still served (failed).",
            labels=["result"],
        )
        for result, count in reloads.items():
            counter.add_metric([result], float(count))
        yield counter
        if expiry is not None:
            yield GaugeMetricFamily(
                "trainmon_http_tls_certificate_expiry_timestamp_seconds",
                "When the certificate the HTTP server serves expires (its notAfter, Unix "
                "time).", value=expiry)

    def _signatures(self) -> tuple[FileSignature, ...]:
        paths = (self._settings.cert_file, self._settings.key_file,
                 self._settings.client_ca_file)
        return tuple(_signature(path) for path in paths)


def _signature(path: Path | None) -> FileSignature:
    if path is None:
        return None
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


def not_after_of_file(path: Path) -> float | None:
    """The notAfter (Unix time) of the first certificate in the PEM file ``path``;
    None when it cannot be read."""
    try:
        with open(path, "rb") as pem:
            text = pem.read(MAX_CERTIFICATE_FILE_BYTES)
    except OSError:
        return None
    begin = text.find(_PEM_BEGIN)
    end = text.find(_PEM_END, begin)
    if begin < 0 or end < 0:
        return None
    try:
        der = base64.b64decode(b"".join(text[begin + len(_PEM_BEGIN):end].split()),
                               validate=True)
    except (binascii.Error, ValueError):
        return None
    return not_after(der)


def not_after(der: bytes) -> float | None:
    """The notAfter of a DER X.509 certificate (RFC 5280 4.1: Certificate → tbsCertificate
    → [version], serialNumber, signature, issuer, validity → notAfter); None when the
    bytes are not one."""
    try:
        certificate = _element(der, 0, _SEQUENCE)
        fields = list(_children(der, *_element(der, certificate[0], _SEQUENCE)))
        if fields and fields[0][0] == _EXPLICIT_VERSION:
            fields = fields[1:]
        _, start, end = fields[3]  # serialNumber, signature, issuer, validity
        times = list(_children(der, start, end))
        tag, start, end = times[1]
        return _time(tag, der[start:end].decode("ascii"))
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _header(data: bytes, at: int) -> tuple[int, int, int]:
    """The tag, the content's start and its end of the DER element at ``at``."""
    tag, length = data[at], data[at + 1]
    start = at + 2
    if length & 0x80:
        size = length & 0x7F
        if not 0 < size <= 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(data[start:start + size], "big")
        start += size
    if start + length > len(data):
        raise ValueError("DER element past the end")
    return tag, start, start + length


def _element(data: bytes, at: int, tag: int) -> tuple[int, int]:
    found, start, end = _header(data, at)
    if found != tag:
        raise ValueError(f"DER tag {found:#x}, not {tag:#x}")
    return start, end


def _children(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    at = start
    while at < end:
        tag, content, after = _header(data, at)
        yield tag, content, after
        at = after


def _time(tag: int, text: str) -> float:
    """UTCTime (YYMMDDHHMMSSZ, 1950–2049) or GeneralizedTime (YYYYMMDDHHMMSSZ)."""
    if not text.endswith("Z"):
        raise ValueError("not a UTC time")
    if tag == _UTC_TIME and len(text) == 13:
        year = int(text[:2])
        year += 1900 if year >= 50 else 2000
        rest = text[2:12]
    elif tag == _GENERALIZED_TIME and len(text) == 15:
        year, rest = int(text[:4]), text[4:14]
    else:
        raise ValueError("not a certificate time")
    month, day, hour, minute, second = (int(rest[i:i + 2]) for i in range(0, 10, 2))
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
