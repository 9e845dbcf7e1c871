#!/bin/bash
# Start-up time of a frozen Tandem to its first visible window, under Xvfb (Linux): one cold
# launch (empty user folders: the bundled demo model is converted behind the window) and three
# warm ones. Needs Xvfb and xdotool. Usage: packaging/startup_time.sh [dist/Tandem/tandem] [shot.png]
set -u
APP=${1:-dist/Tandem/tandem}
SHOT=${2:-}
APP=$(cd "$(dirname "$APP")" && pwd)/$(basename "$APP")
export DISPLAY=:98
Xvfb :98 -screen 0 1440x900x24 >/dev/null 2>&1 &
XVFB=$!
sleep 1
HOMEDIR=$(mktemp -d)
for run in cold warm1 warm2 warm3; do
  start=$(date +%s.%N)
  env -i HOME="$HOMEDIR" PATH=/usr/bin:/bin DISPLAY=:98 "$APP" >/dev/null 2>&1 &
  pid=$!
  until xdotool search --onlyvisible --name "Tandem" >/dev/null 2>&1; do sleep 0.02; done
  end=$(date +%s.%N)
  echo "$run: $(echo "$end - $start" | bc) s to the first window"
  if [ "$run" = cold ] && [ -n "$SHOT" ]; then sleep 45; import -window root "$SHOT"; fi
  kill $pid; wait $pid 2>/dev/null; sleep 1
done
kill $XVFB
rm -rf "$HOMEDIR"
