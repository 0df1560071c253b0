//! (Being written.)

use std::sync::Arc;

use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};
use crate::step::Step;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {}

pub(crate) fn compile_batch(
    _name: String,
    _spec: BatchSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnbatchSpec {}

pub(crate) fn compile_unbatch(
    _name: String,
    _spec: UnbatchSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}
