"""``flows/`` — a host extension (not part of Agent Plugins 1.0.0; other clients ignore it).

Each ``flows/*.flow.json`` (or ``.flow.yaml`` / ``.flow.yml``) file holds one flow
definition. localllm validates only the host-neutral envelope and hands the whole
document to the host:

    name         string: letters, digits, '.', '_', '-' (1-64), unique within the plugin
    description  optional string
    start        string: the id of one of the nodes
    nodes        non-empty array of objects, each with a non-empty string "kind" and a
                 unique non-empty string "id"

Other fields (node bodies, ``next`` edges, …) belong to the host and pass through
untouched. One bad file skips that flow; a missing ``flows/`` is not an error.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import MappingProxyType
from typing import Any

from localllm.plugins import files
from localllm.plugins.diagnostics import Diagnostic, origin_of
from localllm.plugins.result import Flow

FLOWS_DIR = "flows"
SECTION = "flows"
FLOW_SUFFIXES = (".flow.json", ".flow.yaml", ".flow.yml")

_FLOW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def load_flows(root: Path, shown_root: Path) -> tuple[list[Flow], list[Diagnostic]]:
    """Load every flow file under ``flows/`` in name order."""
    probe = files.probe_location(root / FLOWS_DIR, root, section=SECTION, want_dir=True, clause="")
    if isinstance(probe, files.Missing):
        return [], []
    if probe is not None:
        return [], [
            Diagnostic(
                probe.component, probe.rule, str(shown_root / FLOWS_DIR), probe.message, probe.severity, probe.clause
            )
        ]
    try:
        with os.scandir(root / FLOWS_DIR) as it:
            names = sorted(entry.name for entry in it)
    except OSError as exc:
        return [], [
            Diagnostic(SECTION, "unreadable", str(shown_root / FLOWS_DIR), f"cannot list flows/: {exc.strerror or exc}")
        ]
    flows: list[Flow] = []
    diagnostics: list[Diagnostic] = []
    seen: dict[str, str] = {}
    for name in names:
        if name.startswith("."):
            continue
        shown = shown_root / FLOWS_DIR / name
        if not files.utf8_name(name):
            diagnostics.append(
                Diagnostic(
                    SECTION,
                    "flow-file-name-invalid",
                    str(shown),
                    "the file name is not UTF-8; rename it to load this flow",
                )
            )
            continue
        if not name.endswith(FLOW_SUFFIXES):
            if os.path.isfile(root / FLOWS_DIR / name):
                diagnostics.append(
                    Diagnostic(
                        SECTION,
                        "not-a-flow-file",
                        str(shown),
                        f"flows/{name} ignored: flow files end in .flow.json, .flow.yaml or .flow.yml",
                        severity="info",
                    )
                )
            continue
        flow = _load_one(root, root / FLOWS_DIR / name, shown)
        if isinstance(flow, Diagnostic):
            diagnostics.append(flow)
        elif flow.name in seen:
            diagnostics.append(
                Diagnostic(
                    SECTION,
                    "flow-duplicate-name",
                    origin_of(str(shown), "name"),
                    f"flow name {flow.name!r} is already defined by {seen[flow.name]}; this file is skipped",
                )
            )
        else:
            seen[flow.name] = f"flows/{name}"
            flows.append(flow)
    return flows, diagnostics


def _load_one(root: Path, path: Path, shown: Path) -> Flow | Diagnostic:
    where = str(shown)
    probe = files.probe_location(path, root, section=SECTION, want_dir=False, clause="")
    if isinstance(probe, files.Missing):  # vanished between listing and reading
        return Diagnostic(SECTION, "unreadable", where, f"{path.name} disappeared while loading")
    if probe is not None:
        return Diagnostic(probe.component, probe.rule, where, probe.message, probe.severity, probe.clause)
    text = files.read_text(path, section=SECTION)
    if isinstance(text, Diagnostic):
        return Diagnostic(text.component, text.rule, where, text.message, text.severity, text.clause)
    if path.name.endswith(".flow.json"):
        parsed = files.parse_json(text, shown, section=SECTION, rule="flow-invalid-json")
        if isinstance(parsed, Diagnostic):
            return parsed
        data = parsed.value
    else:
        loaded = files.parse_yaml(text, where, section=SECTION, rule="flow-invalid-yaml")
        if isinstance(loaded, Diagnostic):
            return loaded
        data = loaded
    return _check_envelope(data, where)


def _check_envelope(data: Any, where: str) -> Flow | Diagnostic:
    def bad(message: str, *pointer: str | int) -> Diagnostic:
        return Diagnostic(SECTION, "flow-schema-invalid", origin_of(where, *pointer), message + "; flow skipped")

    if not isinstance(data, dict):
        return bad("a flow file must contain one object with name, start and nodes")
    name = data.get("name")
    if not isinstance(name, str) or not _FLOW_NAME.fullmatch(name):
        return bad("\"name\" must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", "name")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        return bad('"description" must be a string', "description")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        return bad('"nodes" must be a non-empty array of node objects', "nodes")
    ids: list[str] = []
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            return bad("each node must be an object", "nodes", i)
        node_id, kind = node.get("id"), node.get("kind")
        if not isinstance(node_id, str) or not node_id:
            return bad('each node needs a non-empty string "id"', "nodes", i, "id")
        if not isinstance(kind, str) or not kind:
            return bad('each node needs a non-empty string "kind"', "nodes", i, "kind")
        if node_id in ids:
            return bad(f"node id {node_id!r} is used twice", "nodes", i, "id")
        ids.append(node_id)
    start = data.get("start")
    if not isinstance(start, str) or start not in ids:
        return bad('"start" must be the id of one of the nodes', "start")
    return Flow(
        name=name,
        start=start,
        origin=where,
        description=description,
        node_ids=tuple(ids),
        definition=MappingProxyType(dict(data)),
    )
