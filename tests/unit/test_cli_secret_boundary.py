"""Attack: a server that echoes the bearer key in its 401/500 body (issue 25a).

Every CLI command that can reach a server is driven to its error path against one that
echoes the ``Authorization`` header back; the key must appear in no byte of stdout or
stderr, in text or ``--json`` mode. The masking is one boundary (``cli.output.masked_output``),
so a new command path is covered without a per-site redaction.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from localllm.cli import main
from localllm.cli.app import COMMANDS

KEY = "sk-echo-7f3a9c1e5b2d"


class _Echo(BaseHTTPRequestHandler):
    status = 401

    def do_GET(self) -> None:
        self._echo()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._echo()

    def _echo(self) -> None:
        auth = self.headers.get("Authorization") or ""
        body = json.dumps(
            {"error": {"message": f"invalid key: {auth} (token {auth.split(' ')[-1]})", "type": "auth"}}
        ).encode()
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=[401, 500])
def echo(request: pytest.FixtureRequest) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.status = request.param  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "corpus.txt").write_text("alpha beta gamma\n")
    (tmp_path / "cases.jsonl").write_text(json.dumps({"id": "c1", "args": {}, "expect": {}}) + "\n")
    cfg = tmp_path / "app.yaml"
    cfg.write_text(
        "agent_plugins:\n"
        f"  agent.remote: {{plugin: builtin.local_llm, endpoint: '{url}', api_key_env: ECHO_KEY, fallback: none}}\n"
        "embedders:\n"
        f"  docs: {{endpoint: '{url}', model: all-minilm-l6-v2, api_key_env: ECHO_KEY}}\n"
        "intents:\n"
        "  greet: {examples: ['hello there']}\n"
        "  leave: {examples: ['goodbye now']}\n"
        "router: {embedder: docs, agent: agent.remote}\n"
        "gates:\n"
        "  g: {invoke: host.agent.decide, agent: agent.remote, with: {prompt: pick one}}\n"
    )
    return cfg


def _argvs(cfg: Path, tmp_path: Path) -> dict[str, list[str]]:
    c = str(cfg)
    return {
        "call": ["call", "decide", "--config", c, "--agent", "agent.remote", "--prompt", "pick"],
        "run": ["run", "g", "--config", c],
        "embed": ["embed", "--config", c, "--embedder", "docs", "some text"],
        "search": ["search", "beta", "--config", c, "--embedder", "docs", "--corpus", str(tmp_path / "corpus.txt")],
        "route": ["route", "hello", "--config", c],
        "eval": ["eval", "g", "--config", c, "--cases", str(tmp_path / "cases.jsonl"), "--out", str(tmp_path / "ev")],
    }


#: commands that never contact a configured server (nothing to echo a key)
OFFLINE = {
    "check",
    "fetch",
    "cache",
    "doctor",
    "models",
    "grammar",
    "plugins",
    "trace",
    "serve",
    "ps",
    "stop",
    "logs",
    "version",
    "help",
    "completion",
}


def test_every_command_is_either_driven_or_offline(tmp_path: Path) -> None:
    assert set(COMMANDS) == OFFLINE | set(_argvs(tmp_path / "c", tmp_path))


@pytest.mark.parametrize("command", sorted(_argvs(Path("c"), Path("t"))))
@pytest.mark.parametrize("as_json", [False, True])
def test_an_echoed_key_never_reaches_the_terminal(
    tmp_path: Path,
    echo: str,
    command: str,
    as_json: bool,
    *,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ECHO_KEY", KEY)
    argv = _argvs(_config(tmp_path, echo), tmp_path)[command]
    if as_json and command not in ("embed",):
        argv.append("--json")
    code = main(argv)
    out, err = capfd.readouterr()
    assert code != 0 or command == "eval", (out, err)  # eval reports a failed case and exits 0
    assert KEY not in out + err
    assert out + err  # the failure was reported
    for written in (tmp_path / "ev").rglob("*"):  # eval's report files too
        if written.is_file():
            assert KEY not in written.read_text(errors="replace"), written


@pytest.mark.parametrize("as_json", [False, True])
def test_a_refusal_always_has_a_message(
    tmp_path: Path, as_json: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal whose exception carries no text (a checksum error raised bare) still
    prints what refused and why (issue 24.3: a corrupt mirror copy exited 1 with no message)."""
    from localllm.cli import foundation
    from localllm.errors import DownloadFailed

    def refuse(path: Path) -> Any:
        try:
            raise OSError("mirror copy is corrupt")
        except OSError as exc:
            raise DownloadFailed("") from exc

    monkeypatch.setattr(foundation, "load", refuse)
    code = main(["check", str(tmp_path / "x.yaml"), *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 1
    text = json.loads(out)["detail"] if as_json else err
    assert "download failed" in text and "mirror copy is corrupt" in text
