//! Run a `dpledger` server process on this machine, for tests, examples and local
//! experiments: start it on a free loopback port, mint tokens with its CLI, and
//! replay traces offline with it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Find the `dpledger` binary: `$DPLEDGER_BIN`; else next to the running
/// executable's build directory (`target/<profile>/dpledger` for a test in
/// `target/<profile>/deps/` or an example in `target/<profile>/examples/`); else
/// each of `fallbacks`. The error lists every place looked at.
pub fn locate_binary(fallbacks: &[PathBuf]) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    if let Some(p) = std::env::var_os("DPLEDGER_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        return Err(format!("DPLEDGER_BIN={} does not name a file", p.display()));
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/deps/<test> or target/<profile>/examples/<example>
        if let Some(profile_dir) = exe.parent().and_then(Path::parent) {
            tried.push(profile_dir.join("dpledger"));
        }
        if let Some(dir) = exe.parent() {
            tried.push(dir.join("dpledger"));
        }
    }
    tried.extend(fallbacks.iter().cloned());
    for p in &tried {
        if p.is_file() {
            return Ok(p.clone());
        }
    }
    Err(format!(
        "the dpledger server binary was not found (set DPLEDGER_BIN, or build it with \
         `cargo build --release -p dpledger`); looked at: {}",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// A running `dpledger serve` process, killed when dropped.
#[derive(Debug)]
pub struct LocalServer {
    child: Option<Child>,
    binary: PathBuf,
    data_dir: PathBuf,
    url: String,
}

impl LocalServer {
    /// Start `binary serve --listen 127.0.0.1:0 --data-dir data_dir` and wait until
    /// it listens. The error carries what the server printed when it refused.
    pub fn start(binary: &Path, data_dir: &Path) -> Result<LocalServer, String> {
        Self::start_on(binary, data_dir, "127.0.0.1:0")
    }

    /// Start listening on `listen` (e.g. a fixed port, to restart on the same URL).
    pub fn start_on(binary: &Path, data_dir: &Path, listen: &str) -> Result<LocalServer, String> {
        // stderr goes to a file: an unread pipe could fill up and stall the server.
        std::fs::create_dir_all(data_dir)
            .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
        let log_path = data_dir.join("server.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let mut child = Command::new(binary)
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data_dir)
            .env("DPLEDGER_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if let Some(url) = line.trim().strip_prefix("dpledger listening on ") {
            return Ok(LocalServer {
                child: Some(child),
                binary: binary.to_path_buf(),
                data_dir: data_dir.to_path_buf(),
                url: url.to_string(),
            });
        }
        let _ = child.wait();
        Err(format!(
            "dpledger did not start: {}{}",
            line,
            std::fs::read_to_string(&log_path).unwrap_or_default()
        ))
    }

    /// The base URL, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The admin token the server wrote on first start.
    pub fn admin_token(&self) -> Result<String, String> {
        std::fs::read_to_string(self.data_dir.join("admin.token"))
            .map(|t| t.trim().to_string())
            .map_err(|e| format!("admin token: {e}"))
    }

    /// Mint a token with `dpledger token --role role [--dataset d] [--examples 7,8]`.
    pub fn token(
        &self,
        role: &str,
        dataset: Option<&str>,
        examples: Option<&str>,
    ) -> Result<String, String> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(["token", "--role", role, "--data-dir"])
            .arg(&self.data_dir);
        if let Some(d) = dataset {
            cmd.args(["--dataset", d]);
        }
        if let Some(e) = examples {
            cmd.args(["--examples", e]);
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "dpledger token failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Mint a token covering several datasets with one role (e.g. a curator of
    /// every run of a data-dependent analysis).
    pub fn token_for(
        &self,
        role: &str,
        datasets: &[&str],
        examples: Option<&str>,
    ) -> Result<String, String> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(["token", "--role", role, "--data-dir"])
            .arg(&self.data_dir);
        for d in datasets {
            cmd.args(["--dataset", d]);
        }
        if let Some(e) = examples {
            cmd.args(["--examples", e]);
        }
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "dpledger token failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Stop the server (SIGKILL) and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `binary replay --trace trace --delta delta --json`: the offline per-example
/// epsilons of a trace, as the JSON document the CLI prints.
pub fn replay(binary: &Path, trace: &Path, delta: f64) -> Result<serde_json::Value, String> {
    let out = Command::new(binary)
        .args(["replay", "--trace"])
        .arg(trace)
        .args(["--delta", &delta.to_string(), "--json"])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "dpledger replay failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("replay output: {e}"))
}
