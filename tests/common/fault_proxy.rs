//! A fault-injecting TCP proxy between the server and PostgreSQL:
//! it forwards both ways, reads the client's side of the wire protocol, and
//! when armed cuts the next write transaction's connection at its `COMMIT`:
//! before any of it reaches the database, in the middle of the message, or
//! after the database received all of it (its answer is then withheld). It can
//! also play a database that is down (every connection refused or cut).
//!
//! A write transaction is one that a plain `START TRANSACTION` (or `BEGIN`)
//! simple query opened (the store's writer, `Client::transaction`); readers
//! open theirs with `START TRANSACTION ISOLATION LEVEL ... READ ONLY` and are
//! never cut.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Where the next write transaction's connection is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Before any byte of `COMMIT` is forwarded: the database rolls back.
    Before,
    /// After half of the `COMMIT` message: the database sees a broken message
    /// and rolls back.
    During,
    /// After the whole `COMMIT`: the database commits; its answer never
    /// reaches the server.
    After,
}

#[derive(Default)]
struct State {
    armed: Option<Cut>,
    fired: u32,
    down: bool,
    live: Vec<TcpStream>,
}

/// The proxy, listening on a loopback port until the test ends.
pub struct FaultProxy {
    /// `127.0.0.1:port` to connect to instead of the database.
    pub addr: String,
    state: Arc<Mutex<State>>,
}

impl FaultProxy {
    /// Start forwarding to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let (st, upstream) = (state.clone(), upstream.to_string());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if st.lock().unwrap().down {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut s = st.lock().unwrap();
                    s.live.push(client.try_clone().unwrap());
                    s.live.push(server.try_clone().unwrap());
                }
                let swallow = Arc::new(AtomicBool::new(false));
                let (c2, s2, sw2) = (
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    swallow.clone(),
                );
                std::thread::spawn(move || replies(s2, c2, sw2));
                let st2 = st.clone();
                std::thread::spawn(move || requests(client, server, swallow, st2));
            }
        });
        FaultProxy { addr, state }
    }

    /// `url` (a `postgres://` URL) with its host and port replaced by the proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let user = authority
            .rsplit_once('@')
            .map(|(u, _)| format!("{u}@"))
            .unwrap_or_default();
        format!("{scheme}://{user}{}{tail}", self.addr)
    }

    /// The host and port of a `postgres://` URL (port 5432 when absent).
    pub fn upstream_of(url: &str) -> String {
        let rest = url.split_once("://").unwrap().1;
        let authority = rest.split(['/', '?']).next().unwrap();
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if host.contains(':') {
            host.to_string()
        } else {
            format!("{host}:5432")
        }
    }

    /// Cut the next write transaction at its COMMIT.
    pub fn arm(&self, cut: Cut) {
        self.state.lock().unwrap().armed = Some(cut);
    }

    /// How many cuts were made so far (an armed cut not yet made is not counted).
    pub fn fired(&self) -> u32 {
        self.state.lock().unwrap().fired
    }

    /// Whether a cut is armed and not yet made.
    pub fn armed(&self) -> bool {
        self.state.lock().unwrap().armed.is_some()
    }

    /// Play a database that is down (`true`: cut every connection, refuse new
    /// ones) or up again.
    pub fn set_down(&self, down: bool) {
        let mut s = self.state.lock().unwrap();
        s.down = down;
        if down {
            for c in s.live.drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

/// The database's answers to the client, unless a cut after COMMIT withholds them.
fn replies(mut server: TcpStream, mut client: TcpStream, swallow: Arc<AtomicBool>) {
    let mut buf = [0u8; 16384];
    loop {
        let n = match server.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if swallow.load(Ordering::SeqCst) || client.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}

/// The client's messages to the database, parsed so that `BEGIN` and `COMMIT`
/// are seen whatever the segmentation.
fn requests(
    mut client: TcpStream,
    mut server: TcpStream,
    swallow: Arc<AtomicBool>,
    state: Arc<Mutex<State>>,
) {
    let mut pending: Vec<u8> = Vec::new();
    let mut started = false;
    let mut in_write = false;
    let mut buf = [0u8; 16384];
    'outer: loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            // The startup message has no type byte; every later one has.
            let header = if started { 5 } else { 4 };
            if pending.len() < header {
                break;
            }
            let len_at = if started { 1 } else { 0 };
            let len = u32::from_be_bytes(pending[len_at..len_at + 4].try_into().unwrap()) as usize;
            let total = len_at + len;
            if pending.len() < total {
                break;
            }
            let message: Vec<u8> = pending.drain(..total).collect();
            if !started {
                started = true;
            } else if message[0] == b'Q' {
                let text = String::from_utf8_lossy(&message[5..]).to_ascii_uppercase();
                let text = text.trim_matches(|c: char| c == '\0' || c.is_whitespace());
                if text == "BEGIN" || text == "START TRANSACTION" {
                    in_write = true;
                } else if text == "COMMIT" && in_write {
                    in_write = false;
                    let cut = {
                        let mut s = state.lock().unwrap();
                        let cut = s.armed.take();
                        if cut.is_some() {
                            s.fired += 1;
                        }
                        cut
                    };
                    match cut {
                        None => {}
                        Some(Cut::Before) => break 'outer,
                        Some(Cut::During) => {
                            let _ = server.write_all(&message[..message.len() / 2]);
                            std::thread::sleep(std::time::Duration::from_millis(50));
                            break 'outer;
                        }
                        Some(Cut::After) => {
                            swallow.store(true, Ordering::SeqCst);
                            let _ = server.write_all(&message);
                            // Let the database finish the commit before it sees EOF.
                            std::thread::sleep(std::time::Duration::from_millis(300));
                            break 'outer;
                        }
                    }
                } else if text == "ROLLBACK" {
                    in_write = false;
                }
            }
            if server.write_all(&message).is_err() {
                break 'outer;
            }
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}
