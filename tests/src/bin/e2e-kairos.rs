//! `kairos`, built inside the e2e test package.
fn main() -> anyhow::Result<()> {
    kairos_actors::cli::main()
}
