//! The `kairosctl` binary: see [`kairos_ctl`].

fn main() {
    kairos_ctl::main()
}
