# SPDX-License-Identifier: Apache-2.0
"""What leaves jitterscope for the tools its users already watch: alert
notifications (Alertmanager, a webhook) and the attribution of each request
as a span in the user's own trace (OTLP). A section of ``Settings``
(common/settings.py); every field keeps its flat name."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator


class ExportSettings(BaseModel):
    """Where alerts and answers go out: Alertmanager, a webhook, an OTLP traces endpoint."""

    alertmanager_url: str | None = Field(
        None, description="Alertmanager base URL (http://host:9093): alerts are POSTed to <url>/api/v2/alerts")
    alertmanager_generator_url: str | None = Field(
        None, description="link sent as the alerts' generatorURL (a dashboard, say)")
    webhook_url: str | None = Field(None, description="URL that gets every alert as a plain JSON POST")
    webhook_token_file: Path | None = Field(
        None, description="file holding the bearer token sent to webhook_url (kept out of the config and logs)")
    otlp_export_endpoint: str | None = Field(
        None, description="OTLP/HTTP endpoint (http://otel-collector:4318; /v1/traces is added to a URL without "
                          "a path) that gets, for each attributed request, a `jitterscope.attribution` child span "
                          "under the request's own span, with its cause, culprit and parts (docs/requests.md)")
    otlp_export_queue_max: int = Field(
        20_000, ge=1, description="attribution spans waiting for otlp_export_endpoint at most (beyond it they are "
                                  "dropped and counted; the stream never waits)")
    notify_queue_max: int = Field(
        1000, ge=1, description="alerts waiting per notification target at most (beyond it they are dropped "
                                "and counted; the stream never waits)")
    notify_timeout_s: float = Field(5.0, gt=0, description="HTTP timeout of one notification or export attempt")
    notify_retries: int = Field(
        5, ge=0, description="retries of a failed notification or export (exponential backoff)")

    @field_validator("alertmanager_url", "webhook_url", "alertmanager_generator_url", "otlp_export_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value or None
