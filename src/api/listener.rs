//! The connection layer of `dpledger serve`: the accept loop, with the
//! protections a public listener needs and `axum::serve` does not offer.
//!
//! * **Header timeout**: a client must send a request's complete headers within
//!   [`ConnectionConfig::header_timeout`] (hyper's own timer), or the connection is
//!   closed; a connection that sends nothing after a response is closed by the
//!   same timer.
//! * **Body timeout**: a request's whole body must arrive within
//!   [`ConnectionConfig::body_timeout`] of its headers; a half-sent body (headers
//!   with `Content-Length: 100`, then 8 bytes) is answered `408` and the
//!   connection closed ([`BodyTimedOut`], turned into a problem by the
//!   extractors).
//! * **Idle timeout**: a connection with no request in flight and no byte read or
//!   written for [`ConnectionConfig::idle_timeout`] is closed (an HTTP/2
//!   connection's streams included).
//! * **Connection limit**: at most [`ConnectionConfig::max_connections`] open at
//!   once; beyond it a new connection is answered `503` and closed at once, so
//!   that the clients already connected keep being served.
//! * **TLS** (optional): rustls with the operator's certificate and key; the
//!   handshake must finish within the header timeout.
//!
//! A slow client therefore holds one connection (of the bound) for a bounded
//! time, never a worker thread, and never blocks anyone else.

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Default `--header-timeout`: generous for any real client, short for a
/// slow-loris one.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--body-timeout`: a 64 MiB body (the default body limit) at about
/// 1 MiB/s.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--idle-timeout`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default `--max-connections` (the file-descriptor limit is raised to allow it).
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How connections are accepted and bounded (see the module note).
#[derive(Debug, Clone)]
pub struct ConnectionConfig {
    /// Time allowed for a request's headers (and a TLS handshake).
    pub header_timeout: Duration,
    /// Time allowed for a request's whole body, from its headers.
    pub body_timeout: Duration,
    /// Time a connection may stay open with nothing in flight and no traffic.
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Serve HTTPS with this rustls configuration.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            tls: None,
        }
    }
}

/// A rustls server configuration from PEM files: the certificate chain (leaf
/// first) and its private key (PKCS#8, PKCS#1 or SEC1). HTTP/2 and HTTP/1.1 are
/// offered by ALPN.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<Arc<tokio_rustls::rustls::ServerConfig>> {
    use anyhow::Context as _;
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading --tls-cert {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| {
            format!(
                "--tls-cert {} is not a PEM certificate chain",
                cert.display()
            )
        })?;
    anyhow::ensure!(
        !certs.is_empty(),
        "--tls-cert {} holds no certificate",
        cert.display()
    );
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("--tls-key {} holds no PEM private key", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("--tls-cert and --tls-key do not form a usable certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The error a request body yields once its [`ConnectionConfig::body_timeout`]
/// has passed; the extractors answer it with `408`.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within the body timeout")
    }
}

impl std::error::Error for BodyTimedOut {}

/// Whether `error` (or anything in its source chain) is [`BodyTimedOut`].
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<BodyTimedOut>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// A request body that fails with [`BodyTimedOut`] after its deadline.
struct DeadlineBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    done: bool,
}

impl http_body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if frame.is_none() {
                    self.done = true;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's traffic and requests in flight, for the idle timeout.
struct Activity {
    start: Instant,
    /// Milliseconds since `start` of the last byte read or written.
    last: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let now = self.start.elapsed().as_millis() as u64;
        Some(Duration::from_millis(
            now.saturating_sub(self.last.load(Ordering::Relaxed)),
        ))
    }
}

/// Counts a request in flight until dropped (also when the client goes away).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// An I/O stream that records its traffic in [`Activity`].
struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// What a connection beyond the limit is told before it is closed.
fn over_limit_answer() -> Vec<u8> {
    let body = "{\"type\":\"urn:dpledger:problem:too-many-connections\",\
                \"title\":\"Service Unavailable\",\"status\":503,\
                \"detail\":\"too many open connections; retry\"}";
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
         connection: close\r\nretry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serve `app` on `listener` until `shutdown` completes, then stop accepting,
/// let in-flight requests finish (idle connections are closed at once) and
/// return.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    config: ConnectionConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let config = Arc::new(config);
    let permits = Arc::new(Semaphore::new(config.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let tls = config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!("dpledger_connections_refused_total").increment(1);
            tracing::warn!(
                limit = config.max_connections,
                "connection refused: too many open connections"
            );
            if tls.is_none() {
                let _ = stream.try_write(&over_limit_answer());
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let config = config.clone();
        let tls = tls.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => serve_connection(stream, app, &config, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(config.header_timeout, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls_stream)) => {
                            serve_connection(tls_stream, app, &config, stop).await
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a permit until it is closed.
    let _ = permits.acquire_many(config.max_connections as u32).await;
    Ok(())
}

/// Serve one connection (plain or TLS) until it closes, is idle too long, or the
/// server stops.
async fn serve_connection<S>(
    stream: S,
    app: Router,
    config: &ConnectionConfig,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity {
        start: Instant::now(),
        last: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
    });
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let body_timeout = config.body_timeout;
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        service_activity.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(service_activity.clone());
        let app = app.clone();
        async move {
            let _guard = guard;
            let request = request.map(|inner| {
                Body::new(DeadlineBody {
                    inner,
                    deadline: Box::pin(tokio::time::sleep(body_timeout)),
                    done: false,
                })
            });
            app.oneshot(request).await
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    let tick = (config.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection closed with an error");
                }
                return;
            }
            changed = stop.changed(), if !closing => {
                if changed.is_err() || *stop.borrow() {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
            () = tokio::time::sleep(tick) => {
                match activity.idle_for() {
                    Some(idle) if idle >= config.idle_timeout && !closing => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    // A graceful close the client ignores: end it.
                    Some(idle) if closing && idle >= config.idle_timeout * 2 => return,
                    _ => {}
                }
            }
        }
    }
}

/// Raise this process's soft limit on open files to its hard limit, so that
/// `--max-connections` connections (and the store's files) fit; a failure only
/// logs (the limit then refuses connections sooner, never wrongly).
pub fn raise_open_files_limit(wanted: usize) {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return;
            }
            let needed = (wanted as libc::rlim_t).saturating_add(256);
            if limit.rlim_cur >= needed {
                return;
            }
            limit.rlim_cur = needed.min(limit.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("cannot raise the open-files limit");
            }
            if (limit.rlim_cur as usize) < wanted + 64 {
                tracing::warn!(
                    open_files = limit.rlim_cur,
                    max_connections = wanted,
                    "the open-files limit is below --max-connections: raise it (ulimit -n)"
                );
            }
        }
    }
}
