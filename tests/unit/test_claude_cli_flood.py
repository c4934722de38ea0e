"""Attack: a claude CLI that floods stdout (issue 25d).

200 MiB of well-formed stream events: the call fails as ``plugin_crash`` at the 64 MiB cap,
and memory stays bounded while it reads (stdout is read incrementally; only the first
:data:`_TRANSCRIPT_KEEP` bytes of lines are kept), measured as the peak RSS growth of this
process during the call, sampled every 5 ms.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import psutil
import pytest

from localllm.agents import claude_cli
from localllm.agents.claude_cli import ClaudeCliAgent
from localllm.config import ClaudeCliDecl
from localllm.errors import AgentError, ErrorKind
from tests.unit.agents_fixtures.helpers import ask_request, deadline

FLOOD = """#!{python}
import json, os, sys
sys.stdin.read()
line = (json.dumps({{"type": "assistant", "message": {{"content": [{{"type": "text", "text": "x" * 1000}}]}}}}) + "\\n").encode()
block = line * 1024
written = 0
out = sys.stdout.buffer
try:
    while written < 200 * 1024 * 1024:
        out.write(block)
        written += len(block)
    out.flush()
finally:
    open({record!r}, "w").write(str(written))
"""


def test_a_stdout_flood_is_cut_at_the_cap_with_bounded_memory(tmp_path: Path) -> None:
    binary = tmp_path / "claude"
    binary.write_text(FLOOD.format(python=sys.executable, record=str(tmp_path / "written")))
    binary.chmod(0o755)
    agent = ClaudeCliAgent(ClaudeCliDecl(alias="agent.claude", plugin="builtin.claude_cli", claude_bin=str(binary)))
    me = psutil.Process()
    base = me.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], me.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with pytest.raises(AgentError) as info:
            agent.ask(ask_request("hi"), deadline=deadline(60))
    finally:
        stop.set()
        sampler.join()
        agent.close()
    assert info.value.kind is ErrorKind.PLUGIN_CRASH and "more than" in info.value.detail
    grown = (peak[0] - base) / 2**20
    print(f"claude flood: RSS +{grown:.1f} MiB")
    assert grown < 40, f"RSS grew {grown:.0f} MiB reading a flood cut at {claude_cli._MAX_STDOUT >> 20} MiB"


def test_transcript_keeps_a_bounded_head_and_counts_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claude_cli, "_TRANSCRIPT_KEEP", 100)
    out = claude_cli._Output()
    for _ in range(10):
        out.add(b'{"type": "assistant", "n": 12345678901234567890}', 0.0)
    out.add(b'{"type": "result", "result": "ok"}', 0.0)
    assert out.result == {"type": "result", "result": "ok"}
    assert out.elided == 8 and len(out.lines) == 3 and json.loads(out.lines[-1][0])["type"] == "result"
