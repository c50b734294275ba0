"""Ray's own job client against a trainyard head: ray.job_submission.JobSubmissionClient in this
process and the `ray job` CLI (the `ray` beside this Python) in child processes. Usage:

  ray_jobs_client.py http://127.0.0.1:PORT   (the head's token in $TRAINYARD_TOKEN)

The token goes the ways Ray's client sends it (Note [Ray's token auth]). Prints each step; exits 0
when every call did what it does against a Ray head, 1 otherwise, and within DEADLINE_S."""
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

ADDRESS = sys.argv[1].rstrip("/")
TOKEN = os.environ["TRAINYARD_TOKEN"]
RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
DEADLINE_S = 45  # the whole script; the C++ test waits a little longer
CALL_S = 30  # one `ray job` command, one job to end, one log tail
TERMINAL = {"STOPPED", "SUCCEEDED", "FAILED"}

# Note [Ray's token auth]
# Ray 2.60's clients send the cluster token as `authorization: Bearer <token>` when token auth is
# on (RAY_AUTH_MODE=token), reading it from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH,
# else ~/.ray/auth_token (ray._private.authentication.http_token_authentication). Before that
# mode existed, and still for proxies, the token went as a header of the caller's own:
# JobSubmissionClient(headers=...), `ray job --headers JSON` or RAY_JOB_HEADERS; a caller's
# Authorization header wins over the token. The mode is read when ray is imported, so it is set
# before the import. Whatever steers Ray's client elsewhere (RAY_ADDRESS, RAY_API_SERVER_ADDRESS,
# RAY_JOB_HEADERS, another token) is cleared first.
for name in [n for n in os.environ if n.startswith("RAY_")]:
    del os.environ[name]
BASE_ENV = dict(os.environ)
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = TOKEN

from ray.exceptions import AuthenticationError  # noqa: E402
from ray.job_submission import JobStatus, JobSubmissionClient  # noqa: E402


def on_deadline(signum, frame):
    raise TimeoutError(f"the Ray client calls took more than {DEADLINE_S} s")


def check(condition, what, detail=""):
    if not condition:
        print(f"FAILED: {what}\n{detail}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def expect_error(error_type, call, *args, **kwargs):
    """The exception call raises, which must be an error_type."""
    try:
        call(*args, **kwargs)
    except error_type as e:
        return str(e)
    raise AssertionError(f"{call.__name__} did not raise {error_type.__name__}")


def wait_status(client, job_id, statuses):
    deadline = time.monotonic() + CALL_S
    while time.monotonic() < deadline:
        status = client.get_job_status(job_id)
        if status in statuses:
            return status
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} did not reach {statuses} within {CALL_S} s")


async def tail(client, job_id):
    chunks = []

    async def follow():
        async for text in client.tail_job_logs(job_id):
            chunks.append(text)

    await asyncio.wait_for(follow(), timeout=CALL_S)
    return "".join(chunks)


def ray_job(args, auth="env", token=TOKEN):
    """`ray job ARGS --address ADDRESS` with the token sent as `auth` says: "env" (RAY_AUTH_TOKEN),
    "file" (RAY_AUTH_TOKEN_PATH), "headers" (--headers), "none"."""
    env = dict(BASE_ENV)
    argv = [RAY_CLI, "job", *args[:1], "--address", ADDRESS]
    with tempfile.TemporaryDirectory() as tmp:
        if auth == "env":
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        elif auth == "file":
            path = os.path.join(tmp, "token")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(token + "\n")
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path)
        elif auth == "headers":
            argv += ["--headers", '{"Authorization": "Bearer %s"}' % token]
        r = subprocess.run(argv + list(args[1:]), env=env, capture_output=True, text=True,
                           timeout=CALL_S)
    return r.returncode, r.stdout + r.stderr


def sdk():
    client = JobSubmissionClient(ADDRESS)  # checks /api/version: a Ray 2.0 or later head
    check(client.get_version() == "2", "JobSubmissionClient connects; the Jobs API version is 2")

    message = expect_error(AuthenticationError, JobSubmissionClient, ADDRESS,
                           headers={"Authorization": "Bearer wrong-token"})
    check("Authentication failed" in message,
          "a wrong token in headers= is Ray's AuthenticationError (403)", message)

    entrypoint = "for i in 1 2 3; do echo line $i of $RAY_TEST_NAME; sleep 0.2; done"
    job_id = client.submit_job(entrypoint=entrypoint, submission_id="ray-sdk-1",
                               runtime_env={"env_vars": {"RAY_TEST_NAME": "sdk"}},
                               metadata={"owner": "ray-sdk"}, entrypoint_num_cpus=1)
    check(job_id == "ray-sdk-1", "submit_job returns the submission_id")

    logs = asyncio.run(tail(client, job_id))
    check(all(f"line {i} of sdk" in logs for i in (1, 2, 3)),
          "tail_job_logs yields every line and ends cleanly when the job ends", logs)
    check(wait_status(client, job_id, TERMINAL) == JobStatus.SUCCEEDED,
          "get_job_status: SUCCEEDED")
    info = client.get_job_info(job_id)
    check(info.type.value == "SUBMISSION" and info.entrypoint == entrypoint and
          info.metadata == {"owner": "ray-sdk"} and info.start_time and info.end_time and
          info.driver_exit_code == 0, "get_job_info: Ray's JobDetails", info)
    logs = client.get_job_logs(job_id)
    check("line 3 of sdk" in logs, "get_job_logs returns the logs", logs)
    check(any(j.submission_id == job_id for j in client.list_jobs()), "list_jobs lists the job")

    message = expect_error(RuntimeError, client.submit_job, entrypoint="true",
                           submission_id=job_id)
    check("409" in message, "a second submission_id is refused (409)", message)
    message = expect_error(RuntimeError, client.submit_job, entrypoint="true",
                           runtime_env={"pip": ["requests"]})
    check("400" in message and "'pip'" in message and "_ray_commit" not in message,
          "runtime_env pip is refused naming pip", message)
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "script.py"), "w").close()
        message = expect_error(RuntimeError, client.submit_job, entrypoint="true",
                               runtime_env={"working_dir": tmp})
    check("400" in message and "working_dir" in message,
          "runtime_env working_dir (an upload to /api/packages) is refused naming it", message)

    long_id = client.submit_job(entrypoint="sleep 60")
    check(long_id.startswith("raysubmit_"), "submit_job without an id gets one")
    wait_status(client, long_id, {JobStatus.RUNNING})
    check(client.stop_job(long_id) is True, "stop_job on a running job: True")
    check(wait_status(client, long_id, TERMINAL) == JobStatus.STOPPED, "the job is STOPPED")
    check(client.stop_job(long_id) is False, "stop_job on a stopped job: False")

    check(client.delete_job(job_id) is True, "delete_job deletes a finished job")
    message = expect_error(RuntimeError, client.get_job_info, job_id)
    check("404" in message, "a deleted job is 404", message)


def cli():
    rc, out = ray_job(["submit", "--submission-id", "ray-cli-1", "--runtime-env-json",
                       '{"env_vars": {"RAY_TEST_NAME": "cli"}}', "--",
                       "sh", "-c", "echo hello from $RAY_TEST_NAME"])
    check(rc == 0 and "hello from cli" in out and "Job 'ray-cli-1' succeeded" in out,
          "`ray job submit` runs the job, tails its logs and reports it succeeded", out)
    rc, out = ray_job(["status", "ray-cli-1"], auth="headers")
    check(rc == 0 and "Job 'ray-cli-1' succeeded" in out,
          "`ray job status --headers` (the token in Authorization): succeeded", out)
    rc, out = ray_job(["logs", "ray-cli-1"], auth="file")
    check(rc == 0 and "hello from cli" in out,
          "`ray job logs` (the token from RAY_AUTH_TOKEN_PATH) prints the logs", out)
    rc, out = ray_job(["list"])
    check(rc == 0 and "submission_id='ray-cli-1'" in out, "`ray job list` lists the job", out)

    rc, out = ray_job(["submit", "--no-wait", "--submission-id", "ray-cli-long", "--",
                       "sleep", "60"])
    check(rc == 0 and "Job 'ray-cli-long' submitted successfully" in out,
          "`ray job submit --no-wait` returns at once", out)
    rc, out = ray_job(["stop", "ray-cli-long"])
    check(rc == 0 and "Job 'ray-cli-long' was stopped" in out,
          "`ray job stop` stops the job and waits until it is STOPPED", out)

    rc, out = ray_job(["submit", "--submission-id", "ray-cli-fails", "--",
                       "sh", "-c", "echo about to fail; exit 3"])
    check(rc == 1 and "about to fail" in out and "Job 'ray-cli-fails' failed" in out,
          "`ray job submit` of a failing job exits 1 naming it", out)
    rc, out = ray_job(["delete", "ray-cli-fails"])
    check(rc == 0 and "deleted successfully" in out, "`ray job delete` deletes it", out)

    rc, out = ray_job(["list"], auth="none")
    check(rc != 0 and "Authentication required" in out,
          "`ray job list` without a token: Ray's authentication error (401)", out)
    rc, out = ray_job(["list"], token="wrong-token")
    check(rc != 0 and "Authentication failed" in out,
          "`ray job list` with a wrong token: Ray's authentication error (403)", out)


def main():
    signal.signal(signal.SIGALRM, on_deadline)
    signal.alarm(DEADLINE_S)
    try:
        sdk()
        cli()
    except Exception as e:  # a client call that raised, or a deadline
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print("all Ray client calls answered", flush=True)


if __name__ == "__main__":
    main()
