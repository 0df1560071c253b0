//! (Being written.)

use std::sync::Arc;

use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};
use crate::step::Step;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {}

pub(crate) fn compile(
    _name: String,
    _spec: TransformSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Err(SpecError::table("not built yet"))
}
