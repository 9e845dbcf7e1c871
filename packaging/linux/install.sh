#!/bin/sh
# Adds Tandem to the desktop's application menu (for this user), from wherever it was unpacked.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
apps="${XDG_DATA_HOME:-$HOME/.local/share}/applications"
icons="${XDG_DATA_HOME:-$HOME/.local/share}/icons/hicolor/256x256/apps"

# The program's path as one argument of a desktop entry's Exec key (Desktop Entry spec, "The Exec
# key"): in double quotes, with ", `, $ and \ backslash-escaped inside them, and % written %%; then,
# since Exec is a string value, every backslash doubled once more (a literal \ becomes \\\\).
exec_arg() {
    printf '%s' "$1" | sed -e 's/[\\"`$]/\\&/g' -e 's/%/%%/g' -e 's/\\/\\\\/g' -e 's/^/"/' -e 's/$/"/'
}

case $here in
    *'
'*) echo "install.sh: the folder $here has a line break in its name, which a menu entry cannot hold;" \
         "move Tandem to a folder without one and run install.sh again." >&2
        exit 1 ;;
esac
exec=$(exec_arg "$here/Tandem/tandem")
mkdir -p "$apps" "$icons"
cp "$here/tandem.png" "$icons/tandem.png"
# line by line rather than sed: the path may hold any character sed's replacement treats as special
while IFS= read -r line; do
    case $line in
        Exec=@EXEC@*) printf 'Exec=%s%s\n' "$exec" "${line#Exec=@EXEC@}" ;;
        Icon=@ICON@) printf 'Icon=tandem\n' ;;
        *) printf '%s\n' "$line" ;;
    esac
done < "$here/tandem.desktop" > "$apps/tandem.desktop"
echo "Tandem is in your applications menu. Or run: $here/Tandem/tandem"
