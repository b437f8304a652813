//! Starting a container: its process runs in a private mount namespace (so each
//! Pod sees its own volumes at their mountPaths), in a process group of its own,
//! with a parent-death signal so it never outlives the node agent. A container
//! of an OCI image runs inside the image's root filesystem instead (read-only
//! when its securityContext asks), as the image's or the Pod's user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::spec::{Confinement, Mount};

/// The base PATH behind a container's own image binaries.
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// Everything needed to start (and later exec into) one container.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Command and arguments, already `$(VAR)`-expanded; `argv[0]` is looked up in PATH.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub working_dir: PathBuf,
    /// Directory of symlinks to the image's executables, first in PATH.
    pub bin_dir: PathBuf,
    pub log_path: PathBuf,
    /// Set for an OCI image: the process's root and user.
    pub root: Option<RootFs>,
    /// For the machine's own binaries (no `root`): the user and a read-only root.
    pub confinement: Confinement,
}

/// Where a confined container finds its binaries: each is bound here, in a
/// tmpfs of its mount namespace, so its user needs no way into the agent's
/// directories (which may sit under a home directory closed to others).
const CONFINED_BIN: &str = "/run/slotkeeper-bin";
/// Where a container's volume sources are bound before being mounted at their paths.
const STAGED: &str = "/run/slotkeeper-volumes";

/// The root filesystem a container runs in, and as whom.
#[derive(Debug, Clone, PartialEq)]
pub struct RootFs {
    pub dir: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub read_only: bool,
}

impl Launch {
    /// Lays out the container's directory: its image binaries and working dir.
    pub fn prepare_dirs(
        container_dir: &Path,
        binaries: &BTreeMap<String, PathBuf>,
    ) -> std::io::Result<(PathBuf, PathBuf)> {
        let bin_dir = container_dir.join("bin");
        let work_dir = container_dir.join("work");
        std::fs::create_dir_all(&bin_dir)?;
        std::fs::create_dir_all(&work_dir)?;
        for (name, target) in binaries {
            let link = bin_dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link)?;
        }
        Ok((bin_dir, work_dir))
    }

    fn path_env(&self) -> String {
        match self.confinement.user {
            Some(_) if self.root.is_none() => format!("{CONFINED_BIN}:{SYSTEM_PATH}"),
            _ => format!("{}:{SYSTEM_PATH}", self.bin_dir.display()),
        }
    }

    /// `setpriv` words that switch to the confined user (and set the
    /// parent-death signal again: a change of user clears it).
    fn become_user(&self) -> Option<String> {
        let (uid, gid, groups) = self.confinement.user.as_ref().filter(|_| self.root.is_none())?;
        let groups = if groups.is_empty() {
            "--clear-groups".to_string()
        } else {
            format!("--groups={}", groups.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        };
        Some(format!(
            "setpriv --reuid={uid} --regid={gid} {groups} --inh-caps=-all --bounding-set=-all --no-new-privs --pdeathsig KILL --"
        ))
    }

    fn base_command(&self, program: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("setpriv");
        command.args(["--pdeathsig", "KILL", "--", program]);
        command.env_clear().env("PATH", self.path_env());
        // Pass the test-run marker on so a leak check after the suite finds strays.
        if let Some(marker) = std::env::var_os(crate::process::TEST_RUN_MARKER) {
            command.env(crate::process::TEST_RUN_MARKER, marker);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command.process_group(0).kill_on_drop(true).stdin(Stdio::null());
        command
    }

    /// Starts the container's main process.
    pub fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path)?;
        let mut command = self.base_command("unshare");
        command
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                &match &self.root {
                    Some(root) => self.rootfs_script(root),
                    None => self.mount_script(),
                },
                "container-init",
            ])
            .args(&self.argv)
            .stdout(log.try_clone()?)
            .stderr(log);
        command.spawn()
    }

    /// Runs `argv` inside the running container `pid`'s mount namespace, with
    /// the container's environment (for exec probes). Output goes to
    /// `probe.log` beside the container's own output.
    pub fn exec(&self, pid: u32, argv: &[String]) -> std::io::Result<tokio::process::Child> {
        let log_path = self.log_path.with_file_name("probe.log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log_path)?;
        let mut command = self.base_command("nsenter");
        command
            .arg(format!("--target={pid}"))
            .arg("--mount")
            .args(self.root.is_some().then_some("--root"))
            .arg(format!("--wdns={}", self.working_dir.display()))
            .arg("--")
            .args(self.become_user().iter().flat_map(|words| words.split(' ')))
            .args(argv)
            .stdout(log.try_clone()?)
            .stderr(log);
        command.spawn()
    }

    /// Shell run inside the new mount namespace: bind every volume, then exec.
    fn mount_script(&self) -> String {
        let mut script = String::from("set -e\n");
        let become_user = self.become_user();
        // Binaries first: a volume mounted over a parent of the agent's
        // directories (an emptyDir at /tmp) would hide them.
        if become_user.is_some() {
            script += &format!("mkdir -p {CONFINED_BIN}\nmount -t tmpfs -o mode=0755 slotkeeper-bin {CONFINED_BIN}\n");
            let mut binaries: Vec<_> = std::fs::read_dir(&self.bin_dir).into_iter().flatten().flatten().collect();
            binaries.sort_by_key(|b| b.file_name());
            for binary in binaries {
                let target = Path::new(CONFINED_BIN).join(binary.file_name());
                let source = std::fs::canonicalize(binary.path()).unwrap_or(binary.path());
                script += &format!(": > {t}\nmount --bind {s} {t}\n", t = quote(&target), s = quote(&source));
            }
        }
        script += &self.volume_mounts(Path::new("/"));
        if self.confinement.read_only_root {
            script += "mount -o remount,bind,ro /\n";
        }
        script += &format!(
            "cd {}\nexec {}\"$@\"\n",
            quote(&self.working_dir),
            become_user.map(|w| w + " ").unwrap_or_default()
        );
        script
    }

    /// Binds every volume at its mountPath under `root`, parents before
    /// children (so a nested mountPath is not hidden), read-only ones remounted.
    /// Every source is first bound into a private staging tmpfs: a volume at
    /// `/tmp` would otherwise hide the sources of the ones after it when the
    /// agent's own directory lies under `/tmp`.
    fn volume_mounts(&self, root: &Path) -> String {
        let mut mounts = self.mounts.clone();
        mounts.sort_by_key(|m| m.target.components().count());
        let mut script = String::new();
        if !mounts.is_empty() {
            script += &format!("mkdir -p {STAGED}\nmount -t tmpfs -o mode=0700 slotkeeper-volumes {STAGED}\n");
        }
        let staged: Vec<PathBuf> = (0..mounts.len()).map(|i| Path::new(STAGED).join(i.to_string())).collect();
        for (mount, staged) in mounts.iter().zip(&staged) {
            let (source, at) = (quote(&mount.source), quote(staged));
            let create = if mount.source.is_file() { format!(": > {at}") } else { format!("mkdir {at}") };
            script += &format!("{create}\nmount --bind {source} {at}\n");
        }
        for (mount, staged) in mounts.iter().zip(&staged) {
            let at = root.join(mount.target.strip_prefix("/").unwrap_or(&mount.target));
            let (source, target) = (quote(staged), quote(&at));
            if mount.source.is_file() {
                let parent = quote(at.parent().unwrap_or(root));
                script += &format!("mkdir -p {parent}; [ -e {target} ] || : > {target}\n");
            } else {
                script += &format!("mkdir -p {target}\n");
            }
            script += &format!("mount --bind {source} {target}\n");
            if mount.read_only {
                script += &format!("mount -o remount,bind,ro {target}\n");
            }
        }
        script
    }
}

impl Launch {
    /// Shell run inside the new mount namespace for an image's root
    /// filesystem: the root bound onto itself (so it can be made read-only
    /// alone), /proc and /dev, every volume under the root, then
    /// `slotkeeper-enter` changes root and user and execs the command.
    fn rootfs_script(&self, root: &RootFs) -> String {
        let dir = quote(&root.dir);
        let mut script = format!("set -e\nmount --bind {dir} {dir}\n");
        for system in ["proc", "dev"] {
            let target = quote(&root.dir.join(system));
            script += &format!("mkdir -p {target}\nmount --rbind /{system} {target}\n");
        }
        script += &self.volume_mounts(&root.dir);
        if root.read_only {
            script += &format!("mount -o remount,bind,ro {dir}\n");
        }
        let enter = enter_binary();
        script += &format!(
            "exec {} --root {dir} --workdir {} --uid {} --gid {} -- \"$@\"\n",
            quote(&enter),
            quote(&self.working_dir),
            root.uid,
            root.gid
        );
        script
    }
}

/// `slotkeeper-enter`, built beside the node agent.
fn enter_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().map(|d| d.join("slotkeeper-enter")).unwrap_or_else(|| PathBuf::from("slotkeeper-enter"))
}

/// Single-quotes a path for sh.
fn quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_parents_first_and_quotes_paths() {
        let launch = Launch {
            argv: vec!["redis-server".into()],
            env: vec![],
            mounts: vec![
                Mount { source: "/v/conf".into(), target: "/etc/redis/conf.d".into(), read_only: true },
                Mount { source: "/v/it's".into(), target: "/etc/redis".into(), read_only: false },
            ],
            working_dir: "/w".into(),
            bin_dir: "/b".into(),
            log_path: "/l".into(),
            root: None,
            confinement: Confinement::default(),
        };
        let script = launch.mount_script();
        // Sources staged first (parents first), then mounted at their paths.
        assert!(script.contains("mount --bind '/v/it'\\''s' '/run/slotkeeper-volumes/0'\n"), "{script}");
        assert!(script.contains("mount --bind '/v/conf' '/run/slotkeeper-volumes/1'\n"), "{script}");
        let parent = script.find("mount --bind '/run/slotkeeper-volumes/0' '/etc/redis'\n").expect("parent mount");
        let child = script.find("mount --bind '/run/slotkeeper-volumes/1' '/etc/redis/conf.d'").expect("child mount");
        assert!(script.find("'/run/slotkeeper-volumes/1'\n").unwrap() < parent, "every source staged before any mount");
        assert!(parent < child, "{script}");
        assert!(script.contains("mount -o remount,bind,ro '/etc/redis/conf.d'"));
        assert!(script.ends_with("cd '/w'\nexec \"$@\"\n"));
    }

    #[test]
    fn an_image_root_is_read_only_after_its_volumes_are_mounted_inside_it() {
        let launch = Launch {
            argv: vec!["/slotkeeper".into()],
            env: vec![],
            mounts: vec![Mount { source: "/v/token".into(), target: "/var/run/secrets".into(), read_only: true }],
            working_dir: "/".into(),
            bin_dir: "/b".into(),
            log_path: "/l".into(),
            root: Some(RootFs { dir: "/r".into(), uid: 65532, gid: 65532, read_only: true }),
            confinement: Confinement::default(),
        };
        let script = launch.rootfs_script(launch.root.as_ref().unwrap());
        let volume = script
            .find("mount --bind '/run/slotkeeper-volumes/0' '/r/var/run/secrets'\n")
            .expect("volume inside the root");
        let read_only = script.find("mount -o remount,bind,ro '/r'\n").expect("root read-only");
        let enter = script.find("--root '/r' --workdir '/' --uid 65532 --gid 65532 -- \"$@\"").expect("enter");
        assert!(volume < read_only && read_only < enter, "{script}");
        assert!(script.contains("mount --rbind /proc '/r/proc'"), "{script}");
    }

    #[test]
    fn a_confined_container_runs_as_its_user_with_a_read_only_root_after_its_volumes() {
        let launch = Launch {
            argv: vec!["redis-server".into()],
            env: vec![],
            mounts: vec![Mount { source: "/v/data".into(), target: "/data".into(), read_only: false }],
            working_dir: "/w".into(),
            bin_dir: "/nonexistent-bin".into(),
            log_path: "/l".into(),
            root: None,
            confinement: Confinement { user: Some((999, 999, vec![999])), read_only_root: true },
        };
        let script = launch.mount_script();
        let volume = script.find("mount --bind '/run/slotkeeper-volumes/0' '/data'\n").expect("volume");
        let read_only = script.find("mount -o remount,bind,ro /\n").expect("read-only root");
        let exec = script
            .find("exec setpriv --reuid=999 --regid=999 --groups=999 --inh-caps=-all --bounding-set=-all --no-new-privs --pdeathsig KILL -- \"$@\"")
            .expect("the user's exec");
        assert!(volume < read_only && read_only < exec, "{script}");
        assert!(launch.path_env().starts_with(CONFINED_BIN));
    }
}
