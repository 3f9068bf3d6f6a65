# SPDX-License-Identifier: Apache-2.0
"""Kafka security settings (``KafkaSettings.kafka_*``) as each client takes
them: librdkafka's configuration keys (the collector's producer, the front
door's admin client and consumer, replay) and a TLS context for aiokafka
(the streams worker, through Faust's credentials). One place, so every
process talks to the cluster the same way.

The password is read here, when a client is built, never earlier: it stays a
SecretStr in the settings (masked in repr and logs), and a password file
(a mounted Kubernetes Secret) may be rotated between restarts.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from jitterscope.common import errors


def _readable(path: Path, what: str) -> str:
    if not path.is_file():
        raise errors.BadConfig(f"{what} {path} does not exist (or is not a file): fix the path in the config")
    return str(path)


def sasl_password(s) -> str | None:
    """The SASL password: kafka_sasl_password, else the first line of kafka_sasl_password_file."""
    if s.kafka_sasl_password is not None:
        return s.kafka_sasl_password.get_secret_value()
    if s.kafka_sasl_password_file is not None:
        try:
            return s.kafka_sasl_password_file.read_text().strip()
        except OSError as exc:
            raise errors.BadConfig(f"kafka_sasl_password_file {s.kafka_sasl_password_file}: cannot read it "
                                   f"({exc.strerror}); fix the path or its permissions") from exc
    return None


def librdkafka_config(s) -> dict[str, str]:
    """The security keys of a confluent-kafka (librdkafka) client. Empty for
    PLAINTEXT, so a default configuration is exactly what it was before."""
    config: dict[str, str] = {}
    if s.kafka_security_protocol != "PLAINTEXT":
        config["security.protocol"] = s.kafka_security_protocol
    if s.kafka_security_protocol.startswith("SASL_"):
        config["sasl.mechanism"] = s.kafka_sasl_mechanism
        config["sasl.username"] = s.kafka_sasl_username
        config["sasl.password"] = sasl_password(s) or ""  # the settings' validator requires one for SASL
    if s.kafka_security_protocol.endswith("SSL"):
        if s.kafka_ssl_ca_file:
            config["ssl.ca.location"] = _readable(s.kafka_ssl_ca_file, "kafka_ssl_ca_file")
        if s.kafka_ssl_cert_file:
            config["ssl.certificate.location"] = _readable(s.kafka_ssl_cert_file, "kafka_ssl_cert_file")
            config["ssl.key.location"] = _readable(s.kafka_ssl_key_file, "kafka_ssl_key_file")
    return config


def ssl_context(s) -> ssl.SSLContext | None:
    """The TLS context aiokafka uses (SSL and SASL_SSL); None without TLS.
    The system's CAs are trusted unless kafka_ssl_ca_file names others,
    like librdkafka's ssl.ca.location."""
    if not s.kafka_security_protocol.endswith("SSL"):
        return None
    ca = _readable(s.kafka_ssl_ca_file, "kafka_ssl_ca_file") if s.kafka_ssl_ca_file else None
    try:
        context = ssl.create_default_context(cafile=ca)
        if s.kafka_ssl_cert_file:
            context.load_cert_chain(_readable(s.kafka_ssl_cert_file, "kafka_ssl_cert_file"),
                                    _readable(s.kafka_ssl_key_file, "kafka_ssl_key_file"))
    except ssl.SSLError as exc:
        raise errors.BadConfig(f"Kafka TLS files do not load ({exc}); check kafka_ssl_ca_file, "
                               "kafka_ssl_cert_file and kafka_ssl_key_file (PEM)") from exc
    return context
