//! The on-disk format fixtures under `crates/testkit/fixtures/formats/` (see its README): data
//! directories and stores written by earlier builds, which every later build must open.
//!
//! [`format_fixtures`] lists them; [`copy_of`] copies one into a temporary directory, so that
//! opening it (which upgrades in place) leaves the fixture as its build wrote it.

use std::path::{Path, PathBuf};

/// Every fixture directory, oldest name first.
pub fn format_fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/formats");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("the fixtures directory")
        .map(|entry| entry.expect("a fixture").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixtures in {}", root.display());
    dirs
}

/// A copy of the fixture directory `fixture` in a temporary directory.
pub fn copy_of(fixture: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("a temporary directory");
    copy_dir(fixture, copy.path());
    copy
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("list a fixture directory") {
        let entry = entry.expect("a fixture file");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            copy_dir(&entry.path(), &target);
            continue;
        }
        std::fs::copy(entry.path(), &target).expect("copy a fixture file");
        if entry.file_name() == tributary_amqp::policies::POLICIES_FILE {
            // Git keeps no file mode but the executable bit; the data directory's policies
            // file, which holds keys, was private (mode 0600), as `serve` requires.
            use std::os::unix::fs::PermissionsExt;
            let private = std::fs::Permissions::from_mode(0o600);
            std::fs::set_permissions(&target, private).expect("make the policies private");
        }
    }
}
