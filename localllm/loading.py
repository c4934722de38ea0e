"""``load_config``: the whole load, composed from the data layer and the checks above it.

Layering: :mod:`localllm.config` is data and imports nothing above the pins; this module
sits above it *and* above :mod:`localllm.schema`, :mod:`localllm.grammar` and
:mod:`localllm.plugins`, and runs the checks that need them::

    parse (config)  →  plugin_dirs: agents (plugins)  →  names across sections (config)
                    →  schema files, $refs, the decide-gate grammar subset (schema, grammar)
                    →  Config, or one ConfigError with every problem in file order
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from localllm.config import Config, LocalLLMDecl, McpHttpDecl, McpStdioDecl
from localllm.config.parse import Draft, check_references, parse

__all__ = ["load_config"]


def load_config(path: str | os.PathLike[str], *, parsed: Callable[[Draft], None] | None = None) -> Config:
    """Load and check a config file; raise ``ConfigError`` listing every problem.

    ``parsed`` is called with the declarations once the file is parsed without a problem,
    before the checks that read other files (plugins, schemas, grammar, examples, evidence):
    ``localllm run`` starts the gate's model there, so that it loads while they run. The
    checks still all run, and their problems still fail the load (the caller then stops
    what it started).
    """
    if not isinstance(path, (str, os.PathLike)):  # before: pathlib's TypeError
        raise TypeError(f"load_config takes the config file's path, got {type(path).__name__}")
    draft = parse(Path(path))
    if parsed is not None and not draft.problems.items:
        parsed(draft)
    for key, plugin_dir in draft.plugin_dirs.items():
        _plugin_agents(draft, key, plugin_dir)
    check_references(draft)
    _check_schemas(draft)
    _check_examples(draft)
    _check_router_cases(draft)
    _check_evidence(draft)
    return draft.config()


def _check_evidence(draft: Draft) -> None:
    """A gate's ``selection.evidence`` is an eval report of that gate (staleness is `check`'s warning)."""
    from localllm.selection import eval_command, gate_problems

    for gate in draft.gates.values():
        if gate.selection is not None and gate.selection.evidence is not None:
            for problem in gate_problems(gate, gate.selection.evidence):
                command = eval_command(gate.name, draft.file, gate.selection.evidence)
                draft.problems.add(
                    f"gates.{gate.name}.selection.evidence",
                    f"{gate.selection.evidence} {problem}",
                    f"run `{command}` to write it, or fix the path",
                )


#: schema types the examples tier can vote on (a label among a few values)
VOTABLE = ("boolean", "integer")


def _votable(prop: object) -> bool:
    return isinstance(prop, dict) and (isinstance(prop.get("enum"), list) or prop.get("type") in VOTABLE)


def _check_router_cases(draft: Draft) -> None:
    """``router.calibration_cases``: the file loads, and every case names a declared intent
    (or ``none_of_these``)."""
    from localllm.config.decls import NONE_OF_THESE
    from localllm.errors import ConfigError
    from localllm.eval.cases import load_intent_cases

    path = draft.router.calibration_cases if draft.router is not None else None
    if path is None:
        return
    try:
        load_intent_cases(path, [*draft.intents, NONE_OF_THESE], regular=True)
    except ConfigError as exc:
        for problem in exc.problems:
            where = f" {problem.key}" if problem.key else ""
            draft.problems.add("router.calibration_cases", f"{path}{where}: {problem.message}", problem.hint)


def _check_examples(draft: Draft) -> None:
    """A gate's ``examples:``: the cases file loads, every case gives the input as text and a
    label for each voted field, no text is under two labels (``distinct_examples``), the voted
    fields are enum/boolean/integer fields of the schema, and when the vote answers, they are
    every field the schema requires. ``fields:`` left empty is filled with the labelled
    votable fields."""
    import dataclasses

    from localllm.errors import ConfigError, SchemaError
    from localllm.eval.cases import distinct_examples, load_cases
    from localllm.schema import read_schema_file

    for name, gate in list(draft.gates.items()):
        examples = gate.examples
        if examples is None or examples.cases is None or not examples.input:
            continue
        key = f"gates.{name}.examples"
        try:
            cases = load_cases(examples.cases, regular=True)
            distinct_examples(cases, examples.input, examples.cases)
        except ConfigError as exc:
            for problem in exc.problems:
                where = f" {problem.key}" if problem.key else ""
                draft.problems.add(f"{key}.cases", f"{examples.cases}{where}: {problem.message}", problem.hint)
            continue
        lacking = [c.line for c in cases if not isinstance(c.args.get(examples.input), str)]
        if lacking:
            draft.problems.add(
                f"{key}.input",
                f"{examples.cases}: line {lacking[0]} (and {len(lacking) - 1} more) has no text args.{examples.input}",
                f'give every case "args": {{"{examples.input}": "…"}}, or name the argument that holds the text',
            )
            continue
        props: dict[str, object] = {}
        required: list[str] = []
        if gate.schema_path is not None:
            try:
                schema = read_schema_file(gate.schema_path)
            except SchemaError:
                continue  # reported by _check_schemas
            # a schema of the wrong shape is _check_schemas' problem to report, not a crash here
            given_props, given_required = schema.get("properties"), schema.get("required")
            props = dict(given_props) if isinstance(given_props, dict) else {}
            required = [str(r) for r in given_required] if isinstance(given_required, list) else []
        labelled = set.intersection(*(set(c.expect.labels()) for c in cases)) if cases else set()
        fields = examples.fields or tuple(f for f in props if _votable(props[f]) and f in labelled)
        bad = [f for f in fields if not _votable(props.get(f))]
        if bad:
            draft.problems.add(
                f"{key}.fields",
                f"{', '.join(bad)}: not an enum, boolean or integer property of {gate.schema_path}",
                "vote only on fields with a few values",
            )
            continue
        unlabelled = [f for f in fields if f not in labelled]
        if unlabelled:
            draft.problems.add(
                f"{key}.fields",
                f"{examples.cases}: not every case labels {', '.join(unlabelled)}",
                'label it in each case\'s "expect", or leave it out of fields:',
            )
            continue
        uncovered = [r for r in required if r not in fields]
        if examples.answer and (not fields or uncovered):
            draft.problems.add(
                f"{key}.answer",
                f"the vote cannot answer the schema: it requires {', '.join(uncovered) or 'a field'} "
                "that no voted field gives",
                "write answer: false (few-shot only), or give the gate a schema of voted fields only",
            )
            continue
        draft.gates[name] = dataclasses.replace(gate, examples=dataclasses.replace(examples, fields=tuple(fields)))


def _plugin_agents(draft: Draft, key: str, plugin_dir: Path) -> None:
    """Declare ``agent.<plugin>.<server>`` for each MCP server of an Agent Plugins directory."""
    from localllm.plugins import load_agent_plugin, mcp_agent_decls

    result = load_agent_plugin(plugin_dir)
    if not result.ok:
        for diag in result.diagnostics:
            draft.problems.add(key, f"plugin rejected: {diag.message}", f"run `localllm plugins check {plugin_dir}`")
        return
    for diag in result.diagnostics:  # a part skipped (bad mcp.json, bad flow) is reported, never silent
        draft.diagnostics.append({**diag.to_json(), "key": key})
    for alias, server in mcp_agent_decls(result):
        if alias in draft.agents:
            draft.problems.add(key, f'MCP server alias "{alias}" collides with a declared agent')
            continue
        query = server.url.partition("?")[2]  # a query string can carry a token (plugins keeps url out of repr)
        values = (*server.env.values(), *server.headers.values(), query, server.url if query else "")
        draft.ctx.secrets.update(v for v in values if v)
        if server.transport == "http":
            draft.agents[alias] = McpHttpDecl(
                alias=alias, plugin="mcp_http", endpoint=server.url, headers=dict(server.headers)
            )
        else:
            draft.agents[alias] = McpStdioDecl(
                alias=alias,
                plugin="mcp_stdio",
                command=server.command,
                args=server.args,
                env=dict(server.env),
                cwd=server.cwd,
                plugin_dir=plugin_dir,
                server=server.name,
            )


def _check_schemas(draft: Draft) -> None:
    """Each static gate schema parses, its ``$ref``s stay inside, and a ``decide`` gate on a
    ``grammar: true`` local model stays inside the llama.cpp grammar subset."""
    from localllm.errors import SchemaError
    from localllm.schema import bundle_file_refs, read_schema_file, ref_problems

    # each file read once, however many gates and checks (refs, bundle) reach it; read-only
    read = functools.cache(read_schema_file)
    for gate in draft.gates.values():
        if gate.schema_path is None:
            continue
        key = f"gates.{gate.name}.with.schema"
        from localllm.grammar.compile import fan_out, meta_problem

        try:
            # the meta-schema first: the ref check reads $id and $ref as the meta-schema types them
            invalid = meta_problem(read(gate.schema_path), formats=False)
            if invalid is not None:  # before: `check` said ok and the call raised jsonschema's own error
                where, reason = invalid
                draft.problems.add(key, f"{gate.schema_path}: not a valid JSON Schema at {where}: {reason}")
                continue
            if costly := fan_out(read(gate.schema_path)):  # no answer could be checked in time
                draft.problems.add(key, f"{gate.schema_path}: at {costly[0]}: {costly[1]}")
                continue
            issues = ref_problems(gate.schema_path, draft.ctx.base_dir, read)
        except SchemaError as exc:
            draft.problems.add(key, str(exc))
            continue
        except RecursionError:
            draft.problems.add(key, f"{gate.schema_path} is nested too deeply to check")
            continue
        for issue in issues:
            draft.problems.add(key, issue)
        decl = draft.agents.get(gate.agent)
        if (
            issues
            or gate.verb != "decide"
            or not isinstance(decl, LocalLLMDecl)
            or not decl.grammar
            or decl.json_schema
        ):
            continue
        from localllm.grammar import format_violation, unenforced

        # the grammar is compiled from what the agent is sent: the file refs made local
        bundled = bundle_file_refs(gate.schema_path, draft.ctx.base_dir, read)
        for violation in unenforced(bundled, compiled=decl.grammar is True):
            draft.problems.add(
                key,
                format_violation(violation, gate.agent, str(gate.schema_path)),
                "drop or relax that keyword (llama.cpp cannot enforce it, with json_schema: true "
                "neither), or route the gate to another agent; answers are still validated",
            )
