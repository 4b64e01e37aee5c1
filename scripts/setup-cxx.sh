#!/usr/bin/env bash
# Installs a C++ compiler, which the test that runs dp-model's CUDA kernels on the CPU
# (dp-model/src/cuda/cpu_check.rs) compiles them with. Debian and Ubuntu (apt-get), Fedora
# (dnf); a no-op when one is there already. Run as root or with sudo available.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have "${CXX:-c++}"; then
    echo "a C++ compiler is installed: $(command -v "${CXX:-c++}")"
    exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    have sudo || { echo "run as root, or install sudo" >&2; exit 1; }
    sudo="sudo"
fi

if have apt-get; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends g++
elif have dnf; then
    $sudo dnf install -y gcc-c++
else
    echo "no apt-get or dnf: install a C++ compiler (g++ or clang++) yourself" >&2
    exit 1
fi
c++ --version | head -1
