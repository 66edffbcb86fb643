//! The `kairos` binary: see [`kairos_actors::cli`].

/// mimalloc, not the system allocator: the node allocates many small, short-lived buffers
/// (keys, records, messages) from several threads, where glibc's allocator spent over half of
/// the request threads' time (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    kairos_actors::cli::main()
}
