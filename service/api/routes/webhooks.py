"""Webhooks: a key's default callback URL and signing secret, and a job's delivery log
(docs/webhooks.md)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool

from api_schemas.webhooks import KeyWebhook, KeyWebhookUpdate, WebhookDeliveryList
from core import webhooks
from service.api.deps import GUARDS, OWNER, KeyDep, SettingsDep, StorageDep, StoreDep, load_job

router = APIRouter(tags=["webhooks"], dependencies=GUARDS)


@router.get(
    "/v1/jobs/{job_id}/webhooks",
    dependencies=OWNER,
    response_model=WebhookDeliveryList,
    summary="The job's webhook deliveries, in event order, with every attempt",
)
def job_webhooks(job_id: str, store: StoreDep, storage: StorageDep) -> WebhookDeliveryList:
    job = load_job(store, job_id)
    return WebhookDeliveryList(items=webhooks.deliveries(job.id, storage))


@router.get("/v1/webhook", response_model=KeyWebhook, summary="This key's webhook settings")
def get_key_webhook(key: KeyDep, storage: StorageDep) -> KeyWebhook:
    cfg = webhooks.key_settings(storage, key.id)
    return KeyWebhook(url=cfg["url"], has_secret=bool(cfg["secret"]))


@router.put(
    "/v1/webhook",
    response_model=KeyWebhook,
    summary="Set (or with null, remove) the callback URL of this key's jobs",
    responses={422: {"description": "not an http(s) URL, or it resolves to a refused address"}},
)
async def put_key_webhook(
    body: KeyWebhookUpdate,
    key: KeyDep,
    storage: StorageDep,
    settings: SettingsDep,
) -> KeyWebhook:
    url = body.url.strip() if body.url else None
    if url:
        try:
            await run_in_threadpool(webhooks.check_url, url, settings.webhook_allow_private)
        except webhooks.WebhookURLError as exc:
            raise HTTPException(422, f"url: {exc}") from None
    cfg = webhooks.key_settings(storage, key.id)
    created = None if cfg["secret"] else webhooks.new_secret()
    webhooks.save_key_settings(storage, key.id, url, cfg["secret"] or created)
    return KeyWebhook(url=url, has_secret=True, secret=created)


@router.post(
    "/v1/webhook/secret",
    response_model=KeyWebhook,
    summary="Create or replace this key's webhook signing secret (shown only in this answer)",
)
def rotate_secret(key: KeyDep, storage: StorageDep) -> KeyWebhook:
    cfg = webhooks.key_settings(storage, key.id)
    secret = webhooks.new_secret()
    webhooks.save_key_settings(storage, key.id, cfg["url"], secret)
    return KeyWebhook(url=cfg["url"], has_secret=True, secret=secret)
