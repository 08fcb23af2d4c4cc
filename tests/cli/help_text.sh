#!/bin/bash
# The help texts say what the build does: the families `easel` runs (SDXL is detected but not
# run), the size multiple of -W/-H per family (checked against `easel plan`'s rounding: 16 for
# Z-Image / FLUX, 8 for SD), and the modules --split-mode row has rules for (the SD UNet and the
# Z-Image, FLUX.1 and FLUX.2 Klein DiTs). Usage: help_text.sh EASEL_BINARY TEST_DATA_DIR
set -u
easel="$1"
data="$2"
fails=0
check() {  # check NAME CONDITION-EXIT-STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1: $3"; fails=$((fails + 1)); fi
}

top=$("$easel" --help | head -1)
[[ "$top" == *"SD1.x/2.x"* && "$top" == *"SDXL"* && "$top" == *"FLUX.1"* && "$top" == *"FLUX.2 Klein"* && "$top" == *"Z-Image"* &&
  "$top" != *"not run"* ]]
check "easel --help names the families it runs (SDXL among them)" $? "$top"

help=$("$easel" generate --help)
w=$(grep -E "^ *-W,--width" <<<"$help")
[[ "$w" == *"8 for SD1.x/2.x"* && "$w" == *"16 for FLUX and Z-Image"* ]]
check "-W help gives the multiple per family" $? "$w"
# the multiples the help states are the ones easel rounds to (down)
z=$("$easel" plan -m "$data/reference/zimage_tiny/diffusers" -W 72 -H 40 2>/dev/null | grep -o "^job: [0-9]*x[0-9]*")
s=$("$easel" plan -m "$data/reference/sd_tiny/sd_tiny.safetensors" -W 76 -H 40 2>/dev/null | grep -o "^job: [0-9]*x[0-9]*")
[ "$z" = "job: 64x32" ] && [ "$s" = "job: 72x40" ]
check "Z-Image rounds 72x40 to 64x32 (16), SD 76x40 to 72x40 (8)" $? "Z-Image '$z', SD '$s'"

r=$(grep -A2 -E "^ *--split-mode" <<<"$help" | tr -s ' \n' ' ')
[[ "$r" == *"SD UNet"* && "$r" == *"Z-Image"* && "$r" == *"FLUX.1"* && "$r" == *"FLUX.2 Klein"* ]]
check "--split-mode help names the modules with row-split rules" $? "$r"

[ "$fails" -eq 0 ] && echo "all help text checks passed" || echo "$fails help text checks failed"
[ "$fails" -eq 0 ]
