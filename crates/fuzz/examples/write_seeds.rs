//! Writes the seeds of every target into `fuzz/corpus/<target>/seed-<n>` (replacing older seed
//! files; other corpus files are kept). Run after changing an encoder or a seed.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    for target in tributary_fuzz::TARGETS {
        let dir = corpus.join(target.name);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
            {
                std::fs::remove_file(path)?;
            }
        }
        for (i, seed) in tributary_fuzz::seeds::seeds(target.name).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed)?;
        }
    }
    Ok(())
}
