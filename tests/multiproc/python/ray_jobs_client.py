#!/usr/bin/python3
"""Replays the calls Ray's JobSubmissionClient (ray.dashboard.modules.job.sdk) and `ray job`
make against a Ray head's Jobs REST API, here against a trainyard head, with python3-requests and
python3-aiohttp as Ray's own client uses them. Usage:

  ray_jobs_client.py http://127.0.0.1:PORT   (the token, if any, in $TRAINYARD_TOKEN)

Prints each step; exits 0 when every answer is what a Ray client expects, 1 otherwise."""
import asyncio
import json
import os
import sys
import time

import aiohttp
import requests

ADDRESS = sys.argv[1].rstrip("/")
TOKEN = os.environ.get("TRAINYARD_TOKEN")
# Ray's clients send the cluster token as X-Ray-Authorization (Authorization works too).
HEADERS = {"X-Ray-Authorization": f"Bearer {TOKEN}"} if TOKEN else {}
TERMINAL = {"STOPPED", "SUCCEEDED", "FAILED"}


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def request(method, path, **kwargs):
    return requests.request(method, ADDRESS + path, headers=HEADERS, timeout=10, **kwargs)


def wait_status(job_id, statuses, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = request("GET", f"/api/jobs/{job_id}")
        r.raise_for_status()
        details = r.json()
        if details["status"] in statuses:
            return details
        time.sleep(0.2)
    raise SystemExit(f"FAILED: job {job_id} did not reach {statuses} within {timeout} s")


async def tail_logs(job_id):
    """JobSubmissionClient.tail_job_logs: a WebSocket that sends text until the job ends."""
    chunks = []
    async with aiohttp.ClientSession(headers=HEADERS) as session:
        ws_url = ADDRESS.replace("http", "ws", 1) + f"/api/jobs/{job_id}/logs/tail"
        async with session.ws_connect(ws_url, timeout=30) as ws:
            while True:
                msg = await asyncio.wait_for(ws.receive(), timeout=60)
                if msg.type == aiohttp.WSMsgType.TEXT:
                    chunks.append(msg.data)
                elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE,
                                  aiohttp.WSMsgType.ERROR):
                    break
    return "".join(chunks)


def main():
    # JobSubmissionClient.__init__ checks the version endpoint first.
    r = request("GET", "/api/version")
    check(r.status_code == 200 and "version" in r.json() and "ray_version" in r.json(),
          "GET /api/version answers version and ray_version")

    # submit_job: entrypoint, submission_id, runtime_env, metadata, entrypoint_num_cpus.
    body = {"entrypoint": "for i in 1 2 3; do echo line $i of $RAY_TEST_NAME; sleep 0.2; done",
            "submission_id": "ray-client-replay-1",
            "runtime_env": {"env_vars": {"RAY_TEST_NAME": "replay"}},
            "metadata": {"owner": "ray-client"},
            "entrypoint_num_cpus": 1}
    r = request("POST", "/api/jobs/", json=body)
    check(r.status_code == 200 and r.json()["submission_id"] == "ray-client-replay-1",
          "POST /api/jobs/ accepts Ray's submit body and returns the submission_id")
    job_id = r.json()["submission_id"]

    r = request("POST", "/api/jobs/", json=body)
    check(r.status_code == 409, "a duplicate submission_id is 409")

    r = request("POST", "/api/jobs/", json={"entrypoint": "true",
                                            "runtime_env": {"pip": ["requests"]}})
    check(r.status_code == 400 and "pip" in r.text, "runtime_env pip is a 400 naming it")

    # tail_job_logs until the job ends.
    logs = asyncio.run(tail_logs(job_id))
    check(all(f"line {i} of replay" in logs for i in (1, 2, 3)),
          "the WebSocket tail carries every line and closes when the job ends")

    details = wait_status(job_id, TERMINAL)
    check(details["status"] == "SUCCEEDED", "get_job_info: SUCCEEDED")
    check(details["type"] == "SUBMISSION" and details["entrypoint"] == body["entrypoint"] and
          details["metadata"] == {"owner": "ray-client"} and
          isinstance(details["start_time"], int) and isinstance(details["end_time"], int),
          "JobDetails carry Ray's fields")

    r = request("GET", f"/api/jobs/{job_id}/logs")
    check(r.status_code == 200 and "line 3 of replay" in r.json()["logs"],
          "get_job_logs returns the logs")

    r = request("GET", "/api/jobs/")
    check(r.status_code == 200 and any(j["submission_id"] == job_id for j in r.json()),
          "list_jobs lists the job")

    # stop_job on a running job.
    r = request("POST", "/api/jobs/", json={"entrypoint": "sleep 60"})
    check(r.status_code == 200, "a second job is submitted without a submission_id")
    long_id = r.json()["submission_id"]
    wait_status(long_id, {"RUNNING"})
    r = request("POST", f"/api/jobs/{long_id}/stop")
    check(r.status_code == 200 and r.json()["stopped"] is True, "stop_job answers stopped")
    check(wait_status(long_id, TERMINAL)["status"] == "STOPPED", "the stopped job is STOPPED")

    # delete_job.
    r = request("DELETE", f"/api/jobs/{job_id}")
    check(r.status_code == 200 and r.json()["deleted"] is True, "delete_job deletes it")
    r = request("GET", f"/api/jobs/{job_id}")
    check(r.status_code == 404, "a deleted job is 404")
    print("all Ray client calls answered as Ray's head does", flush=True)


if __name__ == "__main__":
    main()
