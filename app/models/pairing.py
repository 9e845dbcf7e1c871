"""Can two models be paired? Checked on their tokenizers before any weights load."""

from __future__ import annotations


# Byte-level BPE vocabularies (GPT-2's scheme) spell a space as "Ġ" and a newline as "Ċ"; a
# message shows them the way the side panel does.
_VISIBLE = str.maketrans({"Ġ": "·", "Ċ": "↵", "▁": "·"})


def _show(token: str) -> str:
    return repr(token.translate(_VISIBLE))


class PairingError(ValueError):
    """The two models cannot be used together; the message says why in plain words."""


def check_tokenizers(target, draft) -> None:
    """Raise PairingError unless the draft's tokenizer is the target's (vocabulary and special
    tokens). Embedding matrices padded to different sizes are fine: only the tokenizer's real
    vocabulary is compared, and logits are cut to it."""
    if target.fingerprint() == draft.fingerprint():
        return
    t_vocab, d_vocab = target.vocab(), draft.vocab()
    only_t = sorted(set(t_vocab) - set(d_vocab), key=t_vocab.get)
    only_d = sorted(set(d_vocab) - set(t_vocab), key=d_vocab.get)
    moved = sorted((tok for tok in set(t_vocab) & set(d_vocab) if t_vocab[tok] != d_vocab[tok]),
                   key=t_vocab.get)
    details = []
    if len(t_vocab) != len(d_vocab):
        details.append(f"the target has {len(t_vocab):,} tokens and the draft {len(d_vocab):,}")
    if moved:
        details.append("tokens with other ids: " + ", ".join(
            f"{_show(tok)} ({t_vocab[tok]} vs {d_vocab[tok]})" for tok in moved[:5]))
    if only_t:
        details.append("only in the target: " + ", ".join(_show(t) for t in only_t[:5]))
    if only_d:
        details.append("only in the draft: " + ", ".join(_show(t) for t in only_d[:5]))
    t_special, d_special = target.special_tokens(), draft.special_tokens()
    if t_special != d_special:
        details.append(f"special tokens differ: {sorted(t_special ^ d_special)[:5]}")
    why = "; ".join(details) or "their merges or normalisation differ"
    raise PairingError(
        f"These models cannot be paired: their tokenizers differ ({why}). "
        "A draft must share the target's tokenizer; choose a smaller model of the same family, "
        "or use prompt lookup."
    )
