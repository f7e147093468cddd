//! The refusal of a malformed field, named as the user spelled it: what the
//! validation of a wire type returns, on the server (which answers it as a
//! problem document naming the field) and in the client alike.

/// A rejected input. `name` is the argument (CLI flag or JSON field) at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid {name}: {reason}")]
pub struct InvalidArgument {
    /// Which argument was wrong, as the user spelled it.
    pub name: String,
    /// Why it was rejected.
    pub reason: String,
}

impl InvalidArgument {
    /// Build an error for argument `name`.
    pub fn new(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reason: reason.into(),
        }
    }

    /// The same refusal for an argument spelled `name` (a shared check
    /// applied to one of several fields).
    pub fn renamed(self, name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reason: self.reason,
        }
    }
}

/// A delta in `(0, 1)`: the rule of every delta a request gives.
pub fn check_delta(name: &str, delta: f64) -> Result<f64, InvalidArgument> {
    if delta.is_finite() && delta > 0.0 && delta < 1.0 {
        Ok(delta)
    } else {
        Err(InvalidArgument::new(
            name,
            format!("must be in (0, 1), got {delta}"),
        ))
    }
}
