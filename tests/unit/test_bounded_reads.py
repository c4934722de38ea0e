"""Every file a user names is read bounded: ``/dev/zero`` as a config, schema, prompt or trace
took all 24 GiB of the machine before the OOM killer came (30–50 s), and a 3 GiB file given as
a prompt grew the process to 23 GiB. Now a device is refused and each input has its limit.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localllm._fs import Unreadable, read_capped

REPO = Path(__file__).resolve().parents[2]


def test_a_device_is_refused_and_a_file_or_pipe_read_up_to_the_limit(tmp_path: Path) -> None:
    with pytest.raises(Unreadable, match="is a device"):
        read_capped(Path("/dev/zero"), None)
    small = tmp_path / "small"
    small.write_bytes(b"x" * 10)
    assert read_capped(small, 10) == b"x" * 10
    with pytest.raises(Unreadable, match="larger than 9 bytes"):
        read_capped(small, 9)
    sparse = tmp_path / "sparse"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 40)  # refused by its size: not a byte read
    with pytest.raises(Unreadable, match="larger than"):
        read_capped(sparse, 1 << 20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed(data: bytes) -> None:
        with open(fifo, "wb") as fh:
            fh.write(data)

    for data, limit, ok in ((b"y" * 100, 100, True), (b"y" * 101, 100, False)):
        writer = threading.Thread(target=feed, args=(data,), daemon=True)
        writer.start()
        if ok:
            assert read_capped(fifo, limit) == data  # `--prompt-file <(…)` keeps working
        else:
            with pytest.raises(Unreadable):
                read_capped(fifo, limit)
        writer.join(5)


def _limited() -> None:
    # 1 GiB of address space: before the fix each command read until MemoryError (or, without
    # the limit, until the machine's OOM killer)
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "/dev/zero"],
        ["grammar", "check", "/dev/zero"],
        ["trace", "verify", "/dev/zero"],
        ["trace", "show", "/dev/zero"],
        ["call", "extract", "-c", "{cfg}", "--agent", "agent.x", "--prompt-file", "/dev/zero"],
    ],
)
def test_dev_zero_as_any_input_is_a_one_line_error(tmp_path: Path, argv: list[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9'}\n")
    argv = [a.format(cfg=cfg) for a in argv]
    done = subprocess.run(
        [sys.executable, "-m", "localllm", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        check=False,
    )
    assert done.returncode in (1, 2), done.stderr
    assert "is a device, not a file" in done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr


def test_a_schema_that_is_not_a_file_is_not_called_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localllm.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("agent_plugins:\n  agent.x: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:9'}\n")
    base = ["call", "extract", "-c", str(cfg), "--agent", "agent.x", "--prompt", "hi", "--schema"]
    assert main([*base, "/dev/zero"]) == 2
    assert "--schema /dev/zero: not a regular file" in capsys.readouterr().err  # was "file not found"
    assert main([*base, str(tmp_path / "absent.json")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_a_device_as_the_trace_to_append_to_is_refused() -> None:
    script = (
        "from localllm.trace import TraceWriter\n"
        "from localllm.errors import TraceError\n"
        "try:\n    TraceWriter.open('/dev/zero')\n"
        "except TraceError as exc:\n    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,  # before: it read /dev/zero back until MemoryError
        check=False,
    )
    assert done.returncode == 0 and "refused:" in done.stdout and "not a regular file" in done.stdout, done.stderr


def test_a_directory_is_named_by_its_path_not_a_descriptor(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as info:
        read_capped(tmp_path, 10)  # before (b46936e): "[Errno 21] Is a directory: 3"
    assert info.value.filename == str(tmp_path)
