//! Cursors: opaque, tamper-proof, expiring tokens that say where a reader is.
//!
//! A cursor is `base64url(payload ‖ tag)` where the tag is HMAC-SHA256 (truncated to 128 bits)
//! over the payload under a server key kept in `<data_dir>/http-cursor.key`, so cursors survive
//! a restart and nobody without the key can make or change one. The payload, big-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 1 | format version (1) |
//! | 1 | kind: 1 partition cursor, 2 group cursor |
//! | 8 | expiry, ms since the epoch (i64) |
//! | 2 + n | stream name (u16 length, UTF-8) |
//! | partition: 8, 4, 8 | the stream's creation time (so a recreated stream's cursors fail), partition (u32), next offset (i64) |
//! | group: 2 + n, 2 + n, 8, 8, 1, 4 | group, instance, member epoch, answer count, commit-on-get (0/1), timeout ms |
//!
//! Decoding checks the tag before reading any field (constant-time), then reads strictly:
//! every length is bounded, booleans are 0 or 1, and trailing bytes are an error.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tributary_groups::Session;

use crate::limits::{CURSOR_KEY_BYTES, CURSOR_TAG_BYTES};

const VERSION: u8 = 1;
const KIND_PARTITION: u8 = 1;
const KIND_GROUP: u8 = 2;
/// No legitimate cursor is longer (three 256-byte names and fixed fields, base64-encoded).
const CURSOR_CHARS_MAX: usize = 2048;
/// The longest name field (stream, group, instance).
const NAME_BYTES_MAX: usize = 256;

/// Where a partition reader is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionCursor {
    pub stream: String,
    pub hub_created_ms: i64,
    pub partition: u32,
    /// The next offset (sequence number) to read.
    pub offset: i64,
}

/// A decoded cursor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cursor {
    Partition(PartitionCursor),
    Group(Session),
}

/// Why a cursor was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CursorError {
    #[error("the cursor is not a cursor this service issued ({0})")]
    Malformed(&'static str),
    #[error("the cursor is not a cursor this service issued (its signature does not match)")]
    Forged,
    #[error(
        "the cursor expired {ago_ms} ms ago (cursors are valid for five minutes); create a new one"
    )]
    Expired { ago_ms: i64 },
}

/// The key cursors are authenticated with.
#[derive(Clone)]
pub(crate) struct CursorKey([u8; CURSOR_KEY_BYTES]);

impl std::fmt::Debug for CursorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorKey(..)")
    }
}

/// Why the cursor key cannot be read or made. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CursorKeyError {
    /// The file holds something else than a key.
    #[error("{}: expected {CURSOR_KEY_BYTES} bytes, found {found}; delete it to make a new key (outstanding cursors become invalid)", path.display())]
    Length {
        /// The file.
        path: PathBuf,
        /// How many bytes it holds.
        found: usize,
    },
    /// The file cannot be read.
    #[error("read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The system has no randomness to make a key with.
    #[error("no randomness for the cursor key: {0}")]
    Random(getrandom::Error),
    /// A new key cannot be written.
    #[error("write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl CursorKey {
    /// Reads the key from `<data_dir>/http-cursor.key`, creating it (random, mode 0600) if absent.
    pub(crate) fn load_or_create(data_dir: &Path) -> Result<CursorKey, CursorKeyError> {
        let path = data_dir.join("http-cursor.key");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key: [u8; CURSOR_KEY_BYTES] =
                    bytes
                        .as_slice()
                        .try_into()
                        .map_err(|_| CursorKeyError::Length {
                            path: path.clone(),
                            found: bytes.len(),
                        })?;
                Ok(CursorKey(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::create(&path),
            Err(source) => Err(CursorKeyError::Read { path, source }),
        }
    }

    fn create(path: &Path) -> Result<CursorKey, CursorKeyError> {
        let mut key = [0u8; CURSOR_KEY_BYTES];
        getrandom::fill(&mut key).map_err(CursorKeyError::Random)?;
        let tmp = path.with_extension("key.tmp");
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let write = || -> std::io::Result<()> {
            let mut file = options.open(&tmp)?;
            file.write_all(&key)?;
            file.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|source| CursorKeyError::Write {
            path: path.to_owned(),
            source,
        })?;
        Ok(CursorKey(key))
    }

    pub(crate) fn from_bytes(key: [u8; CURSOR_KEY_BYTES]) -> Self {
        CursorKey(key)
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }

    /// Encodes a cursor valid until `expires_at_ms`.
    pub(crate) fn encode(&self, cursor: &Cursor, expires_at_ms: i64) -> String {
        let mut out = vec![VERSION];
        match cursor {
            Cursor::Partition(c) => {
                out.push(KIND_PARTITION);
                out.extend_from_slice(&expires_at_ms.to_be_bytes());
                put_str(&mut out, &c.stream);
                out.extend_from_slice(&c.hub_created_ms.to_be_bytes());
                out.extend_from_slice(&c.partition.to_be_bytes());
                out.extend_from_slice(&c.offset.to_be_bytes());
            }
            Cursor::Group(s) => {
                out.push(KIND_GROUP);
                out.extend_from_slice(&expires_at_ms.to_be_bytes());
                put_str(&mut out, &s.stream);
                put_str(&mut out, &s.group);
                put_str(&mut out, &s.instance);
                out.extend_from_slice(&s.epoch.to_be_bytes());
                out.extend_from_slice(&s.token.to_be_bytes());
                out.push(u8::from(s.commit_on_get));
                out.extend_from_slice(&s.timeout_ms.to_be_bytes());
            }
        }
        let mut mac = self.mac();
        mac.update(&out);
        out.extend_from_slice(&mac.finalize().into_bytes()[..CURSOR_TAG_BYTES]);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// Decodes and checks a cursor at wall time `now_ms`.
    pub(crate) fn decode(&self, text: &str, now_ms: i64) -> Result<Cursor, CursorError> {
        if text.len() > CURSOR_CHARS_MAX {
            return Err(CursorError::Malformed("too long"));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(text)
            .map_err(|_| CursorError::Malformed("not base64url"))?;
        let Some(split) = bytes.len().checked_sub(CURSOR_TAG_BYTES) else {
            return Err(CursorError::Malformed("too short"));
        };
        let (payload, tag) = bytes.split_at(split);
        let mut mac = self.mac();
        mac.update(payload);
        // `hmac` compares the tag with `subtle::ConstantTimeEq`: in time independent of where
        // a forged tag differs.
        mac.verify_truncated_left(tag)
            .map_err(|_| CursorError::Forged)?;
        let (expires_at_ms, cursor) = parse(payload)?;
        if now_ms > expires_at_ms {
            return Err(CursorError::Expired {
                ago_ms: now_ms - expires_at_ms,
            });
        }
        Ok(cursor)
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    assert!(
        s.len() <= NAME_BYTES_MAX,
        "names are validated before a cursor is made"
    );
    let len = u16::try_from(s.len()).expect("checked above");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A strict reader over an authenticated payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CursorError> {
        let (head, rest) = self
            .0
            .split_at_checked(n)
            .ok_or(CursorError::Malformed("truncated"))?;
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CursorError> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }

    fn u8(&mut self) -> Result<u8, CursorError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, CursorError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CursorError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, CursorError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool, CursorError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CursorError::Malformed("bad flag")),
        }
    }

    fn string(&mut self) -> Result<String, CursorError> {
        let len = usize::from(u16::from_be_bytes(self.array()?));
        if len > NAME_BYTES_MAX {
            return Err(CursorError::Malformed("name too long"));
        }
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| CursorError::Malformed("bad name"))
    }

    fn finish(self) -> Result<(), CursorError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(CursorError::Malformed("trailing bytes"))
        }
    }
}

pub(crate) fn parse(payload: &[u8]) -> Result<(i64, Cursor), CursorError> {
    let mut r = Reader(payload);
    if r.u8()? != VERSION {
        return Err(CursorError::Malformed("unknown version"));
    }
    let kind = r.u8()?;
    let expires_at_ms = r.i64()?;
    let stream = r.string()?;
    let cursor = match kind {
        KIND_PARTITION => Cursor::Partition(PartitionCursor {
            stream,
            hub_created_ms: r.i64()?,
            partition: r.u32()?,
            offset: r.i64()?,
        }),
        KIND_GROUP => Cursor::Group(Session {
            stream,
            group: r.string()?,
            instance: r.string()?,
            epoch: r.u64()?,
            token: r.u64()?,
            commit_on_get: r.bool()?,
            timeout_ms: r.u32()?,
        }),
        _ => return Err(CursorError::Malformed("unknown kind")),
    };
    r.finish()?;
    Ok((expires_at_ms, cursor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CursorKey {
        CursorKey::from_bytes([7; CURSOR_KEY_BYTES])
    }

    fn cursors() -> Vec<Cursor> {
        vec![
            Cursor::Partition(PartitionCursor {
                stream: "orders".into(),
                hub_created_ms: 1_700_000_000_123,
                partition: 3,
                offset: 42,
            }),
            Cursor::Group(Session {
                stream: "orders".into(),
                group: "billing".into(),
                instance: "9f1c-a".into(),
                epoch: 17,
                token: 4,
                commit_on_get: true,
                timeout_ms: 30_000,
            }),
        ]
    }

    #[test]
    fn round_trips_until_it_expires() {
        for c in cursors() {
            let text = key().encode(&c, 1000);
            assert_eq!(key().decode(&text, 1000), Ok(c.clone()));
            assert_eq!(
                key().decode(&text, 1001),
                Err(CursorError::Expired { ago_ms: 1 })
            );
        }
    }

    #[test]
    fn another_key_or_any_changed_byte_is_refused() {
        for c in cursors() {
            let text = key().encode(&c, 1000);
            let other = CursorKey::from_bytes([8; CURSOR_KEY_BYTES]);
            assert_eq!(other.decode(&text, 0), Err(CursorError::Forged));
            let bytes = URL_SAFE_NO_PAD.decode(&text).unwrap();
            for i in 0..bytes.len() {
                for bit in [0x01u8, 0x80] {
                    let mut tampered = bytes.clone();
                    tampered[i] ^= bit;
                    let result = key().decode(&URL_SAFE_NO_PAD.encode(&tampered), 0);
                    assert_eq!(result, Err(CursorError::Forged), "byte {i}");
                }
            }
            for cut in 0..bytes.len() {
                let result = key().decode(&URL_SAFE_NO_PAD.encode(&bytes[..cut]), 0);
                assert!(result.is_err(), "cut at {cut}");
            }
        }
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for text in [
            "",
            "!!!",
            "AAAA",
            &"A".repeat(5000),
            "a b",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        ] {
            assert!(key().decode(text, 0).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_validly_signed_but_malformed_payload_is_refused() {
        // Authentic tags over bad payloads: the strict parser still refuses them.
        for payload in [
            vec![2u8],
            vec![1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vec![1, 1],
        ] {
            let mut mac = key().mac();
            mac.update(&payload);
            let mut bytes = payload.clone();
            bytes.extend_from_slice(&mac.finalize().into_bytes()[..CURSOR_TAG_BYTES]);
            let result = key().decode(&URL_SAFE_NO_PAD.encode(&bytes), 0);
            assert!(
                matches!(result, Err(CursorError::Malformed(_))),
                "{result:?}"
            );
        }
    }

    #[test]
    fn random_bytes_never_decode() {
        proptest::proptest!(|(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200))| {
            proptest::prop_assert!(key().decode(&URL_SAFE_NO_PAD.encode(&bytes), 0).is_err());
        });
    }

    #[test]
    fn the_key_persists() {
        let dir = tempfile::tempdir().unwrap();
        let a = CursorKey::load_or_create(dir.path()).unwrap();
        let b = CursorKey::load_or_create(dir.path()).unwrap();
        assert_eq!(a.0, b.0);
        std::fs::write(dir.path().join("http-cursor.key"), b"short").unwrap();
        assert!(CursorKey::load_or_create(dir.path()).is_err());
    }
}
