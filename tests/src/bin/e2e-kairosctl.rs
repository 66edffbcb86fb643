//! `kairosctl`, built inside the e2e test package.
fn main() {
    kairos_sdk::ctl::main()
}
