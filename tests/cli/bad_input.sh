#!/bin/bash
# Bad values of `easel` flags (tests from the tryout report, /work/notes/tryout_report.md) are
# refused up front, before any model is opened: one stderr line naming the flag, a failing exit
# status, no output file, and nothing replaced. Usage: bad_input.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0

# expect_refused NAME PATTERN CMD ARGS...: exit status 1, one stderr line "error: ...PATTERN...", stderr holds PATTERN,
# no stage ran (no "stage " line), no out.png.
expect_refused() {
  local name="$1" pattern="$2"
  shift 2
  rm -f "$tmp/out.png"
  err=$(timeout 60 ${runner:-} "$easel" "$@" 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || [[ "$err" != "error: "* ]] || [[ "$err" != *"$pattern"* ]] || [[ "$err" == *"stage "* ]] || [ -e "$tmp/out.png" ]; then
    echo "FAIL $name: exit $rc: $err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $err"
  fi
}

check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

# F1: -t above GGML_MAX_N_THREADS (512) segfaulted (100000) or hung (4096) inside ggml
for cmd in generate plan denoise; do
  expect_refused "$cmd -t 100000" "above ggml's maximum of 512" $cmd -m "$sd" -p x --steps 1 -W 64 -H 64 -t 100000 -o "$tmp/out.png"
done
expect_refused "generate -t 4096" "above ggml's maximum of 512" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 4096 -o "$tmp/out.png"
expect_refused "generate -t 2^63" "above ggml's maximum of 512" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 99999999999999999999 -o "$tmp/out.png"
expect_refused "rpc-server -t 100000" "above ggml's maximum of 512" rpc-server --port 62000 -t 100000

# F2/F4/F3: -o must be a (new or regular) file in a writable folder, checked before the run; a FIFO
# or a device was replaced by a PNG (temporary file renamed over it)
mkfifo "$tmp/fifo"
expect_refused "-o onto a FIFO" "not a regular file" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 1 -o "$tmp/fifo"
[ -p "$tmp/fifo" ]
check "the FIFO is still a FIFO" $? "$(ls -l "$tmp/fifo")"
expect_refused "-o empty" "-o is empty" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 1 -o ""
expect_refused "decode -o empty" "-o is empty" decode -m "$sd" --load-latent "$tmp/none.safetensors" -o ""
mkdir "$tmp/ro" && chmod 555 "$tmp/ro"
if [ "$(id -u)" -ne 0 ]; then
  expect_refused "-o in a read-only folder" "cannot write into folder" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 1 -o "$tmp/ro/x.png"
elif command -v setpriv >/dev/null; then
  chmod 777 "$tmp"
  runner="setpriv --reuid=65534 --regid=65534 --clear-groups"
  expect_refused "-o in a read-only folder (as nobody)" "cannot write into folder" generate -m "$sd" -p x --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/ro/x.png"
  runner=""
fi
# the temporary PNG is not "<path>.tmp" (shared by two runs with the same -o): a folder of that
# name in the way does not stop the write, and no temporary file is left
mkdir "$tmp/out.png.tmp"
"$easel" generate -m "$sd" -p "é 猫 🐱 x" --steps 1 -W 64 -H 64 -t 1 --no-cache -o "$tmp/out.png" >/dev/null 2>"$tmp/err.txt"
[ -f "$tmp/out.png" ] && [ -z "$(ls -A "$tmp" | grep -E '\.tmp$' | grep -v '^out.png.tmp$')" ]
check "PNG written past a folder named out.png.tmp (prompt of valid UTF-8), no temporary left" $? "$(cat "$tmp/err.txt"; ls -A "$tmp")"

# F12: a prompt that is not UTF-8 failed after text encoding and denoising with a raw json
# exception; now refused up front with the byte and its offset
expect_refused "-p with bytes 0xFF 0xFE" "-p/--prompt is not valid UTF-8 (byte 0xFF at offset 2)" generate -m "$sd" -t 1 --steps 1 -W 64 -H 64 -p "$(printf 'a \xff\xfe red \xc3 circle')" -o "$tmp/out.png"
expect_refused "-n ending in a truncated sequence" "-n/--negative-prompt is not valid UTF-8 (byte 0xE7 at offset 4)" generate -m "$sd" -t 1 --steps 1 -W 64 -H 64 -p ok -n "$(printf 'bad \xe7\x8c')" -o "$tmp/out.png"
expect_refused "-p with an overlong '/' (0xC0 0xAF)" "(byte 0xC0 at offset 1)" generate -m "$sd" -t 1 --steps 1 -W 64 -H 64 -p "$(printf 'x\xc0\xaf')" -o "$tmp/out.png"
expect_refused "-p with a UTF-16 surrogate (0xED 0xA0 0x80)" "(byte 0xA0 at offset 2)" generate -m "$sd" -t 1 --steps 1 -W 64 -H 64 -p "$(printf 'x\xed\xa0\x80')" -o "$tmp/out.png"
expect_refused "encode-prompt -p invalid" "not valid UTF-8" encode-prompt -m "$sd" -p "$(printf '\xff')" --save-embeddings "$tmp/c.safetensors"

# F10: CLI11's parse errors (range, conversion, missing argument, unknown flag) follow the same
# convention as easel's own errors: one line "error: ...", exit 1 (they were two lines, exit 104-109)
expect_refused "--steps 0 (range)" "--steps" generate -m "$sd" -p a --steps 0 -o "$tmp/out.png"
expect_refused "-W abc (conversion)" "--width" generate -m "$sd" -p a -W abc -o "$tmp/out.png"
expect_refused "--strength 1.5 (range)" "--strength" generate -m "$sd" -p a --strength 1.5 -o "$tmp/out.png"
expect_refused "-M vid_gen (not a member)" "vid_gen" generate -m "$sd" -p a -M vid_gen -o "$tmp/out.png"
expect_refused "inspect without a file (required)" "files" inspect
expect_refused "unknown flag" "--no-such-flag" generate -m "$sd" -p a --no-such-flag -o "$tmp/out.png"
"$easel" generate --help >/dev/null 2>&1
check "--help still exits 0" $? "exit $?"

# F11: non-finite --eta / --flow-shift ran (only --cfg-scale was checked)
for v in nan inf -inf; do
  expect_refused "--eta $v" "--eta must be a finite number" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 --eta $v -o "$tmp/out.png"
  expect_refused "--flow-shift $v" "--flow-shift must be a finite number" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 --flow-shift $v -o "$tmp/out.png"
done

# F13: seed + image index overflowed int64 (negative seeds in the PNGs), and an -s past int64 was
# clamped silently
expect_refused "-s INT64_MAX -b 3" "the seeds of the later images pass 9223372036854775807" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 -s 9223372036854775807 -b 3 -o "$tmp/out_%d.png"
expect_refused "-s 2^64" "outside the seed range" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 -s 99999999999999999999 -o "$tmp/out.png"
rm -f "$tmp"/out*.png
"$easel" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 --no-cache -s 9223372036854775806 -b 2 -o "$tmp/max_%d.png" >/dev/null 2>&1
[ -f "$tmp/max_1.png" ] && [ -f "$tmp/max_2.png" ]
check "-s INT64_MAX-1 -b 2 still runs (last seed INT64_MAX)" $? "$(ls "$tmp")"

[ "$fails" -eq 0 ] && echo "all bad input checks passed" || echo "$fails bad input checks failed"
[ "$fails" -eq 0 ]
