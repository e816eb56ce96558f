"""HTTPS for `memp-broker serve`: the listening SSLContext, renewed when its files change.

uvicorn builds the listening context inside every worker process, before the app exists
(`ssl_context_factory`), so no loop of the app's can reach it. Instead the context's SNI
callback, which OpenSSL runs on every ClientHello, stats the certificate and key files and,
when either changed, hands that handshake and every later one a context loaded from them.
Connections already open keep the context they shook hands with, so their streams go on."""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
)

from broker.runtime.settings import Settings, SettingsError

log = logging.getLogger("memp.tls")
Stamp = tuple[tuple[int, int, int, int], ...]


@dataclass(frozen=True, slots=True)
class CertificateFiles:
    """Where the PEM certificate chain and its private key are (`key` None: in the chain's
    file). uvicorn calls it in each worker process for the listening context."""

    cert: str
    key: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> CertificateFiles | None:
        return cls(settings.tls_cert, settings.tls_key) if settings.tls_cert else None

    def __call__(self, config: object, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return RenewingContext(self).listening

    def stamp(self) -> Stamp:
        """What changes when either file is replaced or rewritten (raises OSError)."""
        paths = (self.cert,) if self.key is None else (self.cert, self.key)
        stats = [os.stat(path) for path in paths]
        return tuple((s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def load(self) -> tuple[ssl.SSLContext, x509.Certificate]:
        """A server context serving these files, and their leaf certificate; SettingsError
        with a one-line reason when they cannot be served."""
        leaf = self._check()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # no client certificates asked for
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION  # client-started renegotiation is a DoS
        try:
            # A password callback, so an encrypted key fails instead of prompting on a tty.
            context.load_cert_chain(self.cert, self.key, password=lambda: b"")
        except (OSError, ssl.SSLError) as exc:  # the files changed after `_check` read them
            raise SettingsError(f"TLS certificate {self.cert}: {_reason(exc)}") from None
        return context, leaf

    def _check(self) -> x509.Certificate:
        chain = _read(self.cert, "TLS certificate")
        try:
            leaf = x509.load_pem_x509_certificates(chain)[0]
        except ValueError:
            raise SettingsError(f"TLS certificate {self.cert} holds no PEM certificate") from None
        where = self.key or self.cert
        pem = _read(self.key, "TLS key") if self.key else chain
        try:
            key = load_pem_private_key(pem, None)
        except TypeError:
            raise SettingsError(f"TLS key {where} is encrypted; give it unencrypted") from None
        except (ValueError, UnsupportedAlgorithm):
            if self.key is None:
                raise SettingsError(f"TLS certificate {self.cert} holds no private key; give "
                                    "it with --tls-key (MEMP_TLS_KEY)") from None
            raise SettingsError(f"TLS key {self.key} holds no PEM private key") from None
        public = (Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        if key.public_key().public_bytes(*public) != leaf.public_key().public_bytes(*public):
            raise SettingsError(f"TLS key {where} does not match the certificate {self.cert}")
        return leaf


class RenewingContext:
    """The listening context; each handshake gets a context loaded from the files as they are
    now, and a renewal caught half-written (a new certificate beside the old key) is not
    served: the one before stays until both files agree again."""

    def __init__(self, files: CertificateFiles) -> None:
        self.files = files
        self._stamp: Stamp | None = files.stamp()
        self.current, leaf = files.load()
        self.listening = self.current
        self.listening.sni_callback = self._hello
        self._problem: str | None = None
        log.info("serving the TLS certificate %s", describe(leaf))

    def _hello(self, connection: ssl.SSLObject, server_name: str | None,
               context: ssl.SSLContext) -> None:
        # An exception here would fail the handshake of every new client: log it and serve
        # what is loaded (`refresh` reports the problems it expects itself).
        try:
            current = self.refresh()
        except Exception:
            log.exception("looking for a renewed TLS certificate failed")
            current = self.current
        if current is not context:
            connection.context = current

    def refresh(self) -> ssl.SSLContext:
        """The context to serve: reloaded when the files changed since last looked at."""
        try:
            stamp = self.files.stamp()
        except OSError as exc:
            self._stamp = None
            self._report(f"TLS certificate: {_reason(exc)}")
            return self.current
        if stamp == self._stamp:
            return self.current
        self._stamp = stamp  # taken before reading, so a later change is never missed
        try:
            context, leaf = self.files.load()
        except SettingsError as exc:
            self._report(str(exc))
            return self.current
        self.current, self._problem = context, None
        log.info("serving the renewed TLS certificate %s", describe(leaf))
        return context

    def _report(self, problem: str) -> None:
        if problem != self._problem:  # once per problem, not once per handshake
            self._problem = problem
            log.warning("%s; still serving the certificate loaded before", problem)


def describe(leaf: x509.Certificate) -> str:
    """Subject, serial number and expiry, for the log."""
    return (f"{leaf.subject.rfc4514_string() or '(no subject)'}, serial {leaf.serial_number:x}, "
            f"valid until {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise SettingsError(f"{what} {path}: {_reason(exc)}") from None


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
