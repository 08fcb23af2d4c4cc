#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root: unpacks the carried .debs under /tmp/deps and
# the carried ggml (.carry/ggml.tar.xz, made by `tar -C third_party -cJf .carry/ggml.tar.xz ggml`), then
# configures and builds easel with ggml's CUDA backend for Hopper into build-cuda/.
# Carry: .carry (debs, ggml.tar.xz). Env: TARGETS (default: easel + the benches), EXTRA_CMAKE,
# GRAPHS (ON/OFF, default ON: ggml's CUDA graphs; GGML_CUDA_DISABLE_GRAPHS=1 turns them off at run time).
# Afterwards source tools/device/env.sh for LD_LIBRARY_PATH.
set -eo pipefail
root="$(pwd)"
mkdir -p /tmp/deps
for f in .carry/debs/*.deb; do dpkg -x "$f" /tmp/deps; done
# absolute links (libz.so -> /lib/...) point into /tmp/deps instead
find /tmp/deps -type l -lname '/*' | while read -r l; do ln -sfn "/tmp/deps$(readlink "$l")" "$l"; done
if [ ! -f third_party/ggml/.easel-ggml-commit ]; then mkdir -p third_party && tar -C third_party -xJf .carry/ggml.tar.xz; fi
source tools/device/env.sh
command -v pkg-config >/dev/null || export PKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DEASEL_CUDA=ON -DEASEL_BENCH=ON -DEASEL_TESTS=${TESTS:-OFF} \
  -DEASEL_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_CUDA_GRAPHS=${GRAPHS:-ON} \
  -DCMAKE_PREFIX_PATH=/tmp/deps/usr -DOPENSSL_ROOT_DIR=/tmp/deps/usr ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE=$PKG_CONFIG_EXECUTABLE} \
  ${EXTRA_CMAKE:-} > build-cuda.configure.log 2>&1 || { tail -40 build-cuda.configure.log; exit 1; }
cmake --build build-cuda -j "$(nproc)" --target ${TARGETS:-easel easel_bench easel_bench_upscale easel_bench_zimage easel_bench_flux} -- -k 0 2>&1 | grep -E "error|Error|FAILED|warning: unused" | head -40
test -x build-cuda/bin/easel
