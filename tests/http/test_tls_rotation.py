"""A certificate renewed under a running server is served without a restart
(``trainmon.http.certificates``): files swapped as a Kubernetes Secret volume swaps
them (a ``..data`` symlink), a new pair that does not load, the expiry read from the
certificate as ``openssl`` reads it."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import time
from calendar import timegm
from pathlib import Path

import pytest

from testkit.exposition import Scrape, scrape
from tests.http.conftest import ServerFactory
from trainmon.http.certificates import CertificateKeeper, not_after, not_after_of_file
from trainmon.http.server import ExporterHTTPServer
from trainmon.http.webconfig import TLSSettings, WebConfig

#: How long a test waits for the server to serve the new certificate (it looks at its
#: files at most once a second, when a connection arrives).
SWAP_DEADLINE_SECONDS = 10.0


def openssl(folder: Path, *args: str) -> str:
    return subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True,
                          text=True).stdout


def issue(folder: Path, ca: Path, name: str, days: int = 2) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 with the common name ``name``, signed by ``ca``."""
    key, request, certificate = (folder / f"{name}.{kind}" for kind in ("key", "csr", "crt"))
    openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request))
    (folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(folder, "x509", "-req", "-in", str(request), "-CA", str(ca),
            "-CAkey", str(ca.with_suffix(".key")), "-CAcreateserial", "-days", str(days),
            "-extfile", f"{name}.ext", "-out", str(certificate))
    return certificate, key


def openssl_not_after(certificate: Path) -> float:
    line = openssl(certificate.parent, "x509", "-noout", "-enddate", "-in", str(certificate))
    when = time.strptime(line.strip().removeprefix("notAfter="), "%b %d %H:%M:%S %Y GMT")
    return float(timegm(when))


def served_name(server: ExporterHTTPServer, ca: Path) -> str:
    """The common name of the certificate a new connection is served."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        subject = dict(pair[0] for pair in tls.getpeercert()["subject"])
        return str(subject["commonName"])


def wait_for_name(server: ExporterHTTPServer, ca: Path, name: str) -> None:
    deadline = time.monotonic() + SWAP_DEADLINE_SECONDS
    while (served := served_name(server, ca)) != name:
        assert time.monotonic() < deadline, f"still serving {served}, not {name}"
        time.sleep(0.2)


def certificate_families(server: ExporterHTTPServer) -> Scrape:
    assert server.tls is not None
    return scrape(server.tls)


def reloads(server: ExporterHTTPServer, result: str) -> float | None:
    return certificate_families(server).value("trainmon_http_tls_certificate_reloads_total",
                                              result=result)


class SecretVolume:
    """Files laid out as the kubelet lays out a Secret: ``tls.crt -> ..data/tls.crt``,
    ``..data -> ..<version>``, a new version swapped in by renaming a new symlink."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.versions = 0
        for name in ("tls.crt", "tls.key"):
            (folder / name).symlink_to(Path("..data") / name)

    def publish(self, certificate: Path, key: Path) -> None:
        self.versions += 1
        version = self.folder / f"..v{self.versions}"
        version.mkdir()
        (version / "tls.crt").write_bytes(certificate.read_bytes())
        (version / "tls.key").write_bytes(key.read_bytes())
        link = self.folder / "..data_tmp"
        link.symlink_to(version.name)
        os.replace(link, self.folder / "..data")

    @property
    def settings(self) -> TLSSettings:
        return TLSSettings(cert_file=self.folder / "tls.crt", key_file=self.folder / "tls.key")


def test_the_expiry_is_read_as_openssl_reads_it(tls_files: dict[str, Path],
                                                tmp_path: Path) -> None:
    ca = tls_files["ca.crt"]
    for certificate in (tls_files["server.crt"], ca):  # RSA, and a CA with no SAN
        assert not_after_of_file(certificate) == openssl_not_after(certificate)
    # past 2049 a certificate's time is a GeneralizedTime, not a UTCTime
    far, _ = issue(tmp_path, ca, "far", days=365 * 40)
    assert not_after_of_file(far) == openssl_not_after(far) > 2524608000  # 2050-01-01
    # a chain: the first certificate is the server's
    chain = tmp_path / "chain.crt"
    chain.write_bytes(far.read_bytes() + ca.read_bytes())
    assert not_after_of_file(chain) == openssl_not_after(far)
    # what is no certificate is None, never an exception
    garbage = tmp_path / "garbage.crt"
    for content in (b"", b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
                    b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"):
        garbage.write_bytes(content)
        assert not_after_of_file(garbage) is None, content
    assert not_after_of_file(tmp_path / "missing.crt") is None
    for der in (b"", b"\x30", b"\x30\x85\x00\x00\x00\x00\x01", b"\x30\x03\x02\x01\x01",
                b"\x30\x82\xff\xff"):
        assert not_after(der) is None, der


def test_a_renewed_certificate_is_served_without_a_restart(
        serve: ServerFactory, tls_files: dict[str, Path], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trainmon.http.certificates")
    ca = tls_files["ca.crt"]
    issued, secret = tmp_path / "issued", tmp_path / "secret"
    issued.mkdir()
    secret.mkdir()
    volume = SecretVolume(secret)
    first = issue(issued, ca, "first")
    volume.publish(*first)
    server = serve(web=WebConfig(tls=volume.settings))
    assert served_name(server, ca) == "first"
    assert (reloads(server, "ok"), reloads(server, "failed")) == (0, 0)
    assert certificate_families(server).value(
        "trainmon_http_tls_certificate_expiry_timestamp_seconds") == openssl_not_after(first[0])

    # renewed: a new version of the volume, swapped in at once
    renewed = issue(issued, ca, "renewed", days=30)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as kept:
        volume.publish(*renewed)
        wait_for_name(server, ca, "renewed")
        kept.settimeout(5)  # a connection accepted before goes on with its own context
        tls = ssl.create_default_context(cafile=str(ca)).wrap_socket(
            kept, server_hostname="127.0.0.1")
        assert dict(p[0] for p in tls.getpeercert()["subject"])["commonName"] == "first"
        tls.close()
    assert (reloads(server, "ok"), reloads(server, "failed")) == (1, 0)
    assert certificate_families(server).value(
        "trainmon_http_tls_certificate_expiry_timestamp_seconds") == openssl_not_after(renewed[0])
    assert "loaded again" in caplog.text

    # a half-done rotation: the next certificate beside the old key does not load;
    # the renewed one is still served, and the failure is counted and logged once
    broken = issue(issued, ca, "broken")
    volume.publish(broken[0], renewed[1])
    deadline = time.monotonic() + SWAP_DEADLINE_SECONDS
    while reloads(server, "failed") == 0:
        assert time.monotonic() < deadline, "the broken pair was never looked at"
        assert served_name(server, ca) == "renewed"
        time.sleep(0.2)
    assert served_name(server, ca) == "renewed"
    assert caplog.text.count("do not load") == 1

    # the rotation completes: its key arrives
    volume.publish(*broken)
    wait_for_name(server, ca, "broken")
    assert (reloads(server, "ok"), reloads(server, "failed")) == (2, 1)


def test_a_reload_looks_at_the_files_at_once(serve: ServerFactory,
                                             tls_files: dict[str, Path],
                                             tmp_path: Path) -> None:
    ca = tls_files["ca.crt"]
    volume = SecretVolume(tmp_path)
    volume.publish(*issue(tmp_path, ca, "before"))
    server = serve(web=WebConfig(tls=volume.settings))
    assert server.tls is not None
    volume.publish(*issue(tmp_path, ca, "after"))
    server.replace_access(WebConfig(tls=volume.settings))  # what a reload calls
    assert reloads(server, "ok") == 1
    assert served_name(server, ca) == "after"


def test_the_files_are_looked_at_once_a_second_and_a_broken_set_tried_once(
        tls_files: dict[str, Path], tmp_path: Path) -> None:
    ca = tls_files["ca.crt"]
    volume = SecretVolume(tmp_path)
    volume.publish(*issue(tmp_path, ca, "one"))
    now = [100.0]
    keeper = CertificateKeeper(volume.settings, clock=lambda: now[0])
    context = keeper.context()
    two = issue(tmp_path, ca, "two")
    volume.publish(*two)
    now[0] += 0.5
    assert keeper.context() is context  # not looked at within the second
    now[0] += 0.5
    renewed = keeper.context()
    assert renewed is not context
    volume.publish(two[0], issue(tmp_path, ca, "three")[1])  # a key of another pair
    for _ in range(3):  # the same broken files: tried once, counted once
        now[0] += 1.0
        assert keeper.context() is renewed
    families = scrape(keeper)
    assert families.value("trainmon_http_tls_certificate_reloads_total", result="ok") == 1
    assert families.value("trainmon_http_tls_certificate_reloads_total", result="failed") == 1
