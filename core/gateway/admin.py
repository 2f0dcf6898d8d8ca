"""Admin routes: create, inspect, finish, harvest and drop sessions, post late rewards, and let
the trainer move a shard's sampler with a weight push (hold, release, version) (token required).

Defines ``admin_routes(gateway)`` and the pydantic ``CreateSessionBody``.
The admin token travels as ``Authorization: Bearer <token>`` or ``X-Admin-Token``;
a missing token is 401, a wrong one 403. Bodies over ``gateway.max_admin_body_bytes``
(session ``metadata`` included) are 413.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from core.gateway.errors import (
    GatewayError,
    bad_request,
    forbidden,
    not_found,
    openai_envelope,
    unauthorized,
)
from core.gateway.fastpath import read_raw
from core.gateway.harvest import harvest_session, harvest_to_json
from core.types import SamplingParams

if TYPE_CHECKING:
    from core.gateway.service import Gateway

__all__ = ["CreateSessionBody", "admin_routes"]


class SamplingBody(BaseModel):
    """Session sampling defaults (``core.types.SamplingParams`` fields)."""

    model_config = ConfigDict(extra="forbid")
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    stop: list[str] = []
    stop_token_ids: list[int] = []
    seed: int | None = None


class CreateSessionBody(BaseModel):
    """Body of ``POST /admin/sessions`` (every field optional)."""

    model_config = ConfigDict(extra="forbid")
    sampling: SamplingBody | None = None
    max_context_tokens: int | None = Field(None, ge=0)
    metadata: dict[str, Any] = {}
    history_mode: Literal["linear", "tree"] | None = None
    allow_sampling_overrides: bool | None = None
    policy: str | None = Field(None, max_length=200)


class RewardBody(BaseModel):
    """Body of ``POST /admin/rollouts/{id}/reward``: the reward of a rollout left pending.

    Strict: a JSON number, finite. ``true`` and ``"0.5"`` are refused (lax parsing took them
    for 1.0 and 0.5: a client bug would have trained as a reward), as are ``NaN``,
    ``Infinity`` and numbers that overflow to them."""

    model_config = ConfigDict(extra="forbid")
    reward: float = Field(allow_inf_nan=False, strict=True)


class TakeBody(BaseModel):
    """Body of ``POST /admin/late_rewards/take`` (a shard's): ``ack``, the ``through`` of the
    last take whose answer the trainer received (0: none yet); those rewards are forgotten."""

    model_config = ConfigDict(extra="forbid")
    ack: int = Field(0, ge=0, strict=True)


class SamplerVersionBody(BaseModel):
    """Body of ``POST /admin/sampler`` and ``POST /admin/sampler/release``: what the trainer's
    fleet looks like now (every field optional; a release without ``weight_version``: the
    push failed and the version stays)."""

    model_config = ConfigDict(extra="forbid")
    weight_version: int | None = Field(None, ge=0, strict=True)
    """The weight version now pushed to the fleet."""
    retired: dict[str, str] = {}
    """Servers the trainer took out of rotation for good (URL -> why): this gateway's
    HTTP sampler stops routing to them too."""
    updated: list[str] = []
    """Servers a push just loaded with ``weight_version``."""
    serving: list[str] | None = None
    """The servers the trainer routes to (up, with the current weights); from the first
    such message on, this gateway routes to those only and never readmits a server by
    itself (its health checks cannot see which weights a server holds)."""
    out: dict[str, str] = {}
    """Why each server of the fleet not ``serving`` is out (URL -> why)."""


_Body = TypeVar("_Body", bound=BaseModel)


def _check_admin(gateway: Gateway, request: Request) -> None:
    auth = request.headers.get("authorization", "")
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-admin-token", "")
    if not token:
        raise unauthorized("admin routes need the admin token (Authorization: Bearer <token> or X-Admin-Token)")
    if not secrets.compare_digest(token.encode(), gateway.admin_token.encode()):
        raise forbidden("wrong admin token (it is printed at start and is GatewayServer.admin_token)")


def _rows_json(rows: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(r) for r in rows]


def admin_routes(gateway: Gateway) -> list[Route]:
    """The admin route table bound to ``gateway``."""

    def wrap(fn: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            try:
                _check_admin(gateway, request)
                out = await fn(request)
                return out if isinstance(out, Response) else JSONResponse(out)
            except GatewayError as err:
                # 408: the rest of a stalled body must not be read as a new request
                headers = {"connection": "close"} if err.status == 408 else None
                return JSONResponse(openai_envelope(err), status_code=err.status, headers=headers)

        return endpoint

    async def read_body(request: Request, model: type[_Body], what: str, hint: str = "") -> _Body:
        """The request's JSON body (empty: ``{}``) as ``model``; a bad one is a 400 saying where."""
        cfg = gateway.config
        raw = await read_raw(
            request, cfg.max_admin_body_bytes, cfg.body_read_timeout_s or None, limit_key="gateway.max_admin_body_bytes"
        )
        try:
            return model.model_validate_json(raw or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise bad_request(f"invalid {what} at {where!r}: {first['msg']}{hint}") from None

    async def create(request: Request) -> Any:
        body = await read_body(request, CreateSessionBody, "session settings")
        sampling = None
        if body.sampling is not None:
            d = body.sampling.model_dump()
            d["stop"], d["stop_token_ids"] = tuple(d["stop"]), tuple(d["stop_token_ids"])
            try:
                sampling = SamplingParams(**d)
            except ValueError as exc:
                raise bad_request(f"invalid sampling: {exc}") from None
        if body.policy is not None and body.policy not in gateway.policies.names:
            raise bad_request(
                f"unknown policy {body.policy[:80]!r}; this gateway serves {list(gateway.policies.names)}",
                param="policy",
            )
        sid = gateway.create_session(
            sampling=sampling,
            max_context_tokens=body.max_context_tokens,
            metadata=body.metadata,
            history_mode=body.history_mode,
            allow_sampling_overrides=body.allow_sampling_overrides,
            policy=body.policy,
        )
        base = str(request.base_url).rstrip("/")
        return {"session_id": sid, "base_url": f"{base}/v1", "session_base_url": f"{base}/sessions/{sid}/v1"}

    async def stats(request: Request) -> Any:
        import time

        # process_time: CPU seconds of the whole gateway process (benchmarks/gateway.py
        # reads it; the load generator shares the cores, so CPU is the fair figure).
        return {
            "process_time": time.process_time(),
            "sessions": len(gateway.sessions()),
            "turns": sum(len(s.turns) for s in gateway.sessions()),
        }

    async def listing(request: Request) -> Any:
        return {"sessions": [s.summary() for s in gateway.sessions()]}

    async def info(request: Request) -> Any:
        return gateway.session(request.path_params["sid"]).summary()

    async def trace(request: Request) -> Any:
        return {"rows": _rows_json(gateway.peek_rows(request.path_params["sid"]))}

    async def finish(request: Request) -> Any:
        return {"rows": _rows_json(gateway.finish_session(request.path_params["sid"]))}

    async def harvest(request: Request) -> Response:
        # What the trainer takes from a shard (core.gateway.harvest): finish, read, drop, in
        # one call. Written with json.dumps, whose -Infinity a logprob may need (starlette's
        # JSONResponse refuses non-finite floats) and Python's json reads back exactly.
        found = harvest_session(gateway, request.path_params["sid"])
        if found is None:
            gateway.session(request.path_params["sid"])  # the 401 naming the unknown id
        assert found is not None
        return Response(json.dumps(harvest_to_json(found)), media_type="application/json")

    async def post_reward(request: Request) -> Any:
        from core.errors import ConfigError

        body = await read_body(request, RewardBody, "reward", '; send {"reward": <number>}')
        rid = request.path_params["rid"]
        try:
            gateway.late_rewards.post(rid, body.reward)
        except ConfigError as exc:
            raise not_found(str(exc)) from None
        return {"rollout_id": rid, "reward": body.reward}

    async def take_rewards(request: Request) -> Any:
        # A shard's posted late rewards, for the trainer's book (core.gateway.late_rewards).
        take = getattr(gateway.late_rewards, "take", None)
        if take is None:
            raise not_found("this gateway is not a shard: late rewards reach its rollouts when posted")
        body = await read_body(request, TakeBody, "take", '; send {"ack": <the last answer\'s through>}')
        taken = take(body.ack)
        return {"rewards": taken.rewards, "through": taken.through}

    async def trainer_decides(server: Any) -> bool:
        return False  # a server back from unhealthy waits for the trainer's word (``serving``)

    def follow(body: SamplerVersionBody) -> None:
        # What the trainer's fleet looks like, applied to this gateway's sampler: the version,
        # the servers retired (no more traffic), those updated or serving (traffic again) and
        # those out of the trainer's rotation (none).
        sampler: Any = gateway.sampler
        if body.weight_version is not None:
            sampler.weight_version = body.weight_version
            if hasattr(sampler, "pushed"):
                sampler.pushed = True  # launch weights ("default") are a mismatch from now on
        pool: Any = getattr(sampler, "pool", None)
        if pool is None:
            return
        by_url = {s.url: s for s in pool.servers}
        for url, why in body.retired.items():
            if (server := by_url.pop(url.rstrip("/"), None)) is not None:
                pool.retire(server, f"retired by the trainer: {why}")
        for url in body.updated:
            if (server := by_url.get(url.rstrip("/"))) is not None:
                server.needs_weights = False
        if body.serving is None:
            return
        pool.readmit = trainer_decides
        serving = {url.rstrip("/") for url in body.serving}
        out = {url.rstrip("/"): why for url, why in body.out.items()}
        for url, server in by_url.items():
            if url in serving:
                server.needs_weights = False
            else:
                pool.mark_needs_weights(server, f"out of the trainer's rotation: {out.get(url, 'not serving')}")

    async def set_sampler_version(request: Request) -> Any:
        # A gateway shard's HTTP sampler learns the weight version the trainer pushed
        # (core.rollout.shards.GatewayShards.set_weight_version).
        body = await read_body(request, SamplerVersionBody, "sampler version", '; send {"weight_version": <int>}')
        if not hasattr(gateway.sampler, "weight_version"):
            raise bad_request(f"this gateway's sampler ({type(gateway.sampler).__name__}) keeps no weight version")
        follow(body)
        return {"weight_version": gateway.sampler.weight_version}

    def holdable() -> Any:
        sampler = gateway.sampler
        if not callable(getattr(sampler, "quiesce", None)):
            raise bad_request(f"this gateway's sampler ({type(sampler).__name__}) samples from no fleet to hold for")
        return sampler

    async def hold_sampler(request: Request) -> Any:
        # Before a push that aborts: answered once nothing more reaches a server until the
        # release (core.rollout.shards.GatewayShards.hold).
        sampler = holdable()
        await sampler.quiesce()
        return {"held": True, "weight_version": sampler.weight_version}

    async def release_sampler(request: Request) -> Any:
        # After the push: its version and servers, then requests go again, aborted ones
        # continued under the new version.
        body = await read_body(request, SamplerVersionBody, "sampler release", '; send {"weight_version": <int>}')
        sampler = holdable()
        follow(body)
        sampler.release()
        return {"held": False, "weight_version": sampler.weight_version}

    async def drop(request: Request) -> Any:
        gateway.session(request.path_params["sid"])
        gateway.drop_session(request.path_params["sid"])
        return {"dropped": True}

    return [
        Route("/admin/sessions", wrap(create), methods=["POST"]),
        Route("/admin/sessions", wrap(listing), methods=["GET"]),
        Route("/admin/stats", wrap(stats), methods=["GET"]),
        Route("/admin/sessions/{sid}", wrap(info), methods=["GET"]),
        Route("/admin/sessions/{sid}", wrap(drop), methods=["DELETE"]),
        Route("/admin/sessions/{sid}/trace", wrap(trace), methods=["GET"]),
        Route("/admin/sessions/{sid}/finish", wrap(finish), methods=["POST"]),
        Route("/admin/sessions/{sid}/harvest", wrap(harvest), methods=["POST"]),
        Route("/admin/rollouts/{rid}/reward", wrap(post_reward), methods=["POST"]),
        Route("/admin/late_rewards/take", wrap(take_rewards), methods=["POST"]),
        Route("/admin/sampler", wrap(set_sampler_version), methods=["POST"]),
        Route("/admin/sampler/hold", wrap(hold_sampler), methods=["POST"]),
        Route("/admin/sampler/release", wrap(release_sampler), methods=["POST"]),
    ]
