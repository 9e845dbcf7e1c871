"""The curated catalog of known-good pairs (`resources/catalog.json`), and the demo pair, which
is always there and needs no network."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind
from app.models.memory import OVERHEAD, OVERHEAD_FLOOR
from app.paths import asset

CATALOG_FILE = ("catalog.json",)
# How a catalog pair's draft is written ("kind" in catalog.json): a draft model, a Gemma 4
# assistant, an EAGLE-3 head or a DFlash drafter to fetch beside the target, or the target
# checkpoint's own MTP layer (nothing to fetch)
CATALOG_KINDS = (DraftKind.MODEL, DraftKind.ASSISTANT, DraftKind.EAGLE3, DraftKind.DFLASH, DraftKind.MTP)


@dataclass(frozen=True)
class CatalogModel:
    repo: str
    size_gb: float  # the hub's download size, rounded: the exact total is shown before downloading
    gated: bool = False


@dataclass(frozen=True)
class CatalogPair:
    id: str
    backend: str
    title: str
    target: CatalogModel
    draft: CatalogModel | None  # what is fetched beside the target; None: nothing (the MTP layer, prompt lookup)
    note: str = ""
    draft_kind: DraftKind = DraftKind.MODEL  # one of CATALOG_KINDS

    @property
    def draft_choice(self) -> DraftChoice:
        if self.draft_kind is DraftKind.MTP:
            return DraftChoice(DraftKind.MTP)
        if self.draft is None:
            return PROMPT_LOOKUP
        return DraftChoice(self.draft_kind, source=self.draft.repo)  # every other kind is fetched by its repo

    @property
    def size_gb(self) -> float:
        return self.target.size_gb + (self.draft.size_gb if self.draft else 0.0)

    @property
    def memory_bytes(self) -> int:
        """About what the pair holds in memory once loaded: its weights as downloaded (they load at
        the precision they are stored in) plus the allowance app/models/memory.py makes for
        activations. The KV cache comes on top; the models' own configs are checked before any
        weights download (app/models/precheck.py), this is for the menu, before anything is fetched."""
        weights = int(self.size_gb * 1e9)
        return weights + max(int(weights * OVERHEAD), OVERHEAD_FLOOR)

    def fit_warning(self, free: int, where: str) -> str | None:
        """None when the pair fits in `free` bytes of `where` (app/models/memory.free_memory),
        else why not, with the numbers."""
        if self.memory_bytes <= free:
            return None
        return (f"It needs about {_gb(self.memory_bytes)} of memory, but {_gb(free)} of {where} is free here, so it "
                "will most likely not load on this computer.")

    @property
    def specs(self) -> tuple[str, DraftChoice]:
        """What the runner is asked to load: hub ids (fetched first) or the demo's names."""
        if self.id == DEMO_PAIR.id:
            return "demo", AUTO_DRAFT
        if self.id == DEMO_REFERENCE_PAIR.id:
            from app.models.demo import DEMO_DRAFT, DEMO_REFERENCE

            return DEMO_REFERENCE, DEMO_DRAFT
        return self.target.repo, self.draft_choice


DEMO_PAIR = CatalogPair(
    id="demo", backend="any", title="Demo: SmolLM2 135M, its fastest pair here (offline)",
    target=CatalogModel("HuggingFaceTB/SmolLM2-135M-Instruct", 0.1), draft=None,
    note="Built in: works without a network. On PyTorch the GGUF at its own 4-bit precisions with prompt "
         "lookup; on MLX the float32 model drafted by its own 4-bit copy.")
DEMO_REFERENCE_PAIR = CatalogPair(
    id="demo-float32", backend="torch", title="Demo reference: SmolLM2 135M in float32 + the same model in 4-bit "
    "(offline)", target=CatalogModel("HuggingFaceTB/SmolLM2-135M-Instruct", 0.5), draft=None,
    note="Built in. The float32 weights the GGUF dequantizes to: the exact reference the self-test checks, "
         "slower than the demo's own 4-bit.")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n < 100e9 else f"{n / 1e9:.0f} GB"


def _model(data: dict) -> CatalogModel:
    return CatalogModel(str(data["repo"]), float(data.get("size_gb", 0.0)), bool(data.get("gated", False)))


def _draft(item: dict) -> tuple[CatalogModel | None, DraftKind]:
    """A pair's draft: {"repo", "size_gb"} (a draft model), with "kind": "assistant" (a Gemma 4
    assistant), "eagle3" (an EAGLE-3 head) or "dflash" (a DFlash drafter), or {"kind": "mtp"} alone
    (the target's own layer, inside its download)."""
    data = item.get("draft")
    if not data:
        return None, DraftKind.MODEL
    kind = DraftKind(data.get("kind", DraftKind.MODEL.value))
    if kind not in CATALOG_KINDS:
        raise ValueError(f"catalog pair {item['id']}: a draft of kind {kind.value} is not one the catalog lists")
    if kind is DraftKind.MTP:
        if "repo" in data:
            raise ValueError(f"catalog pair {item['id']}: the MTP layer is the target's own; it names no repo")
        return None, kind
    return _model(data), kind


def load_catalog(backend: str | None = None) -> list[CatalogPair]:
    """The demo pair first, then the catalog's pairs for `backend` (all when None)."""
    data = json.loads(asset(*CATALOG_FILE).read_text(encoding="utf-8"))
    pairs = [DEMO_PAIR] + ([DEMO_REFERENCE_PAIR] if backend in (None, "torch") else [])
    for item in data["pairs"]:
        if backend is None or item["backend"] == backend:
            draft, kind = _draft(item)
            pairs.append(CatalogPair(
                id=item["id"], backend=item["backend"], title=item["title"], target=_model(item["target"]),
                draft=draft, note=item.get("note", ""), draft_kind=kind))
    return pairs


def catalog_head(target: str, kind: DraftKind) -> CatalogModel | None:
    """The drafter of `kind` (an EAGLE-3 head, a DFlash drafter) the catalog lists for `target` (a
    hub id), on any backend: it reads the target's states the same way on both, so the Draft slot
    offers it wherever the target runs."""
    return next((pair.draft for pair in load_catalog() if pair.draft_kind is kind and pair.target.repo == target),
                None)
