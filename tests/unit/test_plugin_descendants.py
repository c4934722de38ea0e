"""Attack: a subprocess plugin's grandchildren must not outlive a deadline or close (issue 25b).

The plugin starts ``sleep`` children — one in its process group, one in a session of its
own (``start_new_session``, out of reach of a group kill) — then hangs past the deadline, or
answers and is closed. Afterwards no descendant is left running.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from localllm import Runtime, load_config
from localllm.errors import AgentError, ErrorKind

PLUGIN = """
import json, subprocess, sys, time
pids = sys.argv[1]
for line in sys.stdin:
    req = json.loads(line)
    a = subprocess.Popen(["sleep", "300.25"])
    b = subprocess.Popen(["sleep", "301.25"], start_new_session=True)
    c = subprocess.Popen([sys.executable, "-c", "import subprocess,time; subprocess.Popen(['sleep','302.25'], start_new_session=True); time.sleep(300)"])
    time.sleep(0.5)
    open(pids, "w").write(json.dumps([a.pid, b.pid, c.pid]))
    if req["params"]["prompt"] == "hang":
        time.sleep(300)
    result = {"submission": {"ok": True}}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}) + "\\n")
    sys.stdout.flush()
"""


def _running_descendants_of(pids: list[int], started: float) -> list[int]:
    """Which of the plugin's processes (and their children) still run."""
    alive = []
    for proc in psutil.process_iter(["pid", "create_time", "status", "cmdline"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE or info["create_time"] < started - 1:
            continue
        if info["cmdline"] and info["cmdline"][0] == "sleep" and info["cmdline"][1] in ("300.25", "301.25", "302.25"):
            alive.append(info["pid"])
    alive += [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return sorted(set(alive))


def _runtime(tmp_path: Path) -> Runtime:
    (tmp_path / "plug.py").write_text(PLUGIN)
    (tmp_path / "app.yaml").write_text(
        "agent_plugins:\n"
        f"  agent.plug: {{plugin: subprocess, command: {json.dumps(sys.executable)}, "
        f"args: [{json.dumps(str(tmp_path / 'plug.py'))}, {json.dumps(str(tmp_path / 'pids.json'))}]}}\n"
    )
    return Runtime(load_config(tmp_path / "app.yaml"))


def _settle(pids: list[int], started: float) -> list[int]:
    end = time.monotonic() + 5
    left = _running_descendants_of(pids, started)
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = _running_descendants_of(pids, started)
    return left


def test_no_descendant_survives_the_deadline(tmp_path: Path) -> None:
    started = time.time()
    with _runtime(tmp_path) as rt:
        with pytest.raises(AgentError) as info:
            rt.call("ask", agent="agent.plug", prompt="hang", timeout=2.0)
        assert info.value.kind is ErrorKind.DEADLINE_EXCEEDED
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert len(pids) == 3
        assert _settle(pids, started) == []  # before close: the deadline alone killed them all


def test_no_descendant_survives_close(tmp_path: Path) -> None:
    started = time.time()
    with _runtime(tmp_path) as rt:
        assert rt.call("ask", agent="agent.plug", prompt="go").submission == {"ok": True}
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert len(_running_descendants_of(pids, started)) >= 4  # three children and a grandchild run
    assert _settle(pids, started) == []
