//! Compiling a step from its `[[step]]` table: `kind` picks the step, `name` names it (default:
//! the kind), and every other key belongs to the step, which refuses keys it does not know.
//!
//! ```toml
//! [[step]]
//! kind = "filter"
//! when = "body.temperature > 30 AND user.site = 'north'"
//! ```
//!
//! Files a step names (schemas, lookup tables, keys) are read when it is compiled, relative to
//! the task file's directory, so a task with a missing or malformed file never starts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer};

use crate::step::Step;
use crate::steps;

/// Reads an environment variable.
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What compiling a step needs besides its table.
#[derive(Clone)]
pub struct CompileContext {
    /// Relative paths in a step are relative to this directory (the task file's).
    pub base_dir: PathBuf,
    /// Reads an environment variable (keys may come from one); the process environment unless
    /// a test says otherwise.
    pub env: EnvLookup,
}

impl std::fmt::Debug for CompileContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileContext")
            .field("base_dir", &self.base_dir)
            .finish_non_exhaustive()
    }
}

impl CompileContext {
    /// Paths relative to `base_dir`, variables from the process environment.
    pub fn new(base_dir: impl Into<PathBuf>) -> CompileContext {
        CompileContext {
            base_dir: base_dir.into(),
            env: Arc::new(|name| std::env::var(name).ok()),
        }
    }

    /// `path` resolved against the base directory.
    pub fn path(&self, path: &Path) -> PathBuf {
        self.base_dir.join(path)
    }
}

/// A step table that cannot be used: which key (if one) and why, with what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", key.as_ref().map(|k| format!("{k}: ")).unwrap_or_default())]
pub struct SpecError {
    /// The key within the step's table, when the error is about one.
    pub key: Option<String>,
    /// What is wrong and what would be accepted.
    pub message: String,
}

impl SpecError {
    /// An error about `key`.
    pub fn at(key: &str, message: impl Into<String>) -> SpecError {
        SpecError {
            key: Some(key.to_owned()),
            message: message.into(),
        }
    }

    /// An error about the whole table.
    pub fn table(message: impl Into<String>) -> SpecError {
        SpecError {
            key: None,
            message: message.into(),
        }
    }
}

/// Every step kind a task file may name.
pub const KINDS: &[&str] = &[
    "filter",
    "transform",
    "transcode",
    "compress",
    "decompress",
    "batch",
    "unbatch",
    "validate",
    "enrich",
    "dedupe",
    "encrypt",
    "decrypt",
    "sign",
    "verify",
    "attest",
    "chain",
];

/// Reads a step's own keys into its spec type.
fn fields<'de, T: Deserialize<'de>, D: Deserializer<'de>>(fields: D) -> Result<T, SpecError> {
    T::deserialize(fields).map_err(|e| SpecError::table(e.to_string()))
}

/// Compiles the step of kind `kind` named `name` (default: the kind) from its other keys.
pub fn compile<'de, D: Deserializer<'de>>(
    kind: &str,
    name: Option<&str>,
    keys: D,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let name = name.unwrap_or(kind).to_owned();
    match kind {
        "filter" => steps::filter::compile(name, fields(keys)?, context),
        "transform" => steps::transform::compile(name, fields(keys)?, context),
        "transcode" => steps::transcode::compile_transcode(name, fields(keys)?, context),
        "compress" => steps::transcode::compile_compress(name, fields(keys)?, context),
        "decompress" => steps::transcode::compile_decompress(name, fields(keys)?, context),
        "batch" => steps::batch::compile_batch(name, fields(keys)?, context),
        "unbatch" => steps::batch::compile_unbatch(name, fields(keys)?, context),
        "validate" => steps::validate::compile(name, fields(keys)?, context),
        "enrich" => steps::enrich::compile(name, fields(keys)?, context),
        "dedupe" => steps::dedupe::compile(name, fields(keys)?, context),
        "encrypt" => steps::encrypt::compile_encrypt(name, fields(keys)?, context),
        "decrypt" => steps::encrypt::compile_decrypt(name, fields(keys)?, context),
        "sign" => steps::sign::compile_sign(name, fields(keys)?, context),
        "verify" => steps::sign::compile_verify(name, fields(keys)?, context),
        "attest" => steps::attest::compile(name, fields(keys)?, context),
        "chain" => steps::chain::compile(name, fields(keys)?, context),
        other => Err(SpecError::at(
            "kind",
            format!(
                "{other:?} is not a step kind; use one of {}",
                KINDS.join(", ")
            ),
        )),
    }
}
