"""A GGUF whose passes are the lean step's loads into Tandem's own Llama-family modules
(app/models/gguf_llama_torch.py), without transformers' model code: the same tree, the same
tables and the same logits, bit for bit, as transformers' classes filled from the same file."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch

from app.draft_choice import PROMPT_LOOKUP
from app.models import gguf_llama_torch as own

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def qwen3_q4(tmp_path_factory, tiny_fields):
    """A tiny Qwen3 GGUF (Q4_1, the embedding Q8_0), imported."""
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_qwen3, write_qwen3_gguf

    root = tmp_path_factory.mktemp("qwen3_q4")
    write_qwen3_gguf(tiny_qwen3(seed=5), root / "q.gguf", tiny_fields, Q.Q4_1, Q.Q8_0)
    return import_gguf(root / "q.gguf", root / "import", mlx_variants=())["hf"]


@pytest.fixture(scope="module")
def llama_q4(tmp_path_factory, tiny_fields):
    """A tiny Llama GGUF whose every projection has whole chunks of rows (the compiled layers run)."""
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    root = tmp_path_factory.mktemp("llama_q4")
    write_gguf(tiny_llama(seed=23, hidden=128, heads=4, kv_heads=2), root / "m.gguf", tiny_fields, Q.Q4_1,
               embedding_qtype=Q.Q8_0)
    return import_gguf(root / "m.gguf", root / "import", mlx_variants=())["hf"]


def _both(folder):
    """The GGUF loaded twice: into Tandem's own modules, and into transformers' classes."""
    from app.models.gguf_import import gguf_source
    from app.models.gguf_torch import load_gguf_model

    mine, report = load_gguf_model(folder, gguf_source(folder), lean_only=True)
    theirs, their_report = load_gguf_model(folder, gguf_source(folder), lean_only=False)
    assert report.own_layers and isinstance(mine, own.CausalLM)
    assert not their_report.own_layers and not isinstance(theirs, own.CausalLM)
    assert report.classes == their_report.classes and report.fused == their_report.fused
    return mine, theirs


@pytest.mark.parametrize("which", ["llama_q4", "qwen3_q4", "tiny_q4"])
def test_own_modules_give_transformers_classes_logits_bit_for_bit(which, request):
    """Through the lean step (the compiled layers on llama_q4 and qwen3_q4; the PyTorch body on
    tiny_q4, whose 64-wide rows the compiled call does not take), a prefill and a 4-token pass."""
    from app.engine.backends.lean_step_torch import LeanStep

    folder = request.getfixturevalue(which)
    folder = folder[0] if isinstance(folder, tuple) else folder
    mine, theirs = _both(folder)
    compiled = []
    outputs = []
    for model in (mine, theirs):
        lean = LeanStep(model)
        compiled.append(lean.native is not None)
        kv = lean.new_cache()
        with torch.inference_mode():
            first, _ = lean.forward(torch.tensor([[5, 17, 300, 42, 7, 9]]), kv, keep=6)
            kv.appended(6)
            second, _ = lean.forward(torch.tensor([[11, 12, 13, 14]]), kv, keep=4)
        outputs.append((first, second))
    assert compiled[0] == compiled[1] == (which != "tiny_q4")
    for got, want in zip(outputs[0], outputs[1], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("kind,theta,head_dim", [("llama", 10000.0, 64), ("llama", 500000.0, 128),
                                                 ("qwen3", 1000000.0, 128)])
def test_rope_tables_are_transformers_own_bit_for_bit(kind, theta, head_dim):
    from transformers import LlamaConfig, Qwen3Config
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    fields = {"model_type": kind, "hidden_size": 4 * head_dim, "num_attention_heads": 4, "head_dim": head_dim,
              "rope_parameters": {"rope_type": "default", "rope_theta": theta}}
    config = (LlamaConfig if kind == "llama" else Qwen3Config)(**{k: v for k, v in fields.items() if k != "model_type"})
    theirs = (LlamaRotaryEmbedding if kind == "llama" else Qwen3RotaryEmbedding)(config)
    mine = own.RotaryEmbedding(own.PlainConfig(fields))
    positions = torch.arange(8192)[None]
    probe = torch.empty(0)
    for got, want in zip(mine(probe, positions), theirs(probe, positions), strict=True):
        assert torch.equal(got, want)


def test_q_and_k_rows_are_unpermuted_as_transformers_does():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor, TensorProcessor

    fields = {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256}
    rng = np.random.default_rng(0)
    for architecture, theirs in (("llama", LlamaTensorProcessor(config=fields)), ("qwen3", TensorProcessor())):
        mine = own.RowProcessor(own.PlainConfig(fields), architecture)
        for name, rows in (("blk.0.attn_q.weight", 256), ("blk.3.attn_k.weight", 64), ("blk.0.attn_v.weight", 64)):
            for weights in (rng.standard_normal((rows, 256)), np.arange(rows)[:, None]):
                got = mine.process(weights=weights, name=name).weights
                assert np.array_equal(got, theirs.process(weights=weights, name=name).weights)
                assert architecture != "llama" or "attn_v" in name or not np.array_equal(got, weights)


def test_tensor_names_are_transformers_own(llama_q4, qwen3_q4):
    from transformers import AutoConfig, AutoModelForCausalLM

    from app.models.gguf_torch import _processor, _tensor_names

    for folder, architecture in ((llama_q4, "llama"), (qwen3_q4, "qwen3")):
        mine, _ = own.build(own.read_config(folder))
        config = AutoConfig.from_pretrained(str(folder))
        with torch.device("meta"):
            theirs = AutoModelForCausalLM.from_config(config)
        processor, _ = _processor(config, architecture)
        assert own.tensor_names(mine, architecture) == _tensor_names(theirs, processor)
        assert "blk.1.ffn_down.weight" in own.tensor_names(mine, architecture)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_tensor_names_of_many_layers_are_gguf_tables_own(llama_q4, qwen3_q4, architecture):
    """tensor_names reads gguf's table of one block and moves its names to each layer's index:
    the same names as gguf's table of all the layers, for layers 10 and up too."""
    folder = {"llama": llama_q4, "qwen3": qwen3_q4}[architecture]
    config = dict(own.read_config(folder), num_hidden_layers=12)
    mine, _ = own.build(config)
    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    table = gguf.get_tensor_name_map(arch, 12)
    want = {}
    for name, _ in mine.named_parameters():
        base, _, suffix = name.rpartition(".")
        if (found := table.get_name(base)) is not None:
            want[f"{found}.{suffix}"] = name
    assert own.tensor_names(mine, architecture) == want and "blk.11.attn_q.weight" in want


LOAD_SCRIPT = """
import json, sys
from app.draft_choice import PROMPT_LOOKUP
from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.runner import ChatRequest, Runner
runner = Runner()
runner.load(sys.argv[1], "torch", draft=PROMPT_LOOKUP, precision="gguf", progress=lambda m: None)
request = ChatRequest(({"role": "user", "content": "Say hello."},), max_tokens=8,
                      params=SamplingParams(temperature=0.0))
tokens = [t for event in runner.chat(request) if isinstance(event, Round) for t in event.emitted]
heavy = sorted(m for m in sys.modules if m.startswith(("transformers.models.", "transformers.modeling_utils",
                                                       "transformers.cache_utils", "torch._dynamo", "torchao")))
print(json.dumps({"tokens": tokens, "heavy": heavy}))
"""


def test_a_gguf_load_and_answer_import_no_model_code_it_does_not_need(llama_q4):
    """Import time is most of a GGUF's load (docs/gguf.md): transformers' model classes, its
    caches, torch._dynamo and torchao are not imported to load a GGUF and answer on the lean step."""
    done = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, str(llama_q4)], capture_output=True, text=True,
                          timeout=300, cwd=str(own.Path(__file__).parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["tokens"]) == 8
    assert result["heavy"] == []


def test_transformers_forward_is_still_there_when_asked_and_own_modules_refuse_it(llama_q4):
    from app.engine.backends.torch_backend import TorchBackend, own_layers
    from app.engine.sampling import SamplingParams

    lean = TorchBackend(llama_q4, precision="gguf")
    assert own_layers(lean.model) and lean.step == "lean"
    with pytest.raises(ValueError, match="without transformers' model code"):
        lean.step = "transformers"
    assert lean.step == "lean"  # refused before anything changed
    full = TorchBackend(llama_q4, precision="gguf", step="transformers")
    assert not own_layers(full.model) and full.step == "transformers"
    greedy = SamplingParams(temperature=0.0)
    ids = [5, 17, 300, 42]
    for backend in (lean, full):
        backend.reset()
    assert lean.next_token(ids, greedy) == full.next_token(ids, greedy)


def test_other_families_and_rope_types_keep_transformers_classes_and_say_why():
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "intermediate_size": 128, "vocab_size": 10, "rms_norm_eps": 1e-5}
    assert own.why_not(base, "llama") == ""
    assert "qwen2" in own.why_not({**base, "model_type": "qwen2"}, "qwen2")
    assert "biases" in own.why_not({**base, "attention_bias": True}, "llama")
    assert "llama3 rope" in own.why_not({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}},
                                        "llama")
    assert "gelu" in own.why_not({**base, "hidden_act": "gelu"}, "llama")
    assert "sliding" in own.why_not({**base, "model_type": "qwen3", "layer_types": ["sliding_attention"] * 2},
                                    "qwen3")


def test_a_ggufs_tokenizer_is_the_one_autotokenizer_builds(demo):
    """Built directly as TokenizersBackend (no config read through transformers' config classes),
    the same ids, template, specials and stops as AutoTokenizer's."""
    from transformers import AutoTokenizer

    from app.models.transformers_tokenizer import ChatTokenizer

    folder = demo["hf"]
    mine = ChatTokenizer(folder)
    theirs = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    assert type(mine.hf) is type(theirs)
    messages = [{"role": "user", "content": "Hi <|im_end|> there\n  ünïcode 🙂"}]
    assert mine.render_text(messages) == theirs.apply_chat_template(messages, add_generation_prompt=True,
                                                                    tokenize=False)
    text = mine.render_text(messages)
    assert mine.encode(text) == list(theirs.encode(text, add_special_tokens=False))
    assert mine.special_tokens() == {str(t) for t in theirs.all_special_tokens}
    assert len(mine) == len(theirs) and mine.hf.eos_token_id == theirs.eos_token_id


def test_a_ggufs_own_modules_answer_as_the_target_alone(qwen3_q4):
    """Speculation over Tandem's own modules writes, token for token, what they write alone."""
    from app.draft_choice import NO_DRAFT
    from app.engine.events import Round
    from app.engine.sampling import SamplingParams
    from app.runner import ChatRequest, Runner

    answers = {}
    for draft in (PROMPT_LOOKUP, NO_DRAFT):
        runner = Runner()
        runner.load(qwen3_q4, "torch", draft=draft, precision="gguf", progress=lambda m: None)
        assert isinstance(runner.target.model, own.CausalLM)
        request = ChatRequest(({"role": "user", "content": "Repeat: one two three one two three one two"},),
                              max_tokens=48, params=SamplingParams(temperature=0.0))
        answers[draft] = [t for event in runner.chat(request) if isinstance(event, Round) for t in event.emitted]
    assert len(answers[NO_DRAFT]) == 48
    assert answers[PROMPT_LOOKUP] == answers[NO_DRAFT]


def test_the_benchs_anchors_get_transformers_classes_and_are_left_out_in_words_without(llama_q4):
    """transformers' anchors run its forward on the loaded model: Runner.load(model_code=
    "transformers") (the bench's load when anchors run) gives them transformers' classes; over
    Tandem's own modules they are left out, saying why, and Tandem's rows stay."""
    from app.bench.harness import build_methods
    from app.runner import Runner

    runner = Runner()
    runner.load(llama_q4, "torch", draft=PROMPT_LOOKUP, precision="gguf", progress=lambda m: None,
                model_code="transformers")
    assert not isinstance(runner.target.model, own.CausalLM) and runner.target.step == "lean"
    names = [m.name for m in build_methods(runner, ks=(), progress=lambda m: None)]
    assert "transformers plain" in names
    runner.load(llama_q4, "torch", draft=PROMPT_LOOKUP, precision="gguf", progress=lambda m: None)
    said: list[str] = []
    names = [m.name for m in build_methods(runner, ks=(), progress=said.append)]
    assert not any(name.startswith("transformers") for name in names) and names
    assert any("anchors left out" in line for line in said)


def test_a_gguf_without_a_layers_weight_is_refused_naming_it(tmp_path, tiny_fields):
    """Tandem's own modules, like transformers' classes, leave nothing unfilled: a file that lacks
    a tensor the model needs is refused in words that name it."""
    from types import SimpleNamespace

    from app.engine.backends.torch_backend import TorchBackend
    from app.models.errors import ModelFileError
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    model = tiny_llama(seed=3, hidden=128, heads=4, kv_heads=2)
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.1.mlp.down_proj.weight"}
    write_gguf(SimpleNamespace(config=model.config, state_dict=lambda: state), tmp_path / "m.gguf", tiny_fields,
               Q.Q4_1, embedding_qtype=Q.Q8_0)
    # the weights stay in the file (the float32 import would refuse it itself, at import)
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "import", mlx_variants=(), torch_variant="gguf")["gguf"]
    with pytest.raises(ModelFileError, match=r"lacks weights .*model\.layers\.1\.mlp\.down_proj"):
        TorchBackend(folder, precision="gguf")


def test_models_info_says_a_llama_gguf_loads_into_tandems_own_modules(tmp_path, tiny_fields, capsys):
    from app.cli import main
    from tests.factories import tiny_llama, write_gguf

    write_gguf(tiny_llama(seed=4), tmp_path / "m.gguf", tiny_fields, Q.Q4_1, embedding_qtype=Q.Q8_0)
    assert main(["models", "info", str(tmp_path / "m.gguf")]) == 0
    assert "loads into Tandem's own modules, without transformers' model code" in capsys.readouterr().out


def test_an_unknown_model_code_is_refused_naming_the_choices(llama_q4):
    from app.engine.backends.torch_backend import TorchBackend

    with pytest.raises(ValueError, match="unknown model code 'bogus'; choose one of auto, transformers"):
        TorchBackend(llama_q4, precision="gguf", model_code="bogus")
