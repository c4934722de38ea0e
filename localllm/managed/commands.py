"""``localllm fetch | cache | doctor``: thin commands over :mod:`localllm.managed`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from localllm.managed.fetch import human_size


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fetch``, ``cache`` and ``doctor``."""
    fetch = sub.add_parser("fetch", help="pre-warm the cache: llama-server or a model's GGUF")
    fsub = fetch.add_subparsers(dest="fetch_what", metavar="WHAT")
    server = fsub.add_parser("server", help="fetch (or build) llama-server; print its path")
    server.add_argument("--from-source", action="store_true",
                        help="build from the pinned llama.cpp source (~15 min the first time)")
    server.add_argument("--mirror", metavar="M", help="directory or base URL tried before the pinned URL")
    server.add_argument("--json", action="store_true", help="print JSON")
    server.set_defaults(handler=_fetch_server)
    model = fsub.add_parser("model", help="fetch a model's GGUF; print its path")
    model.add_argument("id", nargs="?", metavar="ID", help="model id (default: the default chat model)")
    model.add_argument("--mirror", metavar="M", help="directory or base URL tried before the pinned URL")
    model.add_argument("--json", action="store_true", help="print JSON")
    model.set_defaults(handler=_fetch_model)

    cache = sub.add_parser("cache", help="list, verify or prune the artifact cache")
    csub = cache.add_subparsers(dest="cache_what", metavar="ACTION")
    lst = csub.add_parser("list", help="what is cached")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(handler=_cache_list)
    ver = csub.add_parser("verify", help="re-hash everything; re-fetch corrupted files")
    ver.add_argument("--no-refetch", action="store_true", help="only report corrupted files")
    ver.add_argument("--mirror", metavar="M")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(handler=_cache_verify)
    prune = csub.add_parser("prune", help="remove stale entries and leftover temp files")
    prune.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(handler=_cache_prune)

    doctor = sub.add_parser("doctor", help="platform, glibc/GLIBCXX, pins, cache, build tools")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(handler=_doctor)


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _fetch_server(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
    from localllm.managed.acquire import ensure_server

    install = ensure_server(from_source=args.from_source, mirror=args.mirror)
    if args.json:
        emit_json({"binary": str(install.binary), "release_dir": str(install.release_dir),
                   "release": install.release, "source": install.source})
    else:
        _out(str(install.binary))
    return 0


def _fetch_model(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
    from localllm.managed.acquire import ensure_model
    from localllm.managed.pins import load_pins

    pins = load_pins()
    model_id = args.id or pins.default_chat
    path = ensure_model(model_id, mirror=args.mirror, pins=pins)
    if args.json:
        emit_json({"id": model_id, "path": str(path), "sha256": pins.models[model_id].artifact.sha256,
                   "size": path.stat().st_size})
    else:
        _out(str(path))
    return 0


def _table(entries: list[Any]) -> None:
    for e in entries:
        _out(f"{e.status:<12} {e.kind:<9} {human_size(e.size):>10}  {e.path}"
             + (f"  ({e.detail})" if e.detail else ""))


def _cache_list(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
    from localllm.managed.cache import cache_layout
    from localllm.managed.inventory import list_cache
    from localllm.managed.pins import load_pins

    layout = cache_layout()
    entries = list_cache(layout, load_pins())
    if args.json:
        emit_json({"cache_dir": str(layout.root), "entries": [e.to_json() for e in entries]})
    else:
        _out(f"cache: {layout.root}")
        _table(entries)
    return 0


def _cache_verify(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json, err
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
        return 1
    return 0


def _cache_prune(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
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
        _out(f"{len(removed)} entries, {verb} {human_size(sum(e.size for e in removed))}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from localllm.cli import emit_json
    from localllm.managed.cache import cache_layout
    from localllm.managed.doctor import report
    from localllm.managed.pins import load_pins

    data = report(load_pins(), cache_layout())
    if args.json:
        emit_json(data)
        return 0
    _out(f"platform      {data['platform']}  ({data['os']}, python {data['python']})")
    _out(f"glibc         {data['glibc'] or '-'}")
    cxx = data["libstdcxx"]
    if cxx:
        need = "shim needed" if cxx["shim_needed"] else "no shim needed"
        _out(f"libstdc++     {cxx['path'] or 'not found'}: {cxx['highest']}; prebuilt needs "
             f"{cxx['server_needs']} ({need}; shim pin {cxx['shim_pin'] or 'none'})")
    p = data["pins"]
    _out(f"pins          {p['file']}")
    _out(f"  server      {p['server_release']}: prebuilt for this platform: "
         f"{p['prebuilt_for_platform'] or 'none (use --from-source or endpoint mode)'}; source {p['source']}")
    for mid, m in p["models"].items():
        default = " (default chat)" if mid == p["default_chat"] else ""
        _out(f"  model       {mid}{default}: {m['role']}, {m['pin']}, {'cached' if m['cached'] else 'not cached'}")
    s = data["settings"]
    _out(f"cache         {s['cache_dir']}")
    _out(f"mirrors       {', '.join(s['mirrors']) or '-'}; offline {s['offline']}; "
         f"LOCALLLM_SERVER_BIN {s['server_bin'] or '-'}")
    srv = data["server"]
    _out(f"llama-server  {srv['binary'] + ' (' + srv['source'] + ')' if srv else 'not cached'}")
    for e in data["cache"]:
        _out(f"  cached      {e['status']:<10} {e['kind']:<9} {human_size(e['size']):>10}  {e['path']}")
    for name, tool in data["build_tools"].items():
        _out(f"{name:<13} {tool['path'] + ' (' + (tool['version'] or '?') + ')' if tool else 'missing'}")
    return 0
