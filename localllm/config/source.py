"""Reading the config file: bounded YAML, every failure a ``ConfigError``.

YAML can be made to explode: aliases that expand exponentially ("billion laughs"), an
alias inside its own anchor (a cycle), nesting deep enough to exhaust the stack. The
composer below counts the *expanded* size of the document as it goes and its depth, and
stops at :data:`MAX_NODES` / :data:`MAX_DEPTH` with a clear problem, in milliseconds.
PyYAML's own failures on odd input (``!!timestamp banana``, ``"\\U00110000"``) are
caught here, at the one place the foreign parser runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from localllm._fs import Unreadable, read_capped
from localllm.errors import ConfigError, ConfigProblem

#: deepest nesting a config may use (real ones use < 10)
MAX_DEPTH = 64
#: most nodes a config may expand to, aliases counted at every use
MAX_NODES = 100_000
#: largest config file read (bytes)
MAX_BYTES = 4 << 20
#: the file a command finds in its directory by itself
CONVENTIONAL_NAME = "localllm.yaml"


def _fail(file: Path, message: str, hint: str = "fix the YAML") -> ConfigError:
    return ConfigError([printable(ConfigProblem(str(file), "", message, hint))])


def printable(problem: ConfigProblem) -> ConfigProblem:
    """``problem`` with lone surrogates and control characters escaped, so it can be printed
    (and written as JSON) anywhere; names and values from the file may hold either."""

    def clean(text: str) -> str:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return "".join(ch if ch >= " " or ch in "\n\t" else f"\\x{ord(ch):02x}" for ch in text)

    return ConfigProblem(clean(problem.file), clean(problem.key), clean(problem.message), clean(problem.hint))


def read_yaml(file: Path) -> Any:
    """The parsed document of ``file`` (``None`` when empty), or ``ConfigError``."""
    try:
        text = read_capped(file, MAX_BYTES).decode("utf-8")
    except FileNotFoundError as exc:
        raise _fail(file, "config file not found", "check the path") from exc
    except IsADirectoryError as exc:  # `localllm check examples/quickstart`: the app, not its file
        inside = sorted(p.name for p in file.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))
        named = f"; it holds {', '.join(inside[:5])}" if inside else ""
        raise _fail(
            file,
            f"is a directory, not a config file{named}",
            f"name the file: {file / inside[0]}"
            if len(inside) == 1
            else f"name the file, e.g. {file / CONVENTIONAL_NAME}",
        ) from exc
    except UnicodeDecodeError as exc:  # the file, not its path: its bytes are not UTF-8
        raise _fail(
            file, f"config file is not UTF-8 text: {exc}", "save the file as UTF-8 (YAML configs are UTF-8)"
        ) from exc
    except Unreadable as exc:  # a device, or past MAX_BYTES
        raise _fail(file, f"cannot read config file: {exc}", "a config is a few KiB of YAML text") from exc
    except (OSError, UnicodeError, ValueError) as exc:  # ValueError: NUL or a lone surrogate in the path
        raise _fail(file, f"cannot read config file: {exc}", "check the path") from exc
    return parse_yaml(text, file)


def parse_yaml(text: str, file: Path, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """``text`` parsed with the bounded safe loader: at most ``max_nodes`` nodes once aliases
    are expanded, ``max_depth`` levels deep."""
    import yaml

    loader = _bounded_loader(yaml, max_nodes, max_depth)(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise _fail(file, f"YAML syntax error{where}: {reason}", "fix the YAML syntax") from exc
    except (ValueError, TypeError, AttributeError, OverflowError, IndexError) as exc:
        # PyYAML's constructors fail this way on scalars that look typed but are not
        # (a month 13 timestamp, an escape past U+10FFFF, a digit string past int's limit)
        mark = getattr(loader, "mark", None) or loader.get_mark()
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _fail(file, f"YAML value error{where}: {exc}", "quote the value to keep it a string") from exc
    finally:
        loader.dispose()


def _bounded_loader(yaml: Any, max_nodes: int, max_depth: int) -> Any:
    class BoundedLoader(yaml.SafeLoader):  # type: ignore[misc]
        """SafeLoader that refuses deep nesting, cyclic aliases and alias bombs."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._depth = 0
            self._total = 0
            self._sizes: dict[str, int] = {}

        def _count(self, n: int, mark: Any) -> None:
            self._total += n
            if self._total > max_nodes:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"the document expands to more than {max_nodes} nodes (aliases counted at every use): a YAML bomb?",
                    mark,
                )

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in self.anchors and event.anchor not in self._sizes:
                    raise yaml.composer.ComposerError(
                        None, None, f"alias *{event.anchor} refers to its own anchor (a cycle)", event.start_mark
                    )
                self._count(self._sizes.get(event.anchor, 1), event.start_mark)
                return super().compose_node(parent, index)
            self._depth += 1
            if self._depth > max_depth:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {max_depth} levels", event.start_mark
                )
            before = self._total
            node = super().compose_node(parent, index)
            self._depth -= 1
            self._count(1, event.start_mark)
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                self._sizes[anchor] = self._total - before
            return node

    def timestamp(loader: Any, node: Any) -> Any:
        value = loader.construct_scalar(node)
        if not yaml.constructor.SafeConstructor.timestamp_regexp.match(value):
            raise yaml.constructor.ConstructorError(None, None, f"{value!r} is not a timestamp", node.start_mark)
        return yaml.constructor.SafeConstructor.construct_yaml_timestamp(loader, node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", timestamp)
    return BoundedLoader
