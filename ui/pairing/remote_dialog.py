"""The Target slot's server: an address typed or dropped, its API key, a CA file for a
self-signed server, and the model chosen from the server's own list (/v1/models, asked off the
GUI thread). The key field never shows a kept key; a key typed is kept in the system's credential
store (app/remote/keys.py) when "Remember" is ticked, and otherwise lives only in this load."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget)

from app.remote import keys
from app.remote.endpoint import EndpointError, parse_endpoint


@dataclass(frozen=True)
class RemoteChoice:
    address: str  # the base URL (http(s)://host:port/v1)
    model: str
    ca_file: str = ""
    key: str | None = field(default=None, repr=False)  # typed here; never shown, never logged
    remember: bool = True  # keep the key in the credential store


class _Lister(QObject):
    """Asks a server for its models on a thread of its own; the answer comes back as a signal."""

    listed = Signal(int, object, str)  # the ask's number, [RemoteModel] (None on failure), the words

    def ask(self, number: int, address: str, key: str | None, ca_file: str) -> None:
        def run() -> None:
            from app.remote.client import RemoteClient, RemoteError
            from app.remote.target import engine_name

            try:
                endpoint = parse_endpoint(address)
                client = RemoteClient(endpoint, key or keys.load(endpoint.origin), Path(ca_file) if ca_file else None)
                try:
                    models = client.models()
                finally:
                    client.close()
            except (RemoteError, EndpointError) as exc:
                self.listed.emit(number, None, str(exc))
                return
            engines = sorted({engine_name(m.owned_by) for m in models})
            words = (f"{len(models)} model{'s' if len(models) != 1 else ''} on {', '.join(engines)}" if models
                     else "The server lists no models: load one on it first.")
            self.listed.emit(number, models, words)

        threading.Thread(target=run, name="tandem-remote-models", daemon=True).start()


class RemoteDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, address: str = ""):
        super().__init__(parent)
        self.setObjectName("remoteDialog")
        self.setWindowTitle("Use a model on a server")
        self.address = QLineEdit(address)
        self.address.setPlaceholderText("http://192.168.1.20:8000/v1")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.remember = QCheckBox("Remember the key")
        self.remember.setChecked(True)
        self.remember.setToolTip(f"Kept {keys.where()}.")
        self.ca_file = QLineEdit()
        self.ca_file.setPlaceholderText("only for a self-signed https server")
        choose_ca = QPushButton("Choose…")
        choose_ca.clicked.connect(self._choose_ca)
        self.connect_button = QPushButton("List models")
        self.connect_button.clicked.connect(self.list_models)
        self.models = QComboBox()
        self.models.setEnabled(False)
        self.state = QLabel("Give the address the server printed, with or without /v1, then list its models.")
        self.state.setWordWrap(True)
        self.state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        ca_row = QHBoxLayout()
        ca_row.addWidget(self.ca_file, 1)
        ca_row.addWidget(choose_ca)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key, 1)
        key_row.addWidget(self.remember)
        form = QFormLayout()
        form.addRow("Address", self.address)
        form.addRow("API key", key_row)
        kept = QLabel(f"Remembered keys are kept {keys.where()}.")
        kept.setObjectName("mutedLabel")
        kept.setWordWrap(True)
        form.addRow("", kept)
        form.addRow("CA file", ca_row)
        form.addRow("", self.connect_button)
        form.addRow("Model", self.models)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.use = self.buttons.addButton("Use this model", QDialogButtonBox.ButtonRole.AcceptRole)
        self.use.setEnabled(False)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.state)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(self.fontMetrics().averageCharWidth() * 72)

        self._asked = 0
        self._lister = _Lister(self)
        self._lister.listed.connect(self._listed)
        self.address.textChanged.connect(self._changed)
        self._show_kept_key()

    def _show_kept_key(self) -> None:
        try:
            origin = parse_endpoint(self.address.text()).origin
        except EndpointError:
            origin = None
        kept = origin is not None and keys.load(origin) is not None
        self.key.setPlaceholderText("a key is kept for this server (type to replace it)" if kept
                                    else "none, or the server's key")

    def _changed(self) -> None:
        self.models.clear()
        self.models.setEnabled(False)
        self.use.setEnabled(False)
        self._show_kept_key()

    def _choose_ca(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "The CA that signed the server's certificate", "",
                                              "PEM certificates (*.pem *.crt *.cer);;All files (*)")
        if path:
            self.ca_file.setText(path)

    def list_models(self) -> None:
        try:
            parse_endpoint(self.address.text())
        except EndpointError as exc:
            self.state.setText(str(exc))
            return
        self._asked += 1
        self.connect_button.setEnabled(False)
        self.state.setText("Asking the server for its models…")
        self._lister.ask(self._asked, self.address.text(), self.key.text().strip() or None, self.ca_file.text().strip())

    def _listed(self, number: int, models, words: str) -> None:
        if number != self._asked:
            return  # an older ask, for an address since changed
        self.connect_button.setEnabled(True)
        self.state.setText(words)
        self.models.clear()
        for model in models or ():
            context = f" — {model.max_model_len:,} tokens" if model.max_model_len else ""
            self.models.addItem(model.id + context, model.id)
        self.models.setEnabled(bool(models))
        self.use.setEnabled(bool(models))

    def choice(self) -> RemoteChoice | None:
        model = self.models.currentData()
        if not model:
            return None
        return RemoteChoice(parse_endpoint(self.address.text()).base, model, self.ca_file.text().strip(),
                            self.key.text().strip() or None, self.remember.isChecked())


def ask_remote(parent: QWidget, address: str = "") -> RemoteChoice | None:
    dialog = RemoteDialog(parent, address)
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return None
    return dialog.choice()
