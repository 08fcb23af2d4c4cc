#!/bin/bash
# Staged in-painting (issue 20, the Vulkan user's section-5 sequence): encode-prompt, encode-image
# -i IMAGE, denoise --load-latent INIT --mask MASK, decode give the same final latent (bit for bit)
# and the same pixels as one `generate -i IMAGE --mask MASK`; on SD (sd_tiny) and FLUX.2 Klein
# (klein_tiny); Klein's edit mode staged (denoise -r) likewise. denoise --mask without an
# encode-image latent is refused.
# Usage: stages_inpaint.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
png() { python3 "$(dirname "$0")/lib/pngtool.py" "$@"; }
# the data bytes of every tensor of a safetensors file (not its metadata): equal latents
tensors_sha() {
  python3 - "$1" <<'PY'
import hashlib, json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
d = hashlib.sha256()
for k in sorted(h):
    if k == "__metadata__": continue
    s, e = h[k]["data_offsets"]
    d.update(k.encode()); d.update(b[8 + n + s:8 + n + e])
print(d.hexdigest())
PY
}
png make "$tmp/init.png" 96 64 gradient
png make "$tmp/mask.png" 96 64 mask

staged_equals_generate() {  # NAME MODEL-FLAGS...
  local name="$1"
  shift
  local m=("$@" -t 1 --no-cache -s 5 --steps 3 --strength 0.8)
  if ! "$easel" generate "${m[@]}" -p "a red cat" -i "$tmp/init.png" --mask "$tmp/mask.png" -o "$tmp/gen.png" \
    --save-latent "$tmp/gen.latent" >"$tmp/gen.log" 2>&1; then
    echo "FAIL $name: generate: $(grep -m1 error "$tmp/gen.log")"
    fails=$((fails + 1))
    return
  fi
  if "$easel" encode-prompt "${m[@]}" -p "a red cat" --save-embeddings "$tmp/cond" >"$tmp/s.log" 2>&1 &&
    "$easel" encode-image "${m[@]}" -i "$tmp/init.png" --save-latent "$tmp/init.latent" >>"$tmp/s.log" 2>&1 &&
    "$easel" denoise "${m[@]}" --load-embeddings "$tmp/cond" --load-latent "$tmp/init.latent" --mask "$tmp/mask.png" \
      --save-latent "$tmp/den.latent" >>"$tmp/s.log" 2>&1 &&
    "$easel" decode "${m[@]}" --load-latent "$tmp/den.latent" -o "$tmp/dec.png" >>"$tmp/s.log" 2>&1; then
    if [ "$(tensors_sha "$tmp/gen.latent")" = "$(tensors_sha "$tmp/den.latent")" ]; then
      echo "ok   $name: the staged in-painting's latent equals generate's bit for bit"
    else
      echo "FAIL $name: the staged in-painting's latent differs from generate's"
      fails=$((fails + 1))
    fi
  else
    echo "FAIL $name: a stage failed: $(grep -m1 error "$tmp/s.log")"
    fails=$((fails + 1))
  fi
}

staged_equals_generate "SD (sd_tiny)" -m "$data/reference/sd_tiny/sd_tiny.safetensors"
staged_equals_generate "FLUX.2 Klein (klein_tiny)" -m "$data/reference/klein_tiny/diffusers"

# FLUX.2 Klein edit mode staged: denoise -r REF (the family encodes the reference in the stage) gives
# generate -r REF's latent bit for bit
k=(-m "$data/reference/klein_tiny/diffusers" -t 1 --no-cache -s 9 --steps 2 -W 64 -H 64)
ref0="$data/reference/klein_tiny/ref0.png"
if "$easel" generate "${k[@]}" -p "the cat" -r "$ref0" -o "$tmp/e.png" --save-latent "$tmp/e.latent" >"$tmp/e.log" 2>&1 &&
  "$easel" encode-prompt "${k[@]}" -p "the cat" --save-embeddings "$tmp/ec" >"$tmp/es.log" 2>&1 &&
  "$easel" denoise "${k[@]}" --load-embeddings "$tmp/ec" -r "$ref0" --save-latent "$tmp/ed.latent" >>"$tmp/es.log" 2>&1; then
  if [ "$(tensors_sha "$tmp/e.latent")" = "$(tensors_sha "$tmp/ed.latent")" ]; then
    echo "ok   FLUX.2 Klein denoise -r: generate -r's latent bit for bit"
  else
    echo "FAIL FLUX.2 Klein denoise -r: the latent differs from generate -r's"
    fails=$((fails + 1))
  fi
else
  echo "FAIL FLUX.2 Klein -r staged: $(grep -hm1 error "$tmp/e.log" "$tmp/es.log")"
  fails=$((fails + 1))
fi

# denoise --mask without an encode-image latent: refused
"$easel" encode-prompt -m "$data/reference/sd_tiny/sd_tiny.safetensors" -t 1 -p x --save-embeddings "$tmp/c2" >/dev/null 2>&1
err=$("$easel" denoise -m "$data/reference/sd_tiny/sd_tiny.safetensors" -t 1 --load-embeddings "$tmp/c2" --mask "$tmp/mask.png" \
  --save-latent "$tmp/out.latent" 2>&1 >/dev/null)
if [ $? -eq 1 ] && [[ "$err" == *"error: --mask needs an init image"* ]] && [ ! -e "$tmp/out.latent" ]; then
  echo "ok   denoise --mask without --load-latent: refused"
else
  echo "FAIL denoise --mask without --load-latent: $err"
  fails=$((fails + 1))
fi

[ "$fails" -eq 0 ] && echo "all staged in-painting checks passed" || echo "$fails staged in-painting checks failed"
[ "$fails" -eq 0 ]
