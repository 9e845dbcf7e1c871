"""The chat settings drawer: the system prompt and generation settings of the open chat.

It folds out under the header. Every change is announced at once (the window saves it with
the chat); the system prompt is announced when typing pauses.

It fits the chat column it folds out in, never widening the window: the two columns of settings
stack when the column is narrow, and the drafter's list names the pair's draft in full only in
its popup (the box is as wide as a short name, its tooltip says the whole one).
"""

from __future__ import annotations

from PySide6.QtCore import QSize, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QFrame, QGridLayout, QHBoxLayout,
                               QLabel, QPlainTextEdit, QPushButton, QSpinBox, QWidget)

from app.chat.settings import MAX_DRAFT_TOKENS, TREE_MODES, ChatSettings
from app.draft_choice import NO_DRAFT, PAIR_DRAFT, PAIR_MODEL_ONLY, PROMPT_LOOKUP, REQUEST_CHOICES, DraftKind
from ui.tips import wrap_tip

PROMPT_DELAY_MS = 400
DRAFTER_MIN_CHARS = 12  # the drafter box's least width: "Prompt looku…" still says which
DRAFTER_ITEMS = {PAIR_DRAFT: "The pair's draft", PAIR_MODEL_ONLY: "Draft model only",
                 PROMPT_LOOKUP: "Prompt lookup (n-gram)", NO_DRAFT: "None: the target alone"}
# The pairs whose draft is a model with prompt lookup beside it (app/runner.py wraps these in
# LookupThenModelDrafter): only there does "Draft model only" differ from the pair's draft. A pair
# drafting by prompt lookup or not at all has no model to leave alone, and a Gemma 4 assistant
# drafts without lookup already.
TREE_ITEMS = {"auto": "Auto: where they pay", "on": "Always", "off": "Off: chains only"}  # one per TREE_MODES
MODEL_BESIDE_LOOKUP = frozenset({DraftKind.MODEL, DraftKind.SELF, DraftKind.MTP, DraftKind.HEAD, DraftKind.EAGLE3,
                                 DraftKind.DFLASH})

TIPS = {
    "system_prompt": "Instructions the model reads before every message of this chat, e.g. "
                     "\"Answer briefly\". Kept when old messages must be left out to fit the context.",
    "temperature": "Randomness. 0 always picks the most likely token (the same answer every time); "
                   "0.7 is a good default for chatting; above 1 gets erratic. Speculative decoding keeps "
                   "the answer exactly as the target alone would sample it at any temperature.",
    "top_p": "Nucleus sampling: only the most likely tokens that together hold this much probability are "
             "considered. 1 turns it off.",
    "top_k": "Only the k most likely tokens are considered. Off considers them all.",
    "max_tokens": "The longest answer, in tokens (about ¾ of a word each). The answer also ends when the "
                  "model's context is full.",
    "draft_tokens": "How many tokens the drafter proposes per round. Auto adapts to how many the target "
                    "accepts; a fixed number is for experiments.",
    "drafter": "Where the proposed tokens come from. The target checks every one of them, so the answer "
               "is the same either way; only the speed differs.",
    "trees": "Where the drafter has second guesses (another place the prompt repeats, a draft's runner-up "
             "where it is unsure), the target can check them beside the first guess in the same pass and keep "
             "whichever it agrees with. Auto adds a branch only where measuring says it pays on this machine; "
             "the answer is the same either way.",
    "thinking": "Reasoning models (Qwen3 and others whose template has the switch) write their thinking first, "
                "folded above the answer. Off, they answer at once: faster, often less careful.",
}


class SettingsDrawer(QFrame):
    settings_changed = Signal(object)  # ChatSettings
    system_prompt_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("settingsDrawer")
        self._quiet = False
        self.defaults = ChatSettings()  # what "Defaults" restores; the window sets its own
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("Optional: how the model should answer, e.g. “Answer briefly.”")
        self.system_prompt.setFixedHeight(self.fontMetrics().lineSpacing() * 4 + 12)
        self.temperature = _double(0.0, 2.0, 0.05, 2)
        self.top_p = _double(0.05, 1.0, 0.05, 2)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 131072)
        self.max_tokens.setSingleStep(64)
        self.draft_tokens = QSpinBox()
        self.draft_tokens.setRange(0, MAX_DRAFT_TOKENS)
        self.draft_tokens.setSpecialValueText("auto")
        self.drafter = QComboBox()  # one item per REQUEST_CHOICES, in its order
        self.drafter.addItems([DRAFTER_ITEMS[choice] for choice in REQUEST_CHOICES])
        # as wide as its column allows, not as its longest item ("The pair's draft (the target's
        # own weights at int4 …)" widened the window): the popup still shows every item whole
        self.drafter.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.drafter.setMinimumContentsLength(DRAFTER_MIN_CHARS)
        self.set_pair_draft("the pair's draft")  # and no "Draft model only" until a pair with a model loads
        self.trees = QComboBox()  # one item per TREE_MODES, in its order
        self.trees.addItems([TREE_ITEMS[mode] for mode in TREE_MODES])
        self._trees_note = ""  # why the loaded target verifies chains only (set_trees_note)
        self.thinking = QCheckBox("Think before answering")
        self.thinking.setEnabled(False)  # until a model whose template has the switch is loaded
        self._reasoning = ""  # the loaded model's: "switch", "always" or "" (set_thinking_switch)
        self._wanted_thinking = True  # the chat's choice, shown where the model has the switch
        self.reset_button = QPushButton("Defaults")
        self.reset_button.setToolTip(wrap_tip("Put the generation settings back to Tandem's defaults"))
        self.reset_button.clicked.connect(lambda: self.set_values(self.defaults, self.system_prompt.toPlainText(),
                                                                  announce=True))
        self._prompt_timer = QTimer(self)
        self._prompt_timer.setSingleShot(True)
        self._prompt_timer.setInterval(PROMPT_DELAY_MS)
        self._prompt_timer.timeout.connect(self._announce_prompt)
        self.system_prompt.textChanged.connect(self._prompt_edited)
        for widget in (self.temperature, self.top_p, self.top_k, self.max_tokens, self.draft_tokens):
            widget.valueChanged.connect(self._edited)
        self.drafter.currentIndexChanged.connect(self._edited)
        self.drafter.currentIndexChanged.connect(self._show_drafter_tip)
        self.trees.currentIndexChanged.connect(self._edited)
        self.thinking.toggled.connect(self._thinking_toggled)
        self.thinking.toggled.connect(self._edited)
        self._layout()
        self.set_values(ChatSettings(), "")

    def _layout(self) -> None:
        prompt_label = QLabel("System prompt")
        prompt_label.setToolTip(wrap_tip(TIPS["system_prompt"]))
        self.system_prompt.setToolTip(wrap_tip(TIPS["system_prompt"]))
        self._forms = (QWidget(), QWidget())
        left, right = (QFormLayout(form) for form in self._forms)
        for form in (left, right):
            form.setContentsMargins(0, 0, 0, 0)
            form.setHorizontalSpacing(10)
            form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        rows = [(left, "Temperature", self.temperature, "temperature"), (left, "Top-p", self.top_p, "top_p"),
                (left, "Top-k", self.top_k, "top_k"), (right, "Max new tokens", self.max_tokens, "max_tokens"),
                (right, "Draft tokens", self.draft_tokens, "draft_tokens"), (right, "Drafter", self.drafter, "drafter"),
                (right, "Draft trees", self.trees, "trees")]
        for form, text, widget, key in rows:
            label = QLabel(text)
            label.setToolTip(wrap_tip(TIPS[key]))
            widget.setToolTip(wrap_tip(TIPS[key]))
            form.addRow(label, widget)
        self.thinking.setToolTip(wrap_tip(TIPS["thinking"]))
        bottom = QHBoxLayout()
        bottom.setContentsMargins(0, 0, 0, 0)
        bottom.addWidget(self.thinking)
        bottom.addStretch(1)
        bottom.addWidget(self.reset_button)
        self._grid = grid = QGridLayout(self)
        grid.setContentsMargins(16, 10, 16, 12)
        grid.setHorizontalSpacing(16)
        grid.setVerticalSpacing(6)
        grid.addWidget(prompt_label, 0, 0, 1, 2)
        grid.addWidget(self.system_prompt, 1, 0, 1, 2)
        grid.addLayout(bottom, 4, 0, 1, 2)
        self._stacked: bool | None = None
        self._place(stacked=False)
        self._show_drafter_tip()

    # --- fitting the chat column -----------------------------------------------------------

    def _side_by_side_width(self) -> int:
        """The least width that holds the two columns of settings side by side."""
        margins = self._grid.contentsMargins()
        return (sum(form.minimumSizeHint().width() for form in self._forms) + self._grid.horizontalSpacing()
                + margins.left() + margins.right())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        """As narrow as the stacked columns: the drawer never makes the window wider (it stacks
        them when the chat column is narrow)."""
        hint = super().minimumSizeHint()
        margins = self._grid.contentsMargins()
        stacked = max(form.minimumSizeHint().width() for form in self._forms) + margins.left() + margins.right()
        hint.setWidth(min(hint.width(), stacked))
        return hint

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._place(stacked=event.size().width() < self._side_by_side_width())

    def _place(self, stacked: bool) -> None:
        """The two columns of settings side by side, or one under the other."""
        if stacked == self._stacked:
            return
        self._stacked = stacked
        grid = self._grid
        for form in self._forms:
            grid.removeWidget(form)
        if stacked:
            grid.addWidget(self._forms[0], 2, 0, 1, 2)
            grid.addWidget(self._forms[1], 3, 0, 1, 2)
        else:
            grid.addWidget(self._forms[0], 2, 0)
            grid.addWidget(self._forms[1], 2, 1)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 0 if stacked else 1)

    def set_pair_draft(self, name: str, kind: DraftKind | None = None) -> None:
        """The first choice names what the loaded pair drafts with; "Draft model only" is offered
        only where that is a model beside prompt lookup (`kind`, the loaded draft's). A chat that
        chose it keeps it shown, marked as drafting as the pair does here."""
        self.drafter.setItemText(REQUEST_CHOICES.index(PAIR_DRAFT), f"The pair's draft ({name})")
        self._offer_model_only(kind in MODEL_BESIDE_LOOKUP)  # before the popup's width: it changes a text
        # the popup as wide as its longest item, though the box may be narrower
        view = self.drafter.view()
        scroll_bar = view.verticalScrollBar().sizeHint().width()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 2 * view.frameWidth() + scroll_bar)
        self._show_drafter_tip()

    def _offer_model_only(self, offered: bool) -> None:
        row = REQUEST_CHOICES.index(PAIR_MODEL_ONLY)
        item = self.drafter.model().item(row)
        item.setEnabled(offered)
        self.drafter.view().setRowHidden(row, not offered)  # not listed: nothing to choose there
        self.drafter.setItemText(row, DRAFTER_ITEMS[PAIR_MODEL_ONLY] if offered
                                 else f"{DRAFTER_ITEMS[PAIR_MODEL_ONLY]} (this pair has none)")

    def model_only_offered(self) -> bool:
        return self.drafter.model().item(REQUEST_CHOICES.index(PAIR_MODEL_ONLY)).isEnabled()

    def _show_drafter_tip(self) -> None:
        """The box may cut the choice short: its tooltip begins with the whole of it."""
        self.drafter.setToolTip(wrap_tip(f"{self.drafter.currentText()}. {TIPS['drafter']}"))

    def set_thinking_switch(self, reasoning: str) -> None:
        """The loaded model's thinking: "switch" (its template turns it on and off), "always", or "".
        Without a switch the box shows what the model does (ticked: always thinks; empty: never),
        and the chat's own choice is kept for a model that has one."""
        self._reasoning = reasoning
        self._show_thinking()
        self.thinking.setEnabled(reasoning == "switch")
        self.thinking.setToolTip(wrap_tip(TIPS["thinking"] if reasoning == "switch" else
                                          "This model always thinks before it answers: its template has no switch"
                                          if reasoning == "always" else "This model does not think before answering"))

    def set_trees_note(self, note: str) -> None:
        """The loaded target's reason for verifying chains only ("" where it verifies trees): the
        box is then greyed, its tooltip says why, and the chat's own choice is kept for a target
        that takes trees."""
        self._trees_note = note
        self.trees.setEnabled(not note)
        tip = TIPS["trees"] if not note else f"This model checks one guess per position here: {note}."
        self.trees.setToolTip(wrap_tip(tip))

    def _show_thinking(self) -> None:
        shown = {"switch": self._wanted_thinking, "always": True}.get(self._reasoning, False)
        quiet, self._quiet = getattr(self, "_quiet", False), True
        try:
            self.thinking.setChecked(shown)
        finally:
            self._quiet = quiet

    def values(self) -> ChatSettings:
        draft_tokens = self.draft_tokens.value()
        return ChatSettings(
            temperature=round(self.temperature.value(), 2), top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
            draft_tokens=draft_tokens or None, drafter=REQUEST_CHOICES[max(0, self.drafter.currentIndex())],
            trees=TREE_MODES[max(0, self.trees.currentIndex())],
            thinking=self.thinking.isChecked() if self._reasoning == "switch" else self._wanted_thinking,
        )

    def set_values(self, settings: ChatSettings, system_prompt: str, announce: bool = False) -> None:
        """Show a chat's settings; `announce` also reports them as a change (the Defaults button)."""
        self._quiet = True
        try:
            self.temperature.setValue(settings.temperature)
            self.top_p.setValue(settings.top_p)
            self.top_k.setValue(settings.top_k)
            self.max_tokens.setValue(settings.max_tokens)
            self.draft_tokens.setValue(settings.draft_tokens or 0)
            self.drafter.setCurrentIndex(REQUEST_CHOICES.index(settings.drafter))
            self.trees.setCurrentIndex(TREE_MODES.index(settings.trees))
            self._wanted_thinking = settings.thinking
            self._show_thinking()
            if self.system_prompt.toPlainText() != system_prompt:
                self.system_prompt.setPlainText(system_prompt)
            self._prompt_timer.stop()
        finally:
            self._quiet = False
        if announce:
            self.settings_changed.emit(self.values())

    def flush_prompt(self) -> None:
        """Announce a pending system prompt edit now (before sending, or when the chat changes)."""
        if self._prompt_timer.isActive():
            self._prompt_timer.stop()
            self._announce_prompt()

    def _announce_prompt(self) -> None:
        self.system_prompt_changed.emit(self.system_prompt.toPlainText())

    def _prompt_edited(self) -> None:
        if not self._quiet:
            self._prompt_timer.start()

    def _thinking_toggled(self, on: bool) -> None:
        if not self._quiet and self._reasoning == "switch":  # the user's own click
            self._wanted_thinking = on

    def _edited(self, *_args) -> None:
        if not self._quiet:
            self.settings_changed.emit(self.values())


def _double(low: float, high: float, step: float, decimals: int) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    return box
