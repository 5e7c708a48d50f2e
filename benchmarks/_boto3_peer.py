"""The boto3 peer of artifact_overhead.py: every file under a directory to s3://bucket/prefix with ``upload_file``,
then every object back with ``download_file`` (default TransferConfig: 8 MiB multipart, 10 threads per file), one
file after another. Endpoint and credentials from the AWS_* env. Prints {"upload_s", "download_s"} as JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import boto3


def main() -> None:
    src, bucket, prefix, dest = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name=os.environ["AWS_REGION"])
    files = sorted(p for p in src.rglob("*") if p.is_file())
    t0 = time.monotonic()
    for path in files:
        s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(src).as_posix()}")
    t1 = time.monotonic()
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
            for o in page.get("Contents", [])]  # fmt: skip
    for key in keys:
        target = dest / key[len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    t2 = time.monotonic()
    assert len(keys) == len(files), (len(keys), len(files))
    print(json.dumps({"upload_s": t1 - t0, "download_s": t2 - t1}))


if __name__ == "__main__":
    main()
