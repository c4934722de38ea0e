"""The service's HTTP front: Host/Origin/Content-Type checks, limits, structured output, tool calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from localllm.service.guard import Guard
from tests.unit.test_service import Factory, chat, client, env, make_service

__all__ = ["env", "make_service"]  # fixtures used here


# -- Host, Origin, Content-Type ----------------------------------------------------------
def test_guard_host_rules() -> None:
    guard = Guard.build("127.0.0.1", 8911)
    for ok in ("127.0.0.1:8911", "localhost:8911", "[::1]:8911", "localhost", "LOCALHOST:8911"):
        assert guard.host_ok(ok), ok
    for bad in ("evil.example:8911", "evil.example", "127.0.0.1:80", "127.0.0.1:8911.evil", None, "", "[::1"):
        assert not guard.host_ok(bad), bad
    wild = Guard.build("0.0.0.0", 8911, allow_hosts=["box.lan"])
    assert wild.host_ok("192.168.1.7:8911") and wild.host_ok("box.lan:8911")
    assert not wild.host_ok("rebind.evil.example:8911")
    assert not guard.origin_ok("null") and not guard.origin_ok("https://evil.example")
    assert guard.origin_ok(None) and guard.origin_ok("http://localhost:8911")
    assert Guard.build("127.0.0.1", 8911, ["http://localhost:3000/"]).origin_ok("http://localhost:3000")


@pytest.mark.parametrize("no_auth", [True, False])
def test_rebinding_cross_origin_and_text_plain_are_refused(make_service: Factory, no_auth: bool) -> None:
    service = make_service(no_auth=no_auth)
    with client(service) as http:
        rebound = http.get("/v1/models", headers={"Host": f"attacker.example:{service.port}"})
        assert rebound.status_code == 421 and rebound.json()["error"]["code"] == "misdirected_request"
        assert http.get("/health", headers={"Host": "attacker.example"}).status_code == 421
        foreign = http.post(
            "/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
        # the CVE-2024-28224 shape: a page's no-preflight text/plain POST to stop the service
        stop = http.post("/localllm/stop", content=b'{"all": true}', headers={"Content-Type": "text/plain"})
        assert stop.status_code == 415
        null_origin = http.post("/localllm/stop", json={"all": True}, headers={"Origin": "null"})
        assert null_origin.status_code == 403
        form = http.post(
            "/v1/chat/completions", content=b"{}", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert form.status_code == 415
        assert http.get("/v1/models").status_code == 200  # still serving: nothing was stopped
        assert chat(http, "chat").status_code == 200


def test_allow_origin_lets_a_web_app_in(make_service: Factory) -> None:
    service = make_service(allow_origins=("http://localhost:3000",))
    with client(service) as http:
        assert http.get("/v1/models", headers={"Origin": "http://localhost:3000"}).status_code == 200
        assert http.get("/v1/models", headers={"Origin": "http://localhost:3001"}).status_code == 403
