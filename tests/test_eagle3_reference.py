"""Tandem's EAGLE-3 port against the reference: vLLM's `speculators` Eagle3DraftModel, a tiny
random one saved with its own save_pretrained (the layout its published heads have), read back by
Tandem and run on the same target states and tokens: the first draft step's logits agree within
1e-4. This catches a convention read wrongly: the fusion's order, which half of [embedding; state]
is which, the residual, the norms and their flags, the layer type's own norms (Qwen3's q/k)."""

from __future__ import annotations

import pytest
import torch

from transformers.cache_utils import DynamicCache

from app.engine.backends.eagle3_torch import layer_config, load_modules
from app.models.eagle3_head import read_eagle3
from tests.reference_packages import reference

FLAGS = [{}, {"norm_before_residual": True}, {"norm_before_fc": True}, {"fc_norm": True},
         {"norm_before_residual": True, "norm_output": True}]


def _reference_head(folder, model_type: str, flags: dict):
    reference("speculators")
    from transformers import LlamaConfig, Qwen3Config

    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    kind = {"llama": LlamaConfig, "qwen3": Qwen3Config}[model_type]
    layer = kind(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5, max_position_embeddings=256)
    layer._attn_implementation = "sdpa"
    proposals = [GreedyTokenProposalConfig(speculative_tokens=3)]
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer, draft_vocab_size=21, eagle_aux_hidden_state_layer_ids=[1, 2, 3],
        speculators_config=SpeculatorsConfig(algorithm="eagle3", proposal_methods=proposals,
                                             default_proposal_method="greedy",
                                             verifier=VerifierConfig(name_or_path=None, architectures=[])),
        **{"norm_before_residual": False, **flags})
    model = Eagle3DraftModel(config).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "norm." in name and name.endswith(".weight") and p.dim() == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=generator))  # norms that matter
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
        model.d2t.fill_(3)
        model.t2d.zero_()
        model.t2d[3:] = True
    model.save_pretrained(str(folder))
    return model


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "+".join(f) or "defaults")
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_the_port_gives_the_reference_heads_logits(tmp_path, model_type, flags):
    model = _reference_head(tmp_path / "head", model_type, flags)
    head = read_eagle3(tmp_path / "head", {"hidden_size": 32, "vocab_size": 24, "num_hidden_layers": 4})
    assert head.layout == "speculators" and head.layers == (1, 2, 3) and head.own_embedding
    ours = load_modules(head, "cpu", torch.float32)
    generator = torch.Generator().manual_seed(6)
    states = torch.randn(1, 9, 96, generator=generator)
    ids = torch.randint(3, 24, (1, 9), generator=generator)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        # two of its training-time-test steps: the second reads each position's next token beside
        # the first step's own output, as a chained draft step does
        model(hidden_states=states, input_ids=ids, document_ids=torch.zeros(1, 9, dtype=torch.long), ttt_steps=2)
        hook.remove()
        out = ours(ours.embed_tokens(ids), ours.fuse(states), torch.arange(9).view(1, -1), None, None)
        logits = ours.lm_head(ours.norm(out))
        # the chain, on the head's cache: pairs 0..7 read, then token 8 beside the output at 7
        cache = DynamicCache(config=layer_config(head))
        read = ours(ours.embed_tokens(ids[:, :8]), ours.fuse(states[:, :8]), torch.arange(8).view(1, -1), None, cache)
        last = ours.norm(read[:, -1:]) if flags.get("norm_output") else read[:, -1:]
        chained = ours(ours.embed_tokens(ids[:, 8:]), last, torch.tensor([[8]]), None, cache)
        chained_logits = ours.lm_head(ours.norm(chained))[0, -1]
    torch.testing.assert_close(logits, seen[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chained_logits, seen[1][0, 7], atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.arange(21) + ours.d2t, torch.arange(3, 24))  # draft id i is target id i + 3
