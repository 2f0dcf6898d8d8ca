"""The S3 result channel of agentcore-rl-toolkit's ``AgentCoreRLApp``, written lazily.

Defines ``S3ResultWriter`` and ``stored_payload``. The object goes where the
toolkit puts it, ``{exp_id}/{input_id}/{session_id}.json``, a key the writer
derives itself from the trainer's fields and the runtime's session header:
neither the handler nor its result can point it elsewhere (the trainer reads
that key and no other). The saved JSON is the handler's dict plus
``status_code``, ``stop_reason``, ``input_id``, ``s3_bucket`` and the payload
*without* the model credentials: the session key (``api_key``) and the gateway
URL never reach the bucket. The toolkit also saved ``result_key``, which holds
the session id; it is left out for the same reason (it is the object's own key).

boto3 is imported on first use only, so agents that report over HTTP never
need it. The endpoint, region and credentials come from the usual AWS
environment variables (``AWS_ENDPOINT_URL_S3`` points it at a local
S3-compatible server).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from core.agent._protocol import CONFIG_KEY, ENVELOPE_KEY, ROLLOUT_KEY, S3_FIELDS, s3_result_key

_STORED_ROLLOUT_FIELDS = (*S3_FIELDS, "model_id", "sampling_params")
"""``_rollout`` fields kept in the saved payload: enough to tell what ran, no credentials."""


def stored_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as saved next to a result: the dataset row, minus credentials.

    ``_config`` goes entirely (its ``api_key`` is the gateway session key);
    ``_rollout`` keeps only the S3 fields, the model id and the sampling settings.
    """
    out = {k: v for k, v in payload.items() if k not in (CONFIG_KEY, ROLLOUT_KEY, ENVELOPE_KEY)}
    rollout = payload.get(ROLLOUT_KEY)
    if isinstance(rollout, dict):
        out[ROLLOUT_KEY] = {k: rollout[k] for k in _STORED_ROLLOUT_FIELDS if k in rollout}
    return out


def result_key_for(s3: dict[str, str], session_id: str) -> str:
    """The one key a rollout's result may have: ``{exp_id}/{input_id}/{session_id}.json``.

    Raises:
        ValueError: ``input_id`` or the session id is empty or holds a ``/``, which
            would place the result under another rollout's prefix.
    """
    for name, value in (("input_id", s3["input_id"]), ("session id", session_id)):
        if not value or "/" in value:
            raise ValueError(
                f"the {name} {value!r} cannot name an S3 result: it must be non-empty "
                "and hold no '/'"
            )
    return s3_result_key(s3["exp_id"], s3["input_id"], session_id)


class S3ResultWriter:
    """Puts rollout results into S3; one boto3 client per process, created on first use."""

    def __init__(self) -> None:
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3  # lazy: agent containers that use HTTP results need no boto3

                self._client = boto3.client("s3")
            return self._client

    def put(
        self,
        result: dict[str, Any],
        *,
        s3: dict[str, str],
        key: str,
        payload: dict[str, Any],
    ) -> str:
        """Save ``result`` at ``s3://{s3_bucket}/{key}``.

        ``key`` is the one ``result_key_for`` derived when the request arrived, not
        one rebuilt from the handler's context afterwards: a handler that changes
        ``context.session_id`` cannot steer its result onto a sibling rollout's key.

        Returns:
            The key written.

        Raises:
            TypeError: the result is not JSON-serializable.
            botocore.exceptions.ClientError: S3 refused the write.
        """
        body = dict(result)
        body.setdefault("status_code", 200)
        body.setdefault("stop_reason", "end_turn")
        body["input_id"] = s3["input_id"]
        body["s3_bucket"] = s3["s3_bucket"]
        body.pop("result_key", None)
        body["payload"] = stored_payload(payload)
        self._s3().put_object(
            Bucket=s3["s3_bucket"],
            Key=key,
            Body=json.dumps(body, indent=2).encode(),
            ContentType="application/json",
        )
        return key
