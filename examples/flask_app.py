"""A Flask application that enqueues jobs with :class:`qftrio.SyncClient` and
shows how they went. Against a development server (``qftrio serve --dev``,
whose tenant ``default`` has the token ``dev``), with the worker of
``handlers.py`` running:

    cd examples
    flask --app 'flask_app:create_app("http://127.0.0.1:8000", "dev")' run

    curl -X POST localhost:5000/images -H 'Content-Type: application/json' -d '{"src": "cat.png"}'
    curl localhost:5000/images/JOB_ID
"""

from __future__ import annotations

import atexit
from typing import Any

from flask import Flask, request

import qftrio


def create_app(url: str, token: str) -> Flask:
    app = Flask(__name__)
    # One client for the whole process: it is safe to share between the
    # threads serving requests, and keeps its connections alive between them.
    client = qftrio.SyncClient(url, token, timeout=5)
    app.extensions["qftrio"] = client
    atexit.register(client.close)

    @app.post("/images")
    def resize_image() -> tuple[dict[str, Any], int]:
        data = request.get_json(silent=True) or {}
        if not isinstance(data.get("src"), str):
            return {"error": "src: an image file name is required"}, 400
        try:
            job = client.enqueue(
                "resize-image",
                {"src": data["src"], "width": data.get("width", 256)},
                queue="images",
                # A client that sends the same request again gets the same job.
                idempotency_key=request.headers.get("Idempotency-Key"),
            )
        except qftrio.InvalidInput as exc:
            return {"error": exc.message}, 400
        except (qftrio.TransportError, qftrio.Unavailable):
            return {"error": "the job queue cannot be reached; try again shortly"}, 503
        return {"job_id": job.id}, 202

    @app.get("/images/<job_id>")
    def resize_status(job_id: str) -> tuple[dict[str, Any], int]:
        try:
            job = client.job_get(job_id)
        except qftrio.NotFound:
            return {"error": "no such job"}, 404
        return {"job_id": job.id, "status": job.status.value, "result": job.result, "error": job.error}, 200

    return app
