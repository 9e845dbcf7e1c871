"""Aligning a draft to its target (app/align/): on a tiny random Llama target, a draft head trained
on the target's own answers agrees with it far more than before, and distilling the target into an
unrelated draft model raises that model's agreement; either result is saved whole (or not at all,
when cancelled or when writing fails), loads, pairs, and keeps speculation exact at temperature 0
(token for token, both backends, every k) and at temperature 1 (chi-square against the exact
marginals); a draft with another tokenizer, or a machine without the memory, is refused before
anything trains; "auto" pairs a target with its aligned draft only while the alignment is active
and measured no slower, and undoing it leaves the original draft as it was."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.align.job import AlignCancelled, AlignSettings, run
from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind
from app.engine.backends import load_backend
from app.engine.events import Round
from app.engine.mtp import load_head_drafter
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.models.errors import ModelFileError
from app.models.pairing import PairingError

ASKS = ("Write a short poem about dogs.", "List five facts about bees.")  # the target's answers loop: the
# head learns some loops and not others, so two prompts
QUICK = dict(prompts=24, max_tokens=24, batch=8, threads=1, trial=False)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is many times faster than OpenMP's two spinning on tiny ops."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(target, prompt, drafter=None, max_tokens=24, **kw):
    events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=max_tokens, **kw))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1].stats


def _entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture(scope="module")
def prompts(tiny_pair) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_pair["target"]))
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": ask}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for ask in ASKS]


@pytest.fixture(scope="module")
def head(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("aligned")
    progress = []
    # a draft vocabulary of a quarter of the tiny target's 1,024 tokens (the job's default is more than all)
    result = run(AlignSettings(target=str(tiny_pair["target"]), steps=40, out=out, draft_vocab=256, **QUICK),
                 progress.append)
    return result, progress, out


def test_a_trained_head_agrees_with_the_target_far_more_than_the_untrained_one(head, tiny_pair):
    result, progress, out = head
    chance = 1 / 1024
    assert result.held_out_positions >= 20
    # the gain measured on held-out answers (never trained on), before vs after the same head's training
    assert result.agreement_after - result.agreement_before >= 0.2, (result.agreement_before, result.agreement_after)
    assert result.agreement_after > 50 * chance
    manifest = json.loads((result.folder / "manifest.json").read_text())
    assert manifest["agreement"]["after"] == pytest.approx(result.agreement_after, abs=1e-4)
    assert manifest["target"]["folder"] == str(Path(tiny_pair["target"]).resolve())
    assert manifest["steps"] == 40 and manifest["data"]["answers"] == result.answers
    # progress: phases in order, the fraction never goes back, and it ends done at 100%
    phases = [p.phase for p in progress]
    order = ["checking", "loading", "answering", "training", "measuring", "saving", "done"]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == order
    fractions = [p.fraction for p in progress]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert any(p.eta_s is not None for p in progress if p.phase == "training")
    assert _entries(out) == [result.folder.name]  # no partial folder left beside it


def test_the_head_drafts_from_the_answers_tokens_and_its_manifest_says_what_that_costs(head, tiny_pair):
    from transformers import AutoTokenizer

    from app.align.teacher_torch import stop_ids

    result = head[0]
    manifest = json.loads((result.folder / "manifest.json").read_text())
    vocab = result_vocab(result)
    # the loops the tiny target answers with use a few of its 1,024 tokens: a real subset, stops included
    assert vocab is not None and len(vocab) == 256 == result.draft_vocab
    assert manifest["draft_vocab"]["size"] == len(vocab)
    assert set(stop_ids(AutoTokenizer.from_pretrained(str(tiny_pair["target"])))) <= set(vocab)
    coverage = manifest["draft_vocab"]["held_out_coverage"]
    assert 0 < coverage <= 1
    # where the target's token is inside the vocabulary and the whole-vocabulary draft got it, the
    # subset's draft gets it too: it can lose at most the held-out tokens the subset lacks
    in_vocab = manifest["agreement"]["in_draft_vocab"]
    assert in_vocab == pytest.approx(result.agreement_in_vocab, abs=1e-4)
    assert in_vocab >= result.agreement_after - (1 - coverage) - 1e-3


def test_the_saved_head_is_a_draft_head_folder_under_the_mtp_layers_names(head, tiny_pair):
    from app.models.aligned_head import head_weights, is_aligned_head

    result = head[0]
    assert is_aligned_head(result.folder) and result.draft_choice == f"head:{result.folder}"
    config = json.loads((tiny_pair["target"] / "config.json").read_text())
    names = head_weights(result.folder, config).names()
    wanted = {"fc.weight", "pre_fc_norm_embedding.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"}
    assert wanted <= set(names)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_an_aligned_head_drafts_and_speculation_stays_exact_at_every_k(head, tiny_pair, prompts, backend):
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    result = head[0]
    target = load_backend(tiny_pair["target"], backend)
    drafter = load_head_drafter(target, result.folder)
    fresh = load_backend(tiny_pair["target"], backend)
    drafted = accepted = 0
    vocab = set(result_vocab(result))
    for prompt in prompts:
        plain, _ = _run(fresh, prompt)
        for k in range(1, 7):
            events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=24, draft_tokens=k))
            tokens = [t for e in events if isinstance(e, Round) for t in e.emitted]
            assert tokens == plain, k
            seen = vocab | set(prompt)  # the head drafts from its vocabulary and the conversation's tokens alone
            for e in events:
                if isinstance(e, Round):
                    assert e.source != "head" or set(e.drafted) <= seen, k
                    seen |= set(e.emitted)
            drafted, accepted = drafted + events[-1].stats.drafted, accepted + events[-1].stats.accepted
    assert drafted > 0 and accepted / drafted > 0.2  # the head drafted, and the target took much of it


def result_vocab(result) -> list[int]:
    from app.models.aligned_head import draft_vocab

    return draft_vocab(result.folder, 1024)


def test_the_mlx_head_computes_what_the_torch_head_computes(head, tiny_pair):
    pytest.importorskip("mlx_lm")
    import mlx.core as mx
    import torch

    result = head[0]
    heads = {b: load_head_drafter(load_backend(tiny_pair["target"], b), result.folder).head for b in ("torch", "mlx")}
    rng = np.random.default_rng(0)
    ids = [5, 96, 310, 17]
    states = rng.standard_normal((1, 4, 64)).astype(np.float32)
    with torch.inference_mode():
        ours = heads["torch"]._pass(torch.tensor([ids]), torch.tensor(states)).numpy()
    theirs = np.array(heads["mlx"]._pass(mx.array([ids]), mx.array(states)))
    assert np.abs(ours - theirs).max() < 1e-4


@pytest.mark.parametrize("trees", ["off", "on"])
def test_an_aligned_head_keeps_the_targets_distribution_at_temperature_1(head, tiny_pair, prompts, trees):
    """Tokens 2 and 3 keep the target's marginals (chi-square against the exact enumeration):
    chains under the Leviathan/Chen rule, and trees of the head's runner-ups, walked by the
    target's own draws (tree_torch.verify_tree)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_engine_sampling import ALPHA, _p_value, exact_marginals

    params = SamplingParams(temperature=1.0, top_k=6, seed=5)  # a frontier the enumeration can cover
    prompt = prompts[0]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_pair["target"]), dtype=torch.float32).eval()
    exact = exact_marginals(model, prompt, params, depth=3, vocab=1024)
    target = load_backend(tiny_pair["target"], "torch")
    drafter = load_head_drafter(target, head[0].folder)
    counts, drafted, accepted, tree_rounds = np.zeros((3, 1024)), 0, 0, 0
    for i in range(1000):
        events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=3, draft_tokens=2,
                               params=replace(params, seed=params.seed * 100_003 + i), trees=trees))
        tokens = [t for e in events if isinstance(e, Round) for t in e.emitted]
        tree_rounds += sum(1 for e in events if isinstance(e, Round) and e.tree is not None)
        drafted, accepted = drafted + events[-1].stats.drafted, accepted + events[-1].stats.accepted
        for position, t in enumerate(tokens):
            counts[position, t] += 1
    assert 0.05 < accepted / drafted < 0.98, (accepted, drafted)  # both verdicts occurred
    assert (tree_rounds > 300) if trees == "on" else tree_rounds == 0, tree_rounds
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_a_quantized_head_whose_rows_cannot_be_taken_drafts_over_the_whole_vocabulary(head, tiny_pair, prompts):
    from app.engine.backends.subset_head_torch import SubsetHead

    target = load_backend(tiny_pair["target"], "torch", precision="int4-head")  # torchao's packed int4 head
    assert not SubsetHead.fits(target.model.get_output_embeddings())
    drafter = load_head_drafter(target, head[0].folder)
    assert drafter.head.subset is None
    plain, _ = _run(load_backend(tiny_pair["target"], "torch", precision="int4-head"), prompts[0])
    tokens, stats = _run(target, prompts[0], drafter, draft_tokens=3)
    assert tokens == plain and stats.drafted > 0


def test_the_runner_pairs_an_aligned_head_by_its_choice_or_dropped_as_a_draft_folder(head, tiny_pair):
    from app.runner import ChatRequest, Runner

    runner = Runner()
    for choice in (DraftChoice.parse(f"head:{head[0].folder}"), DraftChoice.parse(str(head[0].folder))):
        loaded = runner.load(tiny_pair["target"], "torch", choice, progress=lambda m: None)
        assert loaded.draft.kind is DraftKind.HEAD and loaded.draft_words()[0] == "aligned draft head"
        assert runner.drafter.wants_target_state
        ask = ChatRequest(({"role": "user", "content": "Explain chess to a beginner."},), max_tokens=24,
                          draft_tokens=3)
        spec = list(runner.chat(ask))
        plain = list(runner.chat(ChatRequest(ask.messages, max_tokens=24, drafter=NO_DRAFT)))
        tokens = [[t for e in events if isinstance(e, Round) for t in e.emitted] for events in (spec, plain)]
        assert tokens[0] == tokens[1]
        assert "head" in {e.source for e in spec if isinstance(e, Round) and e.drafted}  # the head drafted


def test_the_memory_check_counts_the_rows_the_draft_vocabulary_holds(head, tiny_pair):
    """The copies of the target head's rows the subset drafts from (its fixed part and, at most,
    DRAFT_VOCAB_EXTRA of the conversation's tokens) are memory the pair needs beside the target."""
    from app.models.aligned_head import DRAFT_VOCAB_EXTRA, head_bytes
    from app.runner import Runner

    runner, estimates = Runner(), []
    real_check = runner._check_memory
    runner._check_memory = lambda models, *rest: (estimates.extend(models), real_check(models, *rest))[1]
    runner.load(tiny_pair["target"], "torch", DraftChoice.head(str(head[0].folder)), progress=lambda m: None)
    subset = runner.drafter.model.head.subset  # the head, with prompt lookup beside it
    assert subset is not None
    row = sum(t.element_size() * t.shape[-1] for t in subset.rows if t is not None and t.dim() == 2)
    full = min(len(subset.fixed) + DRAFT_VOCAB_EXTRA, runner.target.vocab_size) * row  # every row it may hold
    draft = next(e for e in estimates if e.name == "draft")
    assert draft.weights - head_bytes(head[0].folder) * 2 >= full > 0


def test_a_head_aligned_to_another_model_is_refused_before_anything_loads(head, tiny_pair, tmp_path):
    import shutil

    from app.runner import Runner

    other = tmp_path / "other-head"
    shutil.copytree(head[0].folder, other)
    config = json.loads((other / "config.json").read_text())
    config["hidden_size"] = 32
    (other / "config.json").write_text(json.dumps(config))
    runner = Runner()
    with pytest.raises(ModelFileError, match="aligned to .*hidden_size is 32; this model's is 64"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.head(str(other)), progress=lambda m: None)
    assert runner.loaded is None
    # a damaged draft vocabulary is refused there too, with the way to go on without it
    (other / "config.json").write_text((head[0].folder / "config.json").read_text())
    (other / "draft_vocab.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"{}      " + b"\1" * 5)
    with pytest.raises(ModelFileError, match="Delete draft_vocab.safetensors"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.head(str(other)), progress=lambda m: None)
    assert runner.loaded is None


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


def test_distilling_the_target_into_an_unrelated_draft_raises_its_agreement_and_leaves_the_original(
        tiny_pair, tmp_path):
    from app.runner import ChatRequest, Runner

    original = _digest(tiny_pair["draft"])
    result = run(AlignSettings(target=str(tiny_pair["target"]), draft=str(tiny_pair["draft"]), steps=30,
                               out=tmp_path, **QUICK))
    assert result.kind == "model"
    assert result.agreement_after - result.agreement_before >= 0.15, (result.agreement_before, result.agreement_after)
    assert _digest(tiny_pair["draft"]) == original  # reversible: the original draft is untouched
    runner = Runner()
    loaded = runner.load(tiny_pair["target"], "torch", DraftChoice.parse(result.draft_choice), progress=lambda m: None)
    assert loaded.draft.kind is DraftKind.MODEL
    ask = ChatRequest(({"role": "user", "content": "List five facts about bees."},), max_tokens=24, draft_tokens=4)
    spec = [t for e in runner.chat(ask) if isinstance(e, Round) for t in e.emitted]
    plain = [t for e in runner.chat(ChatRequest(ask.messages, max_tokens=24, drafter=NO_DRAFT))
             if isinstance(e, Round) for t in e.emitted]
    assert spec == plain


def test_a_draft_with_another_tokenizer_is_refused_before_training(tiny_pair, tiny_fields, tmp_path, monkeypatch):
    from app.align import teacher_torch as teacher
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    fields = {**tiny_fields, "tokens": tiny_fields["tokens"][:512], "types": tiny_fields["types"][:512]}
    fields["merges"] = [m for m in fields["merges"] if all(p in set(fields["tokens"]) for p in m.split(" "))
                        and m.replace(" ", "") in set(fields["tokens"])]
    write_gguf(tiny_llama(3, vocab=512), tmp_path / "other.gguf", fields)
    other = import_gguf(tmp_path / "other.gguf", tmp_path / "other", mlx_variants=())["hf"]

    def no_teacher(*args, **kwargs):
        raise AssertionError("the teacher loaded before the tokenizers were compared")

    monkeypatch.setattr(teacher.Teacher, "__init__", no_teacher)
    with pytest.raises(PairingError, match="tokenizers differ.*1,024 tokens and the draft 512"):
        run(AlignSettings(target=str(tiny_pair["target"]), draft=str(other), steps=1, out=tmp_path / "out", **QUICK))
    assert not (tmp_path / "out").exists() or not _entries(tmp_path / "out")


def test_too_little_memory_is_refused_before_loading_with_what_to_do(tiny_pair, tmp_path, monkeypatch):
    from app.models.memory import NotEnoughMemory

    monkeypatch.setenv("TANDEM_FREE_MEMORY", "1MB")
    with pytest.raises(NotEnoughMemory, match="Unload the pair"):
        run(AlignSettings(target=str(tiny_pair["target"]), steps=1, out=tmp_path, **QUICK))


def test_cancel_during_training_leaves_no_draft_and_no_partial_folder(tiny_pair, tmp_path):
    seen = []
    with pytest.raises(AlignCancelled):
        run(AlignSettings(target=str(tiny_pair["target"]), steps=400, out=tmp_path, **QUICK), seen.append,
            cancelled=lambda: any(p.phase == "training" and "step" in p.message for p in seen))
    assert _entries(tmp_path) == []


def test_a_write_that_fails_midway_leaves_nothing_and_a_killed_jobs_partial_is_removed(tiny_pair, tmp_path,
                                                                                      monkeypatch):
    from app.align import job, store

    def half_written(trainer, teacher, target, draft, path, vocab=None):
        (path / "model.safetensors").write_bytes(b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(job, "_write", half_written)
    with pytest.raises(OSError, match="No space"):
        run(AlignSettings(target=str(tiny_pair["target"]), steps=2, out=tmp_path, **QUICK))
    assert _entries(tmp_path) == []
    dead, alive = tmp_path / ".x-head.partial-999999999", tmp_path / f".y-head.partial-{os.getpid()}"
    dead.mkdir()
    alive.mkdir()
    assert store.remove_stale_partials(tmp_path) == [dead]  # a running job's own stays
    assert _entries(tmp_path) == [alive.name]


def test_auto_pairs_the_aligned_draft_while_active_and_measured_no_slower(head, tiny_pair, monkeypatch):
    from app.models.pair_memory import PairMemory, TrialResult
    from app.runner import auto_draft

    target = str(tiny_pair["target"])
    aligned = DraftChoice.parse(head[0].draft_choice)
    memory = PairMemory()
    slow, fast = (TrialResult(0.3, s, 1.5, 100, 0.0) for s in (0.9, 1.4))
    assert auto_draft(target, "torch") == PROMPT_LOOKUP
    memory.set_alignment("torch", target, aligned, PROMPT_LOOKUP, slow, fast, (0.0, 0.5))
    assert auto_draft(target, "torch") == aligned
    assert PairMemory().alignment("torch", target)["after"] == fast  # remembered across sessions
    memory.set_alignment_active("torch", target, False)  # "Use original draft"
    assert auto_draft(target, "torch") == PROMPT_LOOKUP
    memory.set_alignment("torch", target, aligned, PROMPT_LOOKUP, fast, slow, (0.0, 0.5))
    assert auto_draft(target, "torch") == PROMPT_LOOKUP  # it measured slower: not paired


def test_tandem_cli_align_writes_the_draft_and_remembers_the_pair(tiny_pair, capsys):
    from app.align.store import aligned_dir
    from app.cli import main
    from app.models.pair_memory import PairMemory

    code = main(["align", "--target", str(tiny_pair["target"]), "--prompts", "16", "--steps", "5",
                 "--max-tokens", "16", "--batch", "8", "--threads", "1", "--no-trial"])
    assert code == 0
    out = capsys.readouterr().out
    folder = Path(out.split("Aligned draft: ")[1].splitlines()[0])
    assert folder.parent == aligned_dir() and (folder / "manifest.json").is_file()
    stored = PairMemory().alignment("torch", str(Path(tiny_pair["target"]).resolve()))
    assert stored["aligned"] == DraftChoice.head(str(folder)) and stored["active"]
    assert f"--draft head:{folder}" in out


def test_the_jobs_card_line_gives_each_speedup_with_its_trials_range_where_it_has_one():
    from app.align.job import AlignResult

    result = AlignResult(Path("x"), "head", 0.0, 0.68, 100, 10, 1000, 5, 1.0,
                         trial_before={"acceptance": 0.11, "speedup": 0.99, "tokens_per_pass": 1.0, "tokens": 117,
                                       "measured_at": 1.0, "low": 0.97, "high": 1.02},
                         trial_after={"acceptance": 0.34, "speedup": 1.18, "tokens_per_pass": 1.4, "tokens": 117,
                                      "measured_at": 1.0})  # a trial remembered without one
    assert result.card() == "agrees 0% -> 68%; accepts 11% -> 34%, 1.0x (0.97-1.02x) -> 1.2x here"



@pytest.mark.parametrize("flag, word", [("--batch", "answer"), ("--prompts", "prompt"), ("--steps", "step"),
                                        ("--max-tokens", "token"), ("--threads", "thread"),
                                        ("--batch-tokens", "token")])
def test_tandem_cli_align_refuses_a_count_below_one_before_anything_runs(flag, word, capsys, tmp_path):
    """--batch 0 used to reach the answering loop (range() with a step of 0: a traceback)."""
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["align", flag, "0", "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"takes at least 1 {word}, not 0" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing written

def test_held_out_answers_share_no_subject_with_the_trained_ones():
    """Agreement is measured on answers about subjects training never saw: with a random tenth of
    the answers, asks about the same subject fell on both sides (the demo's head read 0.45 there,
    0.2 on the bench's prompts)."""
    from types import SimpleNamespace

    from app.align.job import split
    from app.align.prompts import ASKS, SUBJECTS, builtin_prompts

    prompts = builtin_prompts(0)
    answers = [SimpleNamespace(prompt=i) for i in range(len(prompts))]
    held, trained = split(answers, prompts, 0)
    assert len(held) + len(trained) == len(prompts) and 0.05 < len(held) / len(prompts) < 0.15

    def subjects(group):
        return {s for a in group for s in SUBJECTS for ask in ASKS if prompts[a.prompt] == ask.format(s)}

    assert subjects(held) and not subjects(held) & subjects(trained)
    # a short job whose answers hold too few held-out prompts still measures on a tenth of them
    few_held, few_trained = split(answers[:12], prompts, 0)
    assert len(few_held) >= 1 and len(few_held) + len(few_trained) == 12
    assert not {id(a) for a in few_held} & {id(a) for a in few_trained}


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_conversations_tokens_follow_the_conversation_as_the_app_decodes_it(head, tiny_pair, prompts, backend):
    """As Runner.chat decodes (the target's cache kept across turns, reuse_cache=True): a follow-up
    turn keeps the first turn's tokens in the head's vocabulary, another conversation replaces them."""
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    result = head[0]
    fixed = set(result_vocab(result))
    target = load_backend(tiny_pair["target"], backend)
    drafter = load_head_drafter(target, result.folder)
    marker = [t for t in range(1024) if t not in fixed and t not in prompts[1]][:3]  # only in conversation A

    def chat(prompt):
        events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=8, draft_tokens=2,
                               reuse_cache=True))
        return [t for e in events if isinstance(e, Round) for t in e.emitted]

    first = prompts[0] + marker
    answer = chat(first)
    assert set(marker) <= drafter.head.subset.known  # the conversation's tokens joined it
    follow_up = first + answer + prompts[1][1:]
    chat(follow_up)
    assert set(marker) <= drafter.head.subset.known  # a follow-up turn is the same conversation
    other = chat(prompts[1])
    known = drafter.head.subset.known
    assert not set(marker) & known  # another conversation: its tokens, not A's
    assert fixed | set(prompts[1][1:]) <= known <= fixed | set(prompts[1]) | set(other)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_an_aligned_heads_trees_keep_the_answer_and_hand_it_the_kept_paths_states(head, tiny_pair, prompts,
                                                                                   backend):
    """Trees from an aligned head (its runner-ups where it was unsure; tests/head_trees.py), on both
    backends: the target's answer at temperature 0, some rounds taken off the chain, and every
    state handed over the one a prefill computes at that position."""
    from tests.head_trees import check_head_trees

    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(tiny_pair["target"], backend)
    drafter = load_head_drafter(target, head[0].folder)
    assert drafter.drafts_trees and target.tree_note() == ""
    run = check_head_trees(target, load_backend(tiny_pair["target"], backend), drafter, prompts)
    assert run.trees >= 4 and run.off_chain >= 1 and run.states > 40, run


def test_an_mlx_target_hands_the_head_the_states_of_a_lookup_trees_kept_path(head, tiny_pair, prompts):
    """On MLX, beside prompt lookup, a lookup round's tree (first branch wrong, second right) is
    verified, and the head then reads the states of the branch taken (tests/head_trees.py)."""
    pytest.importorskip("mlx_lm")
    from app.engine.drafters import LookupThenModelDrafter
    from tests.head_trees import check_head_trees
    from tests.test_tree_rounds import ScriptedLookup

    target, fresh = load_backend(tiny_pair["target"], "mlx"), load_backend(tiny_pair["target"], "mlx")
    assert target.tree_note() == ""
    prompt = prompts[0]
    alone, _ = _run(fresh, prompt)
    head_drafter = load_head_drafter(target, head[0].folder)

    class FirstChance(ScriptedLookup):  # the first round from 5 tokens into the answer on, whatever k took before
        def propose(self, committed, k, params, should_stop=None):
            if self.at is not None and len(committed) >= self.at:
                pos = len(committed) - len(prompt)  # the answer's index of the token to draft first
                self.at, self.right = len(committed), tuple(alone[pos:pos + 3])
                self.wrong = ((self.right[0] + 1) % 1024, 1, 2, 3)
            return super().propose(committed, k, params, should_stop)

        def propose_tree(self, committed, k, width, params, should_stop=None):
            proposal = super().propose_tree(committed, k, width, params, should_stop)
            if proposal.tree is not None:
                self.at = None  # once
            return proposal

    head_drafter.head.runner_ups = False  # the head's own trees aside: the one tree here is lookup's
    lookup = FirstChance(len(prompt) + 5, (), ())
    drafter = LookupThenModelDrafter(head_drafter, lookup, min_tokens=2)
    run = check_head_trees(target, fresh, drafter, [prompt], reader=head_drafter)
    assert run.trees == 1 and run.off_chain == 1 and run.states > 20, run
