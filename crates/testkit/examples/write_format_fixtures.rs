//! Writes a format fixture (see `tests/formats/fixture.rs`): a data directory and stores in
//! every on-disk format this build writes, for `tests/formats.rs` to open with later builds.
//!
//! ```text
//! cargo run -p tributary-testkit --example write_format_fixtures -- crates/testkit/fixtures/formats/<name>
//! ```
//!
//! Run it when a format changes, into a new directory, and keep the directories written before:
//! each stands for the formats of the build that wrote it (record which in
//! `crates/testkit/fixtures/formats/README.md`).

#[path = "../tests/formats/fixture.rs"]
mod fixture;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: write_format_fixtures <new directory>");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    if dir.exists() {
        eprintln!("{} exists: a fixture is never rewritten", dir.display());
        std::process::exit(2);
    }
    fixture::write(&dir).await;
    println!("wrote {}", dir.display());
}
