"""Asks the target writes itself (app/align/self_prompts_torch.py, Magpie): given its chat template
up to the user's message, the demo writes whole, distinct asks, the same ones for the same seed; a
cut-off, too short, repeated or excluded ask is dropped; the alignment job answers them beside the
built-in asks, within its budget; and a GPU asked for where there is none, or a budget that leaves
no time to train, is refused with what to do."""

from __future__ import annotations

import json
from pathlib import Path
import pytest
import torch

from app.align.job import AlignSettings, mixed, run
from app.align.self_prompts_torch import MIN_WORDS, self_prompts, user_prefix
from app.models.errors import ModelFileError
from tests.test_alignment import QUICK


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_pair):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_pair["target"]))


def test_the_prefix_is_the_template_up_to_where_the_users_message_begins(tiny_tokenizer):
    prefix = user_prefix(tiny_tokenizer)
    full = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Plant a tree, please."}], tokenize=False)
    ids = tiny_tokenizer(full, add_special_tokens=False).input_ids
    assert len(prefix) > 0 and ids[:len(prefix)] == prefix
    assert tiny_tokenizer.decode(ids[len(prefix):]).startswith("Plant a tree")


class _Writes:
    """The teacher's place for the filter test: its generate returns these continuations after
    the prompt, the way transformers' does (prompt, then new tokens, padded)."""

    def __init__(self, rows: list[list[int]], pad: int):
        self.rows, self.pad, self.device = rows, pad, torch.device("cpu")
        self.model = self

    def generate(self, input_ids, **kwargs):
        rows = self.rows[: input_ids.shape[0]]
        width = max(len(r) for r in rows)
        new = torch.tensor([r + [self.pad] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, new], dim=1)


def test_cut_off_short_repeated_and_excluded_asks_are_dropped(tiny_tokenizer):
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    encode = lambda text: tiny_tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    whole = "How do bees make honey in winter?"
    rows = [encode(whole) + [end], encode(whole) + [end],  # the same ask twice
            encode("Hi there") + [end],  # under MIN_WORDS words
            # no end: cut off at max_tokens (the longest row: generate pads only rows that ended)
            encode("Tell me a long story about a dragon who lived in a cave by the sea and who"),
            encode("List three facts about the moon.") + [end],  # a prompt that measures the result
            encode("Why do cats purr when they are happy?") + [end]]
    teacher = _Writes(rows, tiny_tokenizer.eos_token_id)
    asks = self_prompts(teacher, tiny_tokenizer, count=10, batch=len(rows), exclude=frozenset(
        {"List three facts about the moon."}))
    assert asks[:2] == [whole, "Why do cats purr when they are happy?"]
    assert all(len(a.split()) >= MIN_WORDS for a in asks) and len(set(asks)) == len(asks)
    # it tries at most four times the asks wanted, then gives what it has
    assert len(self_prompts(teacher, tiny_tokenizer, count=1, batch=len(rows))) == 1


def test_the_demo_writes_whole_distinct_asks_and_the_same_ones_for_the_same_seed(demo):
    from app.align.teacher_torch import Teacher
    from app.models.demo import demo_folder

    teacher = Teacher(demo_folder("torch", progress=lambda message: None))
    tokenizer = teacher.tokenizer()
    asks = self_prompts(teacher, tokenizer, count=8, batch=8, seed=3, max_tokens=48)
    assert len(asks) >= 4, asks  # measured: 7 of 8 tries end within 48 tokens
    for ask in asks:
        assert len(ask.split()) >= MIN_WORDS and "<|im_" not in ask and not ask.startswith("assistant"), ask
    assert self_prompts(teacher, tokenizer, count=8, batch=8, seed=3, max_tokens=48) == asks


def test_the_job_answers_the_targets_own_asks_beside_the_built_in_ones(tiny_pair, tmp_path, monkeypatch):
    from app.align import self_prompts_torch

    own = ["Why is the sea salty and not sweet?", "Plan a picnic for six friends.", "How do magnets work?"]
    asked, answered = [], []
    monkeypatch.setattr(self_prompts_torch, "self_prompts",
                        lambda teacher, tokenizer, count, batch, seed, **kw: asked.append(count) or own[:count])
    from app.align import teacher_torch

    real_collect = teacher_torch.collect

    def collect(teacher, tokenizer, prompts, *args, **kwargs):
        answered.extend(prompts)
        return real_collect(teacher, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(teacher_torch, "collect", collect)
    progress = []
    result = run(AlignSettings(target=str(tiny_pair["target"]), steps=3, out=tmp_path, self_prompts=3, **QUICK),
                 progress.append)
    assert asked == [3]
    assert set(own) <= set(answered) and answered[1] == own[0]  # taken in turn with the built-in asks
    phases = [p.phase for i, p in enumerate(progress) if i == 0 or progress[i - 1].phase != p.phase]
    assert phases[:4] == ["checking", "loading", "prompting", "answering"]
    fractions = [p.fraction for p in progress]
    assert fractions == sorted(fractions)
    manifest = json.loads((result.folder / "manifest.json").read_text())
    assert manifest["data"]["self_prompts"] == 3 and manifest["device"] == "CPU"


def test_by_default_only_a_gpu_writes_asks_and_only_in_a_job_planned_by_the_clock():
    from app.align.job import SELF_PROMPTS_GPU, self_prompt_count

    timed, counted = AlignSettings(target="t"), AlignSettings(target="t", prompts=24)
    assert self_prompt_count(timed, "cpu") == 0  # on 2 cores they cost answers the head needs more
    assert self_prompt_count(timed, "cuda") == SELF_PROMPTS_GPU
    assert self_prompt_count(counted, "cuda") == 0
    assert self_prompt_count(AlignSettings(target="t", self_prompts=5), "cpu") == 5


def test_prompt_lists_are_taken_in_turn():
    assert mixed(["a", "b", "c"], ["x"]) == ["a", "x", "b", "c"]
    assert mixed([], ["x", "y"]) == ["x", "y"]


def test_a_gpu_asked_for_where_there_is_none_is_refused_with_what_to_do():
    from app.align.teacher_torch import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert resolve_device("auto").type == "cpu"
    with pytest.raises(ModelFileError, match="sees no CUDA GPU.*--device cpu"):
        resolve_device("cuda")


def test_a_device_alignment_does_not_know_is_refused_with_the_ones_it_does():
    from app.align.teacher_torch import resolve_device

    with pytest.raises(ModelFileError, match='"auto", "cpu" or "cuda"'):
        resolve_device("gpu")  # torch.device's own error was a traceback


@pytest.mark.parametrize("flag, value, message", [
    ("--device", "gpu", "invalid choice: 'gpu'"),
    ("--self-prompts", "-1", "takes at least 0 asks, not -1"),
    ("--draft-vocab", "-1", "takes at least 0 tokens, not -1"),
    ("--draft-vocab", "many", "takes a whole number of tokens, not 'many'"),
])
def test_tandem_cli_align_refuses_a_bad_value_before_anything_runs(flag, value, message, capsys, tmp_path):
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["align", flag, value, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_budget_that_leaves_no_time_to_train_saves_nothing_and_says_so(tiny_pair, tmp_path):
    with pytest.raises(ModelFileError, match="ran out before training began.*more minutes"):
        run(AlignSettings(target=str(tiny_pair["target"]), minutes=0.001, out=tmp_path, self_prompts=0, **QUICK))
    assert list(Path(tmp_path).iterdir()) == []

