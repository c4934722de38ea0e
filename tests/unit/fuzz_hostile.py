"""Seeded generators of hostile trace files and plugin directories, and the driver that
feeds them to the library (``python -m tests.unit.fuzz_hostile trace|plugins N SEED DIR``).

Run in a child process under an address-space limit by ``test_fuzz_hostile.py``; prints one
JSON summary: trials, failures (with the first examples), outcomes, the slowest trial.
A failure is any exception the API does not document (the trace reader documents
``TraceError``; the plugin loader documents none), and any string in a result, a
diagnostic or CLI output that cannot be encoded as UTF-8.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import random
import re
import shutil
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------- shared pieces

SURROGATES = ["\\ud800", "x\\udfff", "\\udc80\\udcff", "\\ud83d", "\\ude00x"]
GOOD_ESCAPES = ["\\ud83d\\ude00", "\\u00e9", "e\\u0301", "\\u2028", "\\\\ud800"]
NUMBERS = [
    "0",
    "-0",
    "1.5",
    "1e400",
    "-1e400",
    "1e-400",
    "1" + "0" * 400,
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "9" * 5000,
    "NaN",
    "Infinity",
    "-Infinity",
    "true",
    "false",
    "null",
]


def nested(rng: random.Random) -> str:
    depth = rng.choice([2, 50, 99, 100, 101, 999, 1500, 5000, 50_000])
    open_, close = rng.choice([("[", "]"), ('{"a":', "}")])
    return open_ * depth + "1" + close * depth


def json_string(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.35:
        return '"' + rng.choice(SURROGATES) + '"'
    if pick < 0.5:
        return '"' + rng.choice(GOOD_ESCAPES) + '"'
    if pick < 0.6:
        return '"' + "x" * rng.choice([300, 5000, 1 << 20]) + '"'
    if pick < 0.7:
        return '"' + rng.choice(["\\u0000", "a\\r\\nb", "\\t", '\\"', "\\\\"]) + '"'
    return json.dumps(rng.choice(["", " ", "é", "agent.x", "a" * 64, "\u2603", "Ω"]))


def json_value(rng: random.Random, depth: int = 0) -> str:
    pick = rng.random()
    if pick < 0.3:
        return json_string(rng)
    if pick < 0.55:
        return rng.choice(NUMBERS)
    if pick < 0.65:
        return nested(rng)
    if depth < 3 and pick < 0.85:
        items = [f"{json_string(rng)}:{json_value(rng, depth + 1)}" for _ in range(rng.randint(0, 4))]
        return "{" + ",".join(items) + "}"
    if depth < 3:
        return "[" + ",".join(json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    return '"leaf"'


def byte_mutations(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not out:
            break
        at = rng.randrange(len(out))
        op = rng.random()
        if op < 0.3:
            out[at] = rng.randrange(256)
        elif op < 0.5:
            out[at:at] = rng.choice(
                [
                    b"\xff",
                    b"\xc3",
                    b"\xed\xa0\x80",
                    b"\x00",
                    b"\r",
                    b"\r\n",
                    b"\n",
                    b"\xef\xbb\xbf",
                    b"\\ud800",
                    b'"',
                    b"{",
                    b"]",
                ]
            )
        elif op < 0.7:
            del out[at : at + rng.randint(1, 40)]
        else:
            out = out[:at]
    return bytes(out)


def all_strings(value: Any, seen: set[int] | None = None) -> Iterator[str]:
    """Every string in a result object (dataclasses, mappings, sequences, paths)."""
    seen = set() if seen is None else seen
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, Path):
            yield str(item)
        elif id(item) in seen:
            continue
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            seen.add(id(item))
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
        elif isinstance(item, dict) or hasattr(item, "items"):
            seen.add(id(item))
            for k, v in item.items():
                stack.extend((k, v))
        elif isinstance(item, (list, tuple, set, frozenset)):
            seen.add(id(item))
            stack.extend(item)


def encodable(text: str) -> None:
    text.encode("utf-8")


def strict_streams() -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """stdout/stderr stand-ins that fail, as a real UTF-8 terminal does, on unencodable text."""
    return (
        io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True),
        io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True),
    )


def run_cli(argv: list[str]) -> int:
    from localllm.cli import main

    out, err = strict_streams()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code not in (0, 1, 2):
        raise AssertionError(f"exit code {code} from {argv}")
    return code


# --------------------------------------------------------------------------- traces

HEADER = '{"kind":"session.header","schema_version":1,"written_at":"2026-01-15T09:00:00Z","session_id":"s"}'
KINDS = [
    "turn.start",
    "agent.call.start",
    "agent.call.complete",
    "agent.call.error",
    "machine.state_entered",
    "x.unknown",
]
GOOD_REFS = ["agent-prompts/c1.txt", "agent-prompts/c1-response.json", "transcripts/c1.jsonl", "missing.txt"]
REFS = [
    "agent-prompts/c1.txt",
    "agent-prompts/c1-response.json",
    "transcripts/c1.jsonl",
    "agent-prompts",
    "loop",
    "fifo",
    "missing.txt",
    "../outside",
    "/etc/passwd",
    "a" * 300,
    "d/" * 2100 + "x",
    "agent-prompts/" + "b" * 256,
    "",
    "x\\u0000y",
    "\\ud800",
    "transcripts/big.jsonl",
]


def _trace_dir(base: Path) -> None:
    (base / "agent-prompts").mkdir(parents=True)
    (base / "transcripts").mkdir()
    (base / "agent-prompts" / "c1.txt").write_text("prompt\n")
    (base / "agent-prompts" / "c1-response.json").write_text("{}\n")
    (base / "transcripts" / "c1.jsonl").write_text('{"a":1}\n{"b":2}\n')
    (base / "transcripts" / "c1.timings").write_text("0 1\n1 2\n")
    (base / "transcripts" / "big.jsonl").write_bytes(b"x" * (4 << 20))
    os.symlink("loop", base / "loop")
    os.mkfifo(base / "fifo")


def ref(rng: random.Random) -> str:
    return rng.choice(GOOD_REFS if rng.random() < 0.6 else REFS)


def _event(rng: random.Random, turn: int, seq: int) -> str:
    fields: dict[str, str] = {
        "turn": str(turn),
        "seq": str(seq),
        "ts": '"2026-01-15T09:00:00.123Z"',
        "kind": json.dumps(rng.choice(KINDS)),
        "call_id": '"c1"',
        "state_path": '"room.main"',
    }
    payload: dict[str, str] = {"agent": '"agent.x"', "duration_ms": str(rng.randint(0, 5000))}
    for key in rng.sample(["prompt_file", "response_file", "transcript_ref", "meta"], rng.randint(0, 3)):
        if key == "transcript_ref":
            payload[key] = (
                f'{{"format":"x","path":{json.dumps(ref(rng))},"events":{rng.randint(0, 3)},"schema_version":1}}'
            )
        elif key == "meta":
            payload[key] = '{"fallback_of":"agent.local","usage":{"a":1}}'
        else:
            payload[key] = json.dumps(ref(rng))
    target = rng.random()
    if target < 0.4:  # one hostile value somewhere
        where = rng.choice(["field", "payload", "ref", "key"])
        if where == "field":
            fields[rng.choice(list(fields))] = json_value(rng)
        elif where == "payload":
            payload[rng.choice(list(payload))] = json_value(rng)
        elif where == "ref":
            payload[rng.choice(["prompt_file", "response_file"])] = (
                '"' + rng.choice([*SURROGATES, "a" * rng.choice([255, 256, 300, 5000]), "\\u0000", "d/" * 2100]) + '"'
            )
        else:
            payload[json_string(rng)[1:-1]] = "1"
    if rng.random() < 0.1:
        del fields[rng.choice(list(fields))]
    items = [f'"{k}":{v}' for k, v in fields.items()]
    items.append('"payload":{' + ",".join(f'"{k}":{v}' for k, v in payload.items()) + "}")
    rng.shuffle(items)
    return "{" + ",".join(items) + "}"


def trace_input(rng: random.Random) -> bytes:
    lines = [HEADER]
    seqs: dict[int, int] = {}
    for _ in range(rng.randint(0, 8)):
        turn = rng.randint(0, 3)
        seq = seqs.get(turn, 0)
        seqs[turn] = seq + 1
        lines.append(_event(rng, turn, seq))
    shape = rng.random()
    if shape < 0.1 and len(lines) > 1:
        lines.insert(rng.randrange(1, len(lines) + 1), lines[rng.randrange(1, len(lines))])  # duplicate
    elif shape < 0.15:
        lines[0] = rng.choice(
            [
                HEADER.replace("1,", "99,"),
                HEADER.replace('"session.header"', '"x\\ud800"'),
                '{"kind":"session.header"}',
                json_value(rng),
            ]
        )
    elif shape < 0.2:
        lines.insert(1, HEADER)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if rng.random() < 0.15:
        data = byte_mutations(rng, data)
    return data


def run_traces(trials: int, seed: int, work: Path) -> dict[str, Any]:
    from localllm.errors import TraceError
    from localllm.trace import read_trace
    from localllm.trace.reader import load_object
    from localllm.trace.stats import trace_stats
    from localllm.trace.verify import sidecar_problems

    _trace_dir(work)
    path = work / "t.jsonl"
    rng = random.Random(seed)

    def one(i: int) -> str:
        path.write_bytes(trace_input(rng))
        try:
            trace = read_trace(path, allow_torn=True)
        except TraceError as exc:
            encodable(str(exc))
            return "rejected: " + re.sub(r"\d+", "N", str(exc))[:56]
        for problem in sidecar_problems(trace, work):
            encodable(problem)
        encodable(json.dumps(trace_stats(trace.events), ensure_ascii=False))
        for raw in trace.raw_lines:
            obj, _ = load_object(raw.decode("utf-8"))
            encodable(json.dumps(obj, ensure_ascii=False))
        if i % 20 == 0:
            command = ["verify", "show", "stats"][(i // 20) % 3]
            run_cli(["trace", command, str(path), *(["--json"] if i % 40 == 0 else [])])
        return "read"

    return _drive(trials, one)


# --------------------------------------------------------------------------- plugins

PLUGIN_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/plugin.schema.json"
MCP_SCHEMA = "https://agent-plugins.org/schemas/1.0.0/mcp.schema.json"

YAML_HOSTILE = [
    "!!timestamp banana",
    "!!timestamp 2024-13-45",
    "!!binary '!!'",
    "!!binary aGk=",
    "!!float abc",
    "!!int 0x",
    "!!bool maybe",
    "!!null x",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!!omap 3",
    "!!str [1]",
    "!foo bar",
    "!!python/object/apply:os.system [echo pwned]",
    "!!python/name:os.system",
    "2024-13-45",
    "1e400",
    '"\\ud800"',
    '"x\\udfff"',
    '"\\U0000d800"',
    '"\\U00110000"',
    '"\\U0001F600"',
    '"\\x00"',
    "&a x",
    "*undefined",
    "[" * 2000 + "]" * 2000,
    "{a: " * 300 + "1" + "}" * 300,
    "'" + "x" * (1 << 18) + "'",
    "|\n  block\n  text",
    ">-\n  folded",
    "? complex\n: key",
    "<<: {a: 1}",
    "- a\n- b",
    "[Bash, 3, {x: y}]",
    "{nested: {k: [1, 2]}}",
    "---",
    "...",
    "\t tab",
    "%YAML 1.1",
    "@reserved",
    "`reserved",
]


def yaml_bomb(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        levels, width = rng.randint(3, 12), rng.randint(2, 12)
        lines = ['l0: &l0 "lol"']
        lines += [f"l{i}: &l{i} [{', '.join(f'*l{i - 1}' for _ in range(width))}]" for i in range(1, levels + 1)]
        return "\n".join(lines) + "\n"
    if kind < 0.55:
        return "rec: &r {k: *r}\n"
    if kind < 0.75:
        depth = rng.choice([60, 63, 64, 65, 200, 800, 3000])
        return "deep:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(depth)) + " " * (depth + 1) + "v\n"
    return "deep: " + "[" * rng.choice([63, 64, 65, 1000, 20_000]) + "]" * 3 + "\n"


DESCRIPTIONS = ["Does things.", json.dumps("x" * 1025), "", "*n", '"ok"']


def front_matter(rng: random.Random, name: str) -> str:
    names = [name, name, name.upper(), json.dumps(name), "[" + name + "]", "&n " + name]
    lines = [f"name: {rng.choice(names)}", f"description: {rng.choice(DESCRIPTIONS)}"]
    for _ in range(rng.randint(0, 4)):
        key = rng.choice(["license", "compatibility", "metadata", "allowed-tools", "other", "description"])
        value = rng.choice(YAML_HOSTILE)
        lines.append(f"{key}: {value}" if "\n" not in value else f"{key}:\n  " + value.replace("\n", "\n  "))
    if rng.random() < 0.3:
        lines.append(yaml_bomb(rng))
    rng.shuffle(lines)
    text = "---\n" + "\n".join(lines) + "\n---\n# Body\n"
    if rng.random() < 0.1:
        text = text.replace("\n", "\r\n")
    return text


def json_doc(rng: random.Random, valid: str, keep: float = 0.4) -> bytes:
    pick = rng.random()
    if pick < keep:
        text = valid
    elif pick < keep + 0.35:  # a valid document with one hostile value spliced in
        text = valid.replace('"X"', json_value(rng), 1)
    elif pick < keep + 0.45:
        text = json_value(rng)
    else:
        text = nested(rng)
    data = text.replace('"X"', '"x"').encode("utf-8")
    if rng.random() < 0.15:
        data = byte_mutations(rng, data)
    return data


def plugin_input(rng: random.Random, root: Path) -> None:
    root.mkdir(parents=True)
    manifest = (
        '{"$schema":"' + PLUGIN_SCHEMA + '","name":"acme","version":"X","description":"X",'
        '"author":{"name":"X"},"keywords":["X"],"extensions":{"X":"X"}}'
    )
    mcp = (
        '{"$schema":"' + MCP_SCHEMA + '","mcpServers":{"X":{"type":"stdio","command":"X","args":["X"],'
        '"env":{"X":"X"},"cwd":"X"},"web":{"type":"streamable-http","url":"X","headers":{"X":"X"}}}}'
    )
    special = rng.random()
    if special < 0.05:
        (root / "plugin.json").mkdir()
    elif special < 0.08:
        os.symlink("/etc/hostname", root / "plugin.json")
    elif special < 0.1:
        os.mkfifo(root / "plugin.json")
    elif special < 0.12:
        (root / "plugin.json").write_bytes(b" " * (4 * 1024 * 1024 + 1))
    elif special < 0.98:  # else: no plugin.json at all
        (root / "plugin.json").write_bytes(json_doc(rng, manifest, keep=0.7))
    if rng.random() < 0.6:
        (root / "mcp.json").write_bytes(json_doc(rng, mcp))
    skills = root / "skills"
    for n in range(rng.randint(0, 3)):
        name = rng.choice(["alpha", "beta", "g-1", "bad--name", "x" * 70])
        raw_dir = os.fsencode(skills) + b"/" + (name.encode() if rng.random() < 0.9 else b"caf\xe9" + str(n).encode())
        os.makedirs(raw_dir, exist_ok=True)
        content = front_matter(rng, name).encode("utf-8", "surrogatepass")
        if rng.random() < 0.1:
            content = byte_mutations(rng, content)
        with open(raw_dir + b"/SKILL.md", "wb") as fh:
            fh.write(content)
    if rng.random() < 0.05:
        skills.mkdir(exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.symlink("loop", skills / "loop")
    if rng.random() < 0.4:
        flows = root / "flows"
        flows.mkdir()
        flow_yaml = (
            "name: f1\nstart: a\nnodes:\n  - {id: a, kind: reply}\nextra: "
            + rng.choice(YAML_HOSTILE)
            + "\n"
            + (yaml_bomb(rng) if rng.random() < 0.4 else "")
        )
        flow_name = b"f1.flow.yaml" if rng.random() < 0.9 else b"f\xe91.flow.yaml"
        with open(os.fsencode(flows) + b"/" + flow_name, "wb") as fh:
            fh.write(flow_yaml.encode("utf-8"))
        (flows / "f2.flow.json").write_bytes(json_doc(rng, '{"name":"f2","start":"a","nodes":[{"id":"a","kind":"X"}]}'))


def run_plugins(trials: int, seed: int, work: Path) -> dict[str, Any]:
    from localllm.plugins import PluginLoaded, PluginRejected, load_agent_plugin

    rng = random.Random(seed)

    def one(i: int) -> str:
        root = work / "p" / "acme"
        shutil.rmtree(work / "p", ignore_errors=True)
        plugin_input(rng, root)
        result = load_agent_plugin(root)
        if not isinstance(result, (PluginLoaded, PluginRejected)):
            raise AssertionError(f"result is a {type(result).__name__}")
        for d in result.diagnostics:
            if d.rule == "loader-internal-error":
                raise AssertionError(str(d))
            encodable(str(d))
            encodable(json.dumps(d.to_json(), ensure_ascii=False))
        for text in all_strings(result):
            encodable(text)
        if i % 50 == 0:
            run_cli(["plugins", "check", str(root), *(["--json"] if i % 100 == 0 else [])])
        return "loaded" if result.ok else "rejected"

    return _drive(trials, one)


# --------------------------------------------------------------------------- driver


def _drive(trials: int, one: Callable[[int], str]) -> dict[str, Any]:
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    slowest = 0.0
    started = time.monotonic()
    for i in range(trials):
        t0 = time.monotonic()
        try:
            outcomes[one(i)] += 1
        except Exception as exc:  # everything not documented is a finding
            outcomes["FAILED"] += 1
            if len(failures) < 5:
                failures.append(
                    f"trial {i}: {type(exc).__name__}: {str(exc)[:300]}\n"
                    + "".join(traceback.format_exc(limit=6))[-1500:]
                )
        slowest = max(slowest, time.monotonic() - t0)
    return {
        "trials": trials,
        "failures": outcomes.get("FAILED", 0),
        "examples": failures,
        "outcomes": dict(outcomes.most_common(12)),
        "slowest_s": round(slowest, 3),
        "elapsed_s": round(time.monotonic() - started, 2),
    }


def main(argv: list[str]) -> int:
    target, trials, seed, work = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    sys.setrecursionlimit(1000)
    run = run_traces if target == "trace" else run_plugins
    print(json.dumps(run(trials, seed, work), ensure_ascii=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
