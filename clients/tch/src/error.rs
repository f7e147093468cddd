//! Errors of the trainer.

use std::fmt;

/// Everything a DP-SGD step can fail with. No step updates the model unless the
/// ledger accepted its report first, so after an error the model has not taken
/// the failed step, except after [`Error::TensorBoard`].
#[derive(Debug)]
pub enum Error {
    /// The ledger refused a report or could not be reached (after retries).
    /// Boxed: the client's error carries the server's whole problem document.
    Ledger(Box<dpledger_client::Error>),
    /// libtorch failed.
    Torch(tch::TchError),
    /// The model or data cannot be trained privately as given (e.g. a parameter
    /// outside the per-layer tape, or labels of the wrong shape).
    Model(String),
    /// The dataset's configuration does not fit this trainer (e.g. shuffled
    /// batches, where this trainer draws Poisson batches).
    Config(String),
    /// Reading data failed.
    Io(std::io::Error),
    /// The step was accepted by the ledger **and taken by the model**; only
    /// reading or writing its TensorBoard scalars failed afterwards.
    TensorBoard(Box<Error>),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Ledger(e) => write!(f, "dpledger: {e}"),
            Error::Torch(e) => write!(f, "torch: {e}"),
            Error::Model(m) => write!(f, "model: {m}"),
            Error::Config(m) => write!(f, "configuration: {m}"),
            Error::Io(e) => write!(f, "i/o: {e}"),
            Error::TensorBoard(e) => write!(f, "step taken; TensorBoard scalars not written: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Ledger(e) => Some(e.as_ref()),
            Error::Torch(e) => Some(e),
            Error::Io(e) => Some(e),
            Error::TensorBoard(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<dpledger_client::Error> for Error {
    fn from(e: dpledger_client::Error) -> Self {
        Error::Ledger(Box::new(e))
    }
}

impl From<tch::TchError> for Error {
    fn from(e: tch::TchError) -> Self {
        Error::Torch(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Result of trainer calls.
pub type Result<T> = std::result::Result<T, Error>;
