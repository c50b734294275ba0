"""An S3 endpoint for the S3 storage tests: moto's server (from the venv scripts/setup.sh makes) on
127.0.0.1 with a free port, with IAM authentication on, so that every request's SigV4 signature is
checked against a real access key. Usage:

  s3_server.py BUCKET

Makes an IAM user allowed s3:*, its access key and BUCKET, prints one line

  listening on http://127.0.0.1:PORT ACCESS_KEY_ID SECRET_ACCESS_KEY

and serves until SIGTERM. Objects live in memory."""
import json
import logging
import os
import signal
import sys

# The first requests (the IAM set-up below, which makes the key) need no signature; every later
# one must be signed with the key it makes.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

bucket = sys.argv[1]
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
url = f"http://{host}:{port}"
unsigned = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                aws_secret_access_key="setup")
iam = boto3.client("iam", **unsigned)
iam.create_user(UserName="trainyard")
policy = {"Version": "2012-10-17",
          "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
arn = iam.create_policy(PolicyName="s3", PolicyDocument=json.dumps(policy))["Policy"]["Arn"]
iam.attach_user_policy(UserName="trainyard", PolicyArn=arn)
key = iam.create_access_key(UserName="trainyard")["AccessKey"]
boto3.client("s3", endpoint_url=url, region_name="us-east-1",
             aws_access_key_id=key["AccessKeyId"],
             aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket=bucket)
print(f"listening on {url} {key['AccessKeyId']} {key['SecretAccessKey']}", flush=True)

signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
while True:
    signal.pause()
