//! Processes that die with whoever started them.
//!
//! Every process is started through `setpriv --pdeathsig KILL` in a process group
//! of its own: dropping a [`ManagedProcess`] stops its whole group (SIGTERM, a
//! grace period, SIGKILL), and if the starting process is killed outright the
//! kernel sends SIGKILL to the child. A parent-death signal fires when the
//! *thread* that forked the child exits, so all forks happen on one dedicated,
//! never-ending thread rather than on whichever test or runtime thread asked.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Environment variable carried by every process of a test run, so a check after
/// the suite can find any process the run left behind.
pub const TEST_RUN_MARKER: &str = "SLOTKEEPER_TEST_RUN";

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("cannot create log file {path}: {source}")]
    Log { path: PathBuf, source: std::io::Error },
    #[error("cannot start {name} ({program}): {source}")]
    Spawn { name: String, program: PathBuf, source: std::io::Error },
}

/// What to start: a program, its arguments and extra environment.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    pub log_path: PathBuf,
}

impl ProcessSpec {
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>, log_path: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            log_path: log_path.into(),
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A running child process (and its process group), stopped on drop.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The one thread that forks every child; it lives as long as the process.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("slotkeeper-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("the spawner thread starts");
        Mutex::new(tx)
    })
}

impl ManagedProcess {
    pub fn spawn(spec: ProcessSpec) -> Result<Self, ProcessError> {
        let log =
            File::create(&spec.log_path).map_err(|source| ProcessError::Log { path: spec.log_path.clone(), source })?;
        let log_err = log.try_clone().map_err(|source| ProcessError::Log { path: spec.log_path.clone(), source })?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&spec.program)
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0);
        let (reply_tx, reply_rx) = mpsc::channel();
        let spawn_error =
            |source| ProcessError::Spawn { name: spec.name.clone(), program: spec.program.clone(), source };
        spawner()
            .lock()
            .expect("spawner lock")
            .send((command, reply_tx))
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?;
        let child = reply_rx
            .recv()
            .map_err(|_| spawn_error(std::io::Error::other("spawner thread is gone")))?
            .map_err(spawn_error)?;
        Ok(Self { name: spec.name, child, log_path: spec.log_path })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `None` while running, else a description of how it ended.
    pub fn exit_status(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(status.to_string()),
            Err(e) => Some(format!("unknown ({e})")),
        }
    }

    /// The last `lines` lines of the process's output, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// SIGTERM to the group, up to `grace` to exit, then SIGKILL; reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        if self.exit_status().is_some() {
            self.kill_group(Signal::SIGKILL);
            return;
        }
        self.kill_group(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The group may hold children of the leader even when the leader exited.
        self.kill_group(Signal::SIGKILL);
        let _ = self.child.wait();
    }

    fn kill_group(&self, signal: Signal) {
        // The child is its own group leader (process_group(0)).
        let _ = killpg(Pid::from_raw(self.child.id() as i32), signal);
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `lines` lines of a log file (reads at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let mut bytes = Vec::new();
    if file.read_to_end(&mut bytes).is_ok() {
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
