"""The S3 result channel of agentcore-rl-toolkit's ``AgentCoreRLApp``, written lazily.

Defines ``S3ResultWriter``: builds the saved JSON exactly as the toolkit does
(the handler's dict plus ``status_code``, ``stop_reason``, ``input_id``,
``s3_bucket``, ``result_key`` and ``payload``) and puts it with boto3. boto3 is
imported on first use only, so agents that report over HTTP never need it.
The endpoint, region and credentials come from the usual AWS environment
variables (``AWS_ENDPOINT_URL_S3`` points it at a local S3-compatible server).
"""

from __future__ import annotations

import json
import threading
from typing import Any


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
        result_key: str,
        payload: dict[str, Any],
    ) -> None:
        """Save ``result`` at ``s3://{s3_bucket}/{result_key}`` with the toolkit's metadata.

        Raises:
            TypeError: the result is not JSON-serializable.
            botocore.exceptions.ClientError: S3 refused the write.
        """
        body = dict(result)
        body.setdefault("status_code", 200)
        body.setdefault("stop_reason", "end_turn")
        body["input_id"] = s3["input_id"]
        body["s3_bucket"] = s3["s3_bucket"]
        body["result_key"] = result_key
        body["payload"] = payload
        self._s3().put_object(
            Bucket=s3["s3_bucket"],
            Key=result_key,
            Body=json.dumps(body, indent=2).encode(),
            ContentType="application/json",
        )
