//! Change detection for a local repository: watch its refs, so a commit syncs within a second.

use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::SourceError;

/// How long a burst of ref writes (lock file, rename, reflog) is gathered into one notification.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// Keeps a local repository's refs watched; dropping it stops the watch and closes the channel.
pub struct RefWatcher {
    _watcher: RecommendedWatcher,
}

/// Watches `refs/heads/**` and `packed-refs` of the git directory `git_dir` (see
/// [`Source::git_dir`](super::Source::git_dir)) and sends `()` for every change to them, one
/// message per burst of writes. A message still unread stands for any changes after it.
///
/// Fails when the directory cannot be watched (missing, or the inotify watch limit reached).
pub fn watch_refs(git_dir: &Path) -> Result<(RefWatcher, mpsc::Receiver<()>), SourceError> {
    let watch_error = |source| SourceError::Watch {
        dir: git_dir.to_path_buf(),
        source,
    };
    let git_dir = git_dir.canonicalize().map_err(|e| watch_error(e.into()))?;
    let (raw_tx, raw_rx) = std_mpsc::channel::<()>();
    let (tx, rx) = mpsc::channel(1);

    let heads = git_dir.join("refs").join("heads");
    let packed_refs = git_dir.join("packed-refs");
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if is_write(&event.kind) && event.paths.iter().any(|p| is_ref(p, &heads, &packed_refs)) {
            // The receiver only goes away with the watcher itself, when nobody listens anymore.
            let _ = raw_tx.send(());
        }
    })
    .map_err(watch_error)?;
    // The git directory itself only for packed-refs; refs/ recursively for branches like feature/x.
    watcher
        .watch(&git_dir, RecursiveMode::NonRecursive)
        .map_err(watch_error)?;
    watcher
        .watch(&git_dir.join("refs"), RecursiveMode::Recursive)
        .map_err(watch_error)?;

    std::thread::Builder::new()
        .name("capstan-watch-refs".into())
        .spawn(move || coalesce(&raw_rx, &tx))
        .map_err(|e| watch_error(e.into()))?;
    Ok((RefWatcher { _watcher: watcher }, rx))
}

/// Forwards bursts of raw events as single notifications until either side hangs up.
fn coalesce(raw: &std_mpsc::Receiver<()>, notifications: &mpsc::Sender<()>) {
    while raw.recv().is_ok() {
        loop {
            match raw.recv_timeout(DEBOUNCE) {
                Ok(()) => continue,
                Err(std_mpsc::RecvTimeoutError::Timeout) => break,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        match notifications.try_send(()) {
            // A full channel already holds an unread notification, which covers this burst too.
            Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
            Err(mpsc::error::TrySendError::Closed(())) => return,
        }
    }
}

/// Whether an event may have changed a file's contents (reads, including our own, do not).
fn is_write(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Whether a path is a branch ref or the packed-refs file (not a `.lock` file being written).
fn is_ref(path: &Path, heads: &Path, packed_refs: &Path) -> bool {
    path == packed_refs
        || (path.starts_with(heads) && path.extension().is_none_or(|ext| ext != "lock"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_testing::git::{Entry, FleetRepo};

    const DEADLINE: Duration = Duration::from_secs(30);

    async fn notified(rx: &mut mpsc::Receiver<()>) -> bool {
        matches!(
            tokio::time::timeout(DEADLINE, rx.recv()).await,
            Ok(Some(()))
        )
    }

    /// Empties the channel of notifications for earlier changes.
    async fn settle(rx: &mut mpsc::Receiver<()>) {
        while tokio::time::timeout(DEBOUNCE * 4, rx.recv()).await.is_ok() {}
    }

    #[tokio::test]
    async fn a_commit_on_the_branch_is_noticed() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("a.yaml", Entry::File("a: 1"))], "first");
        let (_watcher, mut rx) = watch_refs(repo.git.path()).expect("watch");
        settle(&mut rx).await;

        repo.commit_files("main", &[("a.yaml", Entry::File("a: 2"))], "second");
        assert!(notified(&mut rx).await, "no notification for a commit");

        repo.commit_files(
            "feature/x",
            &[("a.yaml", Entry::File("a: 3"))],
            "new branch",
        );
        assert!(
            notified(&mut rx).await,
            "no notification for a nested branch"
        );
    }

    #[tokio::test]
    async fn packed_refs_changes_are_noticed() {
        let repo = FleetRepo::new();
        let first = repo.commit_files("main", &[("a.yaml", Entry::File("a: 1"))], "first");
        let second = repo.commit_files("next", &[("a.yaml", Entry::File("a: 2"))], "second");
        let (_watcher, mut rx) = watch_refs(repo.git.path()).expect("watch");
        settle(&mut rx).await;

        repo.pack_refs(&[("refs/heads/main", first)]);
        assert!(notified(&mut rx).await, "no notification for packing refs");
        settle(&mut rx).await;

        // Only packed-refs changes now: the branch has no loose ref left.
        repo.pack_refs(&[("refs/heads/main", second)]);
        assert!(
            notified(&mut rx).await,
            "no notification for a packed ref moving"
        );
        settle(&mut rx).await;

        // A commit in a packed repository writes a loose ref again.
        repo.commit_files("main", &[("a.yaml", Entry::File("a: 3"))], "third");
        assert!(notified(&mut rx).await, "no notification after packing");
    }

    #[tokio::test]
    async fn reading_refs_is_not_a_change() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("a.yaml", Entry::File("a: 1"))], "first");
        let (_watcher, mut rx) = watch_refs(repo.git.path()).expect("watch");
        settle(&mut rx).await;

        for _ in 0..10 {
            repo.git
                .find_reference("refs/heads/main")
                .expect("read ref");
            let _ = std::fs::read(repo.git.path().join("refs/heads/main"));
        }
        assert!(
            tokio::time::timeout(DEBOUNCE * 10, rx.recv())
                .await
                .is_err(),
            "reading a ref was reported as a change"
        );
    }

    #[tokio::test]
    async fn dropping_the_watcher_closes_the_channel() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("a.yaml", Entry::File("a: 1"))], "first");
        let (watcher, mut rx) = watch_refs(repo.git.path()).expect("watch");
        drop(watcher);
        let closed =
            tokio::time::timeout(DEADLINE, async { while rx.recv().await.is_some() {} }).await;
        assert!(
            closed.is_ok(),
            "channel still open after the watcher was dropped"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope");
        let error = watch_refs(&missing).err().expect("error");
        assert!(error.to_string().contains("nope"), "{error}");
    }
}
