"""What loading a config imports: nothing a `localllm run` does not need before its call.

``localllm run`` starts the gate's model at parse time and runs the config's checks while it
loads; a heavy import on that path (the eval report and runner, httpx, rfc3987-syntax's
parsers, numpy) delays the answer. Checked on the demo config (a grammar decide gate, a gate
with examples, an embedder) in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOT_NEEDED = [
    "rfc3987_syntax",
    "lark",
    "localllm.eval.report",
    "localllm.eval.run",
    "httpx",
    "numpy",
    "localllm.trace.writer",
]


def test_loading_the_demo_config_imports_nothing_heavy() -> None:
    code = (
        "import json, sys\n"
        "from localllm import load_config\n"
        "config = load_config(sys.argv[1])\n"
        "assert config.gates['queue'].examples is not None\n"
        "print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "examples" / "demo" / "config.yaml"), json.dumps(NOT_NEEDED)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
