"""The curated public surface: sorted __all__, every name importable, a cheap side-effect-free import."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = ["localllm", "localllm.trace", "localllm.grammar", "localllm.embed", "localllm.managed", "localllm.plugins"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_importable(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical
    assert exported == sorted(exported, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    for attr in exported:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_design_surface_is_exported() -> None:
    import localllm
    from localllm import embed, grammar, trace

    assert {"load_config", "Runtime", "CallResult", "AgentError", "ConfigError"} <= set(localllm.__all__)
    assert {"check_subset", "Violation"} <= set(grammar.__all__)
    assert {"Embedder", "LocalEmbedder", "FakeEmbedder", "Index", "Store"} <= set(embed.__all__)
    assert {"TraceWriter", "read_trace"} <= set(trace.__all__)


def test_import_is_cheap_and_has_no_side_effects(tmp_path: object) -> None:
    code = (
        "import sys, localllm; heavy = [m for m in ('httpx', 'numpy', 'jsonschema', 'yaml', 'psutil', "
        "'filelock', 'tqdm') if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert out.stderr == ""


def test_import_loads_no_subsystem_until_a_name_is_used() -> None:
    code = (
        "import sys, localllm\n"
        "before = sorted(m for m in sys.modules if m.startswith('localllm'))\n"
        "from localllm import Runtime, load_config\n"
        "after = {'localllm.runtime', 'localllm.config'} <= set(sys.modules)\n"
        "print(','.join(before), after, Runtime.__module__, load_config.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["localllm,localllm._version", "True", "localllm.runtime", "localllm.loading"]


def test_unknown_attribute_is_an_attribute_error() -> None:
    import localllm

    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(localllm, "no_such_name")  # noqa: B009
    assert set(localllm.__all__) <= set(dir(localllm))


def test_version_comes_from_the_leaf_module() -> None:
    import localllm
    from localllm._version import __version__

    assert localllm.__version__ == __version__
