#!/bin/bash
# A model file's recommended sampling settings (its easel.* metadata, docs/formats.md; issue 28): with no
# sampler / scheduler / CFG / steps / size flag, `easel generate` and `easel -p` take them from the file (the
# PNG infotext says so, and the image is byte for byte the one an explicit-flags run draws), log at info
# what was taken, and a flag still wins; a bad value is refused on one line. The bundled demo model carries
# its card's settings. Usage: model_defaults.sh EASEL_BINARY TEST_DATA_DIR (python3: tools/demo-model/set_meta.py)
set -u
easel="$1"
data="$2"
src="$(cd "$data/../.." && pwd)"
sd="$data/reference/sd_tiny/sd_tiny.safetensors"
demo="$src/models/demo/easel-demo-shapes.safetensors"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}
infotext() { tr -c '[:print:]\n' ' ' < "$1" | grep -ao 'Steps: [^V]*'; }

# sd_tiny with settings unlike SD's defaults (euler_a, discrete, CFG 7, 20 steps, 512x512)
meta="$tmp/tiny_meta.safetensors"
python3 "$src/tools/demo-model/set_meta.py" "$sd" easel.sampler=dpm++2m easel.scheduler=karras easel.cfg_scale=4.5 \
  easel.steps=3 easel.width=64 easel.height=48 --out "$meta" >/dev/null
check "set_meta.py wrote the copy" $? ""

# no flags: every setting from the file
"$easel" generate -m "$meta" -p cat -n blurry -t 1 --no-cache -o "$tmp/a.png" >/dev/null 2>"$tmp/a.txt"
check "generate with the file's settings runs" $? "$(tail -n 3 "$tmp/a.txt")"
info=$(infotext "$tmp/a.png")
[[ "$info" == *"Steps: 3, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 4.5, "*"Size: 64x48"* ]]
check "infotext: Steps 3, DPM++ 2M, Karras, CFG 4.5, 64x48 from the metadata" $? "$info"
grep -q "from the model file's recommended settings (easel.\* metadata of .*tiny_meta.safetensors): sampler dpm++2m, scheduler karras, 3 steps, CFG scale 4.5, width 64, height 48" "$tmp/a.txt"
check "info line names what was taken from the file" $? "$(grep -i 'recommended' "$tmp/a.txt")"

# the same settings as flags: the same bytes
"$easel" generate -m "$meta" -p cat -n blurry -t 1 --no-cache --sampling-method dpm++2m --scheduler karras --cfg-scale 4.5 \
  --steps 3 -W 64 -H 48 -o "$tmp/b.png" >/dev/null 2>"$tmp/b.txt"
cmp -s "$tmp/a.png" "$tmp/b.png"
check "image identical to the explicit-flags run" $? "$(cmp "$tmp/a.png" "$tmp/b.png" 2>&1)"
! grep -q "recommended settings" "$tmp/b.txt"
check "nothing taken from the file when every flag is given" $? "$(grep 'recommended' "$tmp/b.txt")"

# the flat form (sd-cli style, no `generate`) takes them too
"$easel" -m "$meta" -p cat -n blurry -t 1 --no-cache -o "$tmp/c.png" >/dev/null 2>&1
cmp -s "$tmp/a.png" "$tmp/c.png"
check "easel -m FILE -p ... (flat form) = the same image" $? "$(infotext "$tmp/c.png")"

# a flag wins over its key; the other keys still apply
"$easel" generate -m "$meta" -p cat -n blurry -t 1 --no-cache --steps 2 --cfg-scale 6 -W 32 --sampling-method euler \
  -o "$tmp/d.png" >/dev/null 2>"$tmp/d.txt"
info=$(infotext "$tmp/d.png")
[[ "$info" == *"Steps: 2, Sampler: Euler, Schedule type: Karras, CFG scale: 6, "*"Size: 32x48"* ]]
check "flags win (steps 2, euler, CFG 6, width 32); scheduler and height from the file" $? "$info"

# without the keys: SD's defaults as before (euler_a, 20 steps, CFG 7)
"$easel" generate -m "$sd" -p cat -t 1 --no-cache -W 64 -H 64 --steps 1 -o "$tmp/e.png" >/dev/null 2>"$tmp/e.txt"
info=$(infotext "$tmp/e.png")
[[ "$info" == *"Sampler: Euler a, Schedule type: Normal, CFG scale: 7, "* ]] && ! grep -q "recommended settings" "$tmp/e.txt"
check "a file without easel.* keys keeps the family's defaults" $? "$info"

# a bad value: one line naming the key and the fix, nothing written
for kv in easel.steps=0 easel.sampler=nonesuch easel.cfg_scale=-1 easel.width=100 easel.scheduler=sometimes; do
  python3 "$src/tools/demo-model/set_meta.py" "$sd" "$kv" --out "$tmp/bad.safetensors" >/dev/null
  rm -f "$tmp/out.png"
  err=$("$easel" generate -m "$tmp/bad.safetensors" -p cat -t 1 --no-cache -o "$tmp/out.png" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -ne 0 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] && [[ "$err" == *"metadata ${kv%%=*} = \"${kv#*=}\" is not"* ]] \
    && [[ "$err" == *"set_meta.py"* ]] && [ ! -e "$tmp/out.png" ]
  check "bad $kv refused on one line" $? "exit $rc: $err"
done

# the bundled demo model carries its card's settings (euler, discrete, 256x256; steps given here to keep it short)
"$easel" -m "$demo" -p "a red circle" -t 1 --no-cache --steps 1 -o "$tmp/demo.png" >/dev/null 2>"$tmp/demo.txt"
info=$(infotext "$tmp/demo.png")
cfg=$(python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; print(json.loads(f.read(n))['__metadata__']['easel.cfg_scale'])" "$demo")
[[ "$info" == *"Steps: 1, Sampler: Euler, Schedule type: Normal, CFG scale: $cfg, "*"Size: 256x256"* ]]
check "demo model: Euler, Normal, CFG $cfg, 256x256 from its metadata" $? "$info; $(grep -i 'recommended' "$tmp/demo.txt")"

[ "$fails" -eq 0 ] && echo "all model-defaults checks passed" || echo "$fails model-defaults checks failed"
[ "$fails" -eq 0 ]
