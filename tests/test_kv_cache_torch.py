"""The block-grown KV cache layer (app/engine/backends/kv_cache_torch.py): transformers' DynamicLayer
without a copy of the whole cache on every pass, and the same logits through appends and rollbacks."""

from __future__ import annotations

import random

import torch
from transformers import DynamicCache

from app.engine.backends.kv_cache_torch import STEP, BlockGrownLayer, block_grown_cache
from tests.factories import tiny_llama


@torch.inference_mode()
def test_appends_and_rollbacks_give_dynamic_caches_logits_across_block_boundaries():
    model = tiny_llama(seed=3, context=1024)
    grown, plain = block_grown_cache(model.config), DynamicCache(config=model.config)
    assert all(isinstance(layer, BlockGrownLayer) for layer in grown.layers)
    rng = random.Random(0)
    length = 0
    for step in range(60):  # appends of 1-40 tokens (a decode step, a verify pass, a prefill chunk), some cut back
        ids = torch.tensor([[rng.randrange(3, 1000) for _ in range(rng.choice((1, 1, 5, 17, 40)))]])
        a = model(ids, past_key_values=grown, use_cache=True).logits
        b = model(ids, past_key_values=plain, use_cache=True).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        length += ids.shape[1]
        if step % 3 == 2:  # a rejected draft: drop the last few positions
            cut = rng.randrange(1, ids.shape[1] + 1)
            for cache in (grown, plain):
                for layer in cache.layers:
                    layer.crop(-cut)
            length -= cut
        assert grown.get_seq_length() == plain.get_seq_length() == length
    assert length > 2 * STEP  # the buffer grew past several blocks


@torch.inference_mode()
def test_a_decode_step_writes_in_place_and_growth_comes_in_blocks():
    layer = BlockGrownLayer()
    keys = torch.randn(1, 2, 300, 8)
    layer.update(keys, keys.clone())
    assert layer._keys.shape[-2] == 2 * STEP and layer.get_seq_length() == 300
    buffer = layer._keys.data_ptr()
    one = torch.randn(1, 2, 1, 8)
    out_keys, _ = layer.update(one, one)
    assert layer._keys.data_ptr() == buffer  # no copy of the 300 positions before it
    torch.testing.assert_close(out_keys[..., :300, :], keys)
    torch.testing.assert_close(out_keys[..., 300:, :], one)
    layer.crop(-101)
    assert layer.get_seq_length() == 200
    layer.update(keys[..., :5, :], keys[..., :5, :])  # overwrites what the rollback cut
    torch.testing.assert_close(layer.keys[..., 200:, :], keys[..., :5, :])
    assert layer.keys.shape[-2] == 205
