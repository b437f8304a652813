//! The image table: which local executables stand in for which container
//! image, or which OCI image layout on disk is the image (its root filesystem
//! is then unpacked and the process runs inside it). An image that matches no
//! entry cannot be "pulled" (`ErrImagePull`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::oci::OciImage;

#[derive(Debug, Clone, Deserialize)]
pub struct ImageTable {
    images: Vec<ImageEntry>,
    #[serde(skip)]
    root: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
struct ImageEntry {
    /// `name:tag` with `*` wildcards, matched after the default registry prefix is removed.
    pattern: String,
    #[serde(default)]
    entrypoint: Vec<String>,
    #[serde(default)]
    binaries: BTreeMap<String, PathBuf>,
    /// An OCI image layout directory: the image itself, not a stand-in.
    #[serde(default)]
    oci: Option<PathBuf>,
}

/// An image resolved to the executables that make it up.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    pub entrypoint: Vec<String>,
    /// Executables by command name, absolute paths that exist.
    pub binaries: BTreeMap<String, PathBuf>,
    /// The image is an OCI image: run from its root filesystem.
    pub oci: Option<OciImage>,
}

impl ImageTable {
    /// Loads the table; relative executable paths resolve against `root`.
    pub fn load(path: &Path, root: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read image table {}: {e}", path.display()))?;
        let mut table: ImageTable =
            serde_json::from_str(&text).map_err(|e| format!("image table {} is invalid: {e}", path.display()))?;
        table.root = root.to_owned();
        Ok(table)
    }

    /// The image's executables, or the reason it cannot be pulled.
    pub fn resolve(&self, image: &str) -> Result<ResolvedImage, String> {
        let name = normalize(image);
        let entry = self.images.iter().find(|e| glob_match(&e.pattern, &name)).ok_or_else(|| {
            let known: Vec<&str> = self.images.iter().map(|e| e.pattern.as_str()).collect();
            format!("image {image:?} is not in the node agent's image table (known: {})", known.join(", "))
        })?;
        if let Some(layout) = &entry.oci {
            let layout = if layout.is_absolute() { layout.clone() } else { self.root.join(layout) };
            let image = OciImage::load(&layout)
                .map_err(|e| format!("image {image:?}: {e} (build it: bash deploy/image/build.sh)"))?;
            return Ok(ResolvedImage { entrypoint: Vec::new(), binaries: BTreeMap::new(), oci: Some(image) });
        }
        let mut binaries = BTreeMap::new();
        for (command, path) in &entry.binaries {
            let path = if path.is_absolute() { path.clone() } else { self.root.join(path) };
            if !path.is_file() {
                return Err(format!(
                    "image {image:?} maps {command} to {}, which does not exist: run tests/setup.sh",
                    path.display()
                ));
            }
            binaries.insert(command.clone(), path);
        }
        Ok(ResolvedImage { entrypoint: entry.entrypoint.clone(), binaries, oci: None })
    }
}

fn normalize(image: &str) -> String {
    let image = image.strip_prefix("docker.io/").unwrap_or(image);
    let image = image.strip_prefix("library/").unwrap_or(image);
    if image.rsplit('/').next().is_some_and(|last| last.contains(':')) {
        image.to_owned()
    } else {
        format!("{image}:latest")
    }
}

/// `*` matches any run of characters; everything else literally.
fn glob_match(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(remaining) = text.strip_prefix(head) else {
                return false;
            };
            (0..=remaining.len()).filter(|i| remaining.is_char_boundary(*i)).any(|i| glob_match(rest, &remaining[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_tags_and_registry_prefixes() {
        assert!(glob_match("redis:7.0.*", &normalize("redis:7.0.15")));
        assert!(glob_match("redis:7.0.*", &normalize("docker.io/library/redis:7.0.15")));
        assert!(!glob_match("redis:7.0.*", &normalize("redis:7.2.4")));
        assert!(!glob_match("redis:7.0.*", &normalize("redis")));
        assert_eq!(normalize("busybox"), "busybox:latest");
    }

    #[test]
    fn unknown_image_names_the_known_ones() {
        let table = ImageTable {
            images: vec![ImageEntry {
                pattern: "redis:7.0.*".into(),
                entrypoint: vec![],
                binaries: BTreeMap::new(),
                oci: None,
            }],
            root: PathBuf::from("/"),
        };
        let err = table.resolve("nginx:1.25").unwrap_err();
        assert!(err.contains("nginx:1.25") && err.contains("redis:7.0.*"), "{err}");
    }
}
