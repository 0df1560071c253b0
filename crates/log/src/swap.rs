//! Replacing one or more consecutive sealed segments by the one segment compaction wrote for
//! them, atomically, and finishing a replacement a crash interrupted.
//!
//! The new segment is `<first base>.cleaned`, written and synced by compaction. When it replaces
//! one segment, renaming it over `<base>.log` is atomic by itself and the directory sync after
//! is the commit point. When it replaces several:
//! 1. a marker `<first base>.swap` is written and synced, naming the new segment's rewrite id
//!    and the base offsets of the other segments it replaces; the directory sync after it is
//!    the commit point;
//! 2. `<first base>.cleaned` is renamed over `<first base>.log`, the other segments and their
//!    index files are removed, and the directory synced;
//! 3. the new segment's index file is written, the marker removed and the directory synced.
//!
//! # What it guarantees
//! A crash before the commit point leaves the old segments (recovery removes the `.cleaned`
//! file and a marker whose checksum fails); a crash after it leaves a marker that recovery
//! ([`finish_interrupted`]) follows to the end, whatever of step 2 had happened: it renames the
//! `.cleaned` file only if it is the one the marker names (its rewrite id), removes the other
//! segments only once that one is in place, and removals of files already gone are fine. So the partition holds either all the old segments or the new
//! one, never a mix. A marker left behind (step 3 failed) is harmless: following it again
//! renames nothing (no `.cleaned` file has its id) and removes nothing that exists.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tributary_event::format::check_format_version;

use crate::LogError;
use crate::partition::PartitionShared;
use crate::record::Reader;
use crate::segment::*;
use crate::storage::{OpenMode, Storage, StorageFile, read_whole};

const MARKER_MAGIC: [u8; 8] = *b"TRIBSWP\0";
const MARKER_VERSION: u32 = 1;
const MARKER_VERSION_AT: usize = MARKER_MAGIC.len();
const MARKER_REWRITE_ID_AT: usize = MARKER_VERSION_AT + 4;
const MARKER_COUNT_AT: usize = MARKER_REWRITE_ID_AT + 4;
const MARKER_BASES_AT: usize = MARKER_COUNT_AT + 4;
/// Each replaced segment's base offset takes 8 bytes; a CRC32C of everything before ends it.
const MARKER_BASE_BYTES: usize = 8;
const MARKER_CRC_BYTES: usize = 4;

/// The ending of a replacement's marker.
pub(crate) const MARKER_SUFFIX: &str = ".swap";

fn marker_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}{MARKER_SUFFIX}"))
}

/// What a marker says: the new segment's rewrite id and the other segments it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Marker {
    rewrite_id: u32,
    doomed: Vec<u64>,
}

impl Marker {
    fn encode(&self) -> Vec<u8> {
        let count = u32::try_from(self.doomed.len()).expect("a group holds few segments");
        let mut b = Vec::with_capacity(MARKER_BASES_AT + self.doomed.len() * MARKER_BASE_BYTES);
        b.extend_from_slice(&MARKER_MAGIC);
        b.extend_from_slice(&MARKER_VERSION.to_le_bytes());
        b.extend_from_slice(&self.rewrite_id.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        debug_assert_eq!(b.len(), MARKER_BASES_AT);
        for base in &self.doomed {
            b.extend_from_slice(&base.to_le_bytes());
        }
        let crc = crate::checksum::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` for anything but a whole, checksummed marker.
    fn decode(b: &[u8]) -> Option<Marker> {
        if b.len() < MARKER_BASES_AT + MARKER_CRC_BYTES || b[..MARKER_VERSION_AT] != MARKER_MAGIC {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - MARKER_CRC_BYTES);
        if crate::checksum::crc32c(body).to_le_bytes() != crc {
            return None;
        }
        let mut r = Reader::new(&body[MARKER_VERSION_AT..]);
        let version = r.u32("marker version").ok()?;
        let rewrite_id = r.u32("rewrite id").ok()?;
        let count = r.u32("marker count").ok()? as usize;
        if version != MARKER_VERSION || r.left() != count.checked_mul(MARKER_BASE_BYTES)? {
            return None;
        }
        let doomed = (0..count)
            .map(|_| r.u64("replaced base offset").ok())
            .collect::<Option<Vec<u64>>>()?;
        Some(Marker { rewrite_id, doomed })
    }
}

/// The segment compaction wrote, synced at `cleaned`, to replace `inputs`.
pub(crate) struct Replacement {
    pub cleaned: PathBuf,
    pub file: Box<dyn StorageFile>,
    pub header: SegmentHeader,
    pub contents: SegmentContents,
}

/// Replaces `inputs` (consecutive sealed segments of the partition, oldest first) by
/// `replacement` on disk (see the module doc) and in the segment list; returns the new segment.
///
/// A failure before the commit point leaves the old segments and the log healthy; a failure
/// after it poisons the partition (the disk holds the new segment, or will after recovery).
pub(crate) fn replace(
    shared: &PartitionShared,
    inputs: &[Arc<Segment>],
    replacement: Replacement,
) -> Result<Arc<Segment>, LogError> {
    assert!(!inputs.is_empty());
    let storage = shared.storage.as_ref();
    let dir = &shared.dir;
    let base = inputs[0].header.base_offset;
    assert_eq!(replacement.header.base_offset, base);
    assert!(replacement.header.is_compacted());
    let marker = Marker {
        rewrite_id: replacement.header.rewrite_id,
        doomed: inputs[1..].iter().map(|s| s.header.base_offset).collect(),
    };
    let marker_path = marker_path(dir, base);
    let single = marker.doomed.is_empty();
    if single {
        // One segment for one: the rename is atomic by itself, and the directory sync after
        // it is the commit point; no marker is needed.
        if let Err(e) = storage.rename(&replacement.cleaned, &segment_path(dir, base)) {
            let _ = storage.remove_file(&replacement.cleaned);
            return Err(LogError::io("rename", &replacement.cleaned, e));
        }
    } else if let Err(e) = commit(storage, dir, &marker_path, &marker) {
        let _ = storage.remove_file(&marker_path);
        let _ = storage.remove_file(&replacement.cleaned);
        return Err(e);
    }
    let rolled = if single {
        sync_dir(storage, dir)
    } else {
        roll_forward(storage, dir, base, &marker)
    };
    if let Err(e) = rolled {
        // The disk holds the old segments or the new one (recovery decides): never both.
        shared.poison(&e.to_string());
        return Err(e);
    }
    let segment = Arc::new(Segment {
        id: next_segment_id(),
        path: segment_path(dir, base),
        file: replacement.file,
        header: replacement.header,
        contents: RwLock::new(replacement.contents),
    });
    swap_in(shared, inputs, &segment);
    let index = index_path(dir, base);
    let contents = segment.contents();
    // If this fails, the next open scans the segment and writes its index.
    let mut tidied = write_index_file(storage, &index, &segment.header, &contents);
    if !single {
        tidied = tidied
            .and_then(|()| remove(storage, &marker_path))
            .and_then(|()| sync_dir(storage, dir));
    }
    if let Err(e) = tidied {
        tracing::warn!(error = %e, "cannot tidy up after replacing compacted segments");
    }
    Ok(segment)
}

/// Writes and syncs the marker, then syncs the directory: the commit point.
fn commit(storage: &dyn Storage, dir: &Path, path: &Path, marker: &Marker) -> Result<(), LogError> {
    storage
        .open(path, OpenMode::Replace)
        .and_then(|f| {
            f.write_all_at(&marker.encode(), 0)
                .and_then(|()| f.sync_all())
        })
        .map_err(|e| LogError::io("write", path, e))?;
    sync_dir(storage, dir)
}

/// Puts `segment` in place of `inputs` in the segment list.
fn swap_in(shared: &PartitionShared, inputs: &[Arc<Segment>], segment: &Arc<Segment>) {
    let mut segments = shared.segments.write().expect("segments lock");
    let i = segments
        .iter()
        .position(|s| Arc::ptr_eq(s, &inputs[0]))
        .expect("only compaction replaces sealed segments");
    for (k, input) in inputs.iter().enumerate() {
        assert!(
            segments.get(i + k).is_some_and(|s| Arc::ptr_eq(s, input)),
            "the replaced segments are consecutive"
        );
    }
    assert!(
        i + inputs.len() < segments.len(),
        "the active segment is never compacted"
    );
    segments.splice(i..i + inputs.len(), [segment.clone()]);
}

/// Step 2 of the module doc, as the marker says; safe to repeat.
fn roll_forward(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    marker: &Marker,
) -> Result<(), LogError> {
    let cleaned = cleaned_path(dir, base);
    let path = segment_path(dir, base);
    if rewrite_id_of(storage, &cleaned) == Some(marker.rewrite_id) {
        storage
            .rename(&cleaned, &path)
            .map_err(|e| LogError::io("rename", &cleaned, e))?;
    }
    if rewrite_id_of(storage, &path) != Some(marker.rewrite_id) {
        // The new segment is neither beside the old one nor in its place: the commit did not
        // fully reach the disk. The old segments stay, all of them.
        tracing::warn!(segment = %path.display(), "a compaction marker without its segment");
        return Ok(());
    }
    for &doomed in &marker.doomed {
        remove(storage, &segment_path(dir, doomed))?;
        remove(storage, &index_path(dir, doomed))?;
    }
    sync_dir(storage, dir)
}

/// The rewrite id in the header of the compacted segment file at `path`, if it is one.
fn rewrite_id_of(storage: &dyn Storage, path: &Path) -> Option<u32> {
    let file = storage.open(path, OpenMode::Read).ok()?;
    let mut head = [0u8; SEGMENT_HEADER_BYTES];
    file.read_exact_at(&mut head, 0).ok()?;
    let header = SegmentHeader::decode(&head, path).ok()?;
    header.is_compacted().then_some(header.rewrite_id)
}

/// Removes a file; one already gone is fine.
fn remove(storage: &dyn Storage, path: &Path) -> Result<(), LogError> {
    match storage.remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LogError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Refuses a marker a newer build wrote (its magic holds and its version is higher): it may be
/// past its commit point, so discarding it as torn could lose the replacement.
fn refuse_newer(b: &[u8], path: &Path) -> Result<(), LogError> {
    if b.len() < MARKER_REWRITE_ID_AT || b[..MARKER_VERSION_AT] != MARKER_MAGIC {
        return Ok(());
    }
    let version = &b[MARKER_VERSION_AT..MARKER_REWRITE_ID_AT];
    let version = u32::from_le_bytes(version.try_into().expect("4 bytes"));
    let what = format_args!("compaction marker {}", path.display());
    check_format_version(what, version.into(), MARKER_VERSION.into())?;
    Ok(())
}

/// Finishes every replacement whose marker is in `dir` (committed: it rolls forward) and
/// removes markers that never were (a torn or checksum-failing one). Runs before the segments
/// are listed; `.cleaned` files left after it are rewrites that never took effect.
pub(crate) fn finish_interrupted(storage: &dyn Storage, dir: &Path) -> Result<(), LogError> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| LogError::io("list", dir, e))?;
    let mut bases: Vec<u64> = names
        .iter()
        .filter_map(|name| name.strip_suffix(MARKER_SUFFIX)?.parse().ok())
        .collect();
    bases.sort_unstable();
    for base in bases {
        let path = marker_path(dir, base);
        let bytes = read_whole(storage, &path).ok();
        if let Some(bytes) = &bytes {
            refuse_newer(bytes, &path)?;
        }
        match bytes.and_then(|b| Marker::decode(&b)) {
            Some(marker) => {
                tracing::warn!(marker = %path.display(), "finishing an interrupted compaction");
                roll_forward(storage, dir, base, &marker)?;
            }
            None => {
                tracing::warn!(marker = %path.display(), "discarding an uncommitted compaction");
            }
        }
        remove(storage, &path)?;
        sync_dir(storage, dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_round_trips_and_a_torn_one_is_refused() {
        let marker = Marker {
            rewrite_id: 9,
            doomed: vec![4096, 8192],
        };
        let b = marker.encode();
        assert_eq!(Marker::decode(&b), Some(marker));
        for len in 0..b.len() {
            assert_eq!(Marker::decode(&b[..len]), None, "{len} bytes");
        }
        let mut damaged = b.clone();
        damaged[MARKER_BASES_AT] ^= 1;
        assert_eq!(Marker::decode(&damaged), None);
        // A newer build's marker is refused, not discarded as torn.
        let path = Path::new("0.swap");
        assert!(refuse_newer(&b, path).is_ok());
        let mut newer = b;
        newer[MARKER_VERSION_AT..MARKER_REWRITE_ID_AT].copy_from_slice(&2u32.to_le_bytes());
        let refused = refuse_newer(&newer, path).unwrap_err().to_string();
        assert!(
            refused.starts_with(
                "compaction marker 0.swap was written by format 2; this binary reads up to format 1"
            ),
            "{refused}"
        );
    }
}
