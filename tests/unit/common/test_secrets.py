# SPDX-License-Identifier: Apache-2.0
"""Secrets masked wherever they would be shown (common/masking.py): URLs'
passwords, webhook tokens, secret settings; in `jitterscope config`,
`doctor`, error messages and log lines."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import SecretStr

from jitterscope.broker import free_port
from jitterscope.common import errors
from jitterscope.common.masking import (MASK, URL_SETTINGS, WEBHOOK_SETTINGS, is_secret_setting, mask_setting,
                                        mask_text, mask_url, mask_webhook_url, masked_settings)
from jitterscope.common.settings import Settings, load

PASSWORD = "s3cretPa55"
HOOK_TOKEN = "XyZhookT0ken42"
CLICKHOUSE_URL = f"http://default:{PASSWORD}@127.0.0.1:8123"
WEBHOOK_URL = f"https://hooks.slack.com/services/T0001/B0002/{HOOK_TOKEN}"


@pytest.mark.parametrize("url, shown", [
    (CLICKHOUSE_URL, "http://default:***@127.0.0.1:8123"),
    (f"https://u:{PASSWORD}@ch.example:8443/db?x=1", "https://u:***@ch.example:8443/db?x=***"),
    (f"http://{PASSWORD}@am:9093/", "http://***@am:9093/"),  # a lone user name is often a token
    (f"http://u:{PASSWORD}@h:notaport", "http://u:***@h:notaport"),  # what the settings check quotes
    (f"http://am:9093/?token={PASSWORD}&debug", "http://am:9093/?token=***&***"),
    (f"http://[::1]:8123/#{PASSWORD}", "http://[::1]:8123/#***"),
    ("http://127.0.0.1:6066", "http://127.0.0.1:6066"),
    ("", ""),
])
def test_mask_url(url, shown):
    assert mask_url(url) == shown
    assert mask_url(shown) == shown  # idempotent


def test_mask_webhook_url_hides_the_path_token():
    assert mask_webhook_url(WEBHOOK_URL) == "https://hooks.slack.com/***"
    assert mask_webhook_url(f"https://chat.example/v1/spaces/AAA/messages?key=k&token={HOOK_TOKEN}") == \
        "https://chat.example/***"
    assert mask_webhook_url(f"http://u:{PASSWORD}@recv:8080") == "http://recv:8080/***"
    assert mask_webhook_url("http://recv:8080/") == "http://recv:8080/"
    assert mask_webhook_url("https://hooks.slack.com/***") == "https://hooks.slack.com/***"


def test_mask_text_finds_urls_tokens_and_password_pairs():
    text = (f"cannot open ClickHouse ({CLICKHOUSE_URL}): refused; '{CLICKHOUSE_URL}/x', "
            f"sent Bearer {HOOK_TOKEN}abcdef, Authorization: Basic dXNlcjpzM2NyZXRQYTU1, password={PASSWORD}")
    masked = mask_text(text)
    for secret in (PASSWORD, HOOK_TOKEN, "dXNlcjpzM2NyZXRQYTU1"):
        assert secret not in masked
    assert "(http://default:***@127.0.0.1:8123): refused" in masked
    assert mask_text(masked) == masked
    prose = "webhook_token_file /x is empty: write the bearer token into it; the query token: bad"
    assert mask_text(prose) == prose


def test_every_url_setting_is_classified_and_secret_fields_are_named_so():
    fields = Settings.model_fields
    urls = {name for name in fields if name.endswith("_url")}
    assert urls == URL_SETTINGS | WEBHOOK_SETTINGS, "classify a new URL setting in common/masking.py"
    for name, field in fields.items():
        if field.annotation is not None and "SecretStr" in str(field.annotation):
            assert is_secret_setting(name), name
    assert is_secret_setting("kafka_sasl_password") and not is_secret_setting("kafka_sasl_password_file")
    assert not is_secret_setting("webhook_token_file") and not is_secret_setting("kubelet_token_file")
    assert mask_setting("anything", SecretStr("x")) == MASK


def test_masked_settings(tmp_path):
    s = load(data_dir=tmp_path, clickhouse_url=CLICKHOUSE_URL, webhook_url=WEBHOOK_URL,
             alertmanager_url=f"http://am:{PASSWORD}@am:9093", kafka_security_protocol="SASL_SSL",
             kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u", kafka_sasl_password=PASSWORD)
    shown = masked_settings(s)
    assert PASSWORD not in repr(shown) and HOOK_TOKEN not in repr(shown)
    assert shown["clickhouse_url"] == "http://default:***@127.0.0.1:8123"
    assert shown["webhook_url"] == "https://hooks.slack.com/***"
    assert shown["alertmanager_url"] == "http://am:***@am:9093"
    assert shown["kafka_sasl_password"] == MASK and shown["kafka_sasl_username"] == "u"
    assert shown["data_dir"] == str(tmp_path)


def test_errors_mask_their_message():
    exc = errors.ClickHouseUnavailable(f"cannot open ClickHouse ({CLICKHOUSE_URL}): boom")
    assert PASSWORD not in str(exc) and "default:***@" in str(exc) and exc.exit_code == 69
    with pytest.raises(errors.BadConfig) as caught:  # the settings check quotes the value it refuses
        load(clickhouse_url=f"http://default:{PASSWORD}@ch:notaport")
    assert PASSWORD not in str(caught.value) and "clickhouse_url" in str(caught.value)


# -- the commands, as a user runs them ---------------------------------------------

def cli(tmp_path, *args, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env.update(JITTERSCOPE_DATA_DIR=str(tmp_path), **env_extra)
    return subprocess.run([sys.executable, "-m", "jitterscope.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_config_prints_no_secret(tmp_path):
    result = cli(tmp_path, "config", JITTERSCOPE_CLICKHOUSE_URL=CLICKHOUSE_URL, JITTERSCOPE_WEBHOOK_URL=WEBHOOK_URL,
                 JITTERSCOPE_ALERTMANAGER_URL=f"http://admin:{PASSWORD}@am:9093",
                 JITTERSCOPE_KUBELET_URL=f"https://kubelet:10250/?token={PASSWORD}",
                 JITTERSCOPE_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", JITTERSCOPE_KAFKA_SASL_MECHANISM="PLAIN",
                 JITTERSCOPE_KAFKA_SASL_USERNAME="u", JITTERSCOPE_KAFKA_SASL_PASSWORD=PASSWORD)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert PASSWORD not in out and HOOK_TOKEN not in out
    lines = result.stdout.splitlines()
    for line in ('clickhouse_url = "http://default:***@127.0.0.1:8123"', 'webhook_url = "https://hooks.slack.com/***"',
                 'alertmanager_url = "http://admin:***@am:9093"', 'kafka_sasl_password = "***"',
                 'kafka_sasl_username = "u"'):
        assert line in lines, line


def test_doctor_prints_no_password(tmp_path):
    url = f"http://default:{PASSWORD}@127.0.0.1:{free_port()}"  # nothing listens: the check fails, quoting it
    result = cli(tmp_path, "doctor", "--clickhouse-url", url)
    out = result.stdout + result.stderr
    assert "clickhouse" in result.stdout and "FAIL" in result.stdout
    assert PASSWORD not in out and "default:***@127.0.0.1" in out


def test_a_query_error_prints_no_password(tmp_path):
    url = f"http://default:{PASSWORD}@127.0.0.1:{free_port()}"
    result = cli(tmp_path, "query", "--clickhouse-url", url, "SELECT 1")
    assert result.returncode == 69, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert "default:***@127.0.0.1" in result.stderr and "Traceback" not in result.stderr
