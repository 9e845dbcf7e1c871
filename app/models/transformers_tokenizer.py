"""The tokenizer both backends share, loaded with transformers from a model folder.

One tokenizer object per folder, whatever the backend, so MLX and PyTorch runs of the same model
see the same ids, and the chat template is rendered in one place.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path

from transformers import AutoTokenizer

from app.models.errors import ModelFileError

# End-of-turn markers of common chat templates; any that the vocabulary holds stops generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                      "<|end_of_text|>", "</s>", "<turn|>")


class ChatTokenizer:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        try:
            self._tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        except Exception as exc:  # transformers raises many kinds here; the user needs one message
            raise ModelFileError(
                f"{folder}: the tokenizer cannot be loaded ({exc}). The folder needs "
                "tokenizer.json and tokenizer_config.json."
            ) from exc
        self.folder = folder
        self.stop_ids = frozenset(self._stop_ids(folder))

    def __len__(self) -> int:
        return len(self._tok)

    @property
    def hf(self):
        """The transformers tokenizer itself (the benchmarks hand it to the anchors)."""
        return self._tok

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._tok, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int) -> str:
        """The text one token stands for, as the side panel shows it."""
        return self.decode([token_id])

    @property
    def chat_template(self) -> str:
        template = getattr(self._tok, "chat_template", None) or ""
        return template if isinstance(template, str) else "\n".join(str(t) for t in dict(template).values())

    @property
    def supports_tools(self) -> bool:
        """The chat template renders a `tools` list (one that never reads it would drop them)."""
        return "tools" in self.chat_template

    @cached_property
    def thinks(self) -> bool:
        """A reasoning model: it writes a thinking block before the answer (app/chat/thinking.py)."""
        from app.chat.thinking import thinks

        return thinks(self.chat_template, self._tok.get_vocab())

    @cached_property
    def thinking_switch(self) -> bool:
        """The template turns the thinking block on and off (Qwen3.x's enable_thinking)."""
        from app.chat.thinking import SWITCH

        return SWITCH in self.chat_template

    def render_text(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, thinking: bool | None = None) -> str:
        """`messages` ({"role", "content"}, and a tool-aware template's tool_calls and tool
        results) through the model's chat template, with `tools` in its own format and its
        thinking switch set where `thinking` is not None and the template has one."""
        if not self.has_chat_template:
            return "\n\n".join(m.get("content") or "" for m in messages)
        options = {"enable_thinking": thinking} if thinking is not None and self.thinking_switch else {}
        return self._tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             tools=tools or None, **options)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    tools: list[dict] | None = None, thinking: bool | None = None) -> list[int]:
        """Token ids of render_text's prompt."""
        return self.encode(self.render_text(messages, add_generation_prompt, tools, thinking))

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab()

    def special_tokens(self) -> set[str]:
        return {str(t) for t in self._tok.all_special_tokens}

    def fingerprint(self) -> str:
        """A hash of the vocabulary and special tokens: equal fingerprints pair safely."""
        vocab = sorted(self.vocab().items(), key=lambda item: item[1])
        payload = json.dumps([vocab, sorted(self.special_tokens())], ensure_ascii=False).encode()
        return hashlib.sha256(payload).hexdigest()

    def _stop_ids(self, folder: Path) -> set[int]:
        ids: set[int] = set()
        if self._tok.eos_token_id is not None:
            ids.add(int(self._tok.eos_token_id))
        for name in ("config.json", "generation_config.json"):
            path = folder / name
            if path.is_file():
                value = json.loads(path.read_text()).get("eos_token_id")
                ids.update([value] if isinstance(value, int) else (value or []))
        vocab = self._tok.get_vocab()
        ids.update(vocab[t] for t in END_OF_TURN_TOKENS if t in vocab)
        return ids
