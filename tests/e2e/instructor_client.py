"""instructor driving ``localllm serve``: run by the instructor venv's python, not the project's.

instructor 1.17 pins ``jiter<0.15`` and the project's openai 3.x needs ``jiter>=0.16``, so it
lives in its own venv (``make e2e-endpoints`` builds ``~/.cache/localllm-e2e/venvs/instructor-<v>``,
with the openai release instructor supports) and tests/e2e/test_instructor_e2e.py runs this
file there::

    python instructor_client.py BASE_URL TOKEN MODEL MODE    # MODE: TOOLS | JSON_SCHEMA

It asks for a pydantic model with ``response_model`` and ``max_retries=0`` (one request: a
wrong answer is not hidden by a re-ask) and prints one JSON line: the answer, the model's
JSON Schema, the request body instructor sent, the answer's ``finish_reason`` and the
service's ``X-Localllm-*`` headers. Exit status 1 (the error on stderr) when instructor
raises.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx2 as httpx  # what openai 3.x is built on (its http_client must be one)
import instructor
import openai
import pydantic


class Ticket(pydantic.BaseModel):
    """A support ticket, classified."""

    queue: str = pydantic.Field(max_length=20, description="the team that handles it")
    urgent: bool


def main(base_url: str, token: str, model: str, mode: str) -> int:
    seen: dict[str, Any] = {}

    def on_request(request: httpx.Request) -> None:
        seen["body"] = json.loads(request.content or b"{}")

    def on_response(response: httpx.Response) -> None:
        seen["headers"] = {k: v for k, v in response.headers.items() if k.lower().startswith("x-localllm-")}

    hooks: Any = {"request": [on_request], "response": [on_response]}
    with httpx.Client(event_hooks=hooks, trust_env=False, timeout=120) as http:
        api = openai.OpenAI(base_url=base_url, api_key=token or "none", max_retries=0, http_client=http)
        client = instructor.from_openai(api, mode=instructor.Mode[mode])
        try:
            ticket, completion = client.chat.completions.create_with_completion(
                model=model,
                response_model=Ticket,
                max_retries=0,
                max_tokens=128,
                # greedy: a sampled answer can run past max_tokens (e.g. listing the forced call
                # again, up to the service's 8 parallel calls), an honest 502 that says nothing
                # about instructor's interop (one `make test` run in many met it)
                temperature=0,
                messages=[{"role": "user", "content": "Ticket: my invoice is wrong. Classify it."}],
            )
        except Exception as exc:  # reported to the test as data
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print(
        json.dumps(
            {
                "answer": ticket.model_dump(),
                "schema": Ticket.model_json_schema(),
                "sent": seen.get("body"),
                "finish_reason": completion.choices[0].finish_reason,
                "headers": seen.get("headers", {}),
                "versions": {"instructor": instructor.__version__, "openai": openai.__version__},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
