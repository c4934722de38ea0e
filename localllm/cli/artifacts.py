"""``localllm fetch | cache | doctor | models``: thin commands over :mod:`localllm.managed`."""

from __future__ import annotations

import argparse
import re
from typing import Any

from localllm.cli.output import EXIT_FAILED, EXIT_OK, UsageError, emit_json, err, out, warn

_MIRROR_HELP = "directory or base URL tried before the pinned URL"


def mirror_arg(text: str) -> str:
    """An argparse ``type=`` for ``--mirror``: an http(s) base URL, or a directory (a path or a
    ``file://`` URL) that exists; anything else is a usage error naming the value (exit 2)."""
    from pathlib import Path

    from localllm.managed.fetch import mirror_location

    if "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} contains a NUL byte")
    try:
        kind, where = mirror_location(text)
    except ValueError as exc:  # http://[::1
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL: {exc}") from exc
    if kind == "url":
        return text
    if kind == "other" or not Path(where).is_dir():
        what = "no such directory" if kind == "dir" else "not an http(s):// or file:// URL"
        raise argparse.ArgumentTypeError(f"{text!r}: {what} (a mirror is a directory or an http(s):// base URL)")
    return text


def _setup_fetch(parser: argparse.ArgumentParser) -> None:
    fsub = parser.add_subparsers(dest="fetch_what", metavar="WHAT", required=True)
    server = fsub.add_parser("server", help="fetch (or build) llama-server; print its path")
    how = server.add_mutually_exclusive_group()
    how.add_argument(
        "--from-source", action="store_true", help="build from the pinned llama.cpp source (13-20 min the first time)"
    )
    how.add_argument(
        "--prebuilt-only",
        action="store_true",
        help="fail when the prebuilt release is unreachable instead of building from source",
    )
    server.add_argument("--mirror", type=mirror_arg, metavar="M", help=_MIRROR_HELP)
    server.add_argument("--json", action="store_true", help="print JSON")
    server.set_defaults(handler=_fetch_server)
    model = fsub.add_parser("model", help="fetch a model's GGUF; print its path")
    model.add_argument("id", metavar="ID", nargs="?", help="a pinned model id (`localllm models` lists them)")
    model.add_argument("--url", metavar="U", help="add a model first: its https:// GGUF URL (with --sha256, --id)")
    model.add_argument("--sha256", metavar="H", help="the GGUF's sha256 (64 hex digits)")
    model.add_argument("--id", dest="new_id", metavar="NAME", help="the id to pin it under (default: ID)")
    model.add_argument("--role", choices=["chat", "embedding"], default="chat", help="what the model is for")
    model.add_argument("--replace", action="store_true", help="with --url: replace a user pin of the same id")
    model.add_argument("--mirror", type=mirror_arg, metavar="M", help=_MIRROR_HELP)
    model.add_argument("--json", action="store_true", help="print JSON")
    model.set_defaults(handler=_fetch_model, usage=model.format_usage())


def _setup_cache(parser: argparse.ArgumentParser) -> None:
    csub = parser.add_subparsers(dest="cache_what", metavar="ACTION", required=True)
    lst = csub.add_parser("list", help="what is cached")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(handler=_cache_list)
    ver = csub.add_parser("verify", help="re-hash everything; re-fetch corrupted files")
    ver.add_argument("--no-refetch", action="store_true", help="only report corrupted files")
    ver.add_argument("--mirror", type=mirror_arg, metavar="M", help=_MIRROR_HELP)
    ver.add_argument("--json", action="store_true", help="print JSON")
    ver.set_defaults(handler=_cache_verify)
    rm = csub.add_parser("rm", help="remove a cached model (by id) or an embedding store (by file name)")
    rm.add_argument("name", metavar="ID", help="a model id or store name from `localllm cache list`")
    rm.add_argument("--json", action="store_true", help="print JSON")
    rm.set_defaults(handler=_cache_rm)
    prune = csub.add_parser("prune", help="remove stale entries and leftover temp files")
    prune.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    prune.add_argument("--json", action="store_true", help="print JSON")
    prune.set_defaults(handler=_cache_prune)


def _setup_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=_doctor)


def _setup_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--unpin", metavar="ID", help="remove a model you pinned from your pins file")
    parser.set_defaults(handler=_models)


SETUP = {"fetch": _setup_fetch, "cache": _setup_cache, "doctor": _setup_doctor, "models": _setup_models}


def _size(n: int) -> str:
    from localllm.managed.fetch import human_size

    return human_size(n)


def _fetch_server(args: argparse.Namespace) -> int:
    from localllm.errors import DownloadFailed, UnsupportedPlatform
    from localllm.managed.acquire import ensure_server

    try:
        install = ensure_server(from_source=args.from_source, mirror=args.mirror)
    except (DownloadFailed, UnsupportedPlatform) as exc:
        if args.from_source or args.prebuilt_only:
            raise
        # No prebuilt reachable (or none for this platform): not an error yet, the pinned
        # source is the way on, and saying so first is what the user needs to read.
        why = str(exc).split(";", 1)[0]
        err(f"localllm: building llama-server from the pinned source because no prebuilt is reachable ({why})")
        install = ensure_server(from_source=True, mirror=args.mirror)
    if args.json:
        emit_json(
            {
                "binary": str(install.binary),
                "release_dir": str(install.release_dir),
                "release": install.release,
                "source": install.source,
            }
        )
    else:
        out(str(install.binary))
    return EXIT_OK


def _check_pin_flags(args: argparse.Namespace) -> None:
    """``--sha256`` as typed is a usage error naming the flag (exit 2), before the pins file is
    opened: its own check speaks of ``models.entries.ID.sha256 … or null``."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", args.sha256):
        raise UsageError(
            f"--sha256 {args.sha256!r} is not a sha256: 64 hex digits",
            hint="`sha256sum FILE` prints it (the first word of its line)",
            usage=args.usage,
        )


def _fetch_model(args: argparse.Namespace) -> int:
    from localllm.managed.acquire import ensure_model
    from localllm.managed.pins import add_user_model, load_pins

    model_id = args.new_id or args.id
    if model_id is None:
        raise UsageError(
            "the following arguments are required: ID (or --id NAME)",
            hint="localllm models lists them; localllm fetch model ID",
            usage=args.usage,
        )
    if args.new_id and args.id and args.new_id != args.id:
        raise UsageError(f"two ids given: {args.id} and --id {args.new_id}", hint="give one of them", usage=args.usage)
    if (args.url is None) != (args.sha256 is None):
        raise UsageError(
            "--url and --sha256 go together", hint="localllm fetch model --url U --sha256 H --id NAME", usage=args.usage
        )
    if args.url is not None:
        _check_pin_flags(args)
        pin = add_user_model(model_id, url=args.url, sha256=args.sha256, role=args.role, replace=args.replace)
        err(f"localllm: pinned {model_id} in {pin.pins_file}")
    pins = load_pins()
    path = ensure_model(model_id, mirror=args.mirror, pins=pins)
    if args.json:
        emit_json(
            {
                "id": model_id,
                "path": str(path),
                "sha256": pins.models[model_id].artifact.sha256,
                "size": path.stat().st_size,
            }
        )
    else:
        out(str(path))
    return EXIT_OK


def _table(entries: list[Any]) -> None:
    for e in entries:
        out(f"{e.status:<12} {e.kind:<9} {_size(e.size):>10}  {e.path}" + (f"  ({e.detail})" if e.detail else ""))


def _cache_list(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import list_cache
    from localllm.managed.pins import load_pins

    layout = cache_layout()
    entries = list_cache(layout, load_pins())
    if args.json:
        emit_json({"cache_dir": str(layout.root), "entries": [e.to_json() for e in entries]})
    else:
        out(f"cache: {layout.root}")
        _table(entries)
    return EXIT_OK


def _cache_verify(args: argparse.Namespace) -> int:
    from localllm.managed.acquire import mirrors_with
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import verify_cache
    from localllm.managed.pins import load_pins

    entries = verify_cache(
        cache_layout(), load_pins(), refetch=not args.no_refetch, mirrors=mirrors_with(args.mirror), log=err
    )
    bad = [e for e in entries if e.status == "corrupt"]
    if args.json:
        emit_json({"ok": not bad, "entries": [e.to_json() for e in entries]})
    else:
        _table(entries)
    if bad:
        err(f"localllm: error: {len(bad)} corrupted cache entr{'y' if len(bad) == 1 else 'ies'} remain")
        return EXIT_FAILED
    return EXIT_OK


def _cache_rm(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import remove_entries
    from localllm.managed.pins import load_pins

    removed = remove_entries(cache_layout(), load_pins(), args.name, log=err)
    if args.json:
        emit_json({"removed": [e.to_json() for e in removed], "bytes": sum(e.size for e in removed)})
    else:
        _table(removed)
        out(f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, freed {_size(sum(e.size for e in removed))}")
    return EXIT_OK


def _models(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import model_rows
    from localllm.managed.pins import load_pins, user_pins_path

    if args.unpin is not None:
        from localllm.managed.pins import remove_user_model

        where = remove_user_model(args.unpin)
        if args.json:
            emit_json({"unpinned": args.unpin, "pins": str(where)})
        else:
            err(f"localllm: removed {args.unpin} from {where} (its cached GGUF, if any: localllm cache prune)")
        return EXIT_OK
    pins = load_pins()
    rows = model_rows(cache_layout(), pins)
    total = sum(int(r["size"] or 0) for r in rows if r["cached"])  # type: ignore[call-overload]
    if args.json:
        emit_json({"models": rows, "cached_bytes": total, "pins": str(pins.path), "user_pins": str(user_pins_path())})
        return EXIT_OK
    for r in rows:
        size = _size(int(r["size"])) if r["size"] is not None else "-"  # type: ignore[call-overload]
        if r["cached"]:
            state = "cached"
        elif r["source"] == "unpinned":
            state = "no sha256 pin: never fetched"
        else:
            state = f"not cached (from {'PyPI wheels' if r['source'] == 'pypi' else r['source']})"
        out(f"{r['id']:<26} {r['role']:<9} {size:>10}  {state}" + ("  (user pin)" if r["pinned"] == "user" else ""))
    out(
        f"{sum(1 for r in rows if r['cached'])} of {len(rows)} cached, {_size(total)}; "
        f"add models in {user_pins_path()} or with: localllm fetch model --url U --sha256 H --id NAME"
    )
    return EXIT_OK


def _cache_prune(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import prune_cache
    from localllm.managed.pins import load_pins

    removed = prune_cache(cache_layout(), load_pins(), dry_run=args.dry_run)
    freed = sum(e.size for e in removed if e.status != "in use")  # in use: another process is fetching it
    if args.json:
        emit_json({"dry_run": args.dry_run, "removed": [e.to_json() for e in removed], "bytes": freed})
    else:
        _table(removed)
        verb = "would free" if args.dry_run else "freed"
        out(f"{len(removed)} entries, {verb} {_size(freed)}")
    return EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.doctor import report
    from localllm.managed.pins import load_pins

    data = report(load_pins(), cache_layout())
    if args.json:
        emit_json(data)
        return EXIT_OK
    out(f"platform      {data['platform']}  ({data['os']}, python {data['python']})")
    out(f"glibc         {data['glibc'] or '-'}")
    cxx = data["libstdcxx"]
    if cxx:
        need = "shim needed" if cxx["shim_needed"] else "no shim needed"
        out(
            f"libstdc++     {cxx['path'] or 'not found'}: {cxx['highest']}; prebuilt needs "
            f"{cxx['server_needs']} ({need}; shim pin {cxx['shim_pin'] or 'none'})"
        )
    p = data["pins"]
    out(f"pins          {p['file']}")
    out(
        f"  server      {p['server_release']}: prebuilt for this platform: "
        f"{p['prebuilt_for_platform'] or 'none (use --from-source or endpoint mode)'}; source {p['source']}"
    )
    for mid, m in p["models"].items():
        default = " (default chat)" if mid == p["default_chat"] else ""
        out(f"  model       {mid}{default}: {m['role']}, {m['pin']}, {'cached' if m['cached'] else 'not cached'}")
        if m["template_warning"]:
            warn(f"{mid}: {m['template_warning']}")
    s = data["settings"]
    out(f"cache         {s['cache_dir']}")
    out(
        f"mirrors       {', '.join(s['mirrors']) or '-'}; offline {s['offline']}; "
        f"LOCALLLM_SERVER_BIN {s['server_bin'] or '-'}"
    )
    srv = data["server"]
    out(f"llama-server  {srv['binary'] + ' (' + srv['source'] + ')' if srv else 'not cached'}")
    for e in data["cache"]:
        out(f"  cached      {e['status']:<10} {e['kind']:<9} {_size(e['size']):>10}  {e['path']}")
    for name, tool in data["build_tools"].items():
        out(f"{name:<13} {tool['path'] + ' (' + (tool['version'] or '?') + ')' if tool else 'missing'}")
    return EXIT_OK
