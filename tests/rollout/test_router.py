"""sglang-router 0.3.2 (PyPI, a Rust binary; it runs here on CPU) in front of test workers that hold each
request for a while (testbed/routerworker.py): the rollout's drain and add-back through its worker API, and a
constant client load through it that must see no failed request. No root, no Docker."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from sglfleet.flow.traffic import ClientLoad
from sglfleet.rollout.router import RouterClient, RouterError, RouterProcess, add_back, drain, worker_inflight
from testbed.routerworker import RouterWorker

pytestmark = [pytest.mark.integration]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def fleet(tmp_path):
    pytest.importorskip("sglang_router")
    w1, w2 = RouterWorker(_port(), delay_s=1.0, name="w1"), RouterWorker(_port(), delay_s=1.0, name="w2")
    with w1, w2, RouterProcess(_port(), [w1.url, w2.url], prometheus_port=_port(),
                               log=tmp_path / "router.log") as r:
        c = RouterClient(r.url, metrics_url=r.metrics_url)
        deadline = time.monotonic() + 60
        while sorted(w.url for w in c.workers() if w.healthy) != sorted([w1.url, w2.url]):
            assert time.monotonic() < deadline, c.workers()
            time.sleep(0.25)
        yield {"router": r, "client": c, "w1": w1, "w2": w2}
        c.close()


def test_drain_waits_for_inflight_then_add_back(fleet):
    c, w1 = fleet["client"], fleet["w1"]
    codes: list[int] = []

    def call() -> None:
        codes.append(httpx.post(fleet["router"].url + "/v1/chat/completions", timeout=30,
                                json={"model": "x", "messages": [{"role": "user", "content": "hi"}]}).status_code)

    ts = [threading.Thread(target=call) for _ in range(4)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    assert worker_inflight(w1.url) >= 1  # round robin put some on w1
    d = drain(c, "h1", w1.url, timeout_s=20)
    assert d.removed and d.inflight_left == 0 and 0.3 < d.waited_s < 5, d
    assert c.find(w1.url) is None
    for t in ts:
        t.join()
    assert codes == [200] * 4  # removal does not cut the requests it already proxied
    served = w1.stats()["served"]
    for _ in range(4):
        call()
    assert w1.stats()["served"] == served  # nothing new reaches a drained worker
    a = add_back(c, "h1", w1.url, timeout_s=30)
    assert a.healthy and c.find(w1.url).healthy
    assert not drain(c, "h9", "http://127.0.0.1:9", timeout_s=1).removed  # not in the router: nothing removed
    m = c.metrics()
    assert any(k.startswith("smg_worker_health") for k in m), list(m)[:20]


def test_constant_load_through_drain_and_restart_loses_nothing(fleet):
    c, w1 = fleet["client"], fleet["w1"]
    with ClientLoad(fleet["router"].url, rate_per_s=5) as load:
        time.sleep(1.5)
        load.set_stage("drain w1")
        drain(c, "w1", w1.url, timeout_s=20)
        load.set_stage("restart w1")
        w1.stop()
        w1.start()
        load.set_stage("add back w1")
        add_back(c, "w1", w1.url, timeout_s=30)
        time.sleep(1.5)
    res = {s.stage: s for s in load.result()}
    assert sum(s.sent for s in res.values()) >= 15
    assert sum(s.failed for s in res.values()) == 0, {k: (v.failed, dict(v.errors)) for k, v in res.items()}


def test_router_down_is_one_clear_error(fleet):
    c = fleet["client"]
    fleet["router"].stop()
    with pytest.raises(RouterError, match="did not answer GET /workers"):
        c.workers()
    assert not c.alive()
