"""reproduce.sh run so that nothing it starts outlives it, and nothing happens after the limit.

A time limit enforced by signalling the script's process group (coreutils `timeout`) misses what
left the group: a `setsid` writer kept writing after the limit, and its files were credited in
the executed snapshot; a fork bomb outlived a script that exited 0 and was recorded a success.
So the script runs under a guard (`GUARD`), its parent in the workspace, which, when the script
ends or the limit is reached (whichever is first), stops every other process of the workspace's
user at once (`kill(-1, SIGSTOP)`: one call, which the kernel applies while no process can fork,
so none escapes), kills those that were not there before the run, and lets the workspace's own
processes (its main process, the exec's `timeout`) go on. Only then is the submission captured:
what it holds was written within the limit (a file written after the limit, while the guard
waited to be scheduled, is removed).

The guard runs as the workspace's user: a workspace has `no-new-privileges`, under which an exec
as root gets no capabilities (measured: dockerd 20.10 gives it none, and a privileged exec is
refused), so root could not signal the user's processes anyway. The user's processes can signal
the guard in turn; they cannot read or trace it (it makes itself non-dumpable). The guard's record
(`RECORD_PREFIX`, JSON) is the last line of the run's output, written after every other process
of the user was stopped, and its exec exits 0 only when the guard got there: a run that kills its
guard (or the kernel's OOM killer doing so) ends otherwise, and `scoring.reproduction` then
restarts the workspace, which stops everything, and records how the exec ended.

The record says the script's exit status, whether the limit stopped it, how many processes it left
behind, and whether the workspace's process limit was reached during the run (its cgroup's
`pids.events`, v1 or v2): a run that hit it (a fork bomb) is a failure whatever its exit status.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ValidationError

# Starts each line of the guard's record (the last line of a guarded run's output).
RECORD_PREFIX = "[baseline] guard record: "

# The guard: argv limit in seconds, the shell script to run.
GUARD = r"""
import ctypes, json, os, signal, sys, time
ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE 0: the run cannot read or trace the guard
limit, script = float(sys.argv[1]), sys.argv[2]
me = os.getpid()
def processes():
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 19 and fields[0] != b"Z":  # a zombie is dead already, only unreaped
            found[int(name)] = fields[19]  # its start time: a reused PID is another process
    return found
def limit_events():
    for path in ("/sys/fs/cgroup/pids.events", "/sys/fs/cgroup/pids/pids.events"):
        try:
            with open(path) as events:
                for line in events:
                    key, _, value = line.partition(" ")
                    if key == "max":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
def say(text):
    os.write(1, f"\n[baseline] {text}\n".encode())
def signal_all(number):
    try:
        os.kill(-1, number)  # every process this user may signal but PID 1 and this one, at once
    except ProcessLookupError:  # there is none
        pass
before = processes()
events_before = limit_events()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
started = time.monotonic()
wall_deadline = time.time() + limit
child = os.fork()
if child == 0:
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        os.execvp("bash", ["bash", "-c", script])
    finally:
        os._exit(127)
deadline = started + limit
status, timed_out = None, False
while status is None:
    done, code = os.waitpid(child, os.WNOHANG)
    if done:
        status = code
        break
    left = deadline - time.monotonic()
    if left <= 0:
        timed_out = True
        break
    signal.sigtimedwait([signal.SIGCHLD], left)
ended = time.monotonic()
killed = set()
for sweep in range(50):
    signal_all(signal.SIGSTOP)
    strays = [pid for pid, start in processes().items() if before.get(pid) != start]
    if not strays:
        break
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        except ProcessLookupError:
            pass
    signal_all(signal.SIGCONT)  # the killed die; the workspace's own processes go on
late = 0
if timed_out:
    # The stop comes as soon as the guard is scheduled after the limit, which on a busy machine
    # is tens of ms late: whatever the run wrote meanwhile is removed (its processes are stopped).
    for folder, _, names in os.walk(".", followlinks=False):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if os.lstat(path).st_mtime > wall_deadline:
                    os.remove(path)
                    late += 1
            except OSError:
                pass
signal_all(signal.SIGCONT)
if status is None:
    status = os.waitpid(child, 0)[1]
events_after = limit_events()
reached = events_before is not None and events_after is not None and events_after > events_before
left_behind = len(killed - {child})
if timed_out:
    say(f"the time limit ({round(limit, 1):g} s) was reached: reproduce.sh and every process it "
        f"started ({left_behind} besides it) were stopped and killed")
elif left_behind:
    say(f"reproduce.sh ended leaving {left_behind} process(es) running; they were stopped and "
        "killed before the submission was captured")
if late:
    say(f"{late} file(s) written after the limit, before every process was stopped, were removed")
if reached:
    say("the workspace's process limit was reached during the run (too many processes at once)")
code = os.waitstatus_to_exitcode(status)
exit_code = None if timed_out else (128 - code if code < 0 else code)  # killed: 128 + signal
record = dict(exit_code=exit_code, timed_out=timed_out, duration_s=ended - started,
              stray_processes=left_behind, process_limit_reached=reached)
os.write(1, ("\n" + sys.argv[3] + json.dumps(record) + "\n").encode())
"""


class GuardedRun(BaseModel):
    """How one guarded run of reproduce.sh went, as the guard recorded it."""

    exit_code: int | None
    timed_out: bool
    duration_s: float
    stray_processes: int = 0
    process_limit_reached: bool = False


def command(script: str, limit_s: float) -> list[str]:
    """The guard's command line (run as the workspace's user) for `script`."""
    return ["python3", "-I", "-S", "-c", GUARD, repr(limit_s), script, RECORD_PREFIX]


def parse_record(output_tail: bytes) -> GuardedRun | None:
    """The guard's record: the last line of a run's output when it starts with `RECORD_PREFIX`
    (None when it does not: the guard did not finish)."""
    lines = output_tail.rstrip(b"\n").rsplit(b"\n", 1)
    last = lines[-1].decode("utf-8", errors="replace")
    if not last.startswith(RECORD_PREFIX):
        return None
    try:
        return GuardedRun.model_validate(json.loads(last[len(RECORD_PREFIX) :]))
    except (ValueError, ValidationError):
        return None
