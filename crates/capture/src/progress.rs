//! A partition's capture progress: a small file of two slots, each rewritten in place in turn.
//!
//! It says where the next window starts: the sequence number of its first event
//! (`next_sequence`) and its start time (`window_start_ms`, which names its file). It is
//! written when a capture starts, and after each window only once that window's file is
//! durable (or, with skip-empty, once an empty window is passed over).
//!
//! # Format
//! `<hub, lower case>/<partition>.progress` holds two slots of [`SLOT_BYTES`]. A slot is
//! [`SLOT_MAGIC`], the length of its record (`u32`, little-endian), the CRC-32C of the record
//! (`u32`, little-endian) and the record: JSON with the format version, the hub, the
//! partition, a generation and the progress; zeros after it. Each save writes the slot the
//! last one did not, with the next generation, then `fdatasync`s: the file's size and names
//! never change, so no inode is created, renamed or freed per window. An atomic replace
//! (temporary file, `fsync`, `rename`, `fsync` of the directory) waits for several writes
//! instead of one, and where freed blocks are discarded, for the device's discard of the old
//! file.
//!
//! # Guarantees
//! A load takes the valid slot with the highest generation. A save torn by a crash leaves a
//! slot whose checksum fails and the other slot whole: the progress before that save, which
//! the capture's recovery already handles (a window published but not yet recorded). So
//! after a crash the file holds the old progress or the new, never a mix. A file still all
//! zeros (a crash between creating it and the first save) holds no progress.
//!
//! The first format, `<partition>.json` (one JSON document, replaced atomically), is still
//! read where no `.progress` file holds progress; the first save after it writes the slots
//! and removes it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::destination::{create_dirs_durably, sync_dir};
use crate::error::CaptureError;
use crate::limits::PROGRESS_FILE_BYTES_MAX;

/// The version of the slots' records this build writes and reads.
pub const PROGRESS_VERSION: u32 = 2;
/// The version of the first format's `.json` files, still read.
const JSON_PROGRESS_VERSION: u32 = 1;
/// The bytes of one slot: a block, so a slot's write never shares one with the other slot.
pub const SLOT_BYTES: usize = 4096;
/// What every slot starts with.
pub const SLOT_MAGIC: [u8; 4] = *b"TCP2";
/// Magic, length and checksum.
const SLOT_HEADER_BYTES: usize = 12;

/// Where the next window of one partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The sequence number of the next window's first event.
    pub next_sequence: i64,
    /// When the next window started, ms since the Unix epoch (UTC); its archive name's time.
    pub window_start_ms: i64,
}

/// A slot's record (version 2), or the whole of a `.json` file (version 1, no generation).
#[derive(Debug, Serialize, Deserialize)]
struct ProgressRecord {
    version: u32,
    hub: String,
    partition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    #[serde(flatten)]
    progress: Progress,
}

/// The progress file of one partition.
#[derive(Debug)]
pub struct ProgressStore {
    path: PathBuf,
    json_path: PathBuf,
    state_dir: PathBuf,
    hub: String,
    partition: String,
    /// The generation of the last slot loaded or saved (0: none yet).
    generation: u64,
    /// The slots' file, kept open between saves once it exists.
    file: Option<File>,
}

impl ProgressStore {
    /// The progress file of (`hub`, `partition`) in `state_dir`:
    /// `<hub, lower case>/<partition>.progress`.
    pub fn new(state_dir: &Path, hub: &str, partition: &str) -> ProgressStore {
        let dir = state_dir.join(tributary_event::names::name_key(hub));
        ProgressStore {
            path: dir.join(format!("{partition}.progress")),
            json_path: dir.join(format!("{partition}.json")),
            state_dir: state_dir.to_path_buf(),
            hub: hub.to_owned(),
            partition: partition.to_owned(),
            generation: 0,
            file: None,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recorded progress, or `None` if the capture never started.
    pub fn load(&mut self) -> Result<Option<Progress>, CaptureError> {
        self.file = None;
        self.generation = 0;
        // A file of zeros was created and never saved to (a crash right after creating it):
        // no progress was recorded in it.
        let slots = read_bounded(&self.path)?.filter(|bytes| bytes.iter().any(|&b| b != 0));
        let Some(bytes) = slots else {
            return match read_bounded(&self.json_path)? {
                Some(bytes) => self.check_json(&bytes).map(Some),
                None => Ok(None),
            };
        };
        let corrupted = |reason: String| CaptureError::Corrupted {
            path: self.path.clone(),
            reason,
        };
        let mut newest: Option<ProgressRecord> = None;
        let mut refusals = Vec::new();
        for (i, slot) in bytes.chunks(SLOT_BYTES).enumerate() {
            match decode_slot(slot) {
                Ok(record) => {
                    if newest
                        .as_ref()
                        .is_none_or(|n| record.generation > n.generation)
                    {
                        newest = Some(record);
                    }
                }
                Err(reason) => refusals.push(format!("slot {i}: {reason}")),
            }
        }
        let record = newest.ok_or_else(|| {
            corrupted(format!(
                "not a capture progress file ({})",
                refusals.join("; ")
            ))
        })?;
        let progress = self.check(&self.path, &record)?;
        self.generation = record.generation.unwrap_or(0);
        Ok(Some(progress))
    }

    /// Records `progress` durably: the slot the last save did not write, with the next
    /// generation, then `fdatasync`.
    pub fn save(&mut self, progress: Progress) -> Result<(), CaptureError> {
        assert!(progress.next_sequence >= 0);
        self.open_for_saving()?;
        let generation = self.generation + 1;
        let record = ProgressRecord {
            version: PROGRESS_VERSION,
            hub: self.hub.clone(),
            partition: self.partition.clone(),
            generation: Some(generation),
            progress,
        };
        let slot = encode_slot(&record).ok_or_else(|| CaptureError::InvalidConfig {
            setting: "hub",
            reason: format!(
                "the progress of partition {} of {} does not fit a {SLOT_BYTES}-byte slot",
                self.partition, self.hub
            ),
        })?;
        let offset = (generation % 2) * SLOT_BYTES as u64;
        let file = self.file.as_ref().expect("opened above");
        file.write_all_at(&slot, offset)
            .and_then(|()| file.sync_data())
            .map_err(|e| CaptureError::io("write", &self.path, e))?;
        self.generation = generation;
        if generation == 1 {
            // The first format's file, if the capture started under it: the slots now say
            // more than it does.
            match std::fs::remove_file(&self.json_path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CaptureError::io("remove", &self.json_path, e)),
            }
        }
        Ok(())
    }

    /// Opens the slots' file on first use: created, durably, with both slots empty; or, when
    /// it exists and nothing was loaded from it, read for its newest generation, so a save
    /// never writes a generation older than one already there.
    fn open_for_saving(&mut self) -> Result<(), CaptureError> {
        if self.file.is_none() {
            let dir = self.path.parent().unwrap_or(&self.state_dir).to_path_buf();
            std::fs::create_dir_all(&self.state_dir)
                .map_err(|e| CaptureError::io("create", &self.state_dir, e))?;
            create_dirs_durably(&self.state_dir, &dir)?;
            let created = !self.path.exists();
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(|e| CaptureError::io("open", &self.path, e))?;
            if created {
                file.set_len(2 * SLOT_BYTES as u64)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| CaptureError::io("create", &self.path, e))?;
                sync_dir(&dir)?;
            } else if self.generation == 0 {
                let bytes = read_bounded(&self.path)?.unwrap_or_default();
                self.generation = bytes
                    .chunks(SLOT_BYTES)
                    .filter_map(|slot| decode_slot(slot).ok()?.generation)
                    .max()
                    .unwrap_or(0);
            }
            self.file = Some(file);
        }
        Ok(())
    }

    /// A record's progress, once it is this build's and this partition's.
    fn check(&self, path: &Path, record: &ProgressRecord) -> Result<Progress, CaptureError> {
        let corrupted = |reason: String| CaptureError::Corrupted {
            path: path.to_path_buf(),
            reason,
        };
        if record.hub != self.hub || record.partition != self.partition {
            return Err(corrupted(format!(
                "it is the progress of partition {} of {}, not of partition {} of {}",
                record.partition, record.hub, self.partition, self.hub
            )));
        }
        if record.progress.next_sequence < 0 {
            return Err(corrupted(format!(
                "next_sequence {} is negative",
                record.progress.next_sequence
            )));
        }
        Ok(record.progress)
    }

    /// The progress of a first-format `.json` file.
    fn check_json(&self, bytes: &[u8]) -> Result<Progress, CaptureError> {
        let corrupted = |reason: String| CaptureError::Corrupted {
            path: self.json_path.clone(),
            reason,
        };
        let record: ProgressRecord = serde_json::from_slice(bytes)
            .map_err(|e| corrupted(format!("not a capture progress file: {e}")))?;
        if record.version != JSON_PROGRESS_VERSION {
            return Err(corrupted(format!(
                "version {} is not the version this build reads in a .json progress file ({JSON_PROGRESS_VERSION})",
                record.version
            )));
        }
        self.check(&self.json_path, &record)
    }
}

/// The bytes of `path`, or `None` if there is no such file; more than
/// [`PROGRESS_FILE_BYTES_MAX`] is an error.
fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, CaptureError> {
    let size = match std::fs::metadata(path) {
        Ok(metadata) => metadata.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(CaptureError::io("stat", path, e)),
    };
    if size > PROGRESS_FILE_BYTES_MAX {
        return Err(CaptureError::Corrupted {
            path: path.to_path_buf(),
            reason: format!(
                "{size} bytes is more than a progress file holds ({PROGRESS_FILE_BYTES_MAX})"
            ),
        });
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| CaptureError::io("read", path, e))
}

/// `record` as a whole slot, or `None` if it does not fit one.
fn encode_slot(record: &ProgressRecord) -> Option<Vec<u8>> {
    let json = serde_json::to_vec(record).expect("a progress record serialises");
    if json.len() > SLOT_BYTES - SLOT_HEADER_BYTES {
        return None;
    }
    let mut slot = Vec::with_capacity(SLOT_BYTES);
    slot.extend_from_slice(&SLOT_MAGIC);
    slot.extend_from_slice(&(json.len() as u32).to_le_bytes());
    slot.extend_from_slice(&crc32c::crc32c(&json).to_le_bytes());
    slot.extend_from_slice(&json);
    slot.resize(SLOT_BYTES, 0);
    Some(slot)
}

/// The record a slot holds, or why it holds none this build reads.
fn decode_slot(slot: &[u8]) -> Result<ProgressRecord, String> {
    let header = slot
        .get(..SLOT_HEADER_BYTES)
        .ok_or_else(|| format!("{} bytes, shorter than a slot's header", slot.len()))?;
    if header[..4] != SLOT_MAGIC {
        return Err("no slot magic".into());
    }
    let len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    let json = slot
        .get(SLOT_HEADER_BYTES..SLOT_HEADER_BYTES.saturating_add(len))
        .ok_or_else(|| format!("a record of {len} bytes runs past the slot"))?;
    if crc32c::crc32c(json) != crc {
        return Err("its checksum does not match (a write torn by a crash?)".into());
    }
    let record: ProgressRecord =
        serde_json::from_slice(json).map_err(|e| format!("its record is not JSON: {e}"))?;
    if record.version != PROGRESS_VERSION {
        return Err(format!(
            "version {} is not the version this build reads ({PROGRESS_VERSION})",
            record.version
        ));
    }
    if record.generation.is_none() {
        return Err("its record has no generation".into());
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(next_sequence: i64) -> Progress {
        Progress {
            next_sequence,
            window_start_ms: 1_700_000_000_000 + next_sequence,
        }
    }

    /// A state directory and the store of partition 0 of `orders` in it.
    fn orders_0() -> (tempfile::TempDir, ProgressStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = ProgressStore::new(dir.path(), "orders", "0");
        (dir, store)
    }

    /// Writes partition 0 of `orders`'s progress as the first format wrote it; returns the path.
    fn write_first_format(state_dir: &Path, progress: Progress) -> PathBuf {
        let json = state_dir.join("orders").join("0.json");
        std::fs::create_dir_all(json.parent().unwrap()).unwrap();
        let text = format!(
            r#"{{"version":1,"hub":"orders","partition":"0","next_sequence":{},"window_start_ms":{}}}"#,
            progress.next_sequence, progress.window_start_ms
        );
        std::fs::write(&json, text).unwrap();
        json
    }

    #[test]
    fn saves_alternate_slots_in_place_and_a_load_takes_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ProgressStore::new(dir.path(), "Orders", "3");
        assert_eq!(store.load().unwrap(), None);
        for n in 0..5 {
            store.save(progress(n)).unwrap();
            assert_eq!(
                std::fs::metadata(store.path()).unwrap().len(),
                2 * SLOT_BYTES as u64
            );
            let mut reopened = ProgressStore::new(dir.path(), "Orders", "3");
            assert_eq!(reopened.load().unwrap(), Some(progress(n)));
            // A store that loaded goes on from the generation it found.
            reopened.save(progress(n + 100)).unwrap();
            assert_eq!(
                ProgressStore::new(dir.path(), "Orders", "3")
                    .load()
                    .unwrap(),
                Some(progress(n + 100))
            );
            store.load().unwrap();
        }
    }

    #[test]
    fn a_store_that_saves_without_loading_goes_on_from_the_newest_generation() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = ProgressStore::new(dir.path(), "orders", "0");
        for n in 0..3 {
            first.save(progress(n)).unwrap();
        }
        let mut second = ProgressStore::new(dir.path(), "orders", "0");
        second.save(progress(7)).unwrap();
        assert_eq!(first.load().unwrap(), Some(progress(7)));
    }

    #[test]
    fn a_file_created_but_never_saved_to_holds_no_progress() {
        let (dir, mut store) = orders_0();
        std::fs::create_dir_all(dir.path().join("orders")).unwrap();
        for len in [0, 2 * SLOT_BYTES] {
            std::fs::write(store.path(), vec![0; len]).unwrap();
            assert_eq!(store.load().unwrap(), None);
        }
        // Beside a first-format file, that file still says where the capture is.
        let json = write_first_format(dir.path(), progress(5));
        assert_eq!(store.load().unwrap(), Some(progress(5)));
        store.save(progress(6)).unwrap();
        assert_eq!(store.load().unwrap(), Some(progress(6)));
        assert!(!json.exists());
    }

    #[test]
    fn a_torn_slot_leaves_the_progress_before_it() {
        let (_dir, mut store) = orders_0();
        store.save(progress(10)).unwrap();
        store.save(progress(20)).unwrap();
        // Generation 2 is in slot 0; cut its record short as a crash mid-write might.
        let mut bytes = std::fs::read(store.path()).unwrap();
        bytes[SLOT_HEADER_BYTES + 5..SLOT_BYTES].fill(0);
        std::fs::write(store.path(), &bytes).unwrap();
        assert_eq!(store.load().unwrap(), Some(progress(10)));
        // The next save overwrites the torn slot, not the good one.
        store.save(progress(30)).unwrap();
        assert_eq!(store.load().unwrap(), Some(progress(30)));
    }

    #[test]
    fn a_file_with_no_valid_slot_is_an_error_naming_it() {
        let (dir, mut store) = orders_0();
        store.save(progress(1)).unwrap();
        std::fs::write(store.path(), b"{not a progress file").unwrap();
        let error = store.load().unwrap_err().to_string();
        assert!(
            error.contains("0.progress") && error.contains("not a capture progress file"),
            "{error}"
        );
        let mut other = ProgressStore::new(dir.path(), "orders", "1");
        other.save(progress(1)).unwrap();
        std::fs::copy(other.path(), store.path()).unwrap();
        let error = store.load().unwrap_err().to_string();
        assert!(error.contains("not of partition 0"), "{error}");
    }

    #[test]
    fn a_first_format_json_file_is_read_and_replaced_by_the_first_save() {
        let dir = tempfile::tempdir().unwrap();
        let json = write_first_format(dir.path(), progress(42));
        let mut store = ProgressStore::new(dir.path(), "orders", "0");
        assert_eq!(store.load().unwrap(), Some(progress(42)));
        store.save(progress(43)).unwrap();
        assert!(!json.exists());
        assert_eq!(store.load().unwrap(), Some(progress(43)));

        std::fs::write(&json, b"{not json").unwrap();
        std::fs::remove_file(store.path()).unwrap();
        let error = store.load().unwrap_err().to_string();
        assert!(
            error.contains("0.json") && error.contains("not a capture progress file"),
            "{error}"
        );
    }
}
