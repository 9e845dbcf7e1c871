"""The rules a round's drafts are picked and judged by on PyTorch, on the device: the sampling
transform (temperature, top-k, top-p), a drafter's steps, and the verdicts, greedy and the
Leviathan/Chen rejection rule. Nothing here reads a value back to the host but `DraftSteps.result`,
once per draft."""

from __future__ import annotations

import torch

from app.engine.sampling import SamplingParams


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as distributions over the last axis. (..., V) float32."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest set whose mass reaches top_p (the token crossing it stays)
        drop = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        # the likeliest token always stays: a top-p below float32's resolution (1e-300 rounds to 0)
        # would otherwise drop every token, and the sample would be drawn from NaN
        drop[..., 0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


class DraftSteps:
    """What a drafter picks, one step at a time, staying on the device (no sync inside a loop):
    the argmax at temperature 0 (p: the softmax at temperature 1, for display), else a sample
    from the transformed distribution, whose row goes to the Leviathan/Chen rule. `result()` is
    what ModelBackend.draft returns, with one transfer to Python."""

    def __init__(self, params: SamplingParams, generator: torch.Generator, runner_up: bool = False):
        self.params, self.generator = params, generator
        self.tokens, self.p_of, self.rows = [], [], []
        # with `runner_up`: each step's most likely other token (a tree's alternative, tree.py)
        self.second: list[torch.Tensor] | None = [] if runner_up else None

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The token after `logits` (V,), as a 0-d tensor on the device."""
        # indexing by a 0-d tensor would read it back to the host (a sync): gather keeps it there
        if self.params.greedy:
            token = torch.argmax(logits)
            p = torch.softmax(logits, -1).gather(0, token.view(1))[0]
        else:
            probs = probs_from_logits(logits, self.params)
            token = torch.multinomial(probs, 1, generator=self.generator)[0]
            p = probs.gather(0, token.view(1))[0]
            self.rows.append(probs)
        self.tokens.append(token)
        self.p_of.append(p)
        if self.second is not None:  # the best of the rest: the top two, less the token taken
            top = torch.topk(logits, 2).indices
            other = torch.where(top[0] == token, top[1], top[0])
            dist = torch.softmax(logits, -1) if self.params.greedy else self.rows[-1]
            self.second.append(torch.stack([other.to(dist.dtype), dist.gather(0, other.view(1))[0]]))
        return token

    def runner_ups(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Each step's most likely other token and its probability (as `p` is the taken one's)."""
        if not self.second:
            return (), ()
        pairs = torch.stack(self.second).double().tolist()
        return tuple(int(t) for t, _ in pairs), tuple(q for _, q in pairs)

    def drafted(self):
        """What ModelBackend.draft returns: `result()`, and where runner-ups were asked for, each
        step's runner-up too (`runner_ups()`)."""
        return (*self.result(), self.runner_ups()) if self.second is not None else self.result()

    def result(self):
        if not self.tokens:
            return (), (), None, None
        n = len(self.tokens)
        ids_t = torch.stack(self.tokens)  # (n,)
        # one transfer: ids (exact in float32 below 2**24) and their probabilities
        both = torch.cat([ids_t.float(), torch.stack(self.p_of).float()]).tolist()
        return (tuple(int(t) for t in both[:n]), tuple(both[n:]),
                (torch.stack(self.rows) if self.rows else None), ids_t)


def greedy_verdict(logits: torch.Tensor, drafts: torch.Tensor):
    """Greedy rule: accept while the draft token is the target's argmax.

    logits (k+1, V), drafts (k,) -> (n accepted, the target's next token, q of each draft at
    temperature 1 for display), all on the device."""
    k = drafts.shape[0]
    top = torch.argmax(logits, -1)  # (k+1,)
    n = (top[:k] == drafts).int().cumprod(0).sum()
    q = torch.softmax(logits[:k], -1).gather(1, drafts.view(k, 1))[:, 0]
    return n, top.gather(0, n.view(1))[0], q  # gather: no read of n back to the host


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Where a rejected position resamples from: max(q - p, 0), unnormalised. (k, V)"""
    return (q - p).clamp(min=0.0)


def rejection_verdict(q_all: torch.Tensor, p_all: torch.Tensor, drafts: torch.Tensor,
                      r: torch.Tensor):
    """Leviathan et al. 2023 / Chen et al. 2023 (q = target, p = draft, same transform):
    accept draft x_i with probability min(1, q_i(x_i) / p_i(x_i)), i.e. while r_i < that ratio;
    at the first rejection n sample from normalize(max(q_n - p_n, 0)); after k acceptances
    sample the bonus token from q_k.

    q_all (k+1, V), p_all (k, V), drafts (k,), r (k,) uniforms ->
    (n, the distribution to sample the next token from (V,), q of each draft)."""
    k = drafts.shape[0]
    q = q_all[:k].gather(1, drafts.view(k, 1))[:, 0]
    p = p_all.gather(1, drafts.view(k, 1))[:, 0]
    n = (r < (q / p).clamp(max=1.0)).int().cumprod(0).sum()
    rows = torch.cat([residual(q_all[:k], p_all), q_all[k:]])  # (k+1, V)
    row = rows.index_select(0, n.view(1))[0]
    total = row.sum()
    # q == p leaves no residual mass; rejection then had probability 0, so q is the answer
    row = torch.where(total > 0, row / total.clamp(min=1e-30), q_all.index_select(0, n.view(1))[0])
    return n, row, q
