//! Generates the prost code. Needs no system `protoc`: the vendored binary is used.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    let protos = ["kairos/storage/v1/records.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    config.compile_protos(&protos, &["."])?;
    Ok(())
}
