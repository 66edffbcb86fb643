//! The `kairos` binary: see [`kairos_actors::cli`].

fn main() -> anyhow::Result<()> {
    kairos_actors::cli::main()
}
