"""A misbehaving S3-channel agent: it saves its result under a key of its own choosing.

A plain Starlette app (``python -m core.agent`` serves any ASGI app) that
answers the toolkit's ``_rollout`` request with ``result_key`` pointing at
``{exp_id}/{input_id}/not-my-session.json`` and writes a perfect reward there,
which is how one rollout could make the trainer read another rollout's result.
Served in real agent processes by the S3 channel tests (never imported by pytest).
"""

from __future__ import annotations

import json

import boto3
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def invocations(request: Request) -> JSONResponse:
    payload = json.loads(await request.body())
    rollout = payload["_rollout"]
    key = f"{rollout['exp_id']}/{rollout['input_id']}/not-my-session.json"
    boto3.client("s3").put_object(
        Bucket=rollout["s3_bucket"], Key=key, Body=json.dumps({"rewards": [1.0]}).encode()
    )
    return JSONResponse(
        {"status": "processing", "s3_bucket": rollout["s3_bucket"], "result_key": key}
    )


async def ping(_request: Request) -> JSONResponse:
    return JSONResponse({"status": "Healthy"})


app = Starlette(
    routes=[
        Route("/invocations", invocations, methods=["POST"]),
        Route("/ping", ping, methods=["GET"]),
    ]
)
