#!/usr/bin/env bash
# Installs s3s-fs, the S3-compatible server (over a local directory) that dp-data's object
# storage tests and bench start on 127.0.0.1. Built from crates.io with cargo, into cargo's bin
# directory; a no-op when that version is there already. 0.14.1 is the newest release that
# builds with Rust 1.95 (0.15 and later need 1.96).
#
#   bash scripts/setup-s3.sh            a debug build: the tests need a server that works, not
#                                       a fast one, and it builds in about half the time
#   bash scripts/setup-s3.sh --release  a release build, for `cargo xtask bench data --filter
#                                       objects`: the server shares the cores the training
#                                       uses, and a debug build takes three times as many
set -euo pipefail

VERSION=0.14.1
case "${1:-}" in
    "") want=dev; flags=(--debug) ;;
    --release) want=release; flags=() ;;
    *) echo "usage: $0 [--release]" >&2; exit 2 ;;
esac
home="${CARGO_HOME:-$HOME/.cargo}"
bin="$home/bin/s3s-fs"
# The profile cargo recorded when it installed this version ("dev" or "release").
installed=$(grep -o "\"s3s-fs $VERSION [^}]*\"profile\":\"[a-z]*\"" "$home/.crates2.json" 2>/dev/null |
    grep -o '"profile":"[a-z]*"' | cut -d'"' -f4 || true)
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$VERSION" &&
    { [ "$want" = dev ] || [ "$installed" = release ]; }; then
    echo "s3s-fs $VERSION (${installed:-unknown} build) is installed: $bin"
    exit 0
fi
cargo install --quiet --force "${flags[@]}" --locked --version "$VERSION" --features binary s3s-fs >&2
"$bin" --version
