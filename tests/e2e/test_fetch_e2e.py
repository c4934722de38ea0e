"""End to end: real GGUFs fetched through a mirror against their real pins, and the
llama-server built from source running from the real user cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localllm import settings
from localllm.managed import server_env
from localllm.managed.pins import load_pins
from localllm.managed.verify import sha256_file

pytestmark = pytest.mark.e2e

# Read before the per-test isolation points LOCALLLM_CACHE_DIR at tmp_path: this is the
# cache `make fetch-llama-server` filled (the source build is reused, never rebuilt here).
REAL_CACHE = settings.cache_dir()


def _localllm(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localllm", *argv], capture_output=True, text=True, timeout=600, check=False, env=env
    )


def _mirror_of(tmp_path: Path, source: Path, name: str) -> Path:
    mirror = tmp_path / "mirror"
    mirror.mkdir(exist_ok=True)
    (mirror / name).symlink_to(source.resolve())
    return mirror


@pytest.mark.parametrize(("model_id", "fixture"), [("gemma-3-270m", "chat_gguf"), ("all-minilm-l6-v2", "embed_gguf")])
def test_real_gguf_through_a_mirror_matches_its_real_pin(
    model_id: str, fixture: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = load_pins().model(model_id)
    source: Path = request.getfixturevalue(fixture)
    mirror = _mirror_of(tmp_path, source, pin.artifact.file)
    cache = tmp_path / "cache"
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(cache))
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # a directory mirror needs no network at all
    proc = _localllm("fetch", "model", model_id, "--mirror", str(mirror), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    path = Path(out["path"])
    assert path == cache / "models" / model_id / (pin.artifact.sha256 or "")[:16] / pin.artifact.file
    assert sha256_file(path) == pin.artifact.sha256
    assert path.stat().st_size == pin.artifact.size == source.stat().st_size
    assert f"downloading model {model_id} (" in proc.stderr and str(mirror) in proc.stderr
    # Second time: cached, trusted by its stamp, nothing copied, no announcement.
    again = _localllm("fetch", "model", model_id, "--mirror", str(mirror))
    assert again.returncode == 0 and again.stdout.strip() == str(path)
    assert "downloading" not in again.stderr


def test_source_built_server_runs_from_the_real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(REAL_CACHE))
    monkeypatch.delenv("LOCALLLM_SERVER_BIN", raising=False)
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")  # must be served from the cache: no fetch, no build
    proc = _localllm("fetch", "server", "--json")
    assert proc.returncode == 0, proc.stderr
    install = json.loads(proc.stdout)
    binary = Path(install["binary"])
    assert install["source"] in ("source", "prebuilt")
    assert binary.parent.parent == REAL_CACHE / "bin"
    version = subprocess.run(
        [str(binary), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=server_env(binary.parent),
    )
    assert version.returncode == 0, version.stderr
    assert "version:" in version.stdout + version.stderr
    # Its release manifest still matches the files on disk.
    check = _localllm("cache", "verify", "--no-refetch", "--json")
    releases = [e for e in json.loads(check.stdout)["entries"] if e["path"] == str(binary.parent)]
    assert [e["status"] for e in releases] == ["ok"], check.stdout


def test_offline_fetch_of_an_uncached_model_names_the_prewarm_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALLLM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOCALLLM_OFFLINE", "1")
    proc = _localllm("fetch", "model", "qwen2.5-1.5b-instruct")
    assert proc.returncode == 1
    assert "LOCALLLM_OFFLINE=1" in proc.stderr
    assert "localllm fetch model qwen2.5-1.5b-instruct" in proc.stderr
    assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*.gguf*"))
