#!/usr/bin/env bash
# Installs NVRTC (CUDA's run-time compiler, no GPU needed) so that the CUDA kernels can be
# compiled on a CPU machine, from the `nvidia-cuda-nvrtc` Python wheel pinned to the GPU
# machine's CUDA (13.0: PTX from a newer NVRTC names a PTX version its driver refuses). Puts it
# in a virtual environment under ${DP_NVRTC_DIR:-~/.cache/dp-nvrtc} and prints the directory
# that holds libnvrtc.so, for LD_LIBRARY_PATH. Installs python3-venv with apt-get if needed.
set -euo pipefail
. "$(dirname "$0")/packages.sh"

dir="${DP_NVRTC_DIR:-$HOME/.cache/dp-nvrtc}"
find_lib() { find "$dir" -name 'libnvrtc.so.*' -not -name '*alt*' -printf '%h\n' 2>/dev/null | head -1; }

if [ -z "$(find_lib)" ]; then
    if ! python3 -m venv "$dir" >/dev/null 2>&1; then
        apt_install python3-venv
        python3 -m venv "$dir"
    fi
    "$dir/bin/pip" install -q 'nvidia-cuda-nvrtc==13.0.*' >&2
fi
lib=$(find_lib)
[ -n "$lib" ] || { echo "libnvrtc.so not found under $dir after installing" >&2; exit 1; }
echo "$lib"
