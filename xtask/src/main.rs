//! `cargo xtask`: the development entry point (see the library's documentation).

fn main() -> std::process::ExitCode {
    xtask::main(xtask::Binary::Xtask)
}
