//! `kairosctl`, built inside the e2e test package.
fn main() {
    kairos_ctl::main()
}
