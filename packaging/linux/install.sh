#!/bin/sh
# Adds Tandem to the desktop's application menu (for this user), from wherever it was unpacked.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"
mkdir -p "$apps" "$icons"
cp "$here/tandem.png" "$icons/tandem.png"
# quoted in Exec, so an unpack path with spaces works (desktop entry spec, "Exec key")
sed -e "s|@EXEC@|\"$here/Tandem/tandem\"|" -e "s|@ICON@|tandem|" "$here/tandem.desktop" > "$apps/tandem.desktop"
echo "Tandem is in your applications menu. Or run: $here/Tandem/tandem"
