"""Django views that enqueue jobs with :class:`qftrio.SyncClient` and show how
they went. In the project's settings::

    QFTRIO_URL = "http://127.0.0.1:8000"
    QFTRIO_TOKEN = "dev"  # a tenant token; the development server's is "dev"

and in its ``urls.py``::

    from django.urls import path
    from . import django_views

    urlpatterns = [
        path("images", django_views.resize_image),
        path("images/<str:job_id>", django_views.resize_status),
    ]
"""

from __future__ import annotations

import json

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET, require_POST

import qftrio

# One client for the process, shared by the threads serving requests. It
# connects at its first call, so a server that forks its workers after
# importing the views (gunicorn --preload) gives each worker its own
# connections.
client = qftrio.SyncClient(settings.QFTRIO_URL, settings.QFTRIO_TOKEN, timeout=5)


@require_POST
def resize_image(request: HttpRequest) -> JsonResponse:
    try:
        data = json.loads(request.body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("src"), str):
        return JsonResponse({"error": "src: an image file name is required"}, status=400)
    try:
        job = client.enqueue(
            "resize-image",
            {"src": data["src"], "width": data.get("width", 256)},
            queue="images",
            idempotency_key=request.headers.get("Idempotency-Key"),
        )
    except qftrio.InvalidInput as exc:
        return JsonResponse({"error": exc.message}, status=400)
    except (qftrio.TransportError, qftrio.Unavailable):
        return JsonResponse({"error": "the job queue cannot be reached; try again shortly"}, status=503)
    return JsonResponse({"job_id": job.id}, status=202)


@require_GET
def resize_status(request: HttpRequest, job_id: str) -> JsonResponse:
    try:
        job = client.job_get(job_id)
    except qftrio.NotFound:
        return JsonResponse({"error": "no such job"}, status=404)
    return JsonResponse({"job_id": job.id, "status": job.status.value, "result": job.result, "error": job.error})


def order_paid(order_id: int) -> None:
    """Called inside a database transaction (a model's save, say): the job
    is enqueued once the transaction has committed, so that its handler
    finds the order it is given, and never for a transaction rolled back.
    The order's id as the idempotency key makes a second call harmless."""
    transaction.on_commit(
        lambda: client.enqueue("send-receipt", {"order": order_id}, idempotency_key=f"receipt-{order_id}")
    )
