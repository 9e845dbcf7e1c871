"""`tandem-cli bench`: the bound's arithmetic, the report's structure and exactness flags on tiny
models (timings are not asserted: they belong in the notes), and a divergence is caught."""

from __future__ import annotations

import json

import pytest

from app.engine.adaptive import MAX_DRAFT
from app.engine.bound import best_bound, conditional_acceptance, expected_tokens, speedup_bound

from app.bench.anchors_llamacpp import LOOKUP, PLAIN, missing_reason  # noqa: E402

# llama-cpp-python is an optional extra (it compiles from source): its rows appear where it is installed
LLAMACPP_METHODS = set() if missing_reason() else {PLAIN, LOOKUP}
TORCH_METHODS = {"target alone", "transformers plain", "transformers prompt lookup", "transformers assisted",
                 "tandem adaptive", "tandem adaptive, model only", "tandem adaptive, prompt lookup only",
                 "tandem adaptive, chains", "tandem adaptive, trees", "tandem k=2", "tandem k=4", "tandem k=6"}


def test_expected_tokens_and_the_bound():
    assert expected_tokens([1.0, 1.0], 2) == 3.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([0.8], 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)  # the last a_i repeats
    costs = {1: 0.050, 2: 0.060, 3: 0.065, 4: 0.070, 5: 0.075}
    # 3 tokens per round for 2 * 10 ms of drafting + one 65 ms pass, against 50 ms per token alone
    assert speedup_bound([1.0, 1.0], 0.010, costs, 2) == pytest.approx(3 * 0.050 / 0.085)
    k, bound = best_bound([0.9] * 4, 0.010, costs)
    assert k == 4 and bound == pytest.approx(expected_tokens([0.9] * 4, 4) * 0.050 / 0.115)
    assert best_bound([0.0], 0.010, costs) == (0, 1.0)  # nothing accepted: plain decoding is best


def test_conditional_acceptance_from_counts():
    # 10 rounds reached position 0 (8 accepted), 8 reached position 1 (4 accepted), none went further
    assert conditional_acceptance([8, 4, 0], [10, 8, 0]) == [0.8, 0.5]


def _bench(tiny_pair, tmp_path, *extra):
    from app.cli import main

    out = tmp_path / "bench.json"
    code = main(["bench", "--quick", "--repeats", "2", "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_quick_bench_on_torch_reports_every_figure(tiny_pair, tmp_path, capsys):
    code, report = _bench(tiny_pair, tmp_path, "--target", str(tiny_pair["target"]),
                          "--draft", str(tiny_pair["near"]), "--backend", "torch")
    assert code == 0
    methods = {m["name"]: m for m in report["methods"]}
    assert set(methods) == TORCH_METHODS | LLAMACPP_METHODS
    assert report["exactness"] == {"checked": True, "exact": True, "bugs": 0, "divergences": []}
    assert report["config"]["prompts"] == 2 and report["config"]["max_tokens"] == 16
    assert len(report["runs"]) == 2 * 2 * len(methods)
    assert all(run["tokens"] == 16 and run["tokens_per_s"] > 0 for run in report["runs"])
    # adaptive k goes up to MAX_DRAFT drafts, so the bound has every width up to MAX_DRAFT + 1
    assert set(report["costs"]["target_s_by_width"]) == {str(w) for w in range(1, MAX_DRAFT + 2)}
    assert report["costs"]["draft_s_per_token"] > 0 and report["costs"]["draft_is_model"] is True
    for name in ("tandem adaptive", "tandem adaptive, model only", "tandem k=4"):
        m = methods[name]
        if name != "tandem k=4" and "draft_s_per_token" not in m:
            continue  # adaptive k on a tiny random pair may find in 2 x 16 tokens that the model never pays
        assert m["draft_s_per_token"] > 0
        assert m["anchor"] == "transformers assisted"
        # adaptive k follows measured costs, so what it drafts varies from run to run; fixed k does not
        assert 0 <= m["acceptance"] <= 1 and m["tokens_per_pass"] >= 1
        if name == "tandem k=4":
            assert 0 < m["acceptance"] and m["tokens_per_pass"] > 1
        assert m["bound"]["speedup"] >= 1 and m["fraction_of_bound"]["median"] > 0
        spread = m["ratio_to_target_alone"]
        assert spread["min"] <= spread["median"] <= spread["max"]
        assert all(0 <= a <= 1 for a in m["acceptance_by_position"])
    assert len(methods["tandem k=2"]["acceptance_by_position"]) == 2
    # the loop's own time per round: what is left of the decoding wall clock after the passes
    for name in ("target alone", "tandem adaptive", "tandem k=4"):
        outside = methods[name]["outside_passes"]
        assert outside["ms_per_round"] >= 0 and 0 <= outside["share_of_decode"] < 1
    assert "outside_passes" not in methods["transformers plain"]
    assert methods["target alone"]["anchor"] == "transformers plain"
    table = capsys.readouterr().out
    assert "identical to the target alone" in table and "tandem k=6" in table and "of bound" in table
    assert "time outside the model passes, per round" in table


def test_a_wrong_verification_is_reported_as_a_divergence(tiny_pair, tmp_path, monkeypatch, capsys):
    import app.engine.backends.torch_backend as tb

    def accept_everything(logits, drafts):  # a broken greedy rule: the drafts always pass
        n, token, q = real(logits, drafts)
        return n.new_tensor(drafts.shape[0]), logits[-1].argmax(), q

    real = tb.greedy_verdict
    monkeypatch.setattr(tb, "greedy_verdict", accept_everything)
    code, report = _bench(tiny_pair, tmp_path, "--target", str(tiny_pair["target"]),
                          "--draft", str(tiny_pair["draft"]), "--backend", "torch", "--no-anchors",
                          "--ks", "4")
    assert code == 1
    ex = report["exactness"]
    assert not ex["exact"] and ex["bugs"] >= 1
    d = ex["divergences"][0]
    assert d["family"] == "tandem" and d["position"] >= 0 and d["top2_gap"] > 0 and not d["near_tie"]
    assert "CLEAR GAP" in capsys.readouterr().out


def test_quick_bench_on_mlx_with_mlx_lm_anchors(tiny_pair, tmp_path):
    code, report = _bench(tiny_pair, tmp_path, "--target", str(tiny_pair["target_mlx"]),
                          "--draft", str(tiny_pair["near_mlx"]), "--backend", "mlx", "--ks", "4")
    assert code == 0
    methods = {m["name"]: m for m in report["methods"]}
    # an MLX Llama verifies trees (tree_mlx.py): the chains and trees rows run beside adaptive's
    assert set(methods) == {"target alone", "mlx-lm plain", "mlx-lm speculative", "tandem adaptive",
                            "tandem adaptive, model only", "tandem adaptive, prompt lookup only", "tandem k=4",
                            "tandem adaptive, chains", "tandem adaptive, trees"}
    assert report["exactness"]["exact"]
    assert 0 < methods["mlx-lm speculative"]["acceptance"] <= 1
    assert methods["tandem k=4"]["anchor"] == "mlx-lm speculative"
    assert methods["tandem k=4"]["ratio_to_anchor"]["median"] > 0


def test_suite_has_the_kinds_the_benchmark_promises():
    from app.bench.suite import load_suite

    suite = load_suite()
    assert len(suite) >= 8 and all(p.max_tokens == 128 for p in suite)
    kinds = [p.kind for p in suite]
    assert kinds.count("copying from the prompt") >= 2
    assert {"code writing", "code editing", "summarising", "question answering", "a list",
            "free writing"} <= set(kinds)
    quick = load_suite(quick=True)
    assert len(quick) == 2 and {p.max_tokens for p in quick} == {16}


def test_a_broken_suite_file_is_a_clear_error(tmp_path):
    from app.bench.suite import load_suite

    bad = tmp_path / "suite.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a benchmark suite"):
        load_suite(bad)


def test_llamacpp_rows_run_on_the_same_gguf_or_one_line_says_why(tiny_pair, tmp_path, capsys):
    """The tiny target was opened from a GGUF: llama.cpp decodes that very file, with the same
    prompt ids, plainly and with prompt lookup, and the report compares Tandem with both; where
    llama-cpp-python is not installed the rows are left out with one line saying how to get them."""
    code, report = _bench(tiny_pair, tmp_path, "--target", str(tiny_pair["target"]), "--draft", "ngram",
                          "--backend", "torch", "--ks", "")
    assert code == 0
    names = {m["name"] for m in report["methods"]}
    assert report["costs"]["draft_is_model"] is False  # prompt lookup: its proposals' own time
    # its trees beside its chains in the same run (issue 48), each written as the target alone writes
    assert {"tandem adaptive", "tandem adaptive, chains", "tandem adaptive, trees"} <= names
    assert not [d for d in report["exactness"]["divergences"] if "tandem" in d["method"] and not d["near_tie"]]
    err = capsys.readouterr().err
    if missing_reason():
        assert names.isdisjoint({PLAIN, LOOKUP}) and report["llama_cpp"] is None
        assert err.count("llama.cpp rows left out: llama-cpp-python is not installed") == 1
        return
    assert {PLAIN, LOOKUP} <= names
    import psutil

    workers = [c for c in psutil.Process().children(recursive=True)
               if c.is_running() and c.status() != psutil.STATUS_ZOMBIE
               and any("llamacpp_worker" in part for part in c.cmdline())]
    assert not workers  # its worker process ended with the runs, not at interpreter exit
    runs = [r for r in report["runs"] if r["method"] in (PLAIN, LOOKUP)]
    assert runs and all(r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in runs)
    same, total = report["llama_cpp"]["lookup_same_as_plain"]
    assert total == 2 * 2 and 0 <= same <= total
    assert report["llama_cpp"]["ratios"]["tandem adaptive"]["vs_plain"]["median"] > 0
    assert all(d["method"] not in (PLAIN, LOOKUP) for d in report["exactness"]["divergences"])


def test_the_near_tie_threshold_follows_the_logits_rounding():
    from app.bench.exactness import tie_limit

    # one bfloat16 ulp of a logit near 20 is 0.125: a gap of one ulp is a near-tie, not a clear gap
    assert tie_limit("bfloat16", 20.0) > 0.125
    assert tie_limit("bfloat16", 20.0) == 4 * tie_limit("bfloat16", 5.0)  # scales with the logit
    assert tie_limit("float16", 20.0) < tie_limit("bfloat16", 20.0)
    assert tie_limit("float32", 20.0) == 1e-3


def test_pass_parts_refuses_bad_counts_in_words_before_loading_anything(capsys):
    """benchmarks/pass_parts.py: a negative --greedy (or no passes) is an argparse error, exit 2,
    before any model is read (the model named does not exist)."""
    import runpy
    from pathlib import Path

    script = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "pass_parts.py"), run_name="pass_parts")
    for bad in (["--greedy", "-1"], ["--passes", "0"]):
        with pytest.raises(SystemExit) as ended:
            script["main"](["--model", "/no/such/model.gguf", *bad])
        assert ended.value.code == 2
        assert "--greedy must be 0 or more" in capsys.readouterr().err
