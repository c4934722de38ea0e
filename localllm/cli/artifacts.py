"""``localllm fetch | cache | doctor``: thin commands over :mod:`localllm.managed`."""

from __future__ import annotations

import argparse
from typing import Any

from localllm.cli.output import EXIT_FAILED, EXIT_OK, emit_json, err, out

_MIRROR_HELP = "directory or base URL tried before the pinned URL"


def _setup_fetch(parser: argparse.ArgumentParser) -> None:
    fsub = parser.add_subparsers(dest="fetch_what", metavar="WHAT", required=True)
    server = fsub.add_parser("server", help="fetch (or build) llama-server; print its path")
    server.add_argument("--from-source", action="store_true",
                        help="build from the pinned llama.cpp source (~15 min the first time)")
    server.add_argument("--mirror", metavar="M", help=_MIRROR_HELP)
    server.add_argument("--json", action="store_true", help="print JSON")
    server.set_defaults(handler=_fetch_server)
    model = fsub.add_parser("model", help="fetch a model's GGUF; print its path")
    model.add_argument("id", metavar="ID", help="a pinned model id (`localllm doctor` lists them)")
    model.add_argument("--mirror", metavar="M", help=_MIRROR_HELP)
    model.add_argument("--json", action="store_true", help="print JSON")
    model.set_defaults(handler=_fetch_model)


def _setup_cache(parser: argparse.ArgumentParser) -> None:
    csub = parser.add_subparsers(dest="cache_what", metavar="ACTION", required=True)
    lst = csub.add_parser("list", help="what is cached")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(handler=_cache_list)
    ver = csub.add_parser("verify", help="re-hash everything; re-fetch corrupted files")
    ver.add_argument("--no-refetch", action="store_true", help="only report corrupted files")
    ver.add_argument("--mirror", metavar="M", help=_MIRROR_HELP)
    ver.add_argument("--json", action="store_true", help="print JSON")
    ver.set_defaults(handler=_cache_verify)
    prune = csub.add_parser("prune", help="remove stale entries and leftover temp files")
    prune.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    prune.add_argument("--json", action="store_true", help="print JSON")
    prune.set_defaults(handler=_cache_prune)


def _setup_doctor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=_doctor)


SETUP = {"fetch": _setup_fetch, "cache": _setup_cache, "doctor": _setup_doctor}


def _size(n: int) -> str:
    from localllm.managed.fetch import human_size

    return human_size(n)


def _fetch_server(args: argparse.Namespace) -> int:
    from localllm.managed.acquire import ensure_server

    install = ensure_server(from_source=args.from_source, mirror=args.mirror)
    if args.json:
        emit_json({"binary": str(install.binary), "release_dir": str(install.release_dir),
                   "release": install.release, "source": install.source})
    else:
        out(str(install.binary))
    return EXIT_OK


def _fetch_model(args: argparse.Namespace) -> int:
    from localllm.managed.acquire import ensure_model
    from localllm.managed.pins import load_pins

    pins = load_pins()
    path = ensure_model(args.id, mirror=args.mirror, pins=pins)
    if args.json:
        emit_json({"id": args.id, "path": str(path), "sha256": pins.models[args.id].artifact.sha256,
                   "size": path.stat().st_size})
    else:
        out(str(path))
    return EXIT_OK


def _table(entries: list[Any]) -> None:
    for e in entries:
        out(f"{e.status:<12} {e.kind:<9} {_size(e.size):>10}  {e.path}"
            + (f"  ({e.detail})" if e.detail else ""))


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

    entries = verify_cache(cache_layout(), load_pins(), refetch=not args.no_refetch,
                           mirrors=mirrors_with(args.mirror), log=err)
    bad = [e for e in entries if e.status == "corrupt"]
    if args.json:
        emit_json({"ok": not bad, "entries": [e.to_json() for e in entries]})
    else:
        _table(entries)
    if bad:
        err(f"localllm: error: {len(bad)} corrupted cache entr{'y' if len(bad) == 1 else 'ies'} remain")
        return EXIT_FAILED
    return EXIT_OK


def _cache_prune(args: argparse.Namespace) -> int:
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import prune_cache
    from localllm.managed.pins import load_pins

    removed = prune_cache(cache_layout(), load_pins(), dry_run=args.dry_run)
    if args.json:
        emit_json({"dry_run": args.dry_run, "removed": [e.to_json() for e in removed],
                   "bytes": sum(e.size for e in removed)})
    else:
        _table(removed)
        verb = "would free" if args.dry_run else "freed"
        out(f"{len(removed)} entries, {verb} {_size(sum(e.size for e in removed))}")
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
        out(f"libstdc++     {cxx['path'] or 'not found'}: {cxx['highest']}; prebuilt needs "
             f"{cxx['server_needs']} ({need}; shim pin {cxx['shim_pin'] or 'none'})")
    p = data["pins"]
    out(f"pins          {p['file']}")
    out(f"  server      {p['server_release']}: prebuilt for this platform: "
         f"{p['prebuilt_for_platform'] or 'none (use --from-source or endpoint mode)'}; source {p['source']}")
    for mid, m in p["models"].items():
        default = " (default chat)" if mid == p["default_chat"] else ""
        out(f"  model       {mid}{default}: {m['role']}, {m['pin']}, {'cached' if m['cached'] else 'not cached'}")
    s = data["settings"]
    out(f"cache         {s['cache_dir']}")
    out(f"mirrors       {', '.join(s['mirrors']) or '-'}; offline {s['offline']}; "
         f"LOCALLLM_SERVER_BIN {s['server_bin'] or '-'}")
    srv = data["server"]
    out(f"llama-server  {srv['binary'] + ' (' + srv['source'] + ')' if srv else 'not cached'}")
    for e in data["cache"]:
        out(f"  cached      {e['status']:<10} {e['kind']:<9} {_size(e['size']):>10}  {e['path']}")
    for name, tool in data["build_tools"].items():
        out(f"{name:<13} {tool['path'] + ' (' + (tool['version'] or '?') + ')' if tool else 'missing'}")
    return EXIT_OK
