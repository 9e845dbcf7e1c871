"""The menu a click on a model slot opens: choose from disk or the hub, the draft keywords,
the curated catalog (the demo pair first, always offline) and the recent pairs."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QInputDialog, QMenu, QMessageBox, QWidget

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind
from app.models.catalog import CatalogPair, catalog_head, load_catalog
from app.models.draft_heads import has_mtp
from app.models.head_sources import HEADS, heads_beside
from app.models.names import display_name, model_label
from ui.pairing.controller import PairController
from ui.tips import wrap_tip

DRAFT_CHOICES = (
    ("The same model in 4-bit: the target's own weights, smaller", DraftChoice.self_draft("int4")),
    ("Prompt lookup: copies from the chat, no model", PROMPT_LOOKUP),
    ("None: the target decodes alone", NO_DRAFT),
)
MTP_DRAFT = DraftChoice(DraftKind.MTP)  # offered only for a target whose checkpoint has the layer
UNKNOWN_FREE = 2**62
HEAD_TIPS = {  # what each published drafter is (app/models/head_sources.py)
    DraftKind.EAGLE3: "A published EAGLE-3 head: one decoder layer that drafts from three of the target's inner "
                      "layers, with prompt lookup beside it.",
    DraftKind.DFLASH: "A published DFlash block drafter: a few layers that draft a whole block in one pass from the "
                      "target's inner layers, through the target's own embedding and head, with prompt lookup "
                      "beside it.",
}
MEASURED_TIP = " The pair trial measures it here; \"auto\" drafts with it where it measured faster than prompt lookup."


def shipped_head_entry(pairing: PairController) -> tuple[str, str, DraftChoice] | None:
    """(text, tooltip, draft) for the draft head aligned to the demo's GGUF that ships with Tandem,
    where the demo is the loaded target on PyTorch; None elsewhere (it reads that model's states)."""
    from app.models.demo import demo_head, demo_head_agreement
    from app.models.pair_memory import same_pair

    loaded, current = pairing.loaded, pairing.current
    head = demo_head()
    if head is None or loaded is None or current is None or loaded.backend != "torch":
        return None
    if same_pair(str(current.named()[0]), NO_DRAFT, loaded.backend)[0] != "demo":
        return None
    agreement = demo_head_agreement()
    agrees = f" It agrees with the target's next token {agreement[1]:.0%} of the time on answers it never saw" \
        if agreement else ""
    tip = (f"A small layer trained on this model's own answers (Align draft, shipped with Tandem), drafting from the "
           f"states the target's verify pass already computed, with prompt lookup beside it.{agrees}. The pair trial "
           "measures it here; \"auto\" drafts with it where it measured faster than prompt lookup.")
    return "Aligned draft head: trained on this model's answers (shipped)", tip, head


def head_entries(pairing: PairController) -> list[tuple[str, str, DraftChoice]]:
    """(text, tooltip, draft) for each published drafter (EAGLE-3 head, DFlash drafter) offered to
    the loaded target: those in the folders beside it that fit it (app/models/head_sources.py),
    then those the catalog lists for it, fetched from the hub when chosen (as a catalog pair's
    draft is)."""
    from app.models import hub

    loaded, current = pairing.loaded, pairing.current
    if loaded is None:
        return []
    entries = [(f"{HEADS[choice.kind].words}: {Path(choice.source).name} (beside the model)",
                f"{HEAD_TIPS[choice.kind]}{MEASURED_TIP}\n\n{choice.source}", choice)
               for choice in heads_beside(loaded.folder)]
    # the target as the user named it (a hub id), or its hub download's folder by the id
    names = dict.fromkeys(filter(None, (current.named()[0] if current else "", display_name(loaded.folder))))
    for kind in HEADS:
        head = next(filter(None, (catalog_head(name, kind) for name in names)), None)
        if head is None:
            continue
        fetched = hub.cached_model(hub.HubRef(head.repo)) is not None
        where = "downloaded" if fetched else f"{_size(head.size_gb)} download"
        entries.append((f"{HEADS[kind].words}: {head.repo} ({where})",
                        HEAD_TIPS[kind] + MEASURED_TIP + ("" if fetched else " It is fetched from the Hugging Face "
                                                          "hub when chosen; the exact size is shown before the "
                                                          "download starts."),
                        DraftChoice(kind, source=head.repo)))
    return entries


def _mark(item, on: bool) -> None:
    """A check beside the choice in use (the menus say what is current, not only what can be)."""
    item.setCheckable(True)
    item.setChecked(on)


def _drafts_with(pairing: PairController, choice: DraftChoice) -> bool:
    loaded = pairing.loaded
    # a hub draft loads from its download's folder and is named by its id (PairRequest.named)
    named = pairing.current is not None and pairing.current.named()[1] == choice
    return loaded is not None and (loaded.draft == choice or named or (
        choice.kind is DraftKind.SELF and loaded.draft.kind is DraftKind.SELF
        and loaded.draft.precision == choice.precision))


def _pair_key(backend: str, target: str, draft: DraftChoice) -> tuple:
    from app.models.pair_memory import same_pair

    return (backend, *same_pair(target, draft, backend))


def _pair_in_use(pairing: PairController) -> tuple | None:
    if pairing.loaded is None or pairing.current is None:
        return None
    target, draft = pairing.current.named()
    return _pair_key(pairing.loaded.backend, target, draft)


def _size(gb: float) -> str:
    return f"{gb * 1000:.0f} MB" if gb < 1 else f"{gb:.1f} GB"


def build_slot_menu(role: str, pairing: PairController, parent: QWidget, aligner=None) -> QMenu:
    menu = QMenu(parent)
    noun = "target" if role == "target" else "draft"
    menu.addAction("Model folder…", lambda: _choose_folder(role, pairing, parent))
    menu.addAction(".gguf file…", lambda: _choose_gguf(role, pairing, parent))
    menu.addAction("Hugging Face model…", lambda: _enter_repo(role, pairing, parent))
    if role == "target":
        item = menu.addAction("Model on a server…", lambda: pairing.choose_server(
            getattr(pairing.loaded, "remote", "") or ""))
        item.setToolTip(wrap_tip("A model served by another Tandem, vLLM, SGLang, llama.cpp's server or any "
                                 "OpenAI-compatible server: its address, its key, and which of its models."))
    remote = bool(getattr(pairing.loaded, "remote", ""))
    if role == "draft" and remote:
        item = menu.addAction(f"The server drafts: {pairing.loaded.draft_words()[1]}")
        item.setEnabled(False)
    if role == "target" and pairing.loaded is not None and not remote:
        menu.addAction(f"Context length ({pairing.loaded.context_length:,} tokens)…",
                       lambda: _choose_context(pairing, parent))
    if role == "draft" and not remote:
        menu.addSeparator()
        if pairing.loaded is not None and has_mtp(pairing.loaded.folder):  # Qwen3.5/3.6 ship one; conversions do not
            item = menu.addAction(f"{MTP_DRAFT.label.capitalize().replace('mtp', 'MTP')}: the target's own "
                                  "multi-token-prediction layer", lambda: pairing.choose_draft(MTP_DRAFT))
            _mark(item, _drafts_with(pairing, MTP_DRAFT))
            item.setToolTip(wrap_tip("The target checkpoint's own multi-token-prediction layer drafts, with prompt "
                                     "lookup beside it: nothing to download, little memory."))
        for text, tip, choice in head_entries(pairing):
            item = menu.addAction(text, lambda choice=choice: pairing.choose_draft(choice))
            item.setToolTip(wrap_tip(tip))
            _mark(item, _drafts_with(pairing, choice))
        for text, choice in DRAFT_CHOICES:
            item = menu.addAction(text, lambda choice=choice: pairing.choose_draft(choice))
            _mark(item, _drafts_with(pairing, choice))
        shipped = shipped_head_entry(pairing)
        if shipped is not None:
            text, tip, choice = shipped
            item = menu.addAction(text, lambda: pairing.choose_draft(choice))
            item.setToolTip(wrap_tip(tip))
            _mark(item, _drafts_with(pairing, choice))
        if aligner is not None:  # ui/pairing/align.py: train a draft on the target's own answers
            menu.addSeparator()
            for text, tip, start, off in aligner.menu_entries():
                item = menu.addAction(text, start)
                item.setEnabled(not off)
                item.setToolTip(wrap_tip(off or tip))
    menu.addSeparator()
    catalog = menu.addMenu("Known-good pairs")
    free, where = _free_for(pairing)
    for pair in load_catalog(pairing.loaded.backend if pairing.loaded else pairing.backend or None):
        size = "" if pair.id.startswith("demo") else f" — {_size(pair.size_gb)} download"
        warning = pair.fit_warning(free, where)
        item = catalog.addAction(pair.title + size + (" — too large for this computer" if warning else ""),
                                 lambda pair=pair, warning=warning: _choose_catalog(pair, warning, pairing, parent))
        item.setToolTip(wrap_tip(" ".join(part for part in (warning, pair.note) if part)))
    catalog.setToolTipsVisible(True)
    recent = menu.addMenu("Recent pairs")
    entries = pairing.memory.recent_pairs(pairing.loaded.backend if pairing.loaded else None)
    in_use = _pair_in_use(pairing)
    for entry in entries:
        item = recent.addAction(entry["title"], lambda entry=entry: pairing.choose_recent(entry))
        item.setToolTip(wrap_tip(entry["tooltip"]))
        _mark(item, in_use is not None and _pair_key(entry["backend"], entry["target"], entry["draft"]) == in_use)
    recent.setToolTipsVisible(True)
    recent.setEnabled(bool(entries))
    menu.setToolTipsVisible(True)
    menu.setObjectName(f"{noun}Menu")
    return menu


def _choose_context(pairing: PairController, parent: QWidget) -> None:
    """How many tokens a chat may hold with this model: up to what it reads (what memory holds is
    checked when it loads again, and the load says so if that is less)."""
    from app.models.pair_memory import MIN_CONTEXT

    loaded = pairing.loaded
    own = loaded.own_context or loaded.context_length
    name = model_label(pairing.current.named()[0]) if pairing.current else "this model"  # never "demo"
    tokens, ok = QInputDialog.getInt(
        parent, "Context length",
        f"The most tokens a chat may hold with {name}.\n"
        f"The model reads up to {own:,}; longer chats leave out their oldest turns. Less context takes\n"
        "less memory. The pair loads again with it.",
        loaded.context_length, MIN_CONTEXT, max(own, MIN_CONTEXT), 1024)
    if ok and tokens != loaded.context_length:
        pairing.set_context(None if tokens >= own else tokens)


def _free_for(pairing: PairController) -> tuple[int, str]:
    """The memory a catalog pair would load into: what is free where the pair in use runs (or would
    run), plus what that pair holds, since a new pair replaces it (as the runner does)."""
    from app.engine.backends import default_backend
    from app.models.memory import free_memory

    loaded = pairing.loaded
    backend = loaded.backend if loaded else pairing.backend or default_backend()
    try:
        free, where = free_memory(backend, loaded.device if loaded else "cpu")
    except (ValueError, ImportError, RuntimeError, OSError):  # a bad TANDEM_FREE_MEMORY, no array library
        return UNKNOWN_FREE, "memory"  # unmarked: loading the pair checks it with numbers
    return free + pairing.held_bytes, where


def _choose_catalog(pair: CatalogPair, warning: str | None, pairing: PairController, parent: QWidget) -> None:
    """A pair too large for this computer is fetched only when the user says so, knowing why."""
    if warning:
        box = QMessageBox(QMessageBox.Icon.Warning, "This pair may not fit",
                          f"{pair.title}: {warning}\n\nTandem checks the models' own files before it downloads "
                          f"the weights ({_size(pair.size_gb)}) and stops there if they do not fit.",
                          QMessageBox.StandardButton.Cancel, parent)
        box.setObjectName("catalogFitQuestion")
        fetch = box.addButton("Try anyway", QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.clickedButton() is not fetch:
            return
    pairing.choose_catalog(pair)


def _choose_folder(role: str, pairing: PairController, parent: QWidget) -> None:
    folder = QFileDialog.getExistingDirectory(parent, f"Choose the {role} model folder")
    if folder:
        pairing.choose(role, folder)


def _choose_gguf(role: str, pairing: PairController, parent: QWidget) -> None:
    path, _ = QFileDialog.getOpenFileName(parent, f"Choose the {role} .gguf file", "", "GGUF models (*.gguf)")
    if path:
        pairing.choose(role, path)


def _enter_repo(role: str, pairing: PairController, parent: QWidget) -> None:
    text, ok = QInputDialog.getText(
        parent, f"Hugging Face {role}",
        "A repo id or link, e.g. Qwen/Qwen2.5-0.5B-Instruct or https://huggingface.co/HuggingFaceTB/"
        "SmolLM2-135M-Instruct")
    if ok and text.strip():
        pairing.choose(role, text)


def ask_token(parent: QWidget, repo_id: str, why: str) -> str | None:
    """Gated or private repos: a token, stored the way huggingface-hub stores it."""
    from PySide6.QtWidgets import QLineEdit

    text, ok = QInputDialog.getText(
        parent, "Hugging Face token",
        f"{why}\n\nPaste an access token from https://huggingface.co/settings/tokens "
        f"(read access is enough). It is stored where huggingface-hub keeps it.",
        QLineEdit.EchoMode.Password)
    return text.strip() if ok and text.strip() else None
