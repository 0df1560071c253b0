//! (Being written.)

use std::sync::Arc;

use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};
use crate::step::Step;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptSpec {}

pub(crate) fn compile_encrypt(
    _name: String,
    _spec: EncryptSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecryptSpec {}

pub(crate) fn compile_decrypt(
    _name: String,
    _spec: DecryptSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}
