"""What each engine reports of its speculation (app/remote/engines.py), read from the forms they
send: vLLM's Prometheus counters (recorded from vLLM's exposition, with its `_total` suffixes and
labels), llama-server's `timings`; and how a remote target turns them into the answer's figures
and a notice, never estimating what was not reported."""

from __future__ import annotations

from app.engine.events import Notice
from app.remote.engines import llamacpp_figures, prometheus_samples, vllm_counters, vllm_figures

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _metrics(drafts, tokens, accepted, per_pos, generation, running=0, other_model_tokens=500) -> str:
    """vLLM's /metrics as it writes them (recorded shape; numbers varied)."""
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter",
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} {drafts:.1f}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{MODEL}"}} {tokens:.1f}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{MODEL}"}} {accepted:.1f}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="other/model"}} '
             f'{other_model_tokens:.1f}',
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="{i}"}} '
              f'{n:.1f}' for i, n in enumerate(per_pos)]
    lines += [f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} {generation:.1f}',
              f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {running:.1f}',
              'vllm:cache_config_info{block_size="16",cache_dtype="auto"} 1.0',
              "a line that is not a sample"]
    return "\n".join(lines) + "\n"


def test_prometheus_samples_keep_names_labels_and_values():
    samples = prometheus_samples('x_total{a="1",b="q\\"t"} 2.5\n# HELP x\ny 3 1700000000\nbad line here\n')
    assert samples == [("x_total", {"a": "1", "b": 'q"t'}, 2.5), ("y", {}, 3.0)]


def test_vllm_counters_give_the_answers_share_by_position_and_say_when_mixed():
    before = vllm_counters(_metrics(10, 30, 20, [9, 7, 4], 100), MODEL)
    after = vllm_counters(_metrics(16, 48, 31, [14, 11, 6], 124), MODEL)
    assert before.found and after.by_position == (14.0, 11.0, 6.0)
    figures = vllm_figures(before, after, completion_tokens=24)
    assert (figures.drafted, figures.accepted, figures.drafts, figures.accepted_by_position) == (18, 11, 6, (5, 4, 2))
    assert figures.mixed == ""  # the other model's counters are not this one's
    assert "18 tokens drafted, 11 accepted (61%)" in figures.words() and "83%, 67%, 33% of 6" in figures.words()

    busy = vllm_counters(_metrics(10, 30, 20, [9, 7, 4], 100, running=2), MODEL)
    mixed = vllm_figures(busy, vllm_counters(_metrics(16, 48, 31, [14, 11, 6], 160), MODEL), completion_tokens=24)
    assert "2 other requests ran" in mixed.mixed and "wrote 60 tokens meanwhile, this answer 24" in mixed.mixed

    plain = vllm_counters("vllm:generation_tokens_total 5.0\n", MODEL)
    assert not plain.found and vllm_figures(plain, plain, 5) is None  # no speculation: nothing to show


def test_llama_server_timings_give_drafted_and_accepted():
    figures = llamacpp_figures({"predicted_n": 40, "draft_n": 30, "draft_n_accepted": 21})
    assert (figures.drafted, figures.accepted) == (30, 21) and "70%" in figures.words()
    assert llamacpp_figures({"predicted_n": 40}) is None  # drafted nothing: no figures
    assert llamacpp_figures({"draft_n": "30", "draft_n_accepted": 1}) is None
    assert llamacpp_figures(None) is None


class _Server:
    """A remote target's HTTP side replaced by recorded answers (its parsing is what is tested)."""

    def __init__(self, chunks, metrics=()):
        self.chunks, self.metrics = chunks, list(metrics)

    def stream(self, path, body, cancelled):
        yield from self.chunks

    def get_text(self, path):
        answer = self.metrics.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _target(kind: str, server: _Server):
    from app.remote.client import RemoteModel
    from app.remote.endpoint import parse_endpoint
    from app.remote.target import RemoteTarget, engine_name

    target = RemoteTarget.__new__(RemoteTarget)
    target.endpoint, target.client, target.model = parse_endpoint("http://gpu:8000"), server, RemoteModel(MODEL, kind)
    target.engine, target.kind, target.is_tandem, target._said = engine_name(kind), kind, kind == "tandem", set()
    target.context_length = 0
    return target


def _ask(target):
    from app.runner import ChatRequest

    return list(target.chat(ChatRequest(({"role": "user", "content": "hi"},), max_tokens=24)))


CHUNKS = [{"choices": [{"index": 0, "delta": {"content": "Hello there"}}]},
          {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
          {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 24}}]


def test_a_vllm_answer_takes_its_figures_from_metrics_and_says_when_it_cannot():
    from app.remote.client import RemoteError

    target = _target("vllm", _Server(CHUNKS, [_metrics(10, 30, 20, [9, 7, 4], 100),
                                              _metrics(16, 48, 31, [14, 11, 6], 124)]))
    events = _ask(target)
    stats = events[-1].stats
    assert (stats.tokens, stats.drafted, stats.accepted) == (24, 18, 11)
    assert stats.accepted_by_position == (5, 4, 2) and stats.drafted_by_position == (6, 6, 6)
    assert any(isinstance(e, Notice) and "vLLM's /metrics: 18 tokens drafted" in e.message for e in events)

    unreachable = RemoteError("Nothing answers at http://gpu:8000/metrics (HTTP 404)")
    target = _target("vllm", _Server(CHUNKS * 2, [unreachable, unreachable, unreachable, unreachable]))
    first, second = _ask(target), _ask(target)
    said = [e.message for e in first if isinstance(e, Notice)]
    assert len(said) == 1 and "cannot be read from here" in said[0] and "HTTP 404" in said[0]
    assert not any(isinstance(e, Notice) for e in second)  # said once per load
    assert first[-1].stats.drafted == 0  # not reported, so not made up


def test_llama_server_sglang_and_others_show_what_they_report():
    timed = [*CHUNKS[:2], {**CHUNKS[2], "timings": {"predicted_n": 24, "draft_n": 20, "draft_n_accepted": 15}}]
    events = _ask(_target("llamacpp", _Server(timed)))
    assert (events[-1].stats.drafted, events[-1].stats.accepted) == (20, 15)
    assert any(isinstance(e, Notice) and "llama-server's timings: 20 tokens drafted, 15 accepted" in e.message
               for e in events)
    for kind, words in (("sglang", "only on its native /generate"), ("openai", "reports nothing of its speculation")):
        events = _ask(_target(kind, _Server(CHUNKS)))
        notices = [e.message for e in events if isinstance(e, Notice)]
        assert len(notices) == 1 and words in notices[0], kind
        assert events[-1].stats.drafted == 0 and events[-1].stats.tokens == 24


def test_a_servers_own_count_is_the_answers_figures_and_survives_the_history():
    from app.chat.trace import Reported, RoundTrace, TurnTrace

    rounds = [RoundTrace(i, 0, "", (), "text ", 0, 0.1 * (i + 1)) for i in range(4)]  # chipless: text only
    trace = TurnTrace(rounds, reported=Reported(28, 20, 15, (5, 4, 3, 3), 5))
    figures = trace.figures()
    assert (figures.tokens, figures.drafted, figures.accepted, figures.rounds) == (28, 20, 15, 0)
    assert abs(figures.tokens_per_s - 27 / 0.4) < 1e-9  # usage's tokens over this machine's clock
    assert "15 of 20 drafted tokens accepted (75%)" in trace.reported.words() and "100%, 80%, 60%, 60%" in \
        trace.reported.words()
    back = TurnTrace.from_dict(trace.to_dict())
    assert back.reported == trace.reported and back.figures() == figures
    damaged = {**trace.to_dict(), "reported": [28, 20, 21, [], 0]}  # more accepted than drafted
    kept = TurnTrace.from_dict(damaged)
    assert kept is not None and kept.reported is None and len(kept.rounds) == 4  # only that part is lost
    assert TurnTrace.from_dict({**trace.to_dict(), "reported": "x"}).reported is None


def test_a_server_that_fixes_its_speculation_is_benched_as_started_only():
    from app.bench.remote import remote_rows

    rows, left_out = remote_rows(_target("vllm", _Server(CHUNKS)))
    assert [r.name for r in rows] == ["server as started"]
    assert any("target alone: vLLM sets its speculation when it starts" in why for why in left_out)
    rows, left_out = remote_rows(_target("tandem", _Server(CHUNKS)))
    assert len(rows) == 3 and not any("target alone" in why for why in left_out)
