"""Compare chat templates and prompts for the demo gate on the real llama-server + gemma-3-270m.

Usage: ``python examples/demo/compare_templates.py [--server BIN] [--model GGUF] [--out DIR]``.
Each candidate (template × prompt) runs the ``triage`` gate over the labelled tickets below,
one server at a time, and a few free-text ``ask`` prompts; it prints queue accuracy,
priority within ±1, the spread of answers and whether free text leaks template markers.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVER = Path.home() / ".cache/localllm/bin/llama-source-0.3.36-linux-x86_64/llama-server"
MODEL = Path.home() / ".cache/localllm-e2e/gemma-3-270m-q4_k_m.gguf"

#: (ticket, queue, priority): none of them is one of the prompt's examples
TICKETS: list[tuple[str, str, int]] = [
    ("I was charged twice for my subscription this month, please refund one payment.", "billing", 2),
    ("My invoice shows the wrong company name and VAT number.", "billing", 3),
    ("My card was declined but the money still left my account.", "billing", 1),
    ("I want to cancel my plan and get back the unused months.", "billing", 3),
    ("Production is down! Every API call returns HTTP 500 since ten minutes.", "bug", 1),
    ("The search button does nothing when I click it in Firefox.", "bug", 3),
    ("After the last update the login page is just a blank white screen.", "bug", 2),
    ("Uploading a PDF larger than 5 MB fails with an error.", "bug", 3),
    ("Could you add a way to export my reports as CSV?", "feature", 4),
    ("Please build an integration with Slack so we get notified.", "feature", 4),
    ("It would be nice to choose the language of the emails you send.", "feature", 5),
    ("How do I change the email address on my account?", "other", 4),
    ("Where is your company headquartered?", "other", 5),
    ("Just wanted to say thanks, the new dashboard is great!", "other", 5),
]
FREE_TEXT = ["Say hello in one short sentence.", "Name three colours."]
MARKERS = ("<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>")

PLAIN = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
DIALOGUE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}User: "
            "{% elif m['role'] == 'assistant' %}Assistant: {% endif %}{{ m['content'] }}\n{% endfor %}Assistant:")
TEMPLATES: dict[str, list[str]] = {
    # what llama-server does for a GGUF without a template (named, so a pinned format is not applied)
    "none (server default: chatml)": ["--chat-template", "chatml"],
    "gemma": ["--chat-template", "gemma"],
    "plain completion": ["--jinja", "--chat-template-file", "{plain}"],
    "dialogue (User:/Assistant:)": ["--jinja", "--chat-template-file", "{dialogue}"],
}


def run(name: str, extra: list[str], prompt: Path, *, schema_in_prompt: bool, work: Path,
        server: Path, model: Path, schemas: Path) -> dict[str, Any]:
    from localllm import Runtime, load_config
    from localllm.errors import LocalLLMError

    cfg = work / "app.yaml"
    shutil.copytree(schemas, work / "schemas", dirs_exist_ok=True)
    cfg.write_text(json.dumps({
        "app_id": "compare",
        "agent_plugins": {"agent.local": {
            "plugin": "builtin.local_llm", "model": str(model), "server_bin": str(server), "parallel": 1,
            "ctx_size": 2048, "max_tokens": 96, "timeout": 120, "fallback": "none",
            "schema_in_prompt": schema_in_prompt,
            "extra_args": [a.replace("{plain}", str(work / "plain.jinja"))
                           .replace("{dialogue}", str(work / "dialogue.jinja")) for a in extra]}},
        "gates": {"triage": {"invoke": "host.agent.decide", "agent": "agent.local",
                             "with": {"prompt": str(prompt), "schema": "schemas/triage.json",
                                      "args": {"ticket": "{{ args.ticket }}"}}}},
    }))
    (work / "plain.jinja").write_text(PLAIN)
    (work / "dialogue.jinja").write_text(DIALOGUE)
    rows, texts = [], []
    started = time.monotonic()
    with Runtime(load_config(cfg)) as rt:
        for ticket, queue, priority in TICKETS:
            try:
                got = rt.run_gate("triage", {"ticket": ticket}).submission
            except LocalLLMError as exc:
                got = {"error": str(exc)[:120]}
            rows.append((ticket, queue, priority, got))
        for text in FREE_TEXT:
            try:
                texts.append(str(rt.call("ask", agent="agent.local", prompt=text, timeout=60).submission))
            except LocalLLMError as exc:
                texts.append(f"error: {exc}"[:120])
    ok = [r for r in rows if "error" not in r[3]]
    return {
        "candidate": name, "prompt": prompt.name, "schema_in_prompt": schema_in_prompt,
        "queue_accuracy": sum(r[3]["queue"] == r[1] for r in ok) / len(rows),
        "priority_within_1": sum(abs(r[3]["priority"] - r[2]) <= 1 for r in ok) / len(rows),
        "queues": dict(collections.Counter(r[3]["queue"] for r in ok)),
        "priorities": dict(collections.Counter(r[3]["priority"] for r in ok)),
        "errors": len(rows) - len(ok),
        "free_text_with_markers": sum(any(m in t for m in MARKERS) for t in texts),
        "free_text": texts, "answers": [r[3] for r in rows], "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server", type=Path, default=SERVER)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--out", type=Path, default=Path.cwd() / ".compare")
    parser.add_argument("--prompts", nargs="*", type=Path, default=[HERE / "prompts" / "triage.md"])
    parser.add_argument("--templates", nargs="*", default=list(TEMPLATES))
    parser.add_argument("--schema-in-prompt", choices=["true", "false", "both"], default="false")
    parser.add_argument("--schemas", type=Path, default=HERE / "schemas", help="directory holding triage.json")
    ns = parser.parse_args()
    results = []
    shapes = {"true": [True], "false": [False], "both": [True, False]}[ns.schema_in_prompt]
    for prompt in ns.prompts:
        for schema_in_prompt in shapes:
            for name in ns.templates:
                work = ns.out / f"{prompt.stem}-{schema_in_prompt}-{name.split()[0]}"
                work.mkdir(parents=True, exist_ok=True)
                result = run(name, TEMPLATES[name], prompt.resolve(), schema_in_prompt=schema_in_prompt, work=work,
                             server=ns.server, model=ns.model, schemas=ns.schemas.resolve())
                results.append(result)
                print(json.dumps({k: v for k, v in result.items() if k not in ("answers",)}), flush=True)
    (ns.out / f"results-{ns.schema_in_prompt}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
