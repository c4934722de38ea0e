"""`python -m localllm`."""

from localllm.cli import run

run()
