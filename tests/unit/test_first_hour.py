"""A newcomer's first-hour mistakes: each is one clear error naming the key or variable and
the fix, with the documented exit code, before anything is sent or started."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from localllm import Runtime, load_config
from localllm.cli import main
from localllm.config import EmbedderDecl
from localllm.errors import AgentError, ConfigError, EmbedError, ErrorKind

# -- an endpoint: copied from an API's docs, operation and all -----------------------------


def _problems(path: Path) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return {p.key: p.hint for p in info.value.problems}


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8080/v1/chat/completions", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1/chat/completions/", "http://127.0.0.1:8080/v1"),
        ("https://api.example.com/openai/v1/embeddings", "https://api.example.com/openai/v1"),
        ("http://127.0.0.1:8080/completions", "http://127.0.0.1:8080"),
    ],
)
def test_an_endpoint_naming_an_api_operation_is_a_load_problem(tmp_path: Path, url: str, base: str) -> None:
    """It loaded, and every call then went to ``…/v1/chat/completions/v1/chat/completions``: a 404."""
    config = tmp_path / "app.yaml"
    config.write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, endpoint: '{url}'}}\n"
        f"embedders:\n  docs: {{endpoint: '{url}', model: all-minilm-l6-v2}}\n"
    )
    problems = _problems(config)
    assert set(problems) == {"agent_plugins.agent.local.endpoint", "embedders.docs.endpoint"}
    assert all(hint.startswith(f"endpoint: {base} ") for hint in problems.values())


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/"])
def test_an_endpoint_root_or_v1_still_loads(tmp_path: Path, url: str) -> None:
    config = tmp_path / "app.yaml"
    config.write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, endpoint: '{url}'}}\n"
        "  agent.mcp: {plugin: mcp_http, endpoint: 'http://127.0.0.1:7301/v1/models'}\n"  # MCP URLs are whole
        f"embedders:\n  docs: {{endpoint: '{url}', model: all-minilm-l6-v2}}\n"
    )
    loaded = load_config(config)
    assert loaded.embedders["docs"].endpoint == url


# -- api_key_env holding a key pasted with its newline, a space or a typographic dash --------

BAD_KEYS = ["sk-secret-123\n", " sk-secret-123", "sk secret 123", "sk\u2013secret\u2013123", "sk-secret\x07123"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("key", BAD_KEYS)
def test_an_unsendable_key_names_its_variable_and_sends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """Before: "local protocol error (Illegal header value …)", or for a non-ASCII key
    "cannot start llama-server: 'ascii' codec …" from an endpoint agent that starts nothing."""
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.glm:\n    plugin: builtin.local_llm\n"
        f"    endpoint: http://127.0.0.1:{_closed_port()}\n    api_key_env: GLM_KEY\n    fallback: none\n"
    )
    monkeypatch.setenv("GLM_KEY", key)
    with Runtime(load_config(config)) as rt, pytest.raises(AgentError) as info:
        rt.call("ask", agent="agent.glm", prompt="p")
    error = info.value
    assert error.kind is ErrorKind.TRANSPORT_ERROR
    assert "GLM_KEY" in error.detail and "GLM_KEY" in error.hint
    assert "llama-server" not in error.detail  # nothing was to be started
    assert "secret" not in error.detail + error.hint


@pytest.mark.parametrize("key", BAD_KEYS)
def test_an_embedder_refuses_an_unsendable_key_before_any_request(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    from localllm.embed.local import embedder_from_decl

    monkeypatch.setenv("EMBED_KEY", key)
    decl = EmbedderDecl(name="docs", endpoint="http://127.0.0.1:9", model="all-minilm-l6-v2", api_key_env="EMBED_KEY")
    with pytest.raises(EmbedError) as info:
        embedder_from_decl(decl)
    assert "EMBED_KEY" in str(info.value) and "secret" not in str(info.value) + info.value.hint


def test_serve_refuses_an_unsendable_token_as_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the service started with a token no client could ever send."""
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # the old code went on to fetch llama-server
    monkeypatch.setenv("SERVE_KEY", "tok-123\n")
    assert main(["serve", "--api-key-env", "SERVE_KEY", "--port", "0", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "usage_error" and "SERVE_KEY" in doc["detail"]


# -- serve on a port something else holds ----------------------------------------------------


def test_serve_says_the_port_is_busy_before_fetching_llama_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a busy port was found only after llama-server was fetched (or its fetch
    failed): offline, the error was the missing server and the port went unmentioned."""
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # nothing cached: any fetch fails at once
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "service_error" and f"127.0.0.1:{port}" in doc["detail"]


def test_an_offline_missing_server_offers_each_way_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hint said "pre-warm the cache with `localllm fetch server` on a connected machine"
    twice: once from the offline miss, once more in the source-build alternative."""
    from localllm.errors import OfflineArtifactMissing
    from localllm.managed import ensure_server

    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    with pytest.raises(OfflineArtifactMissing) as info:
        ensure_server()
    hint = info.value.hint
    assert hint.count("`localllm fetch server`") == 1 and hint.count("--from-source") == 1


# -- a prompt: path with a typo, or without its suffix ------------------------------------


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ("prompts/triage", True),
        ("prompts", True),
        ("prompts/", True),
        ("yes/no?", False),
        ("Say hi", False),
        ("triage", False),
    ],
)
def test_a_prompt_path_that_names_no_file_is_a_load_problem(tmp_path: Path, prompt: str, problem: bool) -> None:
    """``prompt: prompts/triage`` (the file is triage.md) loaded as inline text: the model was
    asked "prompts/triage" and answered it."""
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "triage.md").write_text("Triage {{ args.ticket }}")
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n"
        f"gates:\n  g: {{invoke: host.agent.ask, agent: agent.stub, with: {{prompt: '{prompt}'}}}}\n"
    )
    if problem:
        assert set(_problems(config)) == {"gates.g.with.prompt"}
    else:
        assert load_config(config).gates["g"].prompt == prompt


# -- a command-line file named as if from the config's directory ----------------------------


@pytest.mark.parametrize("flag", ["--schema", "--prompt-file"])
def test_a_command_line_file_beside_the_config_is_named_when_the_cwd_lacks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """Before: ``--schema schemas/x.json: file not found`` with no hint (and for a prompt file
    the raw errno text), from a directory other than the config's."""
    app_dir = tmp_path / "app"
    (app_dir / "files").mkdir(parents=True)
    (app_dir / "files" / "x.json").write_text('{"type": "object"}')
    (app_dir / "app.yaml").write_text("agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n")
    monkeypatch.chdir(tmp_path)
    argv = ["call", "extract", "-c", "app/app.yaml", "--agent", "agent.stub", "--json"]
    argv += ["--prompt", "p", "--schema", "files/x.json"] if flag == "--schema" else ["--prompt-file", "files/x.json"]
    assert main(argv) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "usage_error"
    assert f"{flag} {app_dir / 'files' / 'x.json'}" in doc["hint"]


# -- the app's directory given where its config file belongs --------------------------------


def test_a_directory_given_as_the_config_names_the_file_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``localllm check examples/quickstart`` said "[Errno 21] Is a directory … (hint: check the path)"."""
    app_dir = tmp_path / "quickstart"
    app_dir.mkdir()
    (app_dir / "localllm.yaml").write_text("app_id: q\n")
    assert main(["check", str(app_dir), "--json"]) == 2
    [problem] = json.loads(capsys.readouterr().out)["problems"]
    assert problem["file"] == str(app_dir) and problem["key"] == ""
    assert problem["hint"] == f"name the file: {app_dir / 'localllm.yaml'}"


# -- route --calibrate on too few examples -----------------------------------------------------


def test_a_calibration_that_accepts_nothing_prints_no_python_none(capsys: pytest.CaptureFixture[str]) -> None:
    """``route --calibrate`` on a handful of examples printed "precision None"."""
    from localllm.cli.embed import _print_calibration
    from localllm.embed.router import Calibration

    cal = Calibration(1.0, 0.0, 0.9, 0.95, False, 4, 4, accepted=0, right=0, coverage=0.0, lower_bound=0.0, needed=29)
    _print_calibration(cal, "all-minilm-l6-v2")
    printed = capsys.readouterr().out
    assert "None" not in printed and "router: {confident: 1.0, margin: 0.0}" in printed


# -- LOCALLLM_CONFIG set once in a shell profile and forgotten ----------------------------------


@pytest.mark.parametrize("target", ["gone.yaml", "app"])
def test_a_stale_localllm_config_is_named_as_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """Before: "gone.yaml: config file not found (hint: check the path)" from `localllm check`
    run without -c in a directory with no localllm.yaml: nothing said the variable chose it."""
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCALLLM_CONFIG", str(tmp_path / target))
    assert main(["check", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "usage_error" and "LOCALLLM_CONFIG" in doc["hint"]


# -- a subprocess agent's command: relative, or a whole command line ---------------------------

AGENT = (
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    req = json.loads(line)\n"
    "    print(json.dumps({'jsonrpc': '2.0', 'id': req['id'], 'result': {'submission': 'ok'}}), flush=True)\n"
)


@pytest.mark.parametrize("cwd", [None, "work"])
def test_a_relative_command_runs_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cwd: str) -> None:
    """``command: ./agent.py`` answered when run from the config's directory and was
    "cannot start './agent.py': No such file or directory" from anywhere else."""
    import sys

    app_dir = tmp_path / "app"
    where = app_dir / cwd if cwd else app_dir
    where.mkdir(parents=True)
    script = where / "agent.py"
    script.write_text(f"#!{sys.executable}\n{AGENT}")
    script.chmod(0o755)
    extra = f", cwd: {cwd}" if cwd else ""
    (app_dir / "app.yaml").write_text(
        f"agent_plugins:\n  agent.fixer: {{plugin: subprocess, command: ./agent.py{extra}}}\n"
    )
    monkeypatch.chdir(tmp_path)
    with Runtime(load_config(app_dir / "app.yaml")) as rt:
        assert rt.call("ask", agent="agent.fixer", prompt="p").submission == "ok"


def test_a_command_line_in_command_is_a_load_problem_naming_args(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text("agent_plugins:\n  agent.fixer: {plugin: subprocess, command: python3 agent.py}\n")
    assert _problems(config) == {"agent_plugins.agent.fixer.command": "command: python3 with args: [agent.py]"}


# -- a model id that is listed but can never be fetched --------------------------------------


def test_a_model_pinned_without_a_sha256_is_a_load_problem_and_never_offered(tmp_path: Path) -> None:
    """``embedders: {e: {model: bge-small-en-v1.5}}`` loaded ("ok") and the hints offered it
    among the known models; every embed then failed with PinNotConfigured."""
    from localllm.managed.pins import load_pins

    unpinned = sorted(m for m, p in load_pins().models.items() if p.role == "embedding" and not p.artifact.sha256)
    assert unpinned  # the shipped pins have one (bge-small-en-v1.5)
    config = tmp_path / "app.yaml"
    config.write_text(f"embedders:\n  e: {{model: {unpinned[0]}}}\n  f: {{model: no-such-model}}\n")
    problems = _problems(config)
    assert set(problems) == {"embedders.e.model", "embedders.f.model"}
    assert unpinned[0] not in problems["embedders.f.model"]  # not offered as a choice


# -- pinning your own model with a mistyped hash ----------------------------------------------


@pytest.mark.parametrize("digest", ["abc", "sha256:" + "a" * 64, "g" * 64])
def test_a_mistyped_sha256_is_a_usage_error_naming_the_flag(capsys: pytest.CaptureFixture[str], digest: str) -> None:
    """Before: exit 1, "pins.json: models.entries.m: sha256 must be 64 lowercase hex digits or
    null" (a key of a file the user never opened, and a null they cannot type)."""
    argv = ["fetch", "model", "--url", "https://example.invalid/m.gguf", "--sha256", digest, "--id", "m", "--json"]
    assert main(argv) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "usage_error" and "--sha256" in doc["detail"]


# -- extra_args that the managed server refuses ---------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "index"),
    [('["--port", "8080"]', 0), ('["--jinja", "--ctx-size=4096"]', 1), ('["--chat-template chatml"]', 0)],
)
def test_extra_args_the_server_would_refuse_are_load_problems(tmp_path: Path, extra: str, index: int) -> None:
    """Before, `check` said ok and the first call failed: "cannot start llama-server: extra args
    must not set --port" (exit 1), or llama-server exited on one word "--chat-template chatml"."""
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    config = tmp_path / "app.yaml"
    config.write_text(
        f"agent_plugins:\n  agent.local: {{plugin: builtin.local_llm, model: ./m.gguf, extra_args: {extra}}}\n"
        f"embedders:\n  docs: {{model: ./m.gguf, extra_args: {extra}}}\n"
    )
    assert set(_problems(config)) == {
        f"agent_plugins.agent.local.extra_args[{index}]",
        f"embedders.docs.extra_args[{index}]",
    }


def test_embedding_flags_are_the_embedders_alone(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, model: ./m.gguf, extra_args: [--pooling, mean]}\n"
        "embedders:\n  docs: {model: ./m.gguf, extra_args: [--pooling, mean]}\n"
    )
    assert set(_problems(config)) == {"embedders.docs.extra_args[0]"}


# -- a template the renderer does not take, in a gate's prompt or args -------------------------


@pytest.mark.parametrize(
    ("prompt", "args", "key"),
    [
        ("Triage {{ arg.ticket }}", "{}", "gates.g.with.prompt"),
        ("Triage {{ ticket }}", "{}", "gates.g.with.prompt"),
        ("Triage {{ examples }}", "{}", "gates.g.with.prompt"),  # a gate without examples: has none
        ("Triage {{ args.t }}", "{t: '{{ args.ticket }} {{ ticket }}'}", "gates.g.with.args.t"),
    ],
)
def test_an_unsupported_template_is_a_load_problem(tmp_path: Path, prompt: str, args: str, key: str) -> None:
    """Before, `check` said ok and every run of the gate failed: "prompt: unsupported template"."""
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n"
        f"gates:\n  g: {{invoke: host.agent.ask, agent: agent.stub, with: {{prompt: '{prompt}', args: {args}}}}}\n"
    )
    assert set(_problems(config)) == {key}


def test_supported_templates_still_load(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\ngates:\n  g: {invoke: host.agent.ask, "
        "agent: agent.stub, with: {prompt: 'T {{ args.t }} {{world.user.name}}', args: {t: '{{ args.ticket }}', n: 3}}}\n"
    )
    assert load_config(config).gates["g"].args == {"t": "{{ args.ticket }}", "n": 3}
    demo = load_config(Path(__file__).resolve().parents[2] / "examples" / "demo" / "config.yaml")
    assert any(g.examples is not None and "{{ examples }}" in g.prompt for g in demo.gates.values())


# -- help for a subcommand ----------------------------------------------------------------------


def test_help_explains_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """`localllm help trace verify` was "unrecognized arguments: verify" (exit 2)."""
    assert main(["help", "trace", "verify"]) == 0
    assert capsys.readouterr().out.startswith("usage: localllm trace verify")
    assert main(["help", "trace", "nope", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "usage_error"


def test_fetching_a_model_id_that_is_not_pinned_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """`localllm fetch model gemma-3-27m` (a typo) exited 1, "the operation failed", where the
    README's rule (and `run` with an unknown gate, `logs` with an unknown model) says 2."""
    assert main(["fetch", "model", "gemma-3-27m", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["kind"] == "unknown_model"


# -- a download with no network (a proxy, an air gap) -------------------------------------------


@pytest.mark.parametrize("mirror", [None, "no-such-dir"])
def test_a_download_that_cannot_connect_names_the_mirror_way_round(tmp_path: Path, mirror: str | None) -> None:
    """Before: "download of m.gguf from http://…: connection refused" with no hint at all."""
    import hashlib

    from localllm.errors import DownloadFailed
    from localllm.managed.fetch import fetch_artifact
    from localllm.managed.pins import Artifact

    url = f"http://127.0.0.1:{_closed_port()}/m.gguf"
    art = Artifact(name="model m", file="m.gguf", sha256=hashlib.sha256(b"x").hexdigest(), url=url, size=1)
    with pytest.raises(DownloadFailed) as info:
        fetch_artifact(
            art,
            tmp_path / "m.gguf",
            lock_path=tmp_path / "m.lock",
            mirrors=[str(tmp_path / mirror)] if mirror else [],
            retries=0,
            progress=False,
            log=lambda line: None,
        )
    assert "--mirror DIR" in info.value.hint and "m.gguf" in info.value.hint
    if mirror:
        assert "no such mirror directory" in str(info.value)


# -- an intent's keys misspelt ------------------------------------------------------------------


def test_an_intents_misspelt_keys_are_named(tmp_path: Path) -> None:
    """`{example: [...]}` said only "needs examples:"; the unknown keys went unnamed."""
    config = tmp_path / "app.yaml"
    config.write_text('intents:\n  billing: {example: ["charged twice"], descripton: money}\n')
    assert set(_problems(config)) == {"intents.billing", "intents.billing.example", "intents.billing.descripton"}


# -- the eval that writes a gate's evidence, from another directory ----------------------------


def test_the_eval_command_a_warning_names_writes_the_evidence_where_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From another directory the warning said `localllm eval g -c app/app.yaml`, which writes
    ./evals/reports/g/latest.json: not the app/evals/reports/g/latest.json the gate reads."""
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "app.yaml").write_text(
        "agent_plugins:\n  agent.stub: {plugin: builtin.inprocess}\n"
        "gates:\n  g: {invoke: host.agent.ask, agent: agent.stub, with: {prompt: hi},\n"
        "      selection: {evidence: evals/reports/g/latest.json, min_accuracy: 0.9}}\n"
    )
    out = app_dir / "evals" / "reports"
    monkeypatch.chdir(tmp_path)
    assert main(["check", "app/app.yaml", "--json"]) == 0
    [warning] = json.loads(capsys.readouterr().out)["warnings"]
    assert f"`localllm eval g -c app/app.yaml --out {out}`" in warning
    monkeypatch.chdir(app_dir)  # from the config's own directory the plain command is right
    assert main(["check", "app.yaml", "--json"]) == 0
    [warning] = json.loads(capsys.readouterr().out)["warnings"]
    assert "`localllm eval g -c app.yaml`" in warning


def test_an_eval_cases_misspelt_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    from localllm.eval.cases import load_cases

    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"args": {"t": "x"}, "expected": {"q": "a"}}\n')
    with pytest.raises(ConfigError) as info:
        load_cases(cases)
    by_key = {p.key: p.message for p in info.value.problems}
    assert by_key["line 1.expected"].endswith('(did you mean "expect"?)')


# -- route --explain without a decide tier ---------------------------------------------------------


def test_a_miss_without_a_decide_tier_does_not_claim_one(tmp_path: Path) -> None:
    """`route --explain` on a router with no agent: said "every intent goes to the decide tier"."""
    from localllm.config import Intent
    from localllm.embed.embedder import FakeEmbedder
    from localllm.embed.router import Router

    intents = [Intent("billing", ("refund please",)), Intent("weather", ("will it rain",))]
    alone = Router(intents, FakeEmbedder(), confident=0.9, margin=0.1).route("xyzzy")
    assert alone.outcome == "miss" and "router.agent is unset" in alone.reason
    tiered = Router(intents, FakeEmbedder(), confident=0.9, margin=0.1, decide=lambda text, names: None)
    assert "goes to the decide tier" in tiered.route("xyzzy").reason


# -- a number written as text --------------------------------------------------------------------


@pytest.mark.parametrize(("written", "meant"), [('"30"', "30"), ("30s", "30"), ("1e3", "1000"), ("four", None)])
def test_a_number_written_as_text_gets_the_number_to_write(tmp_path: Path, written: str, meant: str | None) -> None:
    """`timeout: "30"`, `timeout: 30s` (as --keep-alive takes it) and `timeout: 1e3` (text to
    YAML) said only "must be a number, got '30'"."""
    config = tmp_path / "app.yaml"
    config.write_text(f"agent_plugins:\n  agent.x: {{plugin: builtin.inprocess, timeout: {written}}}\n")
    hint = _problems(config)["agent_plugins.agent.x.timeout"]
    assert hint == (f"write the number alone, unquoted: timeout: {meant}" if meant else "")


def test_a_boolean_written_as_text_gets_the_word_to_write(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text(
        "agent_plugins:\n  agent.local: {plugin: builtin.local_llm, endpoint: 'http://127.0.0.1:8080',"
        " json_schema: 'true', compact: maybe}\n"
    )
    problems = _problems(config)
    assert problems["agent_plugins.agent.local.json_schema"] == "write it unquoted: json_schema: true"
    assert problems["agent_plugins.agent.local.compact"] == ""


def test_a_plugin_type_where_its_declaration_goes_gets_the_mapping_to_write(tmp_path: Path) -> None:
    config = tmp_path / "app.yaml"
    config.write_text("agent_plugins:\n  agent.stub: builtin.inprocess\n")
    assert _problems(config) == {"agent_plugins.agent.stub": "agent.stub: {plugin: builtin.inprocess}"}


def test_a_localllm_yml_beside_is_named_when_no_config_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ./localllm.yaml is looked for; a ./localllm.yml went unmentioned."""
    (tmp_path / "localllm.yml").write_text("app_id: y\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["hint"].startswith("pass -c localllm.yml")
