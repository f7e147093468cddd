//! A private PostgreSQL schema per test (`t_<pid>_<n>_<nanos>`, selected with
//! `options=-csearch_path=...`, dropped at the end), so tests run in parallel
//! without colliding. An unreachable server FAILS the test unless
//! `DPLEDGER_SKIP_POSTGRES=1` asks to skip explicitly.

use postgres::NoTls;
use std::sync::atomic::{AtomicU64, Ordering};

const URL_ENV: &str = "DPLEDGER_TEST_POSTGRES_URL";
const SKIP_ENV: &str = "DPLEDGER_SKIP_POSTGRES";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:55432/test";

static SCHEMAS: AtomicU64 = AtomicU64::new(0);

/// A private schema on the test server, dropped when the test ends.
pub struct TestSchema {
    /// The server's URL without the schema.
    pub base: String,
    /// The schema's name.
    pub schema: String,
    /// The URL selecting the schema.
    pub url: String,
}

impl TestSchema {
    /// `None` only when the server is unreachable and skipping was asked for.
    pub fn new() -> Option<TestSchema> {
        // On a plain thread: the blocking client cannot run inside a tokio runtime.
        match std::thread::spawn(TestSchema::create).join() {
            Ok(schema) => schema,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    fn create() -> Option<TestSchema> {
        let base = std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_string());
        let mut client = match postgres::Client::connect(&base, NoTls) {
            Ok(client) => client,
            Err(e) => {
                let e = match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                };
                if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
                    eprintln!(
                        "skipping: PostgreSQL at {base} is unreachable ({e}) and {SKIP_ENV}=1"
                    );
                    return None;
                }
                panic!(
                    "PostgreSQL at {base} is unreachable: {e}. Start it (or point {URL_ENV} at \
                     one), or set {SKIP_ENV}=1 to skip the PostgreSQL tests explicitly"
                );
            }
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let schema = format!(
            "t_{}_{}_{nanos}",
            std::process::id(),
            SCHEMAS.fetch_add(1, Ordering::SeqCst)
        );
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .unwrap();
        let sep = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{sep}options=-csearch_path%3D{schema}");
        Some(TestSchema { base, schema, url })
    }

    /// A plain client whose search path is the test schema, for tampering.
    pub fn raw(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, NoTls).unwrap()
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let (base, schema) = (self.base.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(mut client) = postgres::Client::connect(&base, NoTls) {
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
            }
        })
        .join();
    }
}
