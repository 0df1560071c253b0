//! The condition language of filters and routes. (Being written: see the brief.)

use crate::item::Item;
use crate::step::Context;

/// A condition that could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConditionError {
    /// What is wrong, and what would be accepted.
    pub message: String,
}

/// A compiled condition.
#[derive(Debug, Clone)]
pub struct Condition {}

impl Condition {
    /// Compiles `text`.
    pub fn parse(text: &str) -> Result<Condition, ConditionError> {
        Err(ConditionError {
            message: format!("{text:?}: conditions are not built yet"),
        })
    }

    /// Whether `item`, read from `context.partition`, satisfies the condition.
    pub fn matches(&self, _context: &Context<'_>, _item: &Item) -> bool {
        false
    }
}
