# GPU-machine run 6 (proposed by run 5, NOT run yet): run 4's recipe (full length) with run 5's fix,
# offset noise 0.3: text encoder + UNet from scratch, VAE of the shipped file. Writes the model in two
# parts, the summary (accuracy at 4 CFG scales, the measured-check test's prompts), samples and the
# parity references (tests/data/reference/demo) made at the best CFG.
# Usage (repo root, $OUT set): bash tools/reference/device_call6.sh   (run tool: timeout_s 560,
# carry [".carry/diffusers.tar.xz", ".carry/demo-vae.safetensors"]; about 480 s)
UNET_TIME=${UNET_TIME:-340} EXTRA="--offset-noise 0.3" bash tools/reference/device_call4.sh
