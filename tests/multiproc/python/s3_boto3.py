"""boto3, AWS's own SDK, on the other side of the S3 storage tests (the endpoint and key come from
the AWS_* variables, as for any AWS SDK). Usage:

  s3_boto3.py get BUCKET PREFIX DIR   lists PREFIX, prints the keys (one JSON list, boto3's order)
                                      and downloads each object to DIR/<n> (n = its place in it)
  s3_boto3.py put BUCKET PREFIX DIR   uploads every file DIR/manifest.json names ({"key": "file"})
                                      under PREFIX, multipart above 5 MiB

Exits non-zero with boto3's error on any failure."""
import json
import os
import sys

import boto3
from boto3.s3.transfer import TransferConfig

mode, bucket, prefix, folder = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
if mode == "get":
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    for n, key in enumerate(keys):
        s3.download_file(bucket, key, os.path.join(folder, str(n)))
    print(json.dumps(keys))
elif mode == "put":
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    for key, name in manifest.items():
        s3.upload_file(os.path.join(folder, name), bucket, prefix + key, Config=config)
else:
    sys.exit(f"unknown mode {mode!r}: get or put")
