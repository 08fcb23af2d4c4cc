# Sourced by the command tests that run small jobs on the tiny reference models of tests/data
# (flags_honest.sh, flags_honest_cases.sh). Needs $easel and $ref (TEST_DATA_DIR/reference).

# model_of FAMILY: the model flags of the tiny model of FAMILY (sd, sdxl, zimage, flux1, klein)
model_of() {
  case "$1" in
    sd) echo "-m $ref/sd_tiny/sd_tiny.safetensors" ;;
    sdxl) echo "-m $ref/sdxl_tiny/sdxl_tiny.safetensors" ;;
    zimage) echo "-m $ref/zimage_tiny/diffusers" ;;
    flux1) echo "-m $ref/flux1_tiny/diffusers" ;;
    klein) echo "-m $ref/klein_tiny/diffusers" ;;
  esac
}
# run FAMILY OUT LOG ARGS...: a small job (64x64, 1 step, one thread, no cache), output in LOG
run() {
  local fam="$1" out="$2" log="$3"
  shift 3
  # shellcheck disable=SC2046
  "$easel" generate $(model_of "$fam") -p "a red cat" -W 64 -H 64 --steps 1 -s 3 -t 1 --no-cache -o "$out" "$@" >"$log" 2>&1
}
