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
expect_refused "rpc-server -t 100000" "above ggml's maximum of 512" rpc-server --port 0 -t 100000

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
"$easel" generate -m "$sd" -p a -t 1 --steps 1 -W 64 -H 64 --no-cache -s 9223372036854775807 -o "$tmp/max_alone.png" >/dev/null 2>&1
# the PNGs' infotexts carry the seeds INT64_MAX-1 and INT64_MAX, and the second image is the one
# a run with -s INT64_MAX makes alone (same bytes: the infotext holds no batch position)
grep -qa "Seed: 9223372036854775806," "$tmp/max_1.png" && grep -qa "Seed: 9223372036854775807," "$tmp/max_2.png" &&
  cmp -s "$tmp/max_2.png" "$tmp/max_alone.png" && ! cmp -s "$tmp/max_1.png" "$tmp/max_2.png"
check "-s INT64_MAX-1 -b 2 runs: seeds INT64_MAX-1 and INT64_MAX, the second as a run of -s INT64_MAX" $? \
  "$(ls "$tmp"); $(grep -ao "Seed: [0-9-]*" "$tmp"/max_*.png)"

# F6/F20: sizes whose buffers cannot exist: -W/-H bounded at parse time (16384), and a job past
# the machine's memory refused before anything is allocated or run, with the numbers and the fix
expect_refused "generate -W/-H 1000000" "1000000 pixels is above the maximum of 16384" generate -m "$sd" -p x -t 1 --steps 1 -W 1000000 -H 1000000 -o "$tmp/out.png"
expect_refused "plan -W/-H 2147483640" "2147483640 pixels is above the maximum of 16384" plan -m "$sd" -p x -W 2147483640 -H 2147483640
expect_refused "generate 16384x16384 (beyond any host RAM)" "at 16384x16384 (parameters" generate -m "$sd" -p x -t 1 --steps 1 --no-cache -W 16384 -H 16384 -o "$tmp/out.png"
err=$(timeout 60 "$easel" generate -m "$sd" -p x -t 1 --steps 1 --no-cache -W 16384 -H 16384 -o "$tmp/out.png" 2>&1 >/dev/null)
[[ "$err" == *"GiB: use a smaller -W/-H"* ]] && [[ "$err" == *"flash attention"* ]]
check "the refusal names the fixes (smaller -W/-H, flash attention)" $? "$err"
out=$(timeout 60 "$easel" plan -m "$sd" -p x -W 16384 -H 16384 2>"$tmp/err.txt")
rc=$?
[ "$rc" -eq 1 ] && [ "$(grep -c . "$tmp/err.txt")" -eq 1 ] && grep -q "^error: .*needs .* GiB on CPU at 16384x16384" "$tmp/err.txt" && [[ "$out" == *"peak"* ]]
check "plan flags a peak above host RAM (table printed, exit 1, one error line)" $? "exit $rc: $(cat "$tmp/err.txt")"
# an allocation that fails anyway (address space capped): easel's one error line, without ggml's
# "failed to allocate" / "insufficient memory" lines before it
err=$( (ulimit -v 1500000; timeout 120 "$easel" generate -m "$sd" -p x -t 1 --steps 1 --no-cache --backend CPU -W 1024 -H 1024 -o "$tmp/out.png") 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] && ! printf '%s\n' "$err" | grep -qiE "ggml_|failed to allocate|insufficient memory" && [[ "$(printf '%s\n' "$err" | tail -n1)" == "error: "* ]] && [ ! -e "$tmp/out.png" ]
check "a failed allocation ends in easel's line without ggml's allocation noise" $? "exit $rc: $err"

# F7: --prediction flow on a discrete-time model
expect_refused "--prediction flow on SD1.x" "--prediction flow does not apply to SD1.x (a discrete-time model): use eps or v" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --prediction flow -o "$tmp/out.png"

# F8: an SD VAE (4 latent channels) for Z-Image names the flag and the kind needed, also when
# its levels divide into 32 groups (sd_tiny's VAE: 32/64 channels) and when they do not (16)
zi="$data/reference/zimage_tiny"
for v in "$sd" "$data/reference/autoencoder_kl_sd_tiny.safetensors"; do
  expect_refused "Z-Image --vae $(basename "$v")" "--vae $v: an SD VAE (4 latent channels); Z-Image needs the FLUX.1 VAE (16 latent channels, ae.safetensors)" \
    generate --diffusion-model "$zi/zimage_tiny_transformer.safetensors" --vae "$v" --llm "$zi/diffusers/text_encoder/model.safetensors" -p cat -t 1 -W 64 -H 64 --steps 1 --no-cache -o "$tmp/out.png"
  expect_refused "FLUX.1 --vae $(basename "$v")" "--vae $v: an SD VAE (4 latent channels); FLUX.1 needs its VAE (16 latent channels" \
    generate --diffusion-model "$data/reference/flux1_tiny/flux1_schnell_tiny_transformer.safetensors" --vae "$v" -p cat -t 1 -W 64 -H 64 --steps 1 --no-cache -o "$tmp/out.png"
done

# F9: a mis-shaped VAE tensor is found from the headers before the text encoder runs (the same
# bytes, another shape: decoder.mid.block_1.conv1.weight [64, 64, 3, 3] stored as [32, 128, 3, 3])
python3 - "$sd" "$tmp/badshape.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
k = 'first_stage_model.decoder.mid.block_1.conv1.weight'
assert h[k]['shape'] == [64, 64, 3, 3], h[k]['shape']
h[k]['shape'] = [32, 128, 3, 3]
hb = json.dumps(h).encode()
hb += b' ' * ((8 - len(hb) % 8) % 8)
open(dst, 'wb').write(struct.pack('<Q', len(hb)) + hb + b[8 + n:])
PY
expect_refused "mis-shaped VAE tensor (before any stage)" "1 mis-shaped (first_stage_model.decoder.mid.block_1.conv1.weight" generate -m "$tmp/badshape.safetensors" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache -o "$tmp/out.png"

# F14: budget errors offer only what can help here: with the CPU as the only device, neither
# "--params-backend te=cpu" (te already is in host RAM) nor a layer split
if [ "$("$easel" devices 2>/dev/null | awk 'NR > 1 && $1 != "CPU"' | grep -c .)" -eq 0 ]; then
  for m in 64:0.005:te 512:0.01:diffusion 128:0.02:vae; do  # (sd_tiny: te 6.3 MiB; diffusion 4.8, vae 25.1 at 128 px)
    IFS=: read -r sz cap mod <<<"$m"
    err=$("$easel" plan -m "$sd" -p a -W "$sz" -H "$sz" --max-vram CPU=$cap 2>&1 >/dev/null)
    [[ "$err" == "error: $mod needs"* ]] && [[ "$err" != *"--params-backend"* ]] && [[ "$err" != *"layer split"* ]] && [[ "$err" == *"a larger --max-vram"* ]]
    check "budget error of $mod on the only device (CPU) suggests no --params-backend / layer split" $? "$err"
  done
fi

# F15: options the model decides are checked before any stage runs (--no-cache: the text
# encoder would run first)
printf 'x' > "$tmp/afile"
expect_refused "-r with an SD model" "SD1.x takes no reference images" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache -r "$data/reference/klein_tiny/ref0.png" -o "$tmp/out.png"
expect_refused "--checkpoint-dir that is a file" "--checkpoint-dir $tmp/afile: exists and is not a folder" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache --checkpoint-dir "$tmp/afile" -o "$tmp/out.png"
mkdir -p "$tmp/ckpt"
expect_refused "--resume with no checkpoint" "--resume: no checkpoint of image 1 in $tmp/ckpt" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache --checkpoint-dir "$tmp/ckpt" --resume -o "$tmp/out.png"
expect_refused "--resume-step past --steps" "--resume-step 50 is past --steps 2" generate -m "$sd" -p x -t 1 --steps 2 -W 64 -H 64 --no-cache --checkpoint-dir "$tmp/ckpt" --resume-step 50 -o "$tmp/out.png"
expect_refused "denoise --resume-step past --steps" "--resume-step 50 is past --steps 2" denoise -m "$sd" --load-embeddings "$tmp/none.safetensors" --steps 2 -W 64 -H 64 --checkpoint-dir "$tmp/ckpt" --resume-step 50 --save-latent "$tmp/l.safetensors"
"$easel" generate -m "$sd" -p x -t 1 --steps 1 -W 8 -H 8 --no-cache -o "$tmp/w8.png" >/dev/null 2>&1
expect_refused "FLUX.2 Klein -r of 8x8 (before the text encoder)" "reference image 8x8 is too small" generate -m "$data/reference/klein_tiny/diffusers" -p cat -t 1 --steps 1 -W 64 -H 64 --no-cache -r "$tmp/w8.png" -o "$tmp/out.png"

# F5: -o patterns other than one %d are replaced as documented, with a warning
"$easel" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 -b 2 --no-cache -o "$tmp/pct_%d_%d.png" >/dev/null 2>"$tmp/err.txt"
[ -f "$tmp/pct_1_1.png" ] && [ -f "$tmp/pct_2_2.png" ] && grep -q "^warning: -o .*pct_%d_%d.png: 2 %d placeholders" "$tmp/err.txt"
check "-o with two %d: both replaced, warned" $? "$(cat "$tmp/err.txt"; ls "$tmp")"
"$easel" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache -o "$tmp/pct_%s.png" >/dev/null 2>"$tmp/err.txt"
[ -f "$tmp/pct_%s.png" ] && grep -q "^warning: -o .*pct_%s.png: only %d" "$tmp/err.txt"
check "-o with %s: kept as written, warned" $? "$(cat "$tmp/err.txt")"

# F16: --load-latent of another size than -W/-H says which size it uses, as -i does
"$easel" generate -m "$sd" -p x -t 1 --steps 1 -W 64 -H 64 --no-cache --save-latent "$tmp/lat64.safetensors" -o "$tmp/l64.png" >/dev/null 2>&1
"$easel" generate -m "$sd" -p x -t 1 --steps 2 -W 128 -H 128 --no-cache --load-latent "$tmp/lat64.safetensors" -o "$tmp/s6.png" >/dev/null 2>"$tmp/err.txt"
grep -q "using the latent's size 64x64" "$tmp/err.txt"
check "--load-latent 64x64 with -W/-H 128: 'using the latent's size 64x64'" $? "$(cat "$tmp/err.txt")"

# tryout 17: a folder as -i / --mask said "out of host memory"; --auto-fit replaced a malformed
# --vae-tile-size with its own instead of refusing it
mkdir -p "$tmp/adir"
expect_refused "generate -i FOLDER" "is a folder, not an image" generate -m "$sd" -p x --steps 1 -t 1 -i "$tmp/adir" -o "$tmp/out.png"
expect_refused "plan -i FOLDER" "is a folder, not an image" plan -m "$sd" -p x -i "$tmp/adir"
expect_refused "plan --auto-fit --vae-tile-size abc" "--vae-tile-size abc: expected [X]x[Y]" plan -m "$sd" -p x --auto-fit --vae-tiling --vae-tile-size abc
expect_refused "generate --auto-fit --vae-tile-overlap 1" "--vae-tile-overlap 1 is outside [0, 1)" generate -m "$sd" -p x --steps 1 -t 1 --auto-fit --vae-tiling --vae-tile-overlap 1 -o "$tmp/out.png"

[ "$fails" -eq 0 ] && echo "all bad input checks passed" || echo "$fails bad input checks failed"
[ "$fails" -eq 0 ]
