//! `dp`: the commands users run and ship to clusters (see the library's documentation).

fn main() -> std::process::ExitCode {
    xtask::dp_main()
}
