"""moto's S3 server on 127.0.0.1, standing in for S3 (which CI cannot reach) in the
tests of the runtimes' S3 result channels."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def moto_s3_server(bucket: str, *, region: str = "us-east-1") -> Iterator[str]:
    """moto's threaded S3 server with ``bucket`` made in ``region``; yields its endpoint URL.

    moto's state is per process: a bucket another server of this run made already stays.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        where = {} if region == "us-east-1" else {"LocationConstraint": region}
        try:
            if where:
                s3.create_bucket(Bucket=bucket, CreateBucketConfiguration=where)
            else:
                s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass  # another test made it on this server: the bucket is what we need
        yield endpoint
    finally:
        server.stop()
