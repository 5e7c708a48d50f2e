"""The output URI table of issue 32: malformed forms (with a word of the problem each message names) and plain ones."""

from __future__ import annotations

CANARY = "pa55-canary-w0rd"

# (uri, a word of the problem the message must name)
MALFORMED = [
    ("s3://bkt/run?v=1", "query"),
    ("s3://bkt/run#2", "fragment"),
    ("s3://bkt/run?", "query"),
    ("s3://bkt/a/../b", "'..'"),
    ("s3://bkt/a/./b", "'.'"),
    ("s3://bkt/..", "'..'"),
    ("s3://bkt/a//b", "empty"),
    ("s3://bkt/run/", "empty"),
    ("s3://bkt", "bucket root"),
    ("s3://bkt/", "bucket root"),
    ("s3://", "bucket"),
    ("s3:///run", "bucket"),
    ("s3://bkt:9000/run", "bucket"),
    ("s3://a..b/run", "bucket"),
    ("s3://user@bkt/run", "credentials"),
    (f"s3://user:{CANARY}@bkt/run", "credentials"),
    ("s3://bkt/a\nb", "control"),
    ("s3://bkt/" + "k" * 901, "900 bytes"),
    ("file:///models/../etc", "'..'"),
    ("file:///models/run?x=1", "query"),
    ("file:///models/run#x", "fragment"),
    ("file:///", "root"),
    ("/", "root"),
    ("/models/./run", "'.'"),
    ("/models//run", "empty"),
    ("pvc://claim/a/../b", "'..'"),
    ("relative/path", "neither a URI nor an absolute path"),
]
GOOD = [
    "s3://bkt/run",
    "s3://b/m",
    "s3://my.bucket-1/models/2026-01-01T00:00:00+00:00/run 1",
    "s3://bkt/%2e%2e",  # literal: the key prefix is "%2e%2e", never decoded into ..
    "file:///models/run1",
    "/mnt/models/run1",
    "pvc://claim/path",
    "pvc://claim",
]
