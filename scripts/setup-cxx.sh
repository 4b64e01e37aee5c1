#!/usr/bin/env bash
# Installs a C++ compiler, which the test that runs dp-model's CUDA kernels on the CPU
# (dp-model/src/cuda/cpu_check/) compiles them with. Debian and Ubuntu (apt-get), Fedora
# (dnf); a no-op when one is there already. Run as root or with sudo available.
set -euo pipefail
. "$(dirname "$0")/packages.sh"

if have "${CXX:-c++}"; then
    echo "a C++ compiler is installed: $(command -v "${CXX:-c++}")"
    exit 0
fi

if have apt-get; then
    apt_install g++
elif have dnf; then
    as_root dnf install -y gcc-c++
else
    echo "no apt-get or dnf: install a C++ compiler (g++ or clang++) yourself" >&2
    exit 1
fi
c++ --version | head -1
