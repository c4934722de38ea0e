"""Reference ``subprocess`` agent: JSON-RPC 2.0 ``agent.ask`` over stdio, one frame a line.

The prompt picks the behaviour, so one process can misbehave on one call and answer the
next (the ``command:`` of a test declaration is ``sys.executable`` + this file):

    echo (anything else)  answer {"echo": prompt, "call_id", "pid", "calls"}
    crash                 write to stderr, exit 3 before answering
    partial               write half a frame (no newline), exit 0
    slow:<seconds>        sleep, then answer
    stderr:<kib>          write <kib> KiB of stderr chatter, then answer
    wrongid               answer with the wrong id
    noise                 print non-frame lines to stdout, then answer
    notify                send a notification frame (no id) before the answer
    rpcerror              answer with a JSON-RPC error object
    badresult             answer with a result that is not an object
    garbage               write a line that starts like a frame but is not JSON
    deep                  write a frame nested deeper than Python's JSON decoder goes
    env:<NAME>            answer {"value": os.environ.get(NAME), "cwd": os.getcwd()}
    hang                  never answer
    leak:<NAME>           print $NAME to stderr and stdout (noise), then exit 5

``--crash-on-start`` exits 2 at once with a stderr message; ``--banner`` prints a
non-frame line before reading anything; ``--linger`` keeps running after stdin closes
(so close() must SIGTERM); ``--ignore-term`` also ignores SIGTERM (close() must SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    if "--crash-on-start" in sys.argv:
        sys.stderr.write("fatal: cannot load model weights\n")
        return 2
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--banner" in sys.argv:
        print("jsonrpc_agent ready", flush=True)
    calls = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        calls += 1
        rid = req["id"]
        params = req["params"]
        prompt: str = params["prompt"]
        result = {
            "submission": {"echo": prompt, "call_id": params["call_id"], "pid": os.getpid(), "calls": calls},
            "meta": {"agent": "jsonrpc_agent"},
        }
        if prompt == "crash":
            sys.stderr.write("panic: something broke in the agent\n")
            sys.stderr.flush()
            os._exit(3)
        elif prompt == "partial":
            sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {rid}, "resu')
            sys.stdout.flush()
            os._exit(0)
        elif prompt.startswith("slow:"):
            time.sleep(float(prompt.split(":", 1)[1]))
        elif prompt.startswith("stderr:"):
            chunk = "chatter " * 127 + "\n"  # 1 KiB a line
            for _ in range(int(prompt.split(":", 1)[1])):
                sys.stderr.write(chunk)
            sys.stderr.write("last stderr line\n")
            sys.stderr.flush()
        elif prompt == "wrongid":
            send({"jsonrpc": "2.0", "id": rid + 1000, "result": result})
            continue
        elif prompt == "noise":
            print("debug: thinking about it", flush=True)
            print("debug: still thinking", flush=True)
        elif prompt == "notify":
            send({"jsonrpc": "2.0", "method": "agent.progress", "params": {"pct": 50}})
        elif prompt == "rpcerror":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "agent refused the task"}})
            continue
        elif prompt == "badresult":
            send({"jsonrpc": "2.0", "id": rid, "result": 42})
            continue
        elif prompt == "garbage":
            sys.stdout.write('{"jsonrpc": "2.0", "id": oops}\n')
            sys.stdout.flush()
            continue
        elif prompt == "deep":
            sys.stdout.write(f'{{"jsonrpc": "2.0", "id": {rid}, "result": {"[" * 100_000}}}\n')
            sys.stdout.flush()
            continue
        elif prompt.startswith("env:"):
            name = prompt.split(":", 1)[1]
            result = {"submission": {"value": os.environ.get(name), "cwd": os.getcwd()}}
        elif prompt == "hang":
            time.sleep(3600)
        elif prompt.startswith("leak:"):
            value = os.environ.get(prompt.split(":", 1)[1], "")
            print(f"token is {value}", flush=True)
            sys.stderr.write(f"auth failed with token {value}\n")
            sys.stderr.flush()
            os._exit(5)
        send({"jsonrpc": "2.0", "id": rid, "result": result})
    if "--linger" in sys.argv or "--ignore-term" in sys.argv:
        time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
