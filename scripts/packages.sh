# Sourced by the setup scripts: how they install system packages, as root or through sudo.
# Package managers' output goes to standard error, which leaves standard output to the
# script's own answer (setup-nvrtc.sh prints a directory there).

have() { command -v "$1" >/dev/null 2>&1; }

# as_root CMD...: runs CMD as root, directly or through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif have sudo; then
        sudo "$@"
    else
        echo "run as root, or install sudo" >&2
        exit 1
    fi
}

# apt_install PKG...: installs Debian or Ubuntu packages, without recommended extras.
apt_install() {
    as_root apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "$@" >&2
}
