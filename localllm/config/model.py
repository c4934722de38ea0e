"""``Config``: a loaded, checked config file, and the questions the runtime asks of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from localllm import settings
from localllm.config.decls import (
    DEFAULT_FALLBACK,
    AgentDecl,
    EmbedderDecl,
    Gate,
    InprocessDecl,
    Intent,
    LocalLLMDecl,
    RouterDecl,
)
from localllm.errors import ConfigError, ConfigProblem

#: secret values shorter than this are not redacted: they cannot be credentials, and
#: replacing "1" everywhere would garble every message
MIN_SECRET = 4


@dataclass(frozen=True)
class Config:
    """A loaded, checked config file. Its ``repr`` never shows env or header values."""

    path: Path
    base_dir: Path
    app_id: str
    agents: dict[str, AgentDecl]
    gates: dict[str, Gate]
    embedders: dict[str, EmbedderDecl]
    intents: dict[str, Intent]
    router: RouterDecl | None
    plugin_dirs: tuple[Path, ...] = ()
    #: every interpolated env/header value and every ``${VAR}`` value substituted into one
    secrets: tuple[str, ...] = field(default=(), repr=False, compare=False)
    #: the Agent Plugins loader's diagnostics for ``plugin_dirs`` that loaded with a part
    #: skipped or doubted (a bad mcp.json, a bad flow file, …): ``section`` (the spec
    #: clause), ``rule``, ``origin``, ``message``, ``severity``, ``key`` (plugin_dirs[i])
    diagnostics: tuple[dict[str, str], ...] = field(default=(), compare=False)

    def fallback_for(self, alias: str, gate: str | None = None) -> str | None:
        """Who answers after ``alias`` returns ``schema_invalid`` (in ``gate``), or ``None``.

        A ``builtin.local_llm`` agent falls back to its ``fallback:`` (default
        ``agent.claude``), a gate's ``fallback:`` overrides it; an in-process agent
        registered with ``local_model=True`` behaves like a local model; nothing else
        falls back.
        """
        decl = self.agents.get(alias)
        given = self.gates[gate].fallback if gate is not None and gate in self.gates else None
        if isinstance(decl, LocalLLMDecl):
            chosen = given or decl.fallback
        elif isinstance(decl, InprocessDecl):
            chosen = given or DEFAULT_FALLBACK
        else:
            return None
        if chosen in ("none", alias) or chosen not in self.agents:
            return None
        return chosen

    def fallbacks(self) -> dict[str, str | None]:
        """Gate name → the alias its local answers fall back to (``None``: no fallback)."""
        return {name: self.fallback_for(gate.agent, name) for name, gate in self.gates.items()}

    def secret_values(self) -> tuple[str, ...]:
        """Every value a redactor must hide, longest first: interpolated ``env``/``headers``
        values (and the ``${VAR}`` values in them) and the current value of every
        ``api_key_env`` variable."""
        values = set(self.secrets)
        for decl in (*self.agents.values(), *self.embedders.values()):
            name = getattr(decl, "api_key_env", None)
            if name:
                value = settings.env_value(name)
                if value:
                    values.add(value)
        return tuple(sorted((v for v in values if len(v) >= MIN_SECRET), key=lambda v: (-len(v), v)))

    def schema_for(self, gate: Gate | str, render: Callable[[str], str]) -> Path | None:
        """The schema file of one call of ``gate``: a templated ``with.schema`` is rendered
        with ``render`` (the runtime's ``{{ args.* }}`` renderer) and must name a file under
        the config directory; ``ConfigError`` otherwise."""
        found = self.gates[gate] if isinstance(gate, str) else gate
        if found.schema_path is not None or found.schema is None:
            return found.schema_path
        from localllm._fs import inside
        from localllm.config.fields import path_issue

        rendered = render(found.schema)
        key = f"gates.{found.name}.with.schema"

        def fail(message: str, hint: str) -> ConfigError:
            return ConfigError([ConfigProblem(str(self.path), key, message, hint)])

        issue = path_issue(rendered)
        target = None if issue else inside(self.base_dir, rendered)
        if target is None:
            raise fail(
                f"{found.schema!r} rendered to {rendered!r}, {issue or 'outside the config directory'}",
                "pass args that name a schema under the config directory",
            )
        try:
            ok = target.is_file()
        except OSError:
            ok = False
        if not ok:
            raise fail(
                f"{found.schema!r} rendered to {rendered!r}: file {target} not found",
                "pass args that name an existing schema file",
            )
        return target
