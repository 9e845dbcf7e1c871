"""Figures from a benchmark run: one table on the terminal, every figure in JSON.

Throughput of a method over the suite, per repeat, is its decode tokens over its decode seconds
summed across prompts; ratios are taken within a repeat (the same conditions), and each figure is
a median with its min and max over the repeats: a claim stands only where that interval clears it.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from app.bench.exactness import Divergence
from app.bench.harness import TARGET_ALONE, BenchRun
from app.engine.bound import best_bound, conditional_acceptance


def _spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _suite_tps(bench: BenchRun, method: str, prompt: str | None = None) -> list[float]:
    """Tokens/s per repeat over all prompts (or one)."""
    out = []
    for repeat in sorted({r.repeat for r in bench.records}):
        runs = [r.result for r in bench.records if r.method == method and r.repeat == repeat
                and (prompt is None or r.prompt == prompt)]
        seconds = sum(r.decode_s for r in runs)
        out.append(sum(r.decode_tokens for r in runs) / seconds if seconds > 0 else 0.0)
    return out


def _ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True) if y > 0]


def summarize(bench: BenchRun, divergences: list[Divergence], config: dict) -> dict:
    base = _suite_tps(bench, TARGET_ALONE)
    methods = []
    for method in bench.methods:
        tps = _suite_tps(bench, method.name)
        runs = [r.result for r in bench.records if r.method == method.name]
        entry = {"name": method.name, "family": method.family, "k": method.k, "anchor": method.anchor,
                 "tokens_per_s": _spread(tps), "ratio_to_target_alone": _spread(_ratios(tps, base))}
        if method.anchor:
            entry["ratio_to_anchor"] = _spread(_ratios(tps, _suite_tps(bench, method.anchor)))
        drafted = sum(r.drafted or 0 for r in runs)
        if drafted:
            entry["acceptance"] = sum(r.accepted or 0 for r in runs) / drafted
        rounds = sum(r.rounds or 0 for r in runs)
        if rounds and method.family != "anchor":
            entry["tokens_per_pass"] = sum(r.decode_tokens for r in runs) / rounds
        if rounds and method.family in ("target", "tandem"):
            # the loop's own time: the wall clock of decoding less the drafter's and the target's
            # passes (sampling, verification, bookkeeping, the consumer between rounds)
            decode = sum(r.decode_s for r in runs)
            outside = decode - sum(r.draft_s + r.verify_s + r.rollback_s for r in runs)
            entry["outside_passes"] = {"ms_per_round": outside / rounds * 1000,
                                       "share_of_decode": outside / decode if decode > 0 else None}
        if rounds and method.family == "tandem":
            # both caches' rollback (the target's checkpoint before each verify pass and rewind
            # after, the draft's own; on hybrid models a copy of recurrent state and a replay of
            # the kept tokens), against the round's time: drafting, the pass, the rollback
            rollback = sum(r.rollback_s for r in runs)
            round_s = sum(r.draft_s + r.verify_s + r.rollback_s for r in runs)
            entry["rollback"] = {"ms_per_round": rollback / rounds * 1000,
                                 "share_of_round": rollback / round_s if round_s > 0 else None,
                                 "replayed_per_round": sum(r.replayed for r in runs) / rounds}
        if method.family == "tandem":
            width = max(len(r.accepted_by_position) for r in runs)
            acc = [sum(r.accepted_by_position[i] for r in runs if i < len(r.accepted_by_position))
                   for i in range(width)]
            reached = [sum(r.reached_by_position[i] for r in runs if i < len(r.reached_by_position))
                       for i in range(width)]
            a = conditional_acceptance(acc, reached)
            entry["acceptance_by_position"] = a
            # t_d(1) as this method paid it in its runs: a lookup round costs microseconds, a
            # model round a pass per token, and a combined drafter mixes the two
            drafted = sum(r.drafted or 0 for r in runs)
            block = bench.draft_block
            if block:  # a block drafter pays per pass, whatever it drafts: the rounds that drafted
                drafted = sum(r.drafted_by_position[0] for r in runs if r.drafted_by_position)
            t_draft = sum(r.draft_s for r in runs) / drafted if drafted else None
            if t_draft is not None and bench.target_costs and a:
                entry["draft_s_per_pass" if block else "draft_s_per_token"] = t_draft
                k, bound = best_bound(a, t_draft, bench.target_costs, per_pass=bool(block), max_k=block or None)
                entry["bound"] = {"k": k, "speedup": bound}
                entry["fraction_of_bound"] = _spread([x / bound for x in _ratios(tps, base)])
        entry["per_prompt"] = {
            p.name: {"tokens_per_s": _spread(_suite_tps(bench, method.name, p.name)),
                     "ratio_to_target_alone": _spread(_ratios(_suite_tps(bench, method.name, p.name),
                                                              _suite_tps(bench, TARGET_ALONE, p.name))),
                     "tokens": statistics.median(len(r.result.tokens) for r in bench.records
                                                 if r.method == method.name and r.prompt == p.name)}
            for p in bench.prompts}
        methods.append(entry)
    tandem_div = [d for d in divergences if d.family != "anchor"]
    external = _against_llamacpp(bench, methods)
    return {
        "config": config,
        "costs": {"target_s_by_width": bench.target_costs, "draft_s_per_token": bench.draft_cost,
                  "draft_is_model": bench.draft_is_model, "drafter": bench.draft_name,
                  "draft_block": bench.draft_block},
        "methods": methods,
        "exactness": {
            "checked": config["temperature"] == 0,
            "exact": config["temperature"] == 0 and not tandem_div,
            "bugs": sum(not d.near_tie for d in tandem_div),
            "divergences": [asdict(d) for d in divergences],
        },
        "llama_cpp": external,
        "runs": [{"prompt": r.prompt, "method": r.method, "repeat": r.repeat, "tokens": len(r.result.tokens),
                  "decode_tokens": r.result.decode_tokens, "decode_s": r.result.decode_s,
                  "tokens_per_s": r.result.tokens_per_s, "rounds": r.result.rounds,
                  "drafted": r.result.drafted, "accepted": r.result.accepted} for r in bench.records],
        "wall_s": bench.wall_s,
    }


def _against_llamacpp(bench: BenchRun, methods: list[dict]) -> dict | None:
    """Tandem's methods against llama.cpp's rows on the same GGUF, and whether llama.cpp's prompt
    lookup wrote its own plain text."""
    from app.bench.anchors_llamacpp import LOOKUP, PLAIN
    from app.bench.exactness import same_as_plain

    names = {m.name for m in bench.methods}
    if PLAIN not in names:
        return None
    plain = _suite_tps(bench, PLAIN)
    lookup = _suite_tps(bench, LOOKUP) if LOOKUP in names else None
    copies = [p.name for p in bench.prompts if p.name.startswith("copy")]
    out = {"lookup_same_as_plain": same_as_plain(bench, LOOKUP, PLAIN) if lookup else None, "ratios": {}}
    for m in methods:
        if m["family"] not in ("target", "tandem"):
            continue
        tps = _suite_tps(bench, m["name"])
        out["ratios"][m["name"]] = {
            "vs_plain": _spread(_ratios(tps, plain)),
            "vs_lookup": _spread(_ratios(tps, lookup)) if lookup else None,
            "copy_prompts_vs_plain": {c: _spread(_ratios(_suite_tps(bench, m["name"], c), _suite_tps(bench, PLAIN, c)))
                                      for c in copies}}
    return out


def _fmt(spread: dict | None, digits: int = 2, suffix: str = "") -> str:
    if not spread or spread.get("median") is None:
        return "-"
    return (f"{spread['median']:.{digits}f}{suffix} "
            f"[{spread['min']:.{digits}f}-{spread['max']:.{digits}f}]")


def format_table(summary: dict) -> str:
    c = summary["config"]
    lines = [f"target {c['target']} ({c['target_precision']}) · draft {c['draft']} · {c['backend']}/{c['device']}"
             f" · T={c['temperature']} · {c['prompts']} prompts · {c['repeats']} repeats",
             "tok/s and ratios: median [min-max] over repeats; acc = acceptance; tok/pass = tokens per target pass",
             ""]
    header = (f"{'method':<28}{'tok/s':>22}{'vs target alone':>24}{'vs anchor':>24}"
              f"{'acc':>6}{'tok/pass':>9}{'bound':>12}{'of bound':>22}")
    lines += [header, "-" * len(header)]
    for m in summary["methods"]:
        bound = m.get("bound")
        bound_text = f"{bound['speedup']:.2f}x@k{bound['k']}" if bound else "-"
        lines.append(
            f"{m['name']:<28}{_fmt(m['tokens_per_s'], 1):>22}{_fmt(m['ratio_to_target_alone'], 2, 'x'):>24}"
            f"{_fmt(m.get('ratio_to_anchor'), 2, 'x'):>24}"
            f"{(format(m['acceptance'], '.0%') if 'acceptance' in m else '-'):>6}"
            f"{(format(m['tokens_per_pass'], '.2f') if 'tokens_per_pass' in m else '-'):>9}"
            f"{bound_text:>12}"
            f"{_fmt(m.get('fraction_of_bound'), 2):>22}")
    for m in summary["methods"]:
        if m.get("acceptance_by_position"):
            draft = (f"; drafting {m['draft_s_per_token'] * 1000:.1f} ms per drafted token"
                     if m.get("draft_s_per_token") is not None else
                     f"; drafting {m['draft_s_per_pass'] * 1000:.1f} ms per block"
                     if m.get("draft_s_per_pass") is not None else "")
            lines.append(f"  {m['name']}: acceptance by position "
                         + " ".join(f"{a:.2f}" for a in m["acceptance_by_position"]) + draft)
    outside = [f"{m['name']} {m['outside_passes']['ms_per_round']:.2f} ms "
               f"({m['outside_passes']['share_of_decode']:.1%})" for m in summary["methods"]
               if m.get("outside_passes") and m["outside_passes"]["share_of_decode"] is not None]
    if outside:
        lines.append("  time outside the model passes, per round (share of decoding): " + "; ".join(outside))
    rollback = [f"{m['name']} {m['rollback']['ms_per_round']:.3f} ms ({m['rollback']['share_of_round']:.1%}"
                f"{f', {r:.2f} tokens replayed' if (r := m['rollback']['replayed_per_round']) else ''})"
                for m in summary["methods"] if m.get("rollback") and m["rollback"]["share_of_round"] is not None]
    if rollback:
        lines.append("  rollback of both caches (checkpoint, rewind, replay), per round (share of round time): "
                     + "; ".join(rollback))
    costs = summary["costs"]
    lines.append("  target pass (ms) by width: " + " ".join(
        f"{w}:{s * 1000:.0f}" for w, s in sorted(costs["target_s_by_width"].items())))
    if costs["draft_s_per_token"] is not None:
        lines.append(f"  draft model alone: {costs['draft_s_per_token'] * 1000:.1f} ms per token"
                     if costs["draft_is_model"] else
                     f"  {costs.get('drafter')}: {costs['draft_s_per_token'] * 1000:.3f} ms per pass (a block of up "
                     f"to {costs['draft_block']} drafts), in the runs" if costs.get("draft_block") else
                     f"  {costs.get('drafter') or 'prompt lookup'}: {costs['draft_s_per_token'] * 1000:.3f} ms per "
                     "proposed token, in the runs")
    lines.append("")
    names = [m["name"] for m in summary["methods"]]
    lines.append("per prompt, median tok/s:  " + " | ".join(names))
    for prompt in summary["methods"][0]["per_prompt"]:
        cells = [f"{m['per_prompt'][prompt]['tokens_per_s']['median']:.1f}" for m in summary["methods"]]
        tokens = summary["methods"][0]["per_prompt"][prompt]["tokens"]
        lines.append(f"  {prompt:<12} ({tokens:>3} tok)  " + " | ".join(cells))
    external = summary.get("llama_cpp")
    if external:
        lines.append("\nagainst llama.cpp on the same GGUF (same prompt ids, same threads):")
        for name, r in external["ratios"].items():
            copies = ", ".join(f"{c} {_fmt(v, 2, 'x')}" for c, v in r["copy_prompts_vs_plain"].items())
            lookup = f"; vs its prompt lookup {_fmt(r['vs_lookup'], 2, 'x')}" if r["vs_lookup"] else ""
            lines.append(f"  {name}: vs llama.cpp plain {_fmt(r['vs_plain'], 2, 'x')}{lookup}"
                         + (f"; copy prompts vs plain: {copies}" if copies else ""))
        if external["lookup_same_as_plain"]:
            same, total = external["lookup_same_as_plain"]
            lines.append(f"  llama.cpp prompt lookup wrote its own plain text on {same} of {total} runs (T=0)")
    ex = summary["exactness"]
    if ex["checked"]:
        verdict = "identical to the target alone" if ex["exact"] else f"{ex['bugs']} divergence(s) at a clear gap"
        lines.append(f"\nexactness (T=0): Tandem outputs {verdict}")
        for d in ex["divergences"]:
            kind = "near-tie (numerics)" if d["near_tie"] else "CLEAR GAP"
            lines.append(f"  {d['method']} on {d['prompt']} (repeat {d['repeat'] + 1}): first differs at token "
                         f"{d['position']}, top-2 logit gap {d['top2_gap']:.2e} - {kind}")
    lines.append(f"\nwall time {summary['wall_s']:.0f}s")
    return "\n".join(lines)
