//! Running a state change to completion. Shared by every route module that
//! changes a dataset (so that none of them has to import another).

use super::problem::{ApiResult, Problem};
use axum::http::StatusCode;

/// Run a state change on its own task so that it completes even if the client
/// disconnects: once a change is in the log it must also be applied in memory.
pub async fn run_to_completion<T: Send + 'static, E: Into<Problem> + Send + 'static>(
    change: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> ApiResult<T> {
    tokio::spawn(change)
        .await
        .map_err(|_| {
            Problem::internal(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the change's task failed",
            )
        })?
        .map_err(Into::into)
}
