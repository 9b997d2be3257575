//! Durability for `--state-dir`: a write-ahead log of every accepted write, synced to
//! disk before the write is acknowledged, compacted now and then into a snapshot.
//!
//! Both files are JSON lines. A run killed mid-append leaves at most one torn line at
//! the end of the log; it was never acknowledged, so opening drops it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::object_key::ObjectKey;

/// A failure reading or writing the state dir.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}:{line}: not a state record: {reason}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// One logged write.
pub struct Record {
    line: Vec<u8>,
}

impl Record {
    /// The object stored at `key` at resourceVersion `rv`.
    pub fn put(key: &ObjectKey, rv: u64, object: &[u8]) -> Self {
        let mut line = header(key, rv);
        line.extend_from_slice(b",\"o\":");
        line.extend_from_slice(object);
        line.extend_from_slice(b"}\n");
        Record { line }
    }

    /// The object at `key` deleted at resourceVersion `rv`.
    pub fn delete(key: &ObjectKey, rv: u64) -> Self {
        let mut line = header(key, rv);
        line.extend_from_slice(b",\"o\":null}\n");
        Record { line }
    }
}

fn header(key: &ObjectKey, rv: u64) -> Vec<u8> {
    let head = json!({"rv": rv, "s": key.storage, "ns": key.namespace, "n": key.name}).to_string();
    // Drop the closing brace so the object can follow without re-serialising it.
    head.as_bytes()[..head.len() - 1].to_vec()
}

const LOG: &str = "wal.log";
const SNAPSHOT: &str = "snapshot.jsonl";
const COMPACT_AFTER_BYTES: u64 = 64 << 20;

/// The open state dir.
pub struct Persist {
    dir: PathBuf,
    log: File,
    log_bytes: u64,
    snapshot_bytes: u64,
}

type Loaded = (Persist, Vec<(ObjectKey, Value)>, u64);

impl Persist {
    /// Opens (creating if needed) the state dir and returns the objects it holds with
    /// the highest resourceVersion written.
    pub fn open(dir: &Path) -> Result<Loaded, PersistError> {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let mut objects = std::collections::BTreeMap::new();
        let snapshot_path = dir.join(SNAPSHOT);
        let mut resource_version = 0;
        let mut snapshot_bytes = 0;
        if snapshot_path.exists() {
            snapshot_bytes = fs::metadata(&snapshot_path)
                .map_err(|e| io_error(&snapshot_path, e))?
                .len();
            resource_version = read_lines(
                &snapshot_path,
                false,
                |line, n| {
                    if n == 1 {
                        return Ok(Entry::Version(field_u64(line, "resourceVersion")?));
                    }
                    Ok(Entry::Object(key_of(line)?, line.get("o").cloned()))
                },
                &mut objects,
            )?;
        }
        let log_path = dir.join(LOG);
        if log_path.exists() {
            let floor = resource_version;
            let last = read_lines(
                &log_path,
                true,
                |line, _| {
                    let rv = field_u64(line, "rv")?;
                    if rv <= floor {
                        return Ok(Entry::Skip);
                    }
                    Ok(Entry::Logged(rv, key_of(line)?, line.get("o").cloned()))
                },
                &mut objects,
            )?;
            resource_version = resource_version.max(last);
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io_error(&log_path, e))?;
        let log_bytes = log.metadata().map_err(|e| io_error(&log_path, e))?.len();
        let persist = Persist {
            dir: dir.to_path_buf(),
            log,
            log_bytes,
            snapshot_bytes,
        };
        let objects = objects
            .into_iter()
            .filter_map(|(k, v): (ObjectKey, Value)| (!v.is_null()).then_some((k, v)))
            .collect();
        Ok((persist, objects, resource_version))
    }

    /// Appends one record and syncs it to disk.
    pub fn append(&mut self, record: &Record) -> Result<(), PersistError> {
        let path = self.dir.join(LOG);
        self.log
            .write_all(&record.line)
            .and_then(|()| self.log.sync_data())
            .map_err(|e| io_error(&path, e))?;
        self.log_bytes += record.line.len() as u64;
        Ok(())
    }

    /// Whether the log has grown enough to fold into a new snapshot.
    pub fn wants_compaction(&self) -> bool {
        self.log_bytes > COMPACT_AFTER_BYTES && self.log_bytes > self.snapshot_bytes
    }

    /// Replaces the snapshot with `objects` at `resource_version` and empties the log.
    /// The snapshot is renamed into place before the log is cut, so a crash in between
    /// only leaves log records the next open skips.
    pub fn compact(
        &mut self,
        resource_version: u64,
        objects: Vec<(ObjectKey, Bytes)>,
    ) -> Result<(), PersistError> {
        let tmp = self.dir.join(format!("{SNAPSHOT}.tmp"));
        let mut out = io::BufWriter::new(File::create(&tmp).map_err(|e| io_error(&tmp, e))?);
        let mut written = 0u64;
        let mut write = |bytes: &[u8]| -> Result<(), PersistError> {
            written += bytes.len() as u64;
            out.write_all(bytes).map_err(|e| io_error(&tmp, e))
        };
        write(
            json!({"resourceVersion": resource_version})
                .to_string()
                .as_bytes(),
        )?;
        write(b"\n")?;
        for (key, bytes) in &objects {
            write(&Record::put(key, resource_version, bytes).line)?;
        }
        let file = out
            .into_inner()
            .map_err(|e| io_error(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| io_error(&tmp, e))?;
        let snapshot = self.dir.join(SNAPSHOT);
        fs::rename(&tmp, &snapshot).map_err(|e| io_error(&snapshot, e))?;
        sync_dir(&self.dir)?;
        let log = self.dir.join(LOG);
        self.log
            .set_len(0)
            .and_then(|()| self.log.sync_all())
            .map_err(|e| io_error(&log, e))?;
        self.log_bytes = 0;
        self.snapshot_bytes = written;
        Ok(())
    }
}

enum Entry {
    Version(u64),
    Object(ObjectKey, Option<Value>),
    Logged(u64, ObjectKey, Option<Value>),
    Skip,
}

/// Reads a JSON-lines file into `objects`; returns the highest resourceVersion seen.
/// With `torn_tail_ok`, an unterminated or unparsable last line is cut off the file.
fn read_lines(
    path: &Path,
    torn_tail_ok: bool,
    parse: impl Fn(&Value, usize) -> Result<Entry, String>,
    objects: &mut std::collections::BTreeMap<ObjectKey, Value>,
) -> Result<u64, PersistError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let mut reader = BufReader::new(file);
    let mut highest = 0;
    let mut good_bytes = 0u64;
    let mut n = 0;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let read = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| io_error(path, e))?;
        if read == 0 {
            break;
        }
        n += 1;
        let complete = buf.last() == Some(&b'\n');
        let parsed = serde_json::from_slice::<Value>(&buf)
            .map_err(|e| e.to_string())
            .and_then(|line| parse(&line, n));
        let entry = match (parsed, complete) {
            (Ok(entry), true) => entry,
            (result, _)
                if torn_tail_ok && reader.fill_buf().map(|b| b.is_empty()).unwrap_or(false) =>
            {
                // The last line of the log was being written when the process died.
                tracing::warn!(path = %path.display(), line = n, ok = result.is_ok(), "dropping torn last record");
                truncate(path, good_bytes)?;
                break;
            }
            (Ok(_), false) => {
                return Err(corrupt(path, n, "unterminated record".into()));
            }
            (Err(reason), _) => return Err(corrupt(path, n, reason)),
        };
        good_bytes += read as u64;
        match entry {
            Entry::Version(rv) => highest = highest.max(rv),
            Entry::Object(key, object) => {
                objects.insert(key, object.unwrap_or(Value::Null));
            }
            Entry::Logged(rv, key, object) => {
                highest = highest.max(rv);
                objects.insert(key, object.unwrap_or(Value::Null));
            }
            Entry::Skip => {}
        }
    }
    Ok(highest)
}

fn key_of(line: &Value) -> Result<ObjectKey, String> {
    let field = |f: &str| {
        line.get(f)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("missing field {f:?}"))
    };
    Ok(ObjectKey::new(field("s")?, field("ns")?, field("n")?))
}

fn field_u64(line: &Value, name: &str) -> Result<u64, String> {
    line.get(name)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("missing field {name:?}"))
}

fn truncate(path: &Path, len: u64) -> Result<(), PersistError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error(path, e))
}

fn sync_dir(dir: &Path) -> Result<(), PersistError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, e))
}

fn io_error(path: &Path, source: io::Error) -> PersistError {
    PersistError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn corrupt(path: &Path, line: usize, reason: String) -> PersistError {
    PersistError::Corrupt {
        path: path.to_path_buf(),
        line,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("configmaps", "default", name)
    }

    #[test]
    fn log_replays_puts_and_deletes() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut persist, objects, rv) = Persist::open(dir.path()).expect("open");
            assert!(objects.is_empty() && rv == 0);
            persist
                .append(&Record::put(&key("a"), 2, br#"{"v":1}"#))
                .expect("a");
            persist
                .append(&Record::put(&key("b"), 3, br#"{"v":2}"#))
                .expect("b");
            persist.append(&Record::delete(&key("a"), 4)).expect("del");
        }
        let (_, objects, rv) = Persist::open(dir.path()).expect("reopen");
        assert_eq!(rv, 4);
        assert_eq!(objects, vec![(key("b"), json!({"v": 2}))]);
    }

    #[test]
    fn a_torn_last_record_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut persist, _, _) = Persist::open(dir.path()).expect("open");
            persist
                .append(&Record::put(&key("a"), 2, br#"{"v":1}"#))
                .expect("a");
        }
        let mut log = OpenOptions::new()
            .append(true)
            .open(dir.path().join(LOG))
            .expect("log");
        log.write_all(br#"{"rv":3,"s":"configmaps","ns":"default","n":"b","o":{"v""#)
            .expect("torn");
        drop(log);
        let (mut persist, objects, rv) = Persist::open(dir.path()).expect("reopen");
        assert_eq!((objects.len(), rv), (1, 2));
        persist
            .append(&Record::put(&key("c"), 3, br#"{"v":3}"#))
            .expect("append after cut");
        let (_, objects, rv) = Persist::open(dir.path()).expect("reopen again");
        assert_eq!((objects.len(), rv), (2, 3));
    }

    #[test]
    fn compaction_keeps_objects_and_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (mut persist, _, _) = Persist::open(dir.path()).expect("open");
            persist
                .append(&Record::put(&key("a"), 2, br#"{"v":1}"#))
                .expect("a");
            persist
                .compact(2, vec![(key("a"), Bytes::from_static(br#"{"v":1}"#))])
                .expect("compact");
            persist
                .append(&Record::put(&key("b"), 3, br#"{"v":2}"#))
                .expect("b");
        }
        let (_, objects, rv) = Persist::open(dir.path()).expect("reopen");
        assert_eq!(rv, 3);
        assert_eq!(objects.len(), 2);
    }

    #[test]
    fn a_corrupt_middle_record_is_an_error_naming_the_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(LOG), "not json\n{\"rv\":2}\n").expect("write");
        let err = Persist::open(dir.path()).err().expect("corrupt");
        assert!(err.to_string().contains("wal.log:1"), "{err}");
    }
}
