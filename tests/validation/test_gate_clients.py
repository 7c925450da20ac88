"""The gate's requests go to the client passed in (validation/gate.py `_run_all`, `_generate`): the live baseline's
answers are asked of the baseline's client, and the gate's own client and settings stay the candidate's."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from rich.progress import Progress

from sglfleet.pipeline.client import ChatResult
from sglfleet.validation.config import GateConfig
from sglfleet.validation.gate import Gate

BASE_URL = "http://127.0.0.1:8"


class FakeClient:
    """Answers every chat request with its own name and records what was asked."""

    def __init__(self, name: str) -> None:
        self.name, self.base_url, self.model = name, f"http://{name}", "m"
        self.asked: list[dict[str, Any]] = []

    def chat(self, messages: Any, **kw: Any) -> ChatResult:
        self.asked.append(kw)
        return ChatResult(f"answer of {self.name}", "stop", 5, 3, 0.1)


def _gate(**over: Any) -> tuple[Gate, FakeClient, FakeClient]:
    cfg = GateConfig(judge={"enabled": False}, determinism={"enabled": False}, variation={"enabled": False},
                     temperatures=[0.0], baseline_url=BASE_URL, quality={"enabled": False},
                     long_copy={"enabled": False}, **over)
    gate = Gate("http://127.0.0.1:9", cfg, console=Console(file=io.StringIO()))
    cand, base = FakeClient("candidate"), FakeClient("baseline")
    gate.client, gate.kind = cand, "llamacpp"
    gate._peers[BASE_URL] = base
    return gate, cand, base


def test_the_live_baselines_t0_answers_are_asked_of_the_baseline_client_with_its_alternatives() -> None:
    gate, cand, base = _gate()
    with Progress(console=gate.console) as progress:
        got = gate._baseline_answers(progress)
    assert set(got.values()) == {"answer of baseline"} and len(got) == len(gate.suite.prompts)
    assert cand.asked == [] and len(base.asked) == len(gate.suite.prompts)
    assert {kw["top_logprobs"] for kw in base.asked} == {gate.cfg.lossless.top_logprobs}
    assert gate.client is cand and gate.t0_logprobs is None  # nothing of the gate was swapped


def test_the_candidates_suite_is_asked_of_its_own_client_without_the_baselines_alternatives() -> None:
    gate, cand, base = _gate()
    with Progress(console=gate.console) as progress:
        samples = gate._request_phases(progress, False)
    assert {s.text for s in samples} == {"answer of candidate"} and base.asked == []
    assert {kw["top_logprobs"] for kw in cand.asked} == {None}


def test_against_a_baseline_the_candidates_t0_answers_come_with_their_own_tokens() -> None:
    """lossless_t0 reads where an answer parted from the baseline by the candidate's own tokens (one listed
    alternative each, validation/lossless.py compare_answer); its T>0 answers are asked as before."""
    gate, cand, base = _gate()
    gate.cfg.temperatures = [0.0, 0.8]
    gate.t0_tokens = True
    with Progress(console=gate.console) as progress:
        samples = gate._request_phases(progress, False)
    suite_t0 = [s for s in samples if s.purpose == "suite" and s.temperature == 0]
    assert len(suite_t0) == len(gate.suite.prompts) and base.asked == []
    asked = [(kw["temperature"], kw["top_logprobs"]) for kw in cand.asked]
    assert asked.count((0.0, 1)) == len(suite_t0)  # every T=0 suite answer, and nothing else at T=0, asks
    gate.t0_tokens, cand.asked = False, []
    with Progress(console=gate.console) as progress:
        gate._request_phases(progress, False)
    before = [(kw["temperature"], kw["top_logprobs"]) for kw in cand.asked]
    assert (0.0, 1) not in before and sorted(a for a in asked if a[0] > 0) == sorted(a for a in before if a[0] > 0)


def test_the_live_baselines_hot_answers_are_asked_of_the_baseline_client() -> None:
    gate, cand, base = _gate(likelihood={"baseline_seeds": [7]})
    gate.cfg.temperatures = [0.0, 0.8]
    with Progress(console=gate.console) as progress:
        got = gate._baseline_hot_answers(progress)
    assert {b.text for b in got} == {"answer of baseline"} and cand.asked == []
    assert {kw["temperature"] for kw in base.asked} == {0.8} and gate.client is cand


class TimedClient(FakeClient):
    """A candidate that takes a few milliseconds an answer and records each request's interval and temperature."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.spans: list[tuple[float, float, float]] = []

    def chat(self, messages: Any, **kw: Any) -> ChatResult:
        import time

        t0 = time.perf_counter()
        time.sleep(0.004)
        self.spans.append((kw["temperature"], t0, time.perf_counter()))
        return super().chat(messages, **kw)


def _suite_counts(gate: Gate) -> tuple[int, int]:
    n = len(gate.suite.prompts)
    hot = sum(len(gate.seeds(t, False)) for t in gate.cfg.temperatures if t > 0) * n
    return n, hot


def _suite_run(client: type[TimedClient], **over: Any) -> tuple[Gate, TimedClient, list, int, int]:
    """The suite phase at T 0 and 0.8 against a fresh ``client``: the gate, the client, the samples, and the suite's
    T=0 and T>0 request counts."""
    gate, _, base = _gate(**over)
    gate.cfg.temperatures = [0.0, 0.8]
    cand = client("candidate")
    gate.client = cand
    with Progress(console=gate.console) as progress:
        samples = gate._request_phases(progress, False)
    assert base.asked == []
    return (gate, cand, samples, *_suite_counts(gate))


def test_greedy_companions_share_every_sampled_requests_batches() -> None:
    """sampling.companions (on by default): while the interleaved suite runs, greedy requests stay in flight, so
    every sampled request's life overlaps a greedy one; the suite's own answers are all that come back."""
    gate, cand, samples, n, hot = _suite_run(TimedClient)
    assert len(samples) == n + hot and {s.purpose for s in samples} == {"suite"}
    greedy = [(a, b) for t, a, b in cand.spans if t == 0]
    sampled = [(a, b) for t, a, b in cand.spans if t > 0]
    assert len(sampled) == hot and len(greedy) > n and gate.companion_requests == len(greedy) - n
    assert all(any(ga < b and a < gb for ga, gb in greedy) for a, b in sampled)


def test_a_companions_answer_is_not_read_by_the_detectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A companion's answer is load: the text detectors and the backstop read only the answers the gate keeps."""
    from sglfleet.validation import gate as gate_mod

    read: list[str] = []
    real = gate_mod.score_text

    def counting(text: str, thresholds: Any) -> Any:
        read.append(text)
        return real(text, thresholds)

    monkeypatch.setattr(gate_mod, "score_text", counting)
    gate, _, samples, n, hot = _suite_run(TimedClient)
    assert gate.companion_requests > 0 and len(read) == len(samples) == n + hot


def test_no_companions_without_interleaving_or_when_set_to_zero() -> None:
    for over in ({"companions": 0}, {"interleave": False}):
        gate, cand, _, n, hot = _suite_run(TimedClient, sampling=over)
        assert len(cand.spans) == n + hot and gate.companion_requests == 0, over


def test_no_companions_when_nothing_is_sampled() -> None:
    gate, _, _ = _gate()
    cand = TimedClient("candidate")
    gate.client = cand
    with Progress(console=gate.console) as progress:
        gate._request_phases(progress, False)
    assert len(cand.spans) == len(gate.suite.prompts) and gate.companion_requests == 0


class FailingClient(TimedClient):
    """A target whose every request fails."""

    def chat(self, messages: Any, **kw: Any) -> ChatResult:
        from sglfleet.pipeline.errors import TargetError

        super().chat(messages, **kw)
        raise TargetError("connection refused")


def test_a_companion_stops_at_the_targets_first_error() -> None:
    gate, cand, samples, n, hot = _suite_run(FailingClient)
    assert all(s.error for s in samples) and gate.companion_requests == 1 and len(cand.spans) == n + hot + 1
