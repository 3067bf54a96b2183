"""S3 helper for the archive upload test (boto3 against a local moto_server).

usage: archive_s3.py ENDPOINT BUCKET create   -> creates the bucket
       archive_s3.py ENDPOINT BUCKET list     -> JSON {key: [size, sha256 of a GET]}
       archive_s3.py - - hash DIR             -> JSON {path under DIR: [size, sha256]} (local)
"""
import hashlib
import json
import os
import sys

endpoint, bucket, cmd = sys.argv[1:4]
if cmd == "hash":
    root = sys.argv[4]
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                data = fh.read()
            out[os.path.relpath(p, root)] = [len(data), hashlib.sha256(data).hexdigest()]
    print(json.dumps(out))
    sys.exit(0)

import boto3  # noqa: E402  (only the store commands need it)

s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    aws_access_key_id="test",
    aws_secret_access_key="test",
    region_name="us-east-1",
)
if cmd == "create":
    s3.create_bucket(Bucket=bucket)
elif cmd == "list":
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            out[o["Key"]] = [o["Size"], hashlib.sha256(body).hexdigest()]
    print(json.dumps(out))
else:
    sys.exit(f"unknown command {cmd}")
