//! Errors of the accounting layer: always name the argument that was wrong.

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

/// Result type of the accounting layer.
pub type Result<T> = std::result::Result<T, InvalidArgument>;
