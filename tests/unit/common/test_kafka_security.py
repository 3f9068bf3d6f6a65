# SPDX-License-Identifier: Apache-2.0
"""Kafka security settings reach each process's client exactly, and the
password never shows in repr, --help or logs.

Tansu (the embedded broker) speaks PLAINTEXT only, so SASL/TLS against a
broker cannot run here; this proves the configuration each client is built
with: the collector's librdkafka producer (from a real Collector), the front
door's admin client, and the streams worker's aiokafka clients (through
Faust's own credentials-to-aiokafka mapping, the one its driver calls for
consumer, producer and admin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.common import errors, kafka_auth
from jitterscope.common.settings import load, to_env

SECRET = "s3cr3t-Hunter2-do-not-log"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    """A real CA and a client certificate signed by it (librdkafka and
    Python's ssl both load the files when a client is built)."""
    d = tmp_path_factory.mktemp("tls")
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=collector")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "2")
    (d / "password").write_text(SECRET + "\n")
    return {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key", "password": d / "password"}


@pytest.fixture
def sasl_ssl(tls_files, tmp_path):
    return load(bootstrap_servers="kafka-1:9093", kafka_security_protocol="SASL_SSL",
                kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="jitterscope",
                kafka_sasl_password_file=tls_files["password"], kafka_ssl_ca_file=tls_files["ca"],
                kafka_ssl_cert_file=tls_files["cert"], kafka_ssl_key_file=tls_files["key"],
                data_dir=tmp_path, spool_max_mb=0, collector_metrics_port=0, otlp_port=0)


def test_plaintext_adds_nothing():
    assert kafka_auth.librdkafka_config(load()) == {}
    assert kafka_auth.ssl_context(load()) is None


def test_collector_producer_gets_exactly_the_security_keys(sasl_ssl, tls_files):
    from jitterscope.collector.agent import Collector

    config = Collector(sasl_ssl).publisher._config()
    security = {k: v for k, v in config.items() if k.startswith(("security.", "sasl.", "ssl."))}
    assert security == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "jitterscope",
        "sasl.password": SECRET, "ssl.ca.location": str(tls_files["ca"]),
        "ssl.certificate.location": str(tls_files["cert"]), "ssl.key.location": str(tls_files["key"])}
    assert config["bootstrap.servers"] == "kafka-1:9093"


def test_topics_admin_client_is_built_with_them(sasl_ssl):
    from jitterscope import topic_admin as topics

    topics.admin(sasl_ssl)  # librdkafka refuses a bad combination (or unreadable files) here


def test_streams_worker_aiokafka_clients_get_the_same(sasl_ssl):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from jitterscope.streams.app import faust_credentials

    auth = credentials_to_aiokafka_auth(faust_credentials(sasl_ssl))
    context = auth.pop("ssl_context")
    assert auth == {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                    "sasl_plain_username": "jitterscope", "sasl_plain_password": SECRET}
    assert context.verify_mode.name == "CERT_REQUIRED"
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test-ca"),),)]


def test_tls_only_and_sasl_plaintext_map_to_the_matching_faust_credentials(tls_files):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from jitterscope.streams.app import faust_credentials

    tls = load(kafka_security_protocol="SSL", kafka_ssl_ca_file=tls_files["ca"])
    assert kafka_auth.librdkafka_config(tls) == {"security.protocol": "SSL", "ssl.ca.location": str(tls_files["ca"])}
    assert credentials_to_aiokafka_auth(faust_credentials(tls))["security_protocol"] == "SSL"
    sasl = load(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u",
                kafka_sasl_password=SECRET)
    auth = credentials_to_aiokafka_auth(faust_credentials(sasl))
    assert (auth["security_protocol"], auth["sasl_mechanism"], auth["sasl_plain_password"], auth["ssl_context"]) \
        == ("SASL_PLAINTEXT", "PLAIN", SECRET, None)
    assert faust_credentials(load()) is None


def test_incomplete_or_broken_security_settings_are_bad_config(tmp_path):
    with pytest.raises(errors.BadConfig, match="kafka_sasl_username"):
        load(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN")
    with pytest.raises(errors.BadConfig, match="SASL_SSL"):
        load(kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u", kafka_sasl_password="p")
    with pytest.raises(errors.BadConfig, match="kafka_ssl_key_file"):
        load(kafka_security_protocol="SSL", kafka_ssl_cert_file=tmp_path / "c.pem")
    missing = load(kafka_security_protocol="SSL", kafka_ssl_ca_file=tmp_path / "nope.pem")
    with pytest.raises(errors.BadConfig, match="nope.pem does not exist"):
        kafka_auth.librdkafka_config(missing)


def test_password_stays_out_of_repr_and_dumps_but_reaches_children():
    s = load(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u",
             kafka_sasl_password=SECRET)
    assert SECRET not in repr(s) and SECRET not in str(s.model_dump()) and SECRET not in s.model_dump_json()
    assert to_env(s)["JITTERSCOPE_KAFKA_SASL_PASSWORD"] == SECRET  # `up` hands resolved settings to its children


def test_password_stays_out_of_help_and_of_what_the_commands_print(tmp_path):
    env = {**os.environ, "JITTERSCOPE_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "JITTERSCOPE_KAFKA_SASL_MECHANISM": "PLAIN", "JITTERSCOPE_KAFKA_SASL_USERNAME": "u",
           "JITTERSCOPE_KAFKA_SASL_PASSWORD": SECRET, "JITTERSCOPE_DATA_DIR": str(tmp_path)}
    env.pop("JITTERSCOPE_CONFIG", None)
    cli = [sys.executable, "-m", "jitterscope.cli"]
    shown = subprocess.run(cli + ["config"], env=env, capture_output=True, text=True, timeout=120)
    assert "kafka_sasl_username = " in shown.stdout and SECRET not in shown.stdout + shown.stderr
    for args in (["collector", "--help"], ["streams", "--help"], ["topics", "check", "--help"],
                 # nothing listens on port 1: the command fails, after building its client and logging
                 ["topics", "check", "--bootstrap-servers", "127.0.0.1:1"],
                 ["collector", "--bootstrap-servers", "127.0.0.1:1"]):
        out = subprocess.run(cli + args, env=env, capture_output=True, text=True, timeout=120)
        assert SECRET not in out.stdout + out.stderr, args
        if "--help" not in args:
            assert out.returncode != 0 and "127.0.0.1:1" in out.stdout + out.stderr
