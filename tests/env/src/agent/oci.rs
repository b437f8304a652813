//! Images as OCI image layouts on disk (what `buildah push … oci:DIR` writes):
//! the manifest's layers unpacked into a root filesystem, and the image
//! config's entrypoint, user, working directory and environment honoured.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What a container needs from an OCI image.
#[derive(Debug, Clone, PartialEq)]
pub struct OciImage {
    /// Layer blobs, bottom first (tar, gzip-compressed or not).
    pub layers: Vec<PathBuf>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `uid[:gid]` or a user name from the image's /etc/passwd; empty is root.
    pub user: String,
    pub working_dir: String,
    /// `NAME=value` entries.
    pub env: Vec<String>,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: RuntimeConfig,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RuntimeConfig {
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    env: Option<Vec<String>>,
}

impl OciImage {
    /// Reads the layout at `dir` (its first manifest).
    pub fn load(dir: &Path) -> Result<Self, String> {
        let read = |path: PathBuf| -> Result<String, String> {
            std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        };
        let blob = |digest: &str| -> Result<PathBuf, String> {
            let hex = digest.strip_prefix("sha256:").ok_or_else(|| format!("unsupported digest {digest}"))?;
            Ok(dir.join("blobs/sha256").join(hex))
        };
        let invalid =
            |what: &str, e: serde_json::Error| format!("{what} of the OCI image at {} is invalid: {e}", dir.display());
        let index: Index =
            serde_json::from_str(&read(dir.join("index.json"))?).map_err(|e| invalid("index.json", e))?;
        let first = index.manifests.first().ok_or_else(|| format!("{}/index.json lists no manifest", dir.display()))?;
        let manifest: Manifest =
            serde_json::from_str(&read(blob(&first.digest)?)?).map_err(|e| invalid("the manifest", e))?;
        let config: ImageConfig =
            serde_json::from_str(&read(blob(&manifest.config.digest)?)?).map_err(|e| invalid("the config", e))?;
        let layers = manifest.layers.iter().map(|l| blob(&l.digest)).collect::<Result<Vec<_>, _>>()?;
        if let Some(missing) = layers.iter().find(|l| !l.is_file()) {
            return Err(format!("layer {} of the OCI image is missing", missing.display()));
        }
        let c = config.config;
        Ok(Self {
            layers,
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            user: c.user.unwrap_or_default(),
            working_dir: c.working_dir.filter(|w| !w.is_empty()).unwrap_or_else(|| "/".into()),
            env: c.env.unwrap_or_default(),
        })
    }

    /// Unpacks the layers into `rootfs` (emptied first), applying each
    /// layer's whiteouts (`.wh.NAME` deletes NAME). An opaque-directory
    /// marker is only dropped: lower layers' entries stay (the images run
    /// here have one layer).
    pub fn unpack(&self, rootfs: &Path) -> Result<(), String> {
        if rootfs.exists() {
            std::fs::remove_dir_all(rootfs).map_err(|e| format!("cannot empty {}: {e}", rootfs.display()))?;
        }
        std::fs::create_dir_all(rootfs).map_err(|e| format!("cannot create {}: {e}", rootfs.display()))?;
        for layer in &self.layers {
            // GNU tar finds out the compression itself; as root it keeps owners and modes.
            let out = std::process::Command::new("tar")
                .arg("-xf")
                .arg(layer)
                .arg("-C")
                .arg(rootfs)
                .output()
                .map_err(|e| format!("cannot run tar: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cannot unpack {}: {}",
                    layer.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            apply_whiteouts(rootfs)?;
        }
        Ok(())
    }
}

/// Removes `.wh.NAME` markers and the NAME beside each.
fn apply_whiteouts(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let _ = std::fs::remove_file(&path);
            if hidden != ".wh..opq" {
                let target = dir.join(hidden);
                let _ = std::fs::remove_dir_all(&target).or_else(|_| std::fs::remove_file(&target));
            }
        } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
            apply_whiteouts(&path)?;
        }
    }
    Ok(())
}

/// A numeric `uid[:gid]`, or a name (and group name) looked up in the
/// image's /etc/passwd and /etc/group. An empty user is root.
pub fn resolve_user(user: &str, rootfs: &Path) -> Result<(u32, u32), String> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (name, group) = match user.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (user, None),
    };
    let table = |file: &str| std::fs::read_to_string(rootfs.join("etc").join(file)).unwrap_or_default();
    let lookup = |file: &str, key: &str, field: usize| -> Option<u32> {
        table(file).lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f[0] == key)?.get(field)?.parse().ok()
    };
    let uid = match name.parse() {
        Ok(uid) => uid,
        Err(_) => {
            lookup("passwd", name, 2).ok_or_else(|| format!("the image's user {name:?} is not in its /etc/passwd"))?
        }
    };
    let gid = match group {
        Some(g) => match g.parse() {
            Ok(gid) => gid,
            Err(_) => {
                lookup("group", g, 2).ok_or_else(|| format!("the image's group {g:?} is not in its /etc/group"))?
            }
        },
        // The user's primary group, else the same number.
        None => table("passwd")
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.get(2).and_then(|u| u.parse().ok()) == Some(uid))
            .and_then(|f| f.get(3)?.parse().ok())
            .unwrap_or(uid),
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\nnonroot:x:65532:65533::/home:/x\n")
            .unwrap();
        std::fs::write(dir.path().join("etc/group"), "root:x:0:\nnonroot:x:65533:\n").unwrap();
        dir
    }

    #[test]
    fn users_by_number_or_name() {
        let root = rootfs();
        assert_eq!(resolve_user("", root.path()), Ok((0, 0)));
        assert_eq!(resolve_user("65532:65532", root.path()), Ok((65532, 65532)));
        assert_eq!(resolve_user("nonroot", root.path()), Ok((65532, 65533)));
        assert_eq!(resolve_user("nonroot:nonroot", root.path()), Ok((65532, 65533)));
        assert_eq!(resolve_user("1000", root.path()), Ok((1000, 1000)));
        let err = resolve_user("ghost", root.path()).unwrap_err();
        assert!(err.contains("ghost") && err.contains("/etc/passwd"), "{err}");
    }

    #[test]
    fn whiteouts_remove_what_an_upper_layer_deleted() {
        let root = rootfs();
        std::fs::write(root.path().join("etc/old"), "x").unwrap();
        std::fs::write(root.path().join("etc/.wh.old"), "").unwrap();
        apply_whiteouts(root.path()).unwrap();
        assert!(!root.path().join("etc/old").exists() && !root.path().join("etc/.wh.old").exists());
        assert!(root.path().join("etc/passwd").exists());
    }

    #[test]
    fn a_layout_without_a_manifest_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.json"), r#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        let err = OciImage::load(dir.path()).unwrap_err();
        assert!(err.contains("lists no manifest"), "{err}");
    }
}
