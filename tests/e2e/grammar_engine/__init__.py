"""The pinned llama.cpp grammar engine through a small C++ shim (``shim.cpp``), from Python.

The shim is compiled with g++ against the headers of the llama.cpp tree the server was built
from (the source build of ``make fetch-llama-server``) and linked to that build's ``libllama``
(rpath to its directory). It lands in ``~/.cache/localllm-e2e/grammar-engine/<key>/``, keyed by
the sha256 of libllama and of the shim source, built under a temporary name and renamed.

    with engine().grammar(gbnf) as g:
        g.accepts('{"a":1}')            # the engine's verdict on a whole string
        g.allowed('{"a":')              # what it allows next: [(lo, hi), ...], can_end
        g.walk(1000, seed=0)            # random walks inside the engine
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

SHIM = Path(__file__).with_name("shim.cpp")
CACHE = Path.home() / ".cache" / "localllm-e2e" / "grammar-engine"
HOW_TO_BUILD = (
    "run `make fetch-llama-server` (offline it builds llama-server from the pinned llama.cpp source; "
    "or `localllm fetch server --from-source`)"
)
ABI = 1
_ERR = 4096


class EngineUnavailable(RuntimeError):
    """The built libllama, its headers or a compiler is missing: the message says what to run."""


class EngineError(RuntimeError):
    """The engine refused a grammar, or the shim caught an exception."""


@dataclass(frozen=True)
class LlamaBuild:
    lib: Path  # libllama.so.* (the real file)
    src: Path  # the llama.cpp tree it was built from (include/, src/, ggml/include/)


def llama_build() -> LlamaBuild:
    """The source build of the pinned llama.cpp: library and headers, or EngineUnavailable."""
    from localllm.managed import platforms
    from localllm.managed.cache import cache_layout
    from localllm.managed.pins import load_pins
    from localllm.managed.source_build import source_paths

    pins = load_pins()
    layout = cache_layout()
    release = layout.source_release_dir(pins.source.version, platforms.current().slug)
    src = source_paths(layout, pins.source)["llama_cpp"]
    libs = sorted(release.glob("libllama.so.*.*")) if release.is_dir() else []
    if not libs:
        raise EngineUnavailable(f"no libllama.so.* in {release} (the llama.cpp source build): {HOW_TO_BUILD}")
    header = src / "src" / "llama-grammar.h"
    if not header.is_file():
        raise EngineUnavailable(f"{header} is missing (the source the server was built from): {HOW_TO_BUILD}")
    return LlamaBuild(lib=libs[-1].resolve(), src=src)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_shim(build: LlamaBuild, cache: Path = CACHE) -> Path:
    """The compiled shim for this libllama and this shim source (built once, atomically)."""
    key = hashlib.sha256(f"{_sha256(build.lib)}:{_sha256(SHIM)}:{ABI}".encode()).hexdigest()[:24]
    target = cache / key / "libtruthshim.so"
    if target.is_file():
        return target
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        raise EngineUnavailable("no C++ compiler (g++) on PATH to build the grammar-engine shim: install g++")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libtruthshim-", suffix=".so", dir=target.parent)
    os.close(fd)
    inc = [f"-I{build.src / d}" for d in ("include", "src", "ggml/include")]
    argv = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", *inc, str(SHIM), "-o", tmp]
    argv += [str(build.lib), f"-Wl,-rpath,{build.lib.parent}"]
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise EngineUnavailable(
                f"building the grammar-engine shim failed ({' '.join(argv)}):\n{done.stderr[-4000:]}"
            )
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


@dataclass
class Walks:
    """One walk call: the samples (finished or cut at the hard cap) and what the probes found."""

    samples: list[str]
    finished: list[bool]
    steps: int
    probes_out: int  # code points outside the read set, offered to the engine
    probes_out_admitted: int  # ... that it took: the reading is wrong (must be 0)
    probes_in: int
    probes_in_rejected: int  # code points of the read set it refused (must be 0)
    dead_ends: int  # walks left with no stack at all (must be 0)
    failure: str = ""  # the first mismatch, described
    unfinished: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return self.probes_out_admitted + self.probes_in_rejected + self.dead_ends


class Engine:
    """The loaded shim."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        c = ctypes
        lib.tg_abi_version.restype = c.c_int
        if lib.tg_abi_version() != ABI:
            raise EngineUnavailable(f"{path}: shim ABI {lib.tg_abi_version()} != {ABI}")
        lib.tg_new.argtypes = [c.c_char_p, c.c_char_p, c.c_char_p, c.c_size_t]
        lib.tg_new.restype = c.c_void_p
        lib.tg_free.argtypes = [c.c_void_p]
        lib.tg_free.restype = None
        u32p = c.POINTER(c.c_uint32)
        lib.tg_accepts.argtypes = [c.c_void_p, u32p, c.c_size_t, c.c_char_p, c.c_size_t]
        lib.tg_accepts.restype = c.c_int
        lib.tg_allowed.argtypes = [
            c.c_void_p,
            u32p,
            c.c_size_t,
            u32p,
            c.c_size_t,
            c.POINTER(c.c_int),
            c.c_char_p,
            c.c_size_t,
        ]
        lib.tg_allowed.restype = c.c_int64
        lib.tg_walk.argtypes = [
            c.c_void_p,
            c.c_uint64,
            c.c_uint32,
            c.c_uint32,
            c.c_uint32,
            c.c_uint32,
            c.c_char_p,
            c.c_size_t,
        ]
        lib.tg_walk.restype = c.c_int
        lib.tg_out.argtypes = [c.c_void_p, c.POINTER(c.c_size_t)]
        lib.tg_out.restype = c.c_void_p
        lib.tg_lengths.argtypes = [c.c_void_p]
        lib.tg_lengths.restype = c.POINTER(c.c_int64)
        lib.tg_finished.argtypes = [c.c_void_p]
        lib.tg_finished.restype = c.POINTER(c.c_uint8)
        lib.tg_stats.argtypes = [c.c_void_p]
        lib.tg_stats.restype = c.POINTER(c.c_uint64)
        lib.tg_failure.argtypes = [c.c_void_p]
        lib.tg_failure.restype = c.c_char_p
        lib.tg_time_accept.argtypes = [c.c_void_p, u32p, c.c_size_t, c.c_uint32, c.c_char_p, c.c_size_t]
        lib.tg_time_accept.restype = c.c_int64
        self.lib = lib
        self.path = path

    def grammar(self, gbnf: str, root: str = "root") -> EngineGrammar:
        err = ctypes.create_string_buffer(_ERR)
        handle = self.lib.tg_new(gbnf.encode(), root.encode(), err, _ERR)
        if not handle:
            raise EngineError(err.value.decode(errors="replace").strip())
        return EngineGrammar(self, handle)


def _code_points(text: str) -> tuple[ctypes.Array[ctypes.c_uint32], int]:
    cps = [ord(ch) for ch in text]
    return (ctypes.c_uint32 * max(1, len(cps)))(*cps), len(cps)


class EngineGrammar:
    """One grammar inside the engine (free it: ``with`` or ``close()``)."""

    def __init__(self, engine: Engine, handle: int) -> None:
        self._lib = engine.lib
        self._h: int | None = handle

    def __enter__(self) -> EngineGrammar:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if self._h is not None:
            self._lib.tg_free(self._h)
            self._h = None

    def _handle(self) -> int:
        if self._h is None:
            raise EngineError("the grammar is closed")
        return self._h

    def accepts(self, text: str) -> bool:
        """Does the engine admit ``text`` whole (every code point, then the end)?"""
        buf, n = _code_points(text)
        err = ctypes.create_string_buffer(_ERR)
        got = self._lib.tg_accepts(self._handle(), buf, n, err, _ERR)
        if got < 0:
            raise EngineError(err.value.decode(errors="replace"))
        return bool(got)

    def allowed(self, prefix: str = "") -> tuple[list[tuple[int, int]], bool] | None:
        """After ``prefix``: the code-point ranges the engine allows next and whether it may end
        here; None when the engine rejects the prefix."""
        buf, n = _code_points(prefix)
        cap = 4096
        pairs = (ctypes.c_uint32 * (2 * cap))()
        can_end = ctypes.c_int(0)
        err = ctypes.create_string_buffer(_ERR)
        got = self._lib.tg_allowed(self._handle(), buf, n, pairs, cap, ctypes.byref(can_end), err, _ERR)
        if got == -1:
            return None
        if got < 0:
            raise EngineError(err.value.decode(errors="replace"))
        ranges = [(pairs[2 * i], pairs[2 * i + 1]) for i in range(min(int(got), cap))]
        return ranges, bool(can_end.value)

    def walk(self, n: int, *, seed: int, soft: int = 192, hard: int = 4096, probe_every: int = 8) -> Walks:
        """``n`` random walks inside the engine: at each step a random code point the engine
        allows (past ``soft`` code points it prefers ending and closing), cut at ``hard``."""
        h = self._handle()
        err = ctypes.create_string_buffer(_ERR)
        if self._lib.tg_walk(h, seed, n, soft, hard, probe_every, err, _ERR) != 0:
            raise EngineError(err.value.decode(errors="replace"))
        size = ctypes.c_size_t(0)
        ptr = self._lib.tg_out(h, ctypes.byref(size))
        data = ctypes.string_at(ptr, size.value) if size.value else b""
        lengths = self._lib.tg_lengths(h)
        flags = self._lib.tg_finished(h)
        stats = self._lib.tg_stats(h)
        samples: list[str] = []
        finished: list[bool] = []
        unfinished: list[str] = []
        at = 0
        for i in range(n):
            text = data[at : at + lengths[i]].decode("utf-8")
            at += lengths[i]
            if flags[i]:
                samples.append(text)
                finished.append(True)
            else:
                unfinished.append(text)
                finished.append(False)
        failure = self._lib.tg_failure(h) or b""
        return Walks(
            samples=samples,
            finished=finished,
            steps=stats[0],
            probes_out=stats[1],
            probes_out_admitted=stats[2],
            probes_in=stats[3],
            probes_in_rejected=stats[4],
            dead_ends=stats[5],
            failure=failure.decode("utf-8", errors="replace"),
            unfinished=unfinished,
        )

    def time_accept(self, text: str, rounds: int) -> float:
        """Nanoseconds per code point inside llama_grammar_accept, feeding ``text`` ``rounds`` times."""
        buf, n = _code_points(text)
        err = ctypes.create_string_buffer(_ERR)
        total: int = self._lib.tg_time_accept(self._handle(), buf, n, rounds, err, _ERR)
        if total == -1:
            raise EngineError(f"the engine rejects {text[:80]!r}")
        if total < 0:
            raise EngineError(err.value.decode(errors="replace"))
        return total / max(1, n * rounds)


_ENGINE: Engine | None = None


def engine() -> Engine:
    """The shim for the pinned build, compiled if needed and loaded once per process."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = Engine(build_shim(llama_build()))
    return _ENGINE
