"""The load plan (app/load_plan.py, issue 45): each file's facts read once, every refusal the
files justify made, before anything loads; Runner.load then loads by the plan."""

from __future__ import annotations

import pytest

from app.draft_choice import PROMPT_LOOKUP, DraftChoice, DraftKind
from app.load_plan import plan_load
from app.models.errors import ModelFileError


@pytest.fixture
def no_weights(monkeypatch):
    """Any weights loaded fail the test: a plan reads files, never loads a model."""
    import app.runner

    monkeypatch.setattr(app.runner, "load_backend", lambda *a, **k: pytest.fail("weights were loaded"))


def test_a_draft_model_is_planned_with_its_own_files_and_tokenizer(tiny_pair, no_weights):
    said = []
    plan = plan_load(tiny_pair["target"], "torch", DraftChoice.model(str(tiny_pair["draft"])), progress=said.append)
    assert plan.folder == tiny_pair["target"] and plan.backend == "torch" and plan.device == "cpu"
    assert plan.draft.folder == tiny_pair["draft"] and plan.draft.tokenizer is not None
    assert plan.draft.tokenizer is not plan.tokenizer  # its own, checked against the target's
    assert [m.name for m in plan.models] == ["target", "draft"]
    assert all(m.weights > 0 for m in plan.models)
    assert not plan.auto
    assert [line for line in said if line.startswith("Reading the tokenizer")], said  # the window's step for it


def test_a_self_draft_at_the_targets_precision_is_planned_as_prompt_lookup(tiny_pair, no_weights):
    said = []
    plan = plan_load(tiny_pair["target"], "torch", DraftChoice(DraftKind.SELF, precision="float32"),
                     precision="float32", progress=said.append)
    assert plan.draft.choice == PROMPT_LOOKUP and plan.draft.folder is None
    assert [m.name for m in plan.models] == ["target"]  # prompt lookup holds no memory
    assert any("would be the target itself" in line for line in said)


@pytest.mark.parametrize("precision", ["int4", "bfloat16"])
def test_a_self_draft_of_a_gguf_at_its_own_precisions_is_planned_as_prompt_lookup(demo, no_weights, precision):
    """PyTorch reads the demo's GGUF at its own 4-bit precisions: no float weights to copy at
    another precision (the draft failed as it loaded, after the target had)."""
    said = []
    plan = plan_load("demo", "torch", DraftChoice(DraftKind.SELF, precision=precision), progress=said.append)
    assert plan.draft.choice == PROMPT_LOOKUP and [m.name for m in plan.models] == ["target"]
    assert any("GGUF file's own 4-bit precisions" in line and precision in line for line in said), said


def test_a_self_draft_at_another_precision_reads_the_targets_folder(tiny_pair, no_weights):
    plan = plan_load(tiny_pair["target"], "torch", DraftChoice(DraftKind.SELF, precision="int4"))
    assert plan.draft.folder == plan.folder and plan.draft.precision == "int4"
    target, draft = plan.models
    assert draft.weights < target.weights  # the int4 copy, counted at its own size


def test_the_context_asked_for_caps_what_memory_is_planned_for(tiny_pair, no_weights):
    own = plan_load(tiny_pair["target"], "torch", PROMPT_LOOKUP).models[0].context
    capped = plan_load(tiny_pair["target"], "torch", PROMPT_LOOKUP, context=64).models[0].context
    assert capped == min(64, own) and own > 64
    with pytest.raises(ValueError, match="cannot hold a message"):
        plan_load(tiny_pair["target"], "torch", PROMPT_LOOKUP, context=1)


def test_refusals_come_from_the_plan_before_any_weights_load(tiny_pair, tmp_path, no_weights):
    with pytest.raises(ModelFileError, match="no built-in multi-token-prediction layer"):
        plan_load(tiny_pair["target"], "torch", DraftChoice(DraftKind.MTP))
    with pytest.raises(ValueError, match="PyTorch only"):
        plan_load(tiny_pair["target"], "mlx", PROMPT_LOOKUP, precision="gguf")
    with pytest.raises(ValueError, match="not a draft to load"):
        plan_load(tiny_pair["target"], "torch", DraftChoice(DraftKind.PAIR))


def test_models_info_reads_the_loads_own_plan_and_says_whether_it_fits(tiny_pair, monkeypatch, capsys, no_weights):
    """`models info` states what the load's memory check will plan (the same plan and figures), and
    whether the memory free now holds it."""
    from app.cli import main
    from app.load_plan import plan_load
    from app.models.memory import size_text

    plan = plan_load(tiny_pair["target"], "torch", PROMPT_LOOKUP)
    monkeypatch.setenv("TANDEM_FREE_MEMORY", "8GB")
    assert main(["models", "info", str(tiny_pair["target"])]) == 0
    out = capsys.readouterr().out
    assert f"weights {size_text(plan.models[0].weights)}" in out and "That fits: 8.0 GB" in out
    monkeypatch.setenv("TANDEM_FREE_MEMORY", "1KB")
    assert main(["models", "info", str(tiny_pair["target"])]) == 0
    assert "This pair does not fit" in capsys.readouterr().out


PLAN_SCRIPT = """
import json, sys
from app.load_plan import plan_load
said = []
plan_load(sys.argv[1], "torch", precision="gguf", progress=said.append)
print(json.dumps(said))
"""


def test_a_fresh_processs_plan_says_it_starts_pytorch_and_prepares_the_kernel(tiny_q4):
    """The seconds between the tokenizer and the weights are said as what they are: PyTorch's first
    import, then the CPU kernel's preparation (a window showed "reading its tokenizer" for both)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", PLAN_SCRIPT, str(tiny_q4[0])], capture_output=True, text=True,
                          timeout=300, cwd=str(Path(__file__).parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    order = [next(i for i, line in enumerate(said) if line.startswith(start))
             for start in ("Reading the tokenizer", "Starting PyTorch", "Preparing the CPU kernel")]
    assert order == sorted(order), said
