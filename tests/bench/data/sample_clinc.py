"""Draw the committed CLINC150 sample (clinc150_examples.jsonl, clinc150_cases.jsonl).

    python tests/bench/data/sample_clinc.py /path/to/data_full.json

Deterministic: seed 19 picks 9 of the 150 in-scope intents; each intent contributes 20
examples (from ``train``) and 25 held-out cases (from ``test``); the out-of-scope label
``oos`` contributes 20 examples (``oos_train``) and 25 cases (``oos_test``). Written in the
eval cases format: ``args.text`` the utterance, ``expect.intent`` its label.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 19
INTENTS = 9
EXAMPLES = 20
CASES = 25
HERE = Path(__file__).resolve().parent


def main(source: str) -> None:
    data = json.loads(Path(source).read_text(encoding="utf-8"))
    rng = random.Random(SEED)
    intents = sorted(rng.sample(sorted({label for _, label in data["train"]}), INTENTS))
    pools = {
        "examples": {i: [t for t, label in data["train"] if label == i] for i in intents},
        "cases": {i: [t for t, label in data["test"] if label == i] for i in intents},
    }
    pools["examples"]["oos"] = [t for t, _ in data["oos_train"]]
    pools["cases"]["oos"] = [t for t, _ in data["oos_test"]]
    for name, per in (("examples", EXAMPLES), ("cases", CASES)):
        lines = []
        for label in [*intents, "oos"]:
            for n, text in enumerate(sorted(rng.sample(pools[name][label], per))):
                doc = {"id": f"{label}-{n:02d}", "args": {"text": text}, "expect": {"intent": label}}
                lines.append(json.dumps(doc, ensure_ascii=False))
        (HERE / f"clinc150_{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("labels:", [*intents, "oos"])


if __name__ == "__main__":
    main(sys.argv[1])
