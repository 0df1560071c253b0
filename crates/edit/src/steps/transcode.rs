//! (Being written.)

use std::sync::Arc;

use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};
use crate::step::Step;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscodeSpec {}

pub(crate) fn compile_transcode(
    _name: String,
    _spec: TranscodeSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressSpec {}

pub(crate) fn compile_compress(
    _name: String,
    _spec: CompressSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecompressSpec {}

pub(crate) fn compile_decompress(
    _name: String,
    _spec: DecompressSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}
