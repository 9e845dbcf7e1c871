"""What lies between a decoder layer's matmuls in the lean step (lean_step_torch.py): the norms
with the residual adds before them, RoPE with the split of the q/k/v product, the gated
activation, attention's softmax and the cache write. Two ways to run it, same arithmetic:

- `EagerGlue`: PyTorch's eager ops, as the lean step always ran them (the CPU, and any GPU);
- `FusedGlue`: the same functions written elementwise and fused by torch.compile (Inductor's
  Triton kernels), where a CUDA GPU replays the passes as graphs.

Why: under CUDA graphs a launch costs nothing, but each small kernel still costs 1-3 us of the
GPU's time. PyTorch's profiler over a captured width-1 pass of a 1B-shape draft (H100, bf16;
docs/performance.md) counted 440 kernels in 1.70 ms of kernel time, ~380 of them elementwise
(dtype copies, the norms' five kernels each, residual adds, RoPE, the cache's index copies,
softmax and its cast) taking ~0.7 ms: a third of a pass whose matmuls read at the bandwidth.
Fused, a layer is about twelve kernels instead of ~27 (gpt-fast gets the same from compiling its
whole model; here only the glue is compiled, so the matmuls stay whatever kernel the weights
need: cuBLAS, tinygemm's int4, a GGUF's). One compile with dynamic shapes serves every layer and
width (the functions take tensors and the model's fixed sizes, never a layer), and the compiled
kernels are captured in the same graphs as everything else (cuda_graphs_torch.py).

Numbers: the fused functions compute each step in float32 and round where the eager ops round,
except inside RoPE, which the eager glue does as a matmul by a rotation matrix (one call on the
CPU) and the fused glue elementwise: both sum x * cos and rotate_half(x) * sin in float32 and
round once (tests/test_layer_glue.py compares them).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: float32 statistics, the weight applied in x's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return weight * h.to(x.dtype)


class EagerGlue:
    """The glue as eager PyTorch ops (what the lean step ran before the glue could be fused)."""

    fused = False

    def __init__(self, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.heads, self.kv_heads, self.head_dim, self.dtype = heads, kv_heads, head_dim, dtype
        half = head_dim // 2
        # rotate_half as a matrix: x @ P = cat(-x2, x1) (transformers' rotate_half)
        swap = torch.zeros(head_dim, head_dim)
        swap[torch.arange(half) + half, torch.arange(half)] = -1.0
        swap[torch.arange(half), torch.arange(half) + half] = 1.0
        self._swap, self._eye = swap.to(dtype), torch.eye(head_dim, dtype=dtype)

    def to(self, device: torch.device) -> EagerGlue:
        self._swap, self._eye = self._swap.to(device), self._eye.to(device)
        return self

    def rope_inputs(self, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """(n, hd, hd): x @ R[i] = x * cos_i + rotate_half(x) * sin_i, transformers' RoPE, as one
        batched matmul per layer (one call on the CPU instead of rotate_half's slices)."""
        return self._eye * cos[:, None, :] + self._swap * sin[:, None, :]

    def norm(self, x: torch.Tensor, module: torch.nn.Module, out_dtype: torch.dtype) -> torch.Tensor:
        return rms_norm(x, module.weight, module.variance_epsilon).to(out_dtype)

    def add_norm(self, x: torch.Tensor, y: torch.Tensor, module: torch.nn.Module,
                 out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add (in place: a kernel's bfloat16 output promotes exactly), then the next norm."""
        x = x.add_(y)
        return x, self.norm(x, module, out_dtype)

    def split_rope(self, y: torch.Tensor, rope: torch.Tensor, q_norm, k_norm):
        """The q/k/v product (n, (H + 2 Hkv) hd) -> q (H, n, hd) rotated, and the new keys and
        values (each (Hkv, n, hd)), in the cache's dtype."""
        n, heads, kv_heads, hd = y.shape[0], self.heads, self.kv_heads, self.head_dim
        y = y.to(self.dtype)
        qk = y[:, :(heads + kv_heads) * hd].view(n, heads + kv_heads, hd)
        if q_norm is not None:  # Qwen3 normalises each head's q and k before RoPE
            qk = torch.cat([rms_norm(qk[:, :heads], q_norm.weight, q_norm.variance_epsilon),
                            rms_norm(qk[:, heads:], k_norm.weight, k_norm.variance_epsilon)], dim=1)
        qk = torch.bmm(qk, rope)
        v = y[:, (heads + kv_heads) * hd:].view(n, kv_heads, hd)
        return qk[:, :heads].transpose(0, 1), (qk[:, heads:].transpose(0, 1), v.transpose(0, 1))

    @staticmethod
    def write(layer_store: torch.Tensor, kv, start: int, positions: torch.Tensor | None) -> None:
        """The new keys and values into one layer's (2, Hkv, capacity, hd) slot of the KV buffer."""
        keys, values = layer_store[0], layer_store[1]
        k, v = kv
        if positions is None:
            n = k.shape[1]
            keys[:, start:start + n] = k
            values[:, start:start + n] = v
        else:
            keys.index_copy_(1, positions, k)
            values.index_copy_(1, positions, v)

    def gated(self, gate_up: torch.Tensor, act_fn, out_dtype: torch.dtype) -> torch.Tensor:
        gate, up = gate_up.to(self.dtype).chunk(2, dim=-1)
        return (act_fn(gate) * up).to(out_dtype)

    @staticmethod
    def softmax(scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)  # upcast inside the kernel


# The fused glue's functions: plain tensor code, each compiled once (dynamic shapes) for all layers.

def _norm(x, weight, eps: float, out_dtype: torch.dtype):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if x.dtype == torch.float32:
        return (h * weight).to(out_dtype)
    return (weight * h.to(x.dtype)).to(out_dtype)


def _add_norm(x, y, weight, eps: float, out_dtype: torch.dtype):
    x = x + y  # a bfloat16 product into a float32 stream promotes exactly, as the eager add_ does
    return x, _norm(x, weight, eps, out_dtype)


def _rotate(x, cos, sin):
    """transformers' apply_rotary_pos_emb on x (n, h, hd) with cos/sin (n, hd), in float32, rounded once."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos[:, None].float() + rotated.float() * sin[:, None].float()).to(x.dtype)


def _split_rope(y, cos, sin, heads: int, kv_heads: int, hd: int, dtype: torch.dtype,
                q_weight, k_weight, eps: float):
    n = y.shape[0]
    y = y.to(dtype)
    q = y[:, :heads * hd].view(n, heads, hd)
    k = y[:, heads * hd:(heads + kv_heads) * hd].view(n, kv_heads, hd)
    v = y[:, (heads + kv_heads) * hd:].view(n, kv_heads, hd)
    if q_weight is not None:
        q, k = _norm(q, q_weight, eps, dtype), _norm(k, k_weight, eps, dtype)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    # q as attention reads it, keys and values stacked as the cache holds them: one write
    return q.transpose(0, 1).contiguous(), torch.stack((k.transpose(0, 1), v.transpose(0, 1)))


def _gated(gate_up, dtype: torch.dtype, out_dtype: torch.dtype):
    gate, up = gate_up.to(dtype).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(out_dtype)


def why_not_fused(config, device: torch.device, asked: bool = False) -> str:
    """"" where the glue can be fused on `device` for a model of `config`, else why not. Unless
    `asked`, only where passes are captured on CUDA: on the CPU (a C++ compiler needed) the
    dispatch it saves is small against the compile."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"the fused glue covers the SiLU-gated MLP, not {act}"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "this PyTorch has no Triton (PyTorch's Windows wheels ship none)"
    if device.type != "cuda" and not asked:
        return f"the glue is fused on CUDA, not {device.type}, unless asked (--glue on)"
    return ""


class FusedGlue(EagerGlue):
    """The glue fused by torch.compile. Compiling happens at the first call (the first pass that
    is captured warms up outside the graph first, so no compile ever runs inside a capture)."""

    fused = True

    def __init__(self, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        super().__init__(heads, kv_heads, head_dim, dtype)
        from app.engine.backends.compile_torch import use_cache_dir

        use_cache_dir()
        import torch._dynamo.config as dynamo_config

        # one graph per function for every layer and width; float32 and bfloat16 models side by
        # side (a target and its draft) and the width-1 specialisation are the only recompiles
        dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 16)

        def compiled(fn):
            return torch.compile(fn, dynamic=True, fullgraph=True)

        self._norm_fn, self._add_norm_fn = compiled(_norm), compiled(_add_norm)
        self._split_fn, self._gated_fn = compiled(_split_rope), compiled(_gated)
        # softmax stays PyTorch's own kernel: Inductor splits a reduction this short and wide
        # into a kernel five times slower (26.5 against 5.6 us a layer on an H100)

    def rope_inputs(self, cos: torch.Tensor, sin: torch.Tensor):
        return cos, sin

    def norm(self, x, module, out_dtype):
        return self._norm_fn(x, module.weight, module.variance_epsilon, out_dtype)

    def add_norm(self, x, y, module, out_dtype):
        return self._add_norm_fn(x, y, module.weight, module.variance_epsilon, out_dtype)

    def split_rope(self, y, rope, q_norm, k_norm):
        cos, sin = rope
        weights = (None, None, 0.0) if q_norm is None else (q_norm.weight, k_norm.weight, q_norm.variance_epsilon)
        return self._split_fn(y, cos, sin, self.heads, self.kv_heads, self.head_dim, self.dtype, *weights)

    @staticmethod
    def write(layer_store, kv, start, positions):
        if positions is None:
            layer_store[:, :, start:start + kv.shape[2]] = kv
        else:
            layer_store.index_copy_(2, positions, kv)

    def gated(self, gate_up, act_fn, out_dtype):
        return self._gated_fn(gate_up, self.dtype, out_dtype)

