#!/usr/bin/env bash
# Installs nasm, with which the JPEG decoder (libjpeg-turbo, built from source by
# mozjpeg-sys) compiles its SIMD kernels: without it the build still works, on the plain C
# kernels, about 1.5x slower (dp-data/README.md). Debian and Ubuntu (apt-get), Fedora (dnf);
# a no-op when it is there already. Run as root or with sudo available. Run it before the first
# build: cargo builds the decoder once, and rebuilds it only when told (`cargo clean -p
# mozjpeg-sys`).
set -euo pipefail
. "$(dirname "$0")/packages.sh"

if have nasm; then
    echo "nasm is installed: $(nasm -v)"
    exit 0
fi

if have apt-get; then
    apt_install nasm
elif have dnf; then
    as_root dnf install -y nasm
else
    echo "no apt-get or dnf: install nasm yourself (the JPEG decoder builds without it, slower)" >&2
    exit 1
fi
nasm -v
