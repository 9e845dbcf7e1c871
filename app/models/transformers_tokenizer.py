"""The tokenizer both backends share, loaded with transformers from a model folder.

One tokenizer object per folder, whatever the backend, so MLX and PyTorch runs of the same model
see the same ids, and the chat template is rendered in one place.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path

from app.models.errors import ModelFileError

# End-of-turn markers of common chat templates; any that the vocabulary holds stops generation.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                      "<|end_of_text|>", "</s>", "<turn|>")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def shipped_code(folder: Path) -> tuple[str, str] | None:
    """(file, class) where a folder's tokenizer is to be built by Python code shipped with the
    model (an `auto_map` naming a tokenizer class, in tokenizer_config.json or config.json), else
    None. Tandem never runs that code (trust_remote_code=False)."""
    for name in ("tokenizer_config.json", "config.json"):
        try:
            found = json.loads((folder / name).read_text(encoding="utf-8")).get("auto_map")
        except (OSError, ValueError, AttributeError):
            continue
        # tokenizer_config.json: {"AutoTokenizer": [slow, fast]} or, older, [slow, fast] itself
        refs = found.get("AutoTokenizer") if isinstance(found, dict) else found if name != "config.json" else None
        refs = [refs] if isinstance(refs, str) else [r for r in refs or () if isinstance(r, str)]
        if refs:
            return name, refs[-1]
    return None


def tokenizer_problem(folder: Path, exc: Exception) -> str:
    """Why transformers could not build a folder's tokenizer, in words: its own refusal of shipped
    code advises trust_remote_code=True and a hub address the folder does not have."""
    from app.models.names import display_name

    code = shipped_code(folder)
    if code is not None and ("trust_remote_code" in str(exc) or "custom code" in str(exc)):
        where, ref = code
        module = ref.split("--")[-1].rsplit(".", 1)[0]
        return (f"{display_name(folder)}: its tokenizer asks to run Python code shipped with the model ({where}'s "
                f"auto_map names {ref}, from {module}.py), and Tandem never runs a model's own code. Use a copy of "
                "the model whose tokenizer_config.json names a tokenizer class transformers has (such as "
                "PreTrainedTokenizerFast, with tokenizer.json) and no auto_map.")
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        return (f"{folder}: the tokenizer cannot be loaded: {' and '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} missing. Copy the model's tokenizer files into the folder.")
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    return f"{folder}: the tokenizer cannot be loaded ({detail}). Its tokenizer files may be damaged: copy them again."


def _load(folder: Path):
    """transformers' tokenizer for `folder`. Tandem's GGUF import names TokenizersBackend, which is what
    AutoTokenizer builds for it; built directly, without AutoTokenizer first reading the model's
    config through transformers' config classes (1-2 s of imports on this CPU that a GGUF's load
    otherwise never needs: app/models/gguf_llama_torch.py)."""
    from app.models.gguf_import import imported_from_gguf

    if imported_from_gguf(folder) and _declared_class(folder) == "TokenizersBackend":
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _declared_class(folder: Path) -> str | None:
    try:
        found = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


class ChatTokenizer:
    def __init__(self, folder: str | Path):
        folder = Path(folder)
        try:
            self._tok = _load(folder)
        except Exception as exc:  # transformers raises many kinds here; the user needs one message
            raise ModelFileError(tokenizer_problem(folder, exc)) from exc
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
