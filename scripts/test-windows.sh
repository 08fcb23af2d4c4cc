#!/usr/bin/env bash
# Windows: cross-builds easel.exe with Debian's MinGW-w64 toolchain and smoke-tests it under Wine.
#
#   1. the dependencies (scripts/fetch-win-deps.sh: header-only libraries, Debian's zlib for
#      MinGW, libpng and sentencepiece built from Debian's source packages);
#   2. a lean build: the easel CLI only (no tests binary), ggml's CPU backend, into build-win/;
#   3. under Wine (Debian's wine64, a prefix in build-win/wineprefix):
#      - `easel --version` and `easel devices` (the CPU must be listed);
#      - the demo image: easel.exe and the Linux build's easel make the same 256x256 picture
#        from the same flags; their pixels may differ by at most EASEL_WIN_MAX_DIFF (default 1,
#        in 1/255 units: MinGW's libm and glibc's round a few float functions differently, see
#        docs/build.md "Windows"); the difference measured is printed;
#      - a model path and an output path with Cyrillic letters and spaces (as "C:\Users\...\Рабочий
#        стол\..." and "D:\files\FLUX.2\..." are), given as Windows paths with backslashes, plus a
#        checkpoint folder and a cache folder there: the image equals the one made through plain
#        paths bit for bit, and a resume from those checkpoints works;
#      - an output written twice (the atomic replace of an existing file, MoveFileExW).
#
# Options (environment): EASEL_WIN_BUILD_DIR (default build-win), EASEL_LINUX_EASEL (the Linux
# easel to compare with; default build/bin/easel, built by scripts/setup.sh when missing),
# EASEL_WIN_VULKAN=1 (also try a Vulkan build: needs Vulkan headers for MinGW, docs/build.md),
# EASEL_SKIP_APT=1.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
t_start=$(date +%s)
bw="${EASEL_WIN_BUILD_DIR:-build-win}"
mkdir -p "$bw"
bw="$(cd "$bw" && pwd)"
max_diff="${EASEL_WIN_MAX_DIFF:-1}"
fail() { echo "test-windows: FAIL: $*" >&2; exit 1; }

# --- packages: Wine and Pillow (the image comparison) besides what fetch-win-deps.sh installs
need=()
for p in wine wine64 python3-pil; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  [ "${EASEL_SKIP_APT:-0}" = "1" ] && fail "missing packages ${need[*]} (EASEL_SKIP_APT=1)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "test-windows: installing ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
PY=/usr/bin/python3  # Debian's Python, where python3-pil is

# --- dependencies and ggml
EASEL_WIN_DEPS="$bw/deps" scripts/fetch-win-deps.sh
scripts/fetch-ggml.sh >/dev/null

# --- the cross-build (lean: the CLI only, ggml CPU + RPC)
jobs="$(nproc 2>/dev/null || echo 2)"
cmake -S . -B "$bw" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64-x86_64.cmake" -DEASEL_WIN_DEPS="$bw/deps" \
  -DCMAKE_BUILD_TYPE=Release -DEASEL_TESTS=OFF -DEASEL_SYSTEM_GGML=OFF >/dev/null
cmake --build "$bw" -j "$jobs" --target easel_cli >/dev/null
exe="$bw/bin/easel.exe"
[ -f "$exe" ] || fail "no $exe after the build"
t_built=$(date +%s)
echo "test-windows: built $exe ($(( t_built - t_start )) s)"

if [ "${EASEL_WIN_VULKAN:-0}" = "1" ]; then
  if cmake -S . -B "$bw-vulkan" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64-x86_64.cmake" -DEASEL_WIN_DEPS="$bw/deps" \
      -DCMAKE_BUILD_TYPE=Release -DEASEL_TESTS=OFF -DEASEL_SYSTEM_GGML=OFF -DEASEL_VULKAN=ON > "$bw/vulkan-configure.log" 2>&1 &&
     cmake --build "$bw-vulkan" -j "$jobs" --target easel_cli > "$bw/vulkan-build.log" 2>&1; then
    echo "test-windows: Vulkan build: $bw-vulkan/bin/easel.exe"
  else
    echo "test-windows: Vulkan build failed (logs: $bw/vulkan-*.log); see docs/build.md" >&2
  fi
fi

# --- the Linux easel to compare with
linux_easel="${EASEL_LINUX_EASEL:-build/bin/easel}"
if [ ! -x "$linux_easel" ]; then
  echo "test-windows: building the Linux easel to compare with"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$jobs" --target easel_cli >/dev/null
  linux_easel=build/bin/easel
fi

# --- Wine
# LC_ALL: Wine converts the command line from the Unix locale's charset: UTF-8, whatever CI has
export WINEPREFIX="$bw/wineprefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" WINEARCH=win64 LC_ALL=C.UTF-8
WINE="$(command -v wine64 || command -v wine || true)"
[ -x /usr/lib/wine/wine64 ] && WINE=/usr/lib/wine/wine64
[ -n "$WINE" ] || fail "wine is not installed"
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  echo "test-windows: creating the Wine prefix $WINEPREFIX"
  "$WINE" wineboot -i >/dev/null 2>&1 || fail "wineboot could not create $WINEPREFIX"
fi
winpath() { "$WINE" winepath -w "$1" 2>/dev/null | tr -d '\r'; }
weasel() { "$WINE" "$exe" "$@"; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --version, devices
weasel --version > "$tmp/version.txt" 2>&1 || fail "easel.exe --version failed: $(cat "$tmp/version.txt")"
grep -q '^easel ' "$tmp/version.txt" || fail "easel.exe --version printed no version: $(cat "$tmp/version.txt")"
weasel devices > "$tmp/devices.txt" 2>&1 || fail "easel.exe devices failed: $(cat "$tmp/devices.txt")"
grep -qi 'cpu' "$tmp/devices.txt" || fail "easel.exe devices lists no CPU: $(cat "$tmp/devices.txt")"
echo "test-windows: easel devices under Wine: $(tr -d '\r' < "$tmp/devices.txt" | grep -i cpu | head -1)"

# the demo image: Windows vs Linux
model="$root/models/demo/easel-demo-shapes.safetensors"
# (no size, sampler, CFG or steps flag: the model file's recommended 256x256, euler, CFG 3, 20 steps, as the README's first command)
flags=(-p "a large red circle in the centre, blue background" -s 42 -t 2 --rng cpu --no-cache)
"$linux_easel" generate -m "$model" "${flags[@]}" -o "$tmp/linux.png" >/dev/null 2>"$tmp/linux.err" || fail "Linux easel failed: $(cat "$tmp/linux.err")"
t0=$(date +%s.%N)
weasel generate -m "$(winpath "$model")" "${flags[@]}" -o "$(winpath "$tmp")\\win.png" >/dev/null 2>"$tmp/win.err" ||
  fail "easel.exe generate failed: $(cat "$tmp/win.err")"
t1=$(date +%s.%N)
[ -f "$tmp/win.png" ] || fail "easel.exe wrote no win.png"
compare() {  # a.png b.png -> "max_diff pixels_differing"
  "$PY" - "$1" "$2" <<'PYEOF'
import sys
from PIL import Image
a = Image.open(sys.argv[1]).convert("RGB"); b = Image.open(sys.argv[2]).convert("RGB")
if a.size != b.size: print("size", a.size, b.size); sys.exit(0)
pa, pb = a.tobytes(), b.tobytes()
d = [abs(x - y) for x, y in zip(pa, pb)]
print(max(d), sum(1 for v in d if v))
PYEOF
}
read -r diff ndiff <<<"$(compare "$tmp/linux.png" "$tmp/win.png")"
[ "$diff" != "size" ] || fail "the Windows image has another size than the Linux one"
echo "test-windows: demo image 256x256, 20 steps: Windows vs Linux max pixel difference $diff/255 ($ndiff of $((256*256*3)) values differ); easel.exe took $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s under Wine"
[ "$diff" -le "$max_diff" ] || fail "the Windows image differs from the Linux one by $diff/255 (allowed $max_diff)"

# Cyrillic and spaces: model, output, checkpoint folder, cache folder
desk="$tmp/Рабочий стол/FLUX.2 модели"
mkdir -p "$desk"
cp "$model" "$desk/демо модель.safetensors"
small=(-p "a small green star on the left, white background" -W 128 -H 128 --steps 6 --sampling-method euler -s 7 -t 2)
weasel generate -m "$(winpath "$model")" "${small[@]}" --no-cache -o "$(winpath "$tmp")\\plain.png" >/dev/null 2>"$tmp/plain.err" ||
  fail "easel.exe generate (plain paths) failed: $(cat "$tmp/plain.err")"
wdesk="$(winpath "$desk")"
[[ "$wdesk" == *"Рабочий стол"* ]] || fail "winpath did not keep the Cyrillic folder name: $wdesk"
weasel generate -m "$wdesk\\демо модель.safetensors" "${small[@]}" --cache-dir "$wdesk\\кэш" --checkpoint-dir "$wdesk\\чекпойнты" \
  -o "$wdesk\\картинка с пробелом.png" >"$tmp/cyr.out" 2>"$tmp/cyr.err" || fail "easel.exe with Cyrillic paths failed: $(cat "$tmp/cyr.err")"
[ -f "$desk/картинка с пробелом.png" ] || fail "no output at the Cyrillic path; easel.exe printed: $(cat "$tmp/cyr.out")"
cmp -s "$tmp/plain.png" "$desk/картинка с пробелом.png" || fail "the image through Cyrillic paths differs from the one through plain paths"
ls "$desk/чекпойнты"/image1-step*.safetensors >/dev/null 2>&1 || fail "no checkpoints in the Cyrillic checkpoint folder"
ls "$desk/кэш"/conditioning/*.safetensors >/dev/null 2>&1 || fail "no conditioning in the Cyrillic cache folder"
# a resume from the Cyrillic checkpoints, written over the existing output (atomic replace)
weasel generate -m "$wdesk\\демо модель.safetensors" "${small[@]}" --cache-dir "$wdesk\\кэш" --checkpoint-dir "$wdesk\\чекпойнты" --resume \
  -o "$wdesk\\картинка с пробелом.png" >/dev/null 2>"$tmp/resume.err" || fail "easel.exe --resume with Cyrillic paths failed: $(cat "$tmp/resume.err")"
cmp -s "$tmp/plain.png" "$desk/картинка с пробелом.png" || fail "the resumed image differs"
ls -A "$desk" | grep -q '\.tmp-' && fail "a temporary file was left in $desk"
echo "test-windows: Cyrillic and spaces in model, output, checkpoint and cache paths: same image bit for bit, resume works"

# a bad path says so in one line
if weasel generate -m "$wdesk\\нет такого.safetensors" -p x --steps 1 -o "$wdesk\\x.png" >/dev/null 2>"$tmp/bad.err"; then
  fail "easel.exe accepted a missing model"
fi
[ "$(tr -d '\r' < "$tmp/bad.err" | grep -c '^error:')" = 1 ] && grep '^error:' "$tmp/bad.err" | grep -q 'нет такого.safetensors' ||
  fail "a missing model under a Cyrillic path did not give one line naming it: $(cat "$tmp/bad.err")"

echo "test-windows: all passed ($(( $(date +%s) - t_start )) s in all, build $(( t_built - t_start )) s)"
