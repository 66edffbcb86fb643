//! Generates the prost messages and tonic services. Needs no system `protoc`: the vendored
//! binary is used.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["kairos/storage/v1/records.proto", "kairos/v1/api.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    tonic_prost_build::configure().codec_path("crate::codec::KairosCodec").compile_with_config(
        config,
        &protos,
        &["."],
    )?;
    Ok(())
}
