#!/usr/bin/env bash
# Installs what training across processes needs: Open MPI (runtime, headers, mpirun) and
# libclang (the `mpi` crate generates its bindings with bindgen). Debian and Ubuntu (apt-get),
# Fedora (dnf); a no-op when everything is there already. Run as root or with sudo available.
set -euo pipefail
. "$(dirname "$0")/packages.sh"

libclang_present() {
    ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'
}

if have mpicc && have mpirun && libclang_present; then
    echo "Open MPI and libclang are installed"
    exit 0
fi

if have apt-get; then
    apt_install libopenmpi-dev openmpi-bin libclang-dev
elif have dnf; then
    as_root dnf install -y openmpi-devel clang-devel
    echo "Fedora puts Open MPI in a module: run 'module load mpi/openmpi-x86_64' before building"
else
    echo "no apt-get or dnf: install Open MPI (headers and mpirun) and libclang yourself" >&2
    exit 1
fi
mpirun --version | head -1
