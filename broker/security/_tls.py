"""TLS for the broker's listeners: the `pulsar+ssl://` port and the admin API's HTTPS port.

Theory of operation
-------------------
`TlsOptions` is what the command line gives (`--tls-cert-file`, `--tls-key-file`,
`--tls-trust-certs-file`, `--tls-require-trusted-client-cert`); `server_ssl_context` turns it
into one `ssl.SSLContext` that every TLS listener of the process shares: TLS 1.2 or newer,
the server's certificate chain and key (PEM), and the trusted CAs when a trust file is given.
With a trust file, a client certificate is asked for and verified when offered; with
`require_trusted_client_cert` a client without a certificate signed by a trusted CA fails the
handshake (mutual TLS, Pulsar's tlsRequireTrustedClientCertOnConnect). The Python `ssl`
module runs the handshakes; a failed handshake ends that socket only.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from .._errors import ConfigurationError

__all__ = ["TlsOptions", "server_ssl_context"]


@dataclass(frozen=True)
class TlsOptions:
    """The TLS settings of a broker.

    Attributes:
        cert_file: the server certificate (PEM; may hold the chain after it).
        key_file: its private key (PEM, unencrypted).
        trust_certs_file: CA certificates that client certificates must chain to (PEM).
        require_trusted_client_cert: refuse clients without such a certificate.
    """

    cert_file: str
    key_file: str
    trust_certs_file: str | None = None
    require_trusted_client_cert: bool = False


def server_ssl_context(options: TlsOptions) -> ssl.SSLContext:
    """The server-side context for `options` (see the module comment).

    Raises:
        ConfigurationError: a file is missing or unreadable, the key does not match the
            certificate, or client certificates are required without a trust file.
    """
    if options.require_trusted_client_cert and not options.trust_certs_file:
        raise ConfigurationError("--tls-require-trusted-client-cert needs "
                                 "--tls-trust-certs-file (the CAs client certificates "
                                 "must chain to)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(options.cert_file, options.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot load the TLS certificate {options.cert_file} with "
                                 f"key {options.key_file}: {exc}") from None
    if options.trust_certs_file:
        try:
            context.load_verify_locations(cafile=options.trust_certs_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot load the trusted certificates "
                                     f"{options.trust_certs_file}: {exc}") from None
        context.verify_mode = (ssl.CERT_REQUIRED if options.require_trusted_client_cert
                               else ssl.CERT_OPTIONAL)
    return context
