"""``python -m localllm``: the same as the ``localllm`` command."""

from __future__ import annotations

import sys

from localllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
