#!/usr/bin/env bash
# Installs s3s-fs, the S3-compatible server (over a local directory) that dp-data's object
# storage tests start on 127.0.0.1 (dp-data/tests/s3). Built from crates.io with cargo, into
# cargo's bin directory; a no-op when that version is there already. 0.14.1 is the newest
# release that builds with Rust 1.95 (0.15 and later need 1.96).
set -euo pipefail
. "$(dirname "$0")/packages.sh"

VERSION=0.14.1
bin="${CARGO_HOME:-$HOME/.cargo}/bin/s3s-fs"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$VERSION"; then
    echo "s3s-fs $VERSION is installed: $bin"
    exit 0
fi
# A debug build: the tests need a server that works, not a fast one, and it builds in about
# half the time. The bench's figures come from a release build (`cargo install s3s-fs
# --version 0.14.1 --features binary`).
cargo install --quiet --debug --locked --version "$VERSION" --features binary s3s-fs >&2
"$bin" --version
