"""instructor's TOOLS and JSON_SCHEMA modes against ``localllm serve`` (real llama-server, gemma-3-270m).

instructor cannot be installed beside the project's openai 3.x (its ``jiter<0.15`` pin), so
it has a venv of its own in the user cache, built by ``make e2e-endpoints`` (part of ``make
e2e`` and ``make test``; keyed by version, reused) with the openai release it supports; the
test runs ``tests/e2e/instructor_client.py`` there as a subprocess. A missing venv fails the
test with the command that builds it: never skipped.

Each mode asks for a pydantic model with ``max_retries=0`` (no re-ask could hide a wrong
answer) and the answer must validate against the model's own JSON Schema, with the service
saying it compiled the constraint and validated the answer.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.e2e.conftest import E2E_HOME
from tests.e2e.test_service_e2e import CHAT, Served, serve

__all__ = ["serve"]  # the fixture

pytestmark = pytest.mark.e2e

INSTRUCTOR_VERSION = "1.17.0"  # the Makefile's INSTRUCTOR_VERSION
INSTRUCTOR_VENV = Path(
    os.environ.get("LOCALLLM_TEST_INSTRUCTOR_VENV") or E2E_HOME / "venvs" / f"instructor-{INSTRUCTOR_VERSION}"
)
CLIENT = Path(__file__).with_name("instructor_client.py")


def _instructor(served: Served, mode: str) -> dict[str, Any]:
    python = INSTRUCTOR_VENV / "bin" / "python"
    if not (INSTRUCTOR_VENV / ".installed").is_file():
        raise AssertionError(f"{INSTRUCTOR_VENV} is not built: run `make e2e-endpoints` (instructor's own venv)")
    done = subprocess.run(
        [str(python), str(CLIENT), served.found.url + "/v1", served.token or "", CHAT, mode],
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", ""), "NO_PROXY": "*"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(mode, json.dumps({k: result[k] for k in ("answer", "finish_reason", "headers", "versions")}))
    return result


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_answers_a_pydantic_model(serve: Callable[..., Served], mode: str) -> None:
    served = serve()
    result = _instructor(served, mode)
    assert result["versions"]["instructor"] == INSTRUCTOR_VERSION
    assert int(result["versions"]["openai"].split(".")[0]) < 4
    jsonschema.validate(result["answer"], result["schema"])  # schema-valid, by the model's own schema
    assert set(result["answer"]) == {"queue", "urgent"} and len(result["answer"]["queue"]) <= 20
    sent = result["sent"]
    if mode == "TOOLS":  # instructor's tool-based output: a forced call of the model's tool
        (tool,) = sent["tools"]
        assert sent["tool_choice"]["function"]["name"] == tool["function"]["name"]
        assert result["finish_reason"] == "tool_calls"
    else:  # the json_schema response_format, answered by localllm's compiled grammar
        assert sent["response_format"]["type"] == "json_schema"
        assert sent["response_format"]["json_schema"]["schema"]["properties"]["queue"]["maxLength"] == 20
    headers = {k.lower(): v for k, v in result["headers"].items()}
    assert headers["x-localllm-structured"] == "compiled" and headers["x-localllm-validated"] == "true"
