"""The API side of webhooks: the callback URL a submission carries, and a key's settings
(core/webhooks.py does the rest; docs/webhooks.md)."""

from __future__ import annotations

from core import webhooks
from core.settings import Settings
from core.storage import JobPaths, Storage
from service.auth import ApiKey
from service.intake import IntakeError


def admit_callback(
    url: str, key: ApiKey, paths: JobPaths, storage: Storage, settings: Settings
) -> None:
    """Check a submission's `callback_url` and keep it with the job; IntakeError when refused."""
    try:
        webhooks.check_url(url.strip(), settings.webhook_allow_private)
    except webhooks.WebhookURLError as exc:
        raise IntakeError(422, f"callback_url: {exc}") from None
    if not webhooks.key_settings(storage, key.id)["secret"]:
        raise IntakeError(
            409,
            "callback_url: this API key has no webhook signing secret yet; create it with "
            "POST /v1/webhook/secret (its answer is the only time the secret is shown)",
        )
    webhooks.set_job_url(paths, url.strip(), storage)
