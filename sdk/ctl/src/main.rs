//! The `kairosctl` binary: see [`kairos_sdk::ctl`].

fn main() {
    kairos_sdk::ctl::main()
}
