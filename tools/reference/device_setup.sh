# Sourced at the start of every GPU-machine run: diffusers' source (carried as .carry/diffusers.tar.xz,
# never committed) on PYTHONPATH, offline Hugging Face, unbuffered Python, work folder $W.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
mkdir -p /tmp/dsrc && tar -xJf .carry/diffusers.tar.xz -C /tmp/dsrc
export PYTHONPATH=/tmp/dsrc${PYTHONPATH:+:$PYTHONPATH}
export W=/tmp/w && mkdir -p $W
GZ=.carry/bpe_simple_vocab_16e6.txt.gz
