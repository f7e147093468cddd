//! A TCP proxy that loses the server's answer to chosen requests, so tests can see
//! what the client does when a request was handled but its answer never arrived.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `upstream` that forwards everything, except that for the first
/// `drop` requests containing `marker` it closes the connection as soon as the
/// server starts answering, so the client never sees those answers (the server has
/// fully handled them). Returns its address and the number of answers dropped.
pub async fn answer_dropping_proxy(
    upstream: SocketAddr,
    marker: &'static [u8],
    drop: usize,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let budget = Arc::new(AtomicUsize::new(drop));
    let dropped = Arc::new(AtomicUsize::new(0));
    let counter = dropped.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let (budget, counter) = (budget.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                relay(client, server, marker, budget, counter).await;
            });
        }
    });
    (addr, dropped)
}

async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    marker: &[u8],
    budget: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
) {
    let (mut cbuf, mut sbuf) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    let mut armed = false;
    loop {
        tokio::select! {
            r = client.read(&mut cbuf) => {
                let n = match r { Ok(0) | Err(_) => return, Ok(n) => n };
                if !armed
                    && cbuf[..n].windows(marker.len()).any(|w| w == marker)
                    && budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1)).is_ok()
                {
                    armed = true;
                }
                if server.write_all(&cbuf[..n]).await.is_err() {
                    return;
                }
            }
            r = server.read(&mut sbuf) => {
                let n = match r { Ok(0) | Err(_) => return, Ok(n) => n };
                if armed {
                    // Both sockets close here: the answer is lost.
                    dropped.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if client.write_all(&sbuf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

pub fn socket_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .parse()
        .expect("server address")
}
