"""Attacks on what localllm writes: a write cut short (``RLIMIT_FSIZE``), a FIFO, a symlink
or a directory where a file goes, the input named as the output, two writers at once.

Each test asserts on what is left on disk and on the error's kind, never on the prose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.trace.sidecars import TEMP_DIR
from tests.conftest import REPO, in_child

_SHA = "a" * 64


def _full_disk(body: str, limit: int) -> str:
    """``body`` run with at most ``limit`` bytes per file: a longer write fails with EFBIG
    (SIGXFSZ ignored), as it would on a full disk with ENOSPC."""
    return textwrap.dedent(
        f"""
        import json, os, resource, signal
        from pathlib import Path
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        """
    ) + textwrap.dedent(body)


def _hidden(directory: Path) -> list[str]:
    """Hidden names under ``directory`` but the sidecar directories' own temp directory."""
    return sorted(p.name for p in directory.rglob(".*") if p.name != TEMP_DIR)


# ------------------------------------------------------------------ a write cut short


@pytest.mark.parametrize("how", ["atomic_write", "create_durably", "write_prompt"])
def test_a_full_disk_leaves_no_temp_file_and_the_old_file(tmp_path: Path, how: str) -> None:
    d = tmp_path / "d"
    (d / "agent-prompts").mkdir(parents=True)
    old = d / "agent-prompts" / "old.txt"
    old.write_bytes(b"old\n")
    target = {"atomic_write": old, "create_durably": d / "agent-prompts" / "new.txt", "write_prompt": None}[how]
    got = in_child(
        _full_disk(
            f"""
            from localllm import _fs
            from localllm.errors import TraceError
            from localllm.trace import sidecars
            try:
                if {how!r} == "write_prompt":
                    sidecars.write_prompt({str(d)!r}, "c1", "x" * 3000, exclusive=True)
                elif {how!r} == "atomic_write":
                    _fs.atomic_write(Path({str(target)!r}), b"x" * 3000)
                else:
                    _fs.create_durably(Path({str(target)!r}), b"x" * 3000)
                print(json.dumps("written"))
            except (OSError, TraceError) as exc:
                print(json.dumps(type(exc).__name__))
            """,
            limit=1000,
        )
    )
    assert got in ("OSError", "TraceError")
    assert _hidden(d) == []  # the 1,000 bytes of temp file that did fit are gone
    assert old.read_bytes() == b"old\n"
    assert sorted(p.name for p in (d / "agent-prompts").iterdir() if p.name != TEMP_DIR) == ["old.txt"]


def test_a_full_disk_under_call_trace_leaves_no_temp_file(tmp_path: Path) -> None:
    app = _app(tmp_path)
    code = _full_disk(
        f"""
        import sys
        from localllm.cli import main
        os.chdir({str(app)!r})
        print(json.dumps(main(["call", "decide", "--config", "app.yaml", "--agent", "agent.local",
              "--cassette", "c.yaml", "--prompt", "x" * 3000, "--trace", "t/t.jsonl"])))
        """,
        limit=1000,
    )
    assert in_child(code) == 0  # the answer stands; the trace says what it could not keep
    assert _hidden(app / "t") == []
    assert main(["trace", "verify", str(app / "t" / "t.jsonl")]) == 0


# ------------------------------------------------------------------ -o naming the input


def _app(tmp_path: Path) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "verdict.json").write_text(
        json.dumps({"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}}, "required": ["verdict"]})
    )
    (app / "app.yaml").write_text(
        "app_id: my-app\nagent_plugins:\n  agent.local: {plugin: builtin.inprocess}\n"
        "gates:\n  judge:\n    invoke: host.agent.decide\n    agent: agent.local\n"
        "    with: {prompt: 'Judge {{ args.item }}', schema: verdict.json}\n"
    )
    (app / "c.yaml").write_text(
        "kind: host_cassette\nepisodes:\n  - id: ep-01\n    match: {handler: agent.local}\n"
        '    replay: any\n    agent: {verb: decide, response: \'{"verdict": "yes"}\'}\n'
    )
    return app


def _traced(tmp_path: Path) -> Path:
    app = _app(tmp_path)
    trace = app / "t" / "t.jsonl"
    argv = ["run", "judge", "--config", str(app / "app.yaml"), "--arg", "item=" + "y" * 2000]
    assert main([*argv, "--cassette", str(app / "c.yaml"), "--trace", str(trace)]) == 0
    return trace


@pytest.mark.parametrize("command", ["cassette", "cases"])
@pytest.mark.parametrize("target", ["itself", "symlink", "hardlink", "sidecar"])
def test_trace_output_never_replaces_the_trace_it_reads(
    tmp_path: Path, command: str, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _traced(tmp_path)
    sidecar = next(p for p in (trace.parent / "agent-prompts").iterdir() if p.is_file())
    before = {p: p.read_bytes() for p in (trace, sidecar)}
    out = {
        "itself": trace,
        "symlink": tmp_path / "link.jsonl",
        "hardlink": tmp_path / "hard.jsonl",
        "sidecar": sidecar,
    }[target]
    if target == "symlink":
        out.symlink_to(trace)
    elif target == "hardlink":
        os.link(trace, out)
    argv = ["trace", command, str(trace), "-o", str(out), "--json"] + (
        ["--gate", "judge"] if command == "cases" else []
    )
    capsys.readouterr()
    assert main(argv) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "usage_error"
    assert {p: p.read_bytes() for p in before} == before
    assert main(["trace", "verify", str(trace)]) == 0


def test_trace_cassette_still_writes_beside_the_trace(tmp_path: Path) -> None:
    trace = _traced(tmp_path)
    out = trace.parent / "c.yaml"
    assert main(["trace", "cassette", str(trace), "-o", str(out)]) == 0
    assert "episodes" in out.read_text()


# ------------------------------------------------------------------ the trace's .torn file


def _torn_trace(tmp_path: Path) -> Path:
    trace = _traced(tmp_path)
    with trace.open("ab") as fh:
        fh.write(b'{"turn":1,"seq":9,"ts":"2026')  # a crash mid-line
    return trace


def test_a_symlink_at_torn_is_never_appended_through(tmp_path: Path) -> None:
    from localllm.errors import TraceError
    from localllm.trace import TraceWriter

    trace = _torn_trace(tmp_path)
    before = trace.read_bytes()
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"user data\n")
    (trace.parent / "t.jsonl.torn").symlink_to(victim)
    with pytest.raises(TraceError):
        TraceWriter.open(trace)
    assert victim.read_bytes() == b"user data\n"
    assert trace.read_bytes() == before  # the torn line is not cut either: nothing kept it


@pytest.mark.parametrize("node", ["fifo", "directory"])
def test_a_fifo_or_directory_at_torn_fails_at_once(tmp_path: Path, node: str) -> None:
    trace = _torn_trace(tmp_path)
    before = trace.read_bytes()
    side = trace.parent / "t.jsonl.torn"
    os.mkfifo(side) if node == "fifo" else side.mkdir()
    got = in_child(
        f"""
        import json
        from localllm.errors import TraceError
        from localllm.trace import TraceWriter
        try:
            TraceWriter.open({str(trace)!r}).close()
            print(json.dumps("opened"))
        except TraceError as exc:
            print(json.dumps(type(exc).__name__))
        """,
        timeout=20,
    )
    assert got == "TraceError"
    assert trace.read_bytes() == before


# ------------------------------------------------------------------ the service log


@pytest.mark.parametrize("node", ["fifo", "symlink", "directory"])
def test_serve_detach_never_writes_its_log_through_a_link_or_a_fifo(tmp_path: Path, node: str) -> None:
    run = tmp_path / "cache" / "run"
    run.mkdir(parents=True, mode=0o700)
    log = run / "service.log"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"user data\n")
    makers: dict[str, Callable[[], None]] = {
        "fifo": lambda: os.mkfifo(log),
        "symlink": lambda: log.symlink_to(victim),
        "directory": log.mkdir,
    }
    makers[node]()
    got = in_child(
        f"""
        import json, os
        from pathlib import Path
        from localllm.errors import ServiceError
        from localllm.service import control

        def spawned(*args, **kwargs):
            raise SystemExit(json.dumps("spawned"))

        os.posix_spawn = spawned  # nothing is started either way
        try:
            control.detach([], cache_root=Path({str(tmp_path / "cache")!r}), wait=1)
        except ServiceError as exc:
            print(json.dumps(type(exc).__name__))
        """,
        timeout=20,
    )
    assert got == "ServiceError"
    assert victim.read_bytes() == b"user data\n"


# ------------------------------------------------------------------ the user's pins file


def test_concurrent_pins_keep_every_model(tmp_path: Path) -> None:
    pins = tmp_path / "cfg" / "pins.json"
    code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from localllm.managed.pins import add_user_model
        while time.time() < float(sys.argv[3]):
            pass
        add_user_model("m" + sys.argv[1], url=f"https://example.com/m{sys.argv[1]}.gguf", sha256="a" * 64,
                       path=Path(sys.argv[2]))
        """
    )
    import time

    start = str(time.time() + 2.0)  # every child past its imports, then all at once
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(i), str(pins), start], cwd=REPO, stderr=subprocess.PIPE)
        for i in range(8)
    ]
    for child in children:
        assert child.wait(timeout=60) == 0, child.stderr.read() if child.stderr else ""
        if child.stderr:
            child.stderr.close()
    assert sorted(json.loads(pins.read_text())["models"]["entries"]) == [f"m{i}" for i in range(8)]


def test_an_unwritable_pins_file_is_a_fetch_error_and_keeps_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "pins.json").write_text('{"format": 1, "models": {"entries": {}}}\n')
    got = in_child(
        _full_disk(
            f"""
            import io, sys
            os.environ["LOCALLLM_CONFIG_DIR"] = {str(cfg)!r}
            os.environ["LOCALLLM_CACHE_DIR"] = {str(tmp_path / "cache")!r}
            from localllm.cli import main
            out, sys.stdout = sys.stdout, io.StringIO()
            code = main(["fetch", "model", "--url", "https://example.com/m.gguf", "--sha256", {_SHA!r},
                         "--id", "m1", "--json"])
            doc, sys.stdout = json.loads(sys.stdout.getvalue()), out
            print(json.dumps([code, doc["kind"]]))
            """,
            limit=10,
        )
    )
    assert got == [1, "fetch_error"]
    assert (cfg / "pins.json").read_text() == '{"format": 1, "models": {"entries": {}}}\n'
    assert [p.name for p in cfg.iterdir() if p.name.endswith(".tmp")] == []


# ------------------------------------------------------------------ a release's files on disk


def test_a_release_marker_is_written_only_after_every_file_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localllm.managed.cache import MARKER, write_marker

    release = tmp_path / "release"
    release.mkdir()
    for name in ("llama-server", "libggml.so", "libllama.so"):
        (release / name).write_bytes(name.encode() * 100)
    (release / "libggml.so.0").symlink_to("libggml.so")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not (release / MARKER).exists():  # before the marker vouches for them
            synced.append(os.path.basename(path))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_marker(release, {"kind": "prebuilt"})
    assert {"llama-server", "libggml.so", "libllama.so"} <= set(synced)


def test_a_transcript_cut_short_leaves_no_timings_behind(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    got = in_child(
        _full_disk(
            f"""
            from localllm.errors import TraceError
            from localllm.trace import sidecars
            from localllm.wire import Transcript
            lines = ["x" * 200 for _ in range(20)]  # 4 KB: past the limit; the timings fit
            try:
                sidecars.write_transcript({str(d)!r}, "c1", Transcript("claude-stream-json", lines, list(range(20))),
                                          exclusive=True)
                print(json.dumps("written"))
            except TraceError as exc:
                print(json.dumps(type(exc).__name__))
            """,
            limit=1000,
        )
    )
    assert got == "TraceError"
    assert sorted(p.name for p in d.rglob("*") if p.is_file()) == []


@pytest.mark.parametrize("where", ["agent-prompts", "transcripts"])
def test_a_file_where_a_sidecar_directory_goes_is_not_a_taken_name(tmp_path: Path, where: str) -> None:
    from localllm import _fs

    blocker = tmp_path / where
    blocker.write_bytes(b"user data\n")
    with pytest.raises(NotADirectoryError):  # not FileExistsError: that means "the name is taken"
        _fs.create_durably(blocker / "c1.txt", b"x")
    assert blocker.read_bytes() == b"user data\n"


def test_a_file_named_agent_prompts_costs_the_sidecar_not_the_answer(tmp_path: Path) -> None:
    from localllm.trace import read_trace

    app = _app(tmp_path)
    trace = app / "t" / "t.jsonl"
    (app / "t").mkdir()
    (app / "t" / "agent-prompts").write_bytes(b"user data\n")
    argv = ["call", "decide", "--config", str(app / "app.yaml"), "--agent", "agent.local"]
    assert main([*argv, "--cassette", str(app / "c.yaml"), "--prompt", "y" * 3000, "--trace", str(trace)]) == 0
    assert [ev.kind for ev in read_trace(trace).events] == ["agent.call.start", "agent.call.complete"]
    assert "trace_error" in read_trace(trace).events[1].payload
    assert (app / "t" / "agent-prompts").read_bytes() == b"user data\n"


@pytest.mark.parametrize("node", ["fifo", "symlink"])
def test_the_source_build_log_is_never_a_fifo_or_a_link(tmp_path: Path, node: str) -> None:
    log = tmp_path / "build.log"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"user data\n")
    os.mkfifo(log) if node == "fifo" else log.symlink_to(victim)
    got = in_child(
        f"""
        import json
        from pathlib import Path
        from localllm.errors import BuildError
        from localllm.managed.source_build import _run_logged
        try:
            _run_logged(["true"], Path({str(log)!r}), cwd=Path({str(tmp_path)!r}))
            print(json.dumps("ran"))
        except BuildError as exc:
            print(json.dumps(type(exc).__name__))
        """,
        timeout=20,
    )
    assert got == "BuildError"
    assert victim.read_bytes() == b"user data\n"


def test_open_append_takes_a_regular_file_only(tmp_path: Path) -> None:
    from localllm import _fs

    fd = _fs.open_append(tmp_path / "new.log")
    os.write(fd, b"a\n")
    os.close(fd)
    assert (tmp_path / "new.log").read_bytes() == b"a\n"
    (tmp_path / "link").symlink_to(tmp_path / "new.log")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("link", "fifo", "dir"):
        with pytest.raises(_fs.NotRegular):
            _fs.open_append(tmp_path / name)
    assert (tmp_path / "new.log").read_bytes() == b"a\n"


def test_temp_files_of_a_killed_sidecar_writer_are_swept_when_the_trace_is_reopened(tmp_path: Path) -> None:
    trace = _traced(tmp_path)
    prompts = trace.parent / "agent-prompts"
    kept = {p.name: p.read_bytes() for p in prompts.iterdir() if p.is_file()}
    temps = prompts / TEMP_DIR
    stale = temps / ".c9.txt.4242.0badc0de.tmp"  # a writer SIGKILLed before its link
    fresh = temps / ".c8.txt.4243.0badc0df.tmp"  # a writer that may be writing now
    other = temps / ".notes.tmp"  # not a name localllm makes
    for path in (stale, fresh, other):
        path.write_bytes(b"partial")
    os.utime(stale, (0, 0))
    os.utime(other, (0, 0))
    app = trace.parent.parent
    argv = ["run", "judge", "--config", str(app / "app.yaml"), "--arg", "item=z"]
    assert main([*argv, "--cassette", str(app / "c.yaml"), "--trace", str(trace)]) == 0
    assert not stale.exists()
    assert fresh.exists() and other.exists()
    assert {name: (prompts / name).read_bytes() for name in kept} == kept


def test_a_sidecar_directory_linked_out_of_the_trace_directory_is_never_written_through(tmp_path: Path) -> None:
    from localllm.trace import read_trace

    app = _app(tmp_path)
    trace = app / "t" / "t.jsonl"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (app / "t").mkdir()
    (app / "t" / "agent-prompts").symlink_to(elsewhere)
    argv = ["call", "decide", "--config", str(app / "app.yaml"), "--agent", "agent.local"]
    assert main([*argv, "--cassette", str(app / "c.yaml"), "--prompt", "y" * 3000, "--trace", str(trace)]) == 0
    assert list(elsewhere.iterdir()) == []
    assert "trace_error" in read_trace(trace).events[1].payload
    assert main(["trace", "verify", str(trace)]) == 0  # what the recorder writes, its verifier accepts


def test_a_directory_where_a_model_goes_is_named_before_any_source_is_tried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hashlib

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "m.gguf").write_bytes(b"GGUF" + bytes(1000))
    sha = hashlib.sha256((mirror / "m.gguf").read_bytes()).hexdigest()
    monkeypatch.setenv("LOCALLLM_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # the mirror alone: no network in a unit test
    blocker = tmp_path / "cache" / "models" / "m1" / sha[:16] / "m.gguf"
    blocker.mkdir(parents=True)
    (blocker / "keep").write_bytes(b"user data\n")
    argv = ["fetch", "model", "--url", "https://example.com/m.gguf", "--sha256", sha, "--id", "m1"]
    assert main([*argv, "--mirror", str(mirror), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "fetch_error"
    assert str(blocker) in doc["detail"] and str(mirror) not in doc["detail"]  # not blamed on the source
    assert (blocker / "keep").read_bytes() == b"user data\n"
