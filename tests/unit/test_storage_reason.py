"""A store's error reaches the user as what they can act on: the S3 call, the HTTP status and the store's error code.

The messages below are OpenDAL 0.47's, captured from the testbed's gateway (versitygw): a wrong secret, a missing
bucket, and a disk-full store (a 24 MiB tmpfs under the gateway); the last is the shape a benchmark met in CI, where
the first 300 characters of the raw message ended before its status.
"""

from __future__ import annotations

import pytest

from trainflow.core import storage_errors

_HEADERS = (
    'headers: {"server": "VERSITYGW", "date": "Sat, 05 Dec 2026 22:47:01 GMT", "content-type": "application/xml", '
    '"content-length": "273", "x-amz-request-id": "GSP4TUMV9ADNBOJO", "connection": "close"}'
)


def _opendal(kind: str, call: str, query: str, status: int, code: str, message: str) -> str:
    return (
        f"{kind} at write, context: {{ service_operation: {call}, uri: http://127.0.0.1:29999/bkt/x/y?{query}, "
        f"response: Parts {{ status: {status}, version: HTTP/1.1, {_HEADERS} }}, service: s3, path: x/y, "
        f'size: 8388608, written: 33554432 }} => S3Error {{ code: "{code}", message: "{message}", resource: "", '
        'request_id: "GSP4TUMV9ADNBOJO" }'
    )


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (
            _opendal(
                "Unexpected (persistent)",
                "UploadPart",
                "partNumber=4&uploadId=7aa351f9-974d-4f11-957f-59f3276f6eb6",
                507,
                "InsufficientStorage",
                "No space left on device.",
            ),
            "Unexpected (persistent) at write, UploadPart, HTTP 507, InsufficientStorage: No space left on device.",
        ),
        (
            _opendal(
                "PermissionDenied (persistent)",
                "CreateMultipartUpload",
                "uploads",
                403,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided.",
            ),
            "PermissionDenied (persistent) at write, CreateMultipartUpload, HTTP 403, SignatureDoesNotMatch: "
            "The request signature we calculated does not match the signature you provided.",
        ),
        ("connection refused\nsecond line", "connection refused"),
    ],
)
def test_the_reason_keeps_the_call_status_and_code(raw: str, shown: str) -> None:
    assert storage_errors.reason(OSError(raw)) == shown


def test_the_failure_names_the_uri_and_endpoint_and_drops_upload_ids() -> None:
    raw = _opendal(
        "Unexpected (persistent)", "UploadPart", "partNumber=4&uploadId=abc", 507, "InsufficientStorage", "x"
    )
    error = storage_errors.fail(
        "publishing", "s3://bkt/run", {"AWS_ENDPOINT_URL": "http://u:p@127.0.0.1:9"}, OSError(raw)
    )
    text = str(error)
    assert text.startswith(
        "publishing s3://bkt/run at http://127.0.0.1:9 failed: OSError: Unexpected (persistent)"
    )
    assert "HTTP 507, InsufficientStorage" in text and "uploadId" not in text and "u:p@" not in text


def test_an_empty_error_is_named_by_its_type() -> None:
    assert storage_errors.reason(TimeoutError()) == "TimeoutError"
