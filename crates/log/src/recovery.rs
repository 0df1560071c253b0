//! Opening a partition directory after a clean stop or a crash.
//!
//! Sealed segments are trusted only as far as their index file agrees with the segment's length
//! (otherwise they are scanned, and any damage is an error: a sealed segment was synced before
//! it was sealed, so damage there means acknowledged data is gone, and we say so rather than
//! silently dropping it). The active segment — the last — is scanned batch by batch; the first
//! batch that fails a check ends the log, the rest is cut off and the file synced, so the
//! recovered log is exactly the longest valid prefix. A last segment whose header never made it
//! to disk (a crash while rolling) holds no events and is removed.
//!
//! Compaction (`compaction.rs`) writes the replacement of one or more segments to
//! `<base>.cleaned` and puts it in place behind a commit marker (`swap.rs`): markers are
//! followed to the end (or, torn, removed) before the segments are listed, and a `.cleaned` file
//! left after that is a rewrite that never took effect and is removed, so a crash at any point
//! of a compaction leaves each group of segments either as it was or as compaction rewrote it. A compacted segment (version 3) has an index
//! file like any sealed segment (trusted only if it names the segment's rewrite id); its
//! offsets and sequence numbers may skip, but never go back; it is never the last segment.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::LogError;
use crate::config::LogConfig;
use crate::partition::create_segment;
use crate::segment::*;
use crate::storage::{OpenMode, Storage, StorageFile};
use tributary_event::Clock;

/// Opens every segment of the partition in `dir`, recovering the active one. Always returns at
/// least one segment (creating the first for a new partition).
pub(crate) fn recover_segments(
    storage: &dyn Storage,
    dir: &Path,
    config: &LogConfig,
    clock: &dyn Clock,
) -> Result<Vec<Arc<Segment>>, LogError> {
    crate::swap::finish_interrupted(storage, dir)?;
    let mut bases = list_segments(storage, dir)?;
    discard_interrupted_creation(storage, dir, &mut bases)?;
    let mut segments: Vec<Arc<Segment>> = Vec::with_capacity(bases.len());
    for (i, &base) in bases.iter().enumerate() {
        let is_last = i + 1 == bases.len();
        let segment = open_segment(storage, dir, base, is_last, config)?;
        if let Some(prev) = segments.last()
            && let Err(e) = check_continuity(prev, &segment)
        {
            let empty = segment.contents().end_position == SEGMENT_HEADER_BYTES as u64;
            if !is_last || !empty || prev.header.is_compacted() {
                return Err(e);
            }
            let prev = segments.pop().expect("a segment before");
            segments.push(Arc::new(discard_empty_last(
                storage, dir, prev, segment, config, &e,
            )?));
            break;
        }
        segments.push(Arc::new(segment));
    }
    if segments.is_empty() {
        let header = SegmentHeader {
            version: SEGMENT_VERSION,
            base_offset: 0,
            base_sequence: 0,
            created_ms: clock.now_ms(),
            prev_last_offset: None,
            prev_last_time_ms: None,
            rewrite_id: 0,
        };
        segments.push(Arc::new(create_segment(storage, dir, header)?));
    }
    Ok(segments)
}

/// The base offsets of the segment files in `dir`, in order. Leftover temporary files and index
/// files without a segment are removed.
fn list_segments(storage: &dyn Storage, dir: &Path) -> Result<Vec<u64>, LogError> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| LogError::io("list", dir, e))?;
    let mut bases = Vec::new();
    let mut indexes = Vec::new();
    for name in names {
        if let Some(base) = parse_segment_name(&name) {
            bases.push(base);
        } else if name.ends_with(".tmp") || name.ends_with(CLEANED_SUFFIX) {
            let _ = storage.remove_file(&dir.join(name));
        } else if let Some(digits) = name.strip_suffix(".index") {
            indexes.push((digits.parse::<u64>().ok(), dir.join(&name)));
        }
    }
    bases.sort_unstable();
    for (base, path) in indexes {
        if base.is_none_or(|b| bases.binary_search(&b).is_err()) {
            let _ = storage.remove_file(&path);
        }
    }
    Ok(bases)
}

/// A crash while a segment was being created (after the previous one was sealed, before the new
/// header was synced) leaves a last file with no valid header and nothing after it. It never
/// held an event; remove it, so the segment before it becomes the active one again.
fn discard_interrupted_creation(
    storage: &dyn Storage,
    dir: &Path,
    bases: &mut Vec<u64>,
) -> Result<(), LogError> {
    let Some(&base) = bases.last() else {
        return Ok(());
    };
    let (file, path, len) = open_file(storage, dir, base)?;
    let head = read_head(file.as_ref(), &path, len)?;
    let Err(e) = SegmentHeader::decode(&head, &path) else {
        return Ok(());
    };
    if matches!(e, LogError::FormatTooNew(_)) {
        // A newer build's segment, whole: never mistaken for a torn one.
        return Err(e);
    }
    // The first segment of a partition may be torn the same way; any other lone segment was
    // created by a roll that completed, so damage to it is real.
    let may_discard = bases.len() > 1 || base == 0;
    if !may_discard || !holds_nothing_past_header(file.as_ref(), &path, len)? {
        return Err(e);
    }
    tracing::warn!(segment = %path.display(), error = %e, "removing a segment whose creation was interrupted");
    drop(file);
    storage
        .remove_file(&path)
        .map_err(|e| LogError::io("remove", &path, e))?;
    sync_dir(storage, dir)?;
    bases.pop();
    Ok(())
}

/// A segment file, its path and its length.
type OpenedFile = (Box<dyn StorageFile>, PathBuf, u64);

fn open_file(storage: &dyn Storage, dir: &Path, base: u64) -> Result<OpenedFile, LogError> {
    let path = segment_path(dir, base);
    let file = storage
        .open(&path, OpenMode::Existing)
        .map_err(|e| LogError::io("open segment", &path, e))?;
    let len = file.size().map_err(|e| LogError::io("stat", &path, e))?;
    Ok((file, path, len))
}

fn read_head(file: &dyn StorageFile, path: &Path, len: u64) -> Result<Vec<u8>, LogError> {
    let mut head = vec![0u8; (len as usize).min(SEGMENT_HEADER_BYTES)];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| LogError::io("read", path, e))?;
    Ok(head)
}

fn open_segment(
    storage: &dyn Storage,
    dir: &Path,
    base: u64,
    is_last: bool,
    config: &LogConfig,
) -> Result<Segment, LogError> {
    let (file, path, len) = open_file(storage, dir, base)?;
    let header = SegmentHeader::decode(&read_head(file.as_ref(), &path, len)?, &path)?;
    if header.base_offset != base {
        return Err(LogError::corrupted(
            &path,
            0,
            format!(
                "the file name says base offset {base}, the header says {}",
                header.base_offset
            ),
        ));
    }
    let contents = if is_last && header.is_compacted() {
        return Err(LogError::corrupted(
            &path,
            0,
            "a compacted segment is the last of the partition (compaction never rewrites the active segment)",
        ));
    } else if is_last {
        recover_active(file.as_ref(), &path, &header, len, config)?
    } else {
        load_sealed(storage, dir, file.as_ref(), &path, &header, len, config)?
    };
    Ok(Segment {
        id: next_segment_id(),
        path,
        file,
        header,
        contents: RwLock::new(contents),
    })
}

/// A last segment holding no event that does not continue the one before it: what a failed
/// sync leaves. The committer's `fdatasync` of the segment before failed and lost its bytes
/// (Linux may drop the pages and report the error once), while a roll's seal of that segment,
/// syncing the same file, was told it succeeded and created this one; the failure then cut this
/// segment back to its header, as it cuts everything unacknowledged. Nothing in or after the gap
/// was ever acknowledged (a failed sync fails every append behind it), so the empty segment is
/// removed and the one before becomes the active segment again, its tail recovered as any
/// active segment's is.
fn discard_empty_last(
    storage: &dyn Storage,
    dir: &Path,
    prev: Arc<Segment>,
    empty: Segment,
    config: &LogConfig,
    gap: &LogError,
) -> Result<Segment, LogError> {
    tracing::warn!(segment = %empty.path.display(), error = %gap, "removing an empty last segment left behind by a failed sync");
    let (path, prev_base) = (empty.path.clone(), prev.header.base_offset);
    drop((empty, prev));
    storage
        .remove_file(&path)
        .map_err(|e| LogError::io("remove", &path, e))?;
    let _ = storage.remove_file(&index_path(dir, prev_base));
    sync_dir(storage, dir)?;
    open_segment(storage, dir, prev_base, true, config)
}

fn holds_nothing_past_header(
    file: &dyn StorageFile,
    path: &Path,
    len: u64,
) -> Result<bool, LogError> {
    let mut reader = ChunkReader::new(file, path, len);
    let mut position = SEGMENT_HEADER_BYTES as u64;
    while position < len {
        let n = (len - position).min(1 << 20) as usize;
        let chunk = reader.get(position, n)?.expect("within the file");
        if chunk.iter().any(|&b| b != 0) {
            return Ok(false);
        }
        position += n as u64;
    }
    Ok(true)
}

fn recover_active(
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    len: u64,
    config: &LogConfig,
) -> Result<SegmentContents, LogError> {
    let scan = scan_segment(file, path, header, len, config.index_interval_bytes)?;
    if let Some((position, why)) = &scan.stopped {
        tracing::warn!(
            segment = %path.display(),
            position,
            reason = %why,
            "cutting off a torn or corrupt tail"
        );
    }
    let end = scan.contents.end_position;
    if len != end {
        file.set_len(end)
            .map_err(|e| LogError::io("truncate", path, e))?;
    }
    // Whatever survived becomes visible now, so make it durable first.
    file.sync_all().map_err(|e| LogError::io("sync", path, e))?;
    Ok(scan.contents)
}

/// A sealed segment (a compacted one too) is loaded from its index file if that is its own (a
/// compacted segment's rewrite id, written in both, tells it from one left by the segment it
/// replaced), else scanned whole, any damage an error, and the index file written again.
fn load_sealed(
    storage: &dyn Storage,
    dir: &Path,
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    len: u64,
    config: &LogConfig,
) -> Result<SegmentContents, LogError> {
    let index = index_path(dir, header.base_offset);
    if let Some(contents) = read_index_file(storage, &index, header, len) {
        return Ok(contents);
    }
    let scan = scan_segment(file, path, header, len, config.index_interval_bytes)?;
    if let Some((position, why)) = scan.stopped {
        return Err(LogError::corrupted(path, position, why));
    }
    if scan.contents.end_position != len {
        return Err(LogError::corrupted(
            path,
            scan.contents.end_position,
            if header.is_compacted() {
                "unwritten space inside a compacted segment"
            } else {
                "unwritten space inside a sealed segment"
            },
        ));
    }
    write_index_file(storage, &index, header, &scan.contents)?;
    Ok(scan.contents)
}

fn check_continuity(prev: &Segment, next: &Segment) -> Result<(), LogError> {
    let prev_contents = prev.contents();
    if prev.header.is_compacted() {
        return check_compacted_continuity(prev, &prev_contents, next);
    }
    let prev_end = prev.header.base_offset + prev_contents.end_position;
    if next.header.base_offset != prev_end {
        return Err(LogError::corrupted(
            &next.path,
            0,
            format!(
                "the segment starts at offset {} but the one before ends at {prev_end}",
                next.header.base_offset
            ),
        ));
    }
    if next.header.base_sequence != prev_contents.next_sequence {
        return Err(LogError::corrupted(
            &next.path,
            0,
            format!(
                "the segment starts at sequence number {} but the one before ends at {}",
                next.header.base_sequence, prev_contents.next_sequence
            ),
        ));
    }
    Ok(())
}

/// After a compacted segment the next one starts past its last kept event, in offset and in
/// sequence number (the events between were removed).
fn check_compacted_continuity(
    prev: &Segment,
    prev_contents: &SegmentContents,
    next: &Segment,
) -> Result<(), LogError> {
    let offset_ok = next.header.base_offset > prev.header.base_offset
        && prev_contents
            .last_offset
            .is_none_or(|last| last < next.header.base_offset);
    if !offset_ok {
        return Err(LogError::corrupted(
            &next.path,
            0,
            format!(
                "the segment starts at offset {} but the compacted one before holds an event at {:?}",
                next.header.base_offset, prev_contents.last_offset
            ),
        ));
    }
    if next.header.base_sequence < prev_contents.next_sequence {
        return Err(LogError::corrupted(
            &next.path,
            0,
            format!(
                "the segment starts at sequence number {} but the compacted one before ends at {}",
                next.header.base_sequence, prev_contents.next_sequence
            ),
        ));
    }
    Ok(())
}
