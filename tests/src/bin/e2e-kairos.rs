//! `kairos`, built inside the e2e test package.
fn main() -> std::process::ExitCode {
    kairos_actors::cli::main()
}
