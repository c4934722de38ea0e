"""``localllm serve``, ``localllm ps`` and ``localllm stop``: the machine-wide service."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from localllm.cli.output import EXIT_OK, UsageError, check_range, emit_json, err, out

__all__ = ["SETUP"]

#: what a browser sends as Origin: scheme://host[:port], nothing after it
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[^\s/:\[\]]+)(:\d{1,5})?", re.IGNORECASE)
#: a DNS name or an IP literal (IPv6 with or without brackets)
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?|\[?[0-9a-f.]*:[0-9a-f.]*:[0-9a-f:.]*\]?", re.IGNORECASE)

_HELP = {
    "serve": "run the OpenAI-compatible service that owns this cache's models",
    "ps": "list the models the running service has loaded",
    "stop": "unload a model from the running service, or stop the service",
}


def _setup_serve(serve: argparse.ArgumentParser) -> None:
    from localllm.service.daemon import DEFAULT_PORT

    serve.add_argument("--config", "-c", type=Path, help="also serve this config's managed models, with its settings")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free)")
    serve.add_argument(
        "--keep-alive",
        default="5m",
        metavar="DURATION",
        help="unload a model idle this long (30s, 5m, 1h; 0 = at once, -1 = never; default 5m)",
    )
    serve.add_argument("--max-models", type=int, metavar="N", help="at most N models loaded (LRU idle one unloads)")
    serve.add_argument("--memory-budget", metavar="GiB", help="keep loaded models within this RSS (e.g. 6 or 512MiB)")
    serve.add_argument(
        "--parallel",
        type=int,
        default=None,
        metavar="N",
        help="slots of a pinned chat model's server, 1-256 (default 4)",
    )
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument("--api-key-env", metavar="NAME", help="take the bearer token from this variable")
    auth.add_argument("--no-auth", action="store_true", help="accept requests without a token (loopback only)")
    serve.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let a web app at ORIGIN (e.g. http://localhost:3000) call the service; repeatable",
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host name besides the bound loopback address (e.g. a LAN name); repeatable",
    )
    limits = serve.add_argument_group("limits (see README: the HTTP front)")
    limits.add_argument(
        "--max-tokens",
        type=int,
        default=1024,
        metavar="N",
        help="default and ceiling of a chat answer's max_tokens (1024)",
    )
    limits.add_argument(
        "--max-queue",
        type=int,
        default=256,
        metavar="N",
        help="proxied requests in flight, those being prepared included; beyond: 503 + Retry-After (256)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        default=2048,  # service.api.DEFAULT_CONNECTIONS
        metavar="N",
        help="open client connections; beyond: 503 (2048, fewer under a lower open-files hard limit)",
    )
    limits.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds a request's line and headers may take to arrive (10)",
    )
    limits.add_argument(
        "--idle-timeout",
        type=float,
        default=15.0,
        metavar="S",
        help="close a keep-alive connection idle this long (15)",
    )
    limits.add_argument("--max-body", default="16MiB", metavar="SIZE", help="largest request body (16MiB); larger: 413")
    serve.add_argument("--detach", action="store_true", help="run in the background (log: <cache>/run/service.log)")
    serve.add_argument("--json", action="store_true", help="announce the service (pid, url, token file, log) as JSON")
    serve.set_defaults(handler=_serve)


def _setup_ps(ps: argparse.ArgumentParser) -> None:
    ps.add_argument("--json", action="store_true", help="print the service and its models as JSON")
    ps.set_defaults(handler=_ps)


def _setup_stop(stop: argparse.ArgumentParser) -> None:
    stop.add_argument("model", nargs="?", help="the model id to unload")
    stop.add_argument("--all", action="store_true", help="stop the service and every model it runs")
    stop.add_argument("--json", action="store_true", help="print what was stopped as JSON")
    stop.set_defaults(handler=_stop)


#: command name → adds its arguments and handler (the lazy command table's convention)
SETUP = {"serve": _setup_serve, "ps": _setup_ps, "stop": _setup_stop}


def _options(args: argparse.Namespace) -> Any:
    import resource

    from localllm import settings
    from localllm.config.decls import MAX_PARALLEL
    from localllm.service.api import DEFAULT_CONNECTIONS
    from localllm.service.daemon import DEFAULT_PORT, ServeOptions, is_loopback, parse_duration, parse_size
    from localllm.service.front import FD_RESERVE

    try:
        keep_alive = parse_duration(args.keep_alive)
        budget = parse_size(args.memory_budget) if args.memory_budget else None
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.max_models is not None:
        check_range("--max-models", args.max_models, low=1)
    if args.parallel is not None:  # before: any number; 100,000 made every model's load abort (a 503 each)
        check_range("--parallel", args.parallel, low=1, high=MAX_PARALLEL, default=4)
    check_range("--port", args.port, low=0, high=65535, default=f"{DEFAULT_PORT}; 0 = any free port")
    for origin in args.allow_origin:
        if origin.strip() != "*" and not _ORIGIN.fullmatch(origin.strip().rstrip("/")):
            raise UsageError(
                f"--allow-origin {origin!r} is not an origin: give SCHEME://HOST[:PORT] with no path "
                "(e.g. http://localhost:3000), or * for any page"
            )
    for name in args.allow_host:
        if not _HOST_NAME.fullmatch(name.strip()):
            raise UsageError(
                f"--allow-host {name!r} is not a host name: give the name alone (e.g. box.lan or 192.168.1.7), "
                "without scheme, port or path"
            )
    if args.no_auth and not is_loopback(args.host):
        raise UsageError(f"--no-auth cannot be used with --host {args.host}: a non-loopback address needs a token")
    for flag, value in (("--max-tokens", args.max_tokens), ("--max-queue", args.max_queue)):
        check_range(flag, value, low=1)
    # a connection is an open file, and the service keeps FD_RESERVE for itself: past the hard
    # limit, the bound promised a 503 that accept() could not give (EMFILE)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    most = None if hard == resource.RLIM_INFINITY else max(1, hard - FD_RESERVE)
    if args.max_connections == DEFAULT_CONNECTIONS and most is not None:  # the default, lowered to fit
        args.max_connections = min(DEFAULT_CONNECTIONS, most)
    check_range("--max-connections", args.max_connections, low=1, high=most, default=DEFAULT_CONNECTIONS)
    for flag, seconds in (("--header-timeout", args.header_timeout), ("--idle-timeout", args.idle_timeout)):
        # inf reached the front, which rounds it (OverflowError)
        check_range(flag, seconds, low=0.0, high=86_400.0, low_open=True, high_open=True, unit="seconds")
    try:
        max_body = parse_size(args.max_body if args.max_body[-1:].isalpha() else args.max_body + "MiB")
    except ValueError as exc:
        raise UsageError(f"--max-body: {exc}") from exc
    from localllm.service.api import FrontLimits
    from localllm.service.chat import ChatLimits

    limits = FrontLimits(
        max_body=max_body,
        max_queue=args.max_queue,
        max_connections=args.max_connections,
        header_timeout=args.header_timeout,
        idle_timeout=args.idle_timeout,
        chat=ChatLimits(max_tokens=args.max_tokens),
    )
    token = None
    if args.api_key_env:
        token = settings.env_value(args.api_key_env)
        if not token:
            raise UsageError(f"--api-key-env {args.api_key_env}: the variable is not set; export it first")
        from localllm._http import token_issue

        issue = token_issue(token)
        if issue:
            raise UsageError(
                f"--api-key-env {args.api_key_env}: its value {issue}",
                hint=f"export {args.api_key_env} again with the key alone",
            )
    return ServeOptions(
        host=args.host,
        port=args.port,
        keep_alive=keep_alive,
        max_models=args.max_models,
        memory_budget=budget,
        token=token,
        no_auth=args.no_auth,
        chat_parallel=args.parallel or 4,
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host),
        limits=limits,
    )


def _child_argv(args: argparse.Namespace) -> list[str]:
    out = ["--host", args.host, "--port", str(args.port), "--keep-alive", args.keep_alive]
    out += ["--max-tokens", str(args.max_tokens), "--max-queue", str(args.max_queue)]
    out += ["--max-connections", str(args.max_connections), "--max-body", args.max_body]
    out += ["--header-timeout", str(args.header_timeout), "--idle-timeout", str(args.idle_timeout)]
    if args.config is not None:
        out += ["--config", str(args.config.resolve())]
    for flag, value in (
        ("--max-models", args.max_models),
        ("--memory-budget", args.memory_budget),
        ("--parallel", args.parallel),
        ("--api-key-env", args.api_key_env),
    ):
        if value is not None:
            out += [flag, str(value)]
    for origin in args.allow_origin:
        out += ["--allow-origin", origin]
    for name in args.allow_host:
        out += ["--allow-host", name]
    if args.no_auth:
        out.append("--no-auth")
    return out


def _announce(
    pid: int, url: str, token_file: str | None, log_file: Path | None = None, *, as_json: bool = False
) -> None:
    if as_json:
        doc = {"pid": pid, "url": f"{url}/v1", "token_file": token_file, "log": str(log_file) if log_file else None}
        emit_json(doc)
        sys.stdout.flush()
        return
    token = f"token file {token_file}" if token_file else "no auth"
    where = f", log {log_file}" if log_file else ""
    sys.stdout.write(f"localllm service pid {pid} at {url}/v1 ({token}{where})\n")
    sys.stdout.flush()


def _serve(args: argparse.Namespace) -> int:
    options = _options(args)
    config = None
    if args.config is not None:
        from localllm.cli.foundation import load

        config = load(args.config)
    if args.detach:
        from localllm.service import control

        found, log_file = control.detach(_child_argv(args))
        _announce(found.pid, found.url, found.token_file, log_file, as_json=args.json)
        return EXIT_OK
    import logging

    from localllm.service.daemon import Service

    logger = logging.getLogger("localllm.service")
    handler = None
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    try:
        service = Service(options, config=config).start()
        _announce(os.getpid(), service.url, str(service.token_path) if service.token else None, as_json=args.json)
        service.wait()
    finally:  # an in-process caller (a test, an embedding app) keeps no handler on a stream it may close
        if handler is not None:
            logger.removeHandler(handler)
    return EXIT_OK


def _human_bytes(value: Any) -> str:
    if not isinstance(value, int):
        return "-"
    return f"{value / (1 << 30):.1f} GiB" if value >= 1 << 30 else f"{value / (1 << 20):.0f} MiB"


def _human_seconds(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    if value < 60:
        return f"{value:.0f}s"
    return f"{value / 60:.0f}m" if value < 3600 else f"{value / 3600:.1f}h"


def _ps(args: argparse.Namespace) -> int:
    from localllm.service import control

    data = control.ps()
    if args.json:
        emit_json(data)
        return EXIT_OK
    service = data["service"]
    err(f"service pid {service['pid']} at {service['url']} (keep-alive {_human_seconds(service['keep_alive_s'])})")
    rows = [("MODEL", "ROLE", "STATE", "PID", "PORT", "SLOTS", "SERVED", "IDLE", "RSS", "GRAMMAR")]
    canary = {True: "enforced", False: "IGNORED", None: "-"}  # the start-up grammar canary
    for m in data["models"]:
        rows.append(
            (
                m["id"],
                m["role"],
                m["state"],
                str(m["pid"] or "-"),
                str(m["port"] or "-"),
                f"{m['slots_busy']}/{m['slots_total']}",
                str(m["requests_served"]),
                _human_seconds(m["idle_s"]),
                _human_bytes(m["rss_bytes"]),
                canary[m.get("grammar_enforced")],
            )
        )
    if not data["models"]:
        err("no models loaded")
        return EXIT_OK
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    from localllm.service import control

    if args.all == (args.model is not None):
        raise UsageError("give a MODEL to unload, or --all to stop the service")
    if args.all:
        result = control.stop()
        if args.json:
            emit_json({**result, "what": "service"})
        else:
            out(f"stopped the service (pid {result['pid']})")
        return EXIT_OK
    result = control.stop(args.model)
    if args.json:
        emit_json({"model": args.model, **result})
    else:
        out(f"unloaded {args.model}" if result["unloaded"] else f"{args.model} was not loaded")
    return EXIT_OK
