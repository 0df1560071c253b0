//! (Being written.)

use std::sync::Arc;

use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};
use crate::step::Step;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignSpec {}

pub(crate) fn compile_sign(
    _name: String,
    _spec: SignSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifySpec {}

pub(crate) fn compile_verify(
    _name: String,
    _spec: VerifySpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}
