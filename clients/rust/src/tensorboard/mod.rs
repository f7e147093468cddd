//! TensorBoard scalars of a training run's privacy, written without
//! TensorFlow or libtorch: [`SummaryWriter`] appends `tensorflow.Event` records
//! ([`event`]) in TFRecord framing ([`record`]) to an `events.out.tfevents.*` file
//! in a log directory, which TensorBoard reads like tensorboardX's.
//! [`privacy_scalars`] reads what a trainer's token may read (the worst case and
//! the latest DP release) under the same tags as the Python client
//! (`dpledger.tensorboard`), so runs of either compare in one TensorBoard.
//! [`read_events`] reads a file back (checksums verified), for tests and tools.

pub mod event;
mod privacy;
pub mod record;

pub use event::{Event, What};
pub use privacy::{privacy_scalars, quantile_tag, PREFIX};

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Distinguishes writers opened by one process in the same second.
static OPENED: AtomicU64 = AtomicU64::new(0);

/// Appends scalar events to a new event file in a log directory.
#[derive(Debug)]
pub struct SummaryWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn hostname() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

impl SummaryWriter {
    /// Create `logdir` if needed and a new file
    /// `events.out.tfevents.{seconds}.{host}.{pid}.{n}` in it, starting with the
    /// `file_version` header TensorBoard expects.
    pub fn new(logdir: impl AsRef<Path>) -> io::Result<Self> {
        let logdir = logdir.as_ref();
        fs::create_dir_all(logdir)?;
        let wall_time = now();
        let name = format!(
            "events.out.tfevents.{}.{}.{}.{}",
            wall_time as u64,
            hostname(),
            std::process::id(),
            OPENED.fetch_add(1, Ordering::Relaxed)
        );
        let path = logdir.join(name);
        let file = File::options().write(true).create_new(true).open(&path)?;
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        writer.write_event(&Event {
            wall_time,
            step: 0,
            what: What::FileVersion(event::FILE_VERSION.into()),
        })?;
        writer.flush()?;
        Ok(writer)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One scalar at `step` (stored as f32, as TensorBoard does).
    pub fn add_scalar(&mut self, tag: &str, value: f64, step: u64) -> io::Result<()> {
        self.add_scalars(&[(tag.to_string(), value)], step)
    }

    /// Several scalars at `step`, in one event.
    pub fn add_scalars(&mut self, scalars: &[(String, f64)], step: u64) -> io::Result<()> {
        let step = i64::try_from(step)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "step exceeds i64"))?;
        let values = scalars
            .iter()
            .map(|(tag, v)| (tag.clone(), *v as f32))
            .collect();
        self.write_event(&Event {
            wall_time: now(),
            step,
            what: What::Scalars(values),
        })
    }

    /// Write one event (any payload).
    pub fn write_event(&mut self, event: &Event) -> io::Result<()> {
        record::write_record(&mut self.out, &event.encode())
    }

    /// Push buffered events to the file, so TensorBoard sees them now.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Every event of an event file, in order; an error when a record's checksum
/// does not match or an event does not decode.
pub fn read_events(path: impl AsRef<Path>) -> io::Result<Vec<Event>> {
    let mut input = BufReader::new(File::open(path)?);
    let mut out = Vec::new();
    while let Some(data) = record::read_record(&mut input)? {
        out.push(Event::decode(&data)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = SummaryWriter::new(dir.path().join("run")).unwrap();
        w.add_scalar("privacy/worst_case_epsilon", 1.25, 3).unwrap();
        w.add_scalars(&[("a".into(), 0.1), ("b".into(), 2.0)], 4)
            .unwrap();
        w.flush().unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        let events = read_events(w.path()).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].what, What::FileVersion("brain.Event:2".into()));
        assert_eq!(
            events[1].what,
            What::Scalars(vec![("privacy/worst_case_epsilon".into(), 1.25)])
        );
        assert_eq!(events[1].step, 3);
        assert_eq!(
            events[2].what,
            What::Scalars(vec![("a".into(), 0.1f32), ("b".into(), 2.0)])
        );
        assert!(events[2].wall_time >= events[0].wall_time && events[0].wall_time > 1.6e9);
        // Two writers on one directory never share a file.
        let w2 = SummaryWriter::new(dir.path().join("run")).unwrap();
        assert_ne!(w2.path(), w.path());
    }
}
