"""``localllm serve``: the machine-wide OpenAI-compatible front over managed llama-servers.

One process per cache owns the managed models of every process on the box: it loads a
model on the first request for it (fetch → verify → spawn → health), shares it, unloads it
after ``keep_alive`` or when room is needed, and publishes a discovery file so that
managed agents and embedders of the same cache attach instead of spawning their own.

Modules: ``catalog`` (what can be served: ``ServerSpec``s), ``backend`` (one model's
``Upstream``, the seam agents and embedders hold too),
``pool`` (load, share, keep alive, evict), ``api`` (HTTP routes, auth, proxy, metrics),
``daemon`` (the process: lock, discovery, signals), ``control`` (ps, stop, detach).
The discovery file and :func:`attach` live in ``localllm.managed`` (``discovery``,
``upstream``), below the agents and embedders that use them.
"""

from __future__ import annotations

from localllm.managed.discovery import Attachment, discover
from localllm.managed.upstream import POLICIES, attach

__all__ = ["POLICIES", "Attachment", "attach", "discover"]
