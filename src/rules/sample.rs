//! The values PromQL evaluation passes between its parts: a label set, one element of an
//! instant vector, and dropping the metric name. Plain data at the bottom of `rules/`, so that
//! [`super::eval`], [`super::binary`] and [`super::functions`] import it and not one another's
//! types; it must not import any of them.

use std::sync::Arc;

use super::history::Labels;

/// A label set, sorted by name.
pub(super) type LabelSet = Vec<(String, String)>;

/// One element of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

/// The labels without `__name__` (what arithmetic and `bool` comparisons return).
pub(super) fn drop_name(labels: &Labels) -> Labels {
    if labels.first().is_some_and(|(k, _)| k == "__name__") {
        Arc::new(labels[1..].to_vec())
    } else {
        labels.clone()
    }
}
