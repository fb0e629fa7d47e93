//! Hugging Face cache locations as inputs: the one place a path the user gave becomes the
//! folder or file wanbake opens.
//!
//! Owns: [`resolve`], which turns
//! - `hf:ORG/NAME[@REVISION][/PATH]` into `<cache>/models--ORG--NAME/snapshots/<commit>[/PATH]`,
//!   looked up offline (nothing is downloaded) in every cache folder the environment names,
//!   in the order huggingface_hub 1.33.0 gives them precedence (`constants.py`: `HF_HUB_CACHE`,
//!   the legacy `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`, `$XDG_CACHE_HOME/huggingface/hub`,
//!   `~/.cache/huggingface/hub`); the first that holds the repo is read;
//! - a cache repo folder (`.../models--ORG--NAME`, holding `snapshots/`) into its snapshot
//!   of `refs/main` (else of its only ref, else its only snapshot);
//!
//! and leaves every other path as it is. A revision is a name under `refs/` (a branch or
//! tag: the file holds the commit) or a commit under `snapshots/`, as huggingface_hub's
//! `try_to_load_from_cache` reads them (`file_download.py`). The snapshot's files are
//! symlinks into `blobs/`; the file system follows them, so they are read and hashed as the
//! files they point to, under their snapshot names. Does not own: what is in the folder
//! (`checkpoint`).

use std::path::{Path, PathBuf};

/// The prefix of a cache reference.
pub const PREFIX: &str = "hf:";

/// Why a cache reference or cache repo folder names nothing to read.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `hf:` followed by something that is not `ORG/NAME[@REVISION][/PATH]`.
    #[error(
        "`{text}`: expected hf:ORG/NAME[@REVISION][/PATH] (e.g. hf:Wan-AI/Wan2.1-T2V-1.3B-Diffusers@main)"
    )]
    Syntax {
        /// The reference as given.
        text: String,
    },
    /// No cache folder holds the repo.
    #[error(
        "`{text}`: {folder} is in no Hugging Face cache (looked in {}); wanbake reads the cache \
         offline: download the repo first (`hf download {repo}`), or set HF_HUB_CACHE or HF_HOME",
        looked_in(looked)
    )]
    NotCached {
        /// The reference as given.
        text: String,
        /// `ORG/NAME`.
        repo: String,
        /// `models--ORG--NAME`.
        folder: String,
        /// Every cache folder searched.
        looked: Vec<PathBuf>,
    },
    /// The repo is cached but not at this revision.
    #[error(
        "{}: revision `{revision}` is not cached (looked for refs/{revision} and \
         snapshots/{revision}; refs: {}; snapshots: {})",
        repo.display(), list(refs), list(snapshots)
    )]
    NoRevision {
        /// The cache repo folder.
        repo: PathBuf,
        /// The revision asked for.
        revision: String,
        /// The refs present.
        refs: Vec<String>,
        /// The snapshots present.
        snapshots: Vec<String>,
    },
    /// A cache repo folder without `refs/main` and more than one ref or snapshot.
    #[error(
        "{}: a Hugging Face cache repo with no refs/main and several revisions (refs: {}; \
         snapshots: {}): name one, as hf:ORG/NAME@REVISION or the snapshots/<commit> folder",
        repo.display(), list(refs), list(snapshots)
    )]
    NoDefault {
        /// The cache repo folder.
        repo: PathBuf,
        /// The refs present.
        refs: Vec<String>,
        /// The snapshots present.
        snapshots: Vec<String>,
    },
    /// A ref names a commit whose snapshot folder is missing.
    #[error("{}: names commit `{commit}`, but {} is missing", reference.display(), snapshot.display())]
    MissingSnapshot {
        /// The ref file.
        reference: PathBuf,
        /// The commit it holds.
        commit: String,
        /// The folder that should hold it.
        snapshot: PathBuf,
    },
    /// A ref file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn looked_in(dirs: &[PathBuf]) -> String {
    match dirs.is_empty() {
        true => "no cache folder: HF_HUB_CACHE, HF_HOME and HOME are all unset".into(),
        false => dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn list(names: &[String]) -> String {
    match names.is_empty() {
        true => "none".into(),
        false => names.join(", "),
    }
}

/// The path to open for `given`: a cache reference or cache repo folder resolved to its
/// snapshot (see the module doc), any other path unchanged.
pub fn resolve(given: &Path) -> Result<PathBuf, HubError> {
    if let Some(text) = given.to_str()
        && let Some(rest) = text.strip_prefix(PREFIX)
    {
        return resolve_reference(text, rest);
    }
    if is_repo_folder(given) {
        return default_snapshot(given);
    }
    Ok(given.to_path_buf())
}

/// Is `p` spelled as a cache reference (`hf:...`)? Such a path is not relative to anything.
pub fn is_reference(p: &Path) -> bool {
    p.to_str().is_some_and(|t| t.starts_with(PREFIX))
}

/// `ORG/NAME[@REVISION][/PATH]` split into its parts.
struct Reference<'a> {
    org: &'a str,
    name: &'a str,
    revision: Option<&'a str>,
    sub: Option<&'a str>,
}

fn parse_reference(rest: &str) -> Option<Reference<'_>> {
    let (org, after) = rest.split_once('/')?;
    let (repo, sub) = match after.split_once('/') {
        Some((r, s)) => (r, Some(s).filter(|s| !s.is_empty())),
        None => (after, None),
    };
    let (name, revision) = match repo.split_once('@') {
        Some((n, r)) => (n, Some(r)),
        None => (repo, None),
    };
    let part_ok = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains('@');
    let ok = part_ok(org) && part_ok(name) && revision.is_none_or(part_ok);
    ok.then_some(Reference {
        org,
        name,
        revision,
        sub,
    })
}

fn resolve_reference(text: &str, rest: &str) -> Result<PathBuf, HubError> {
    let r = parse_reference(rest).ok_or_else(|| HubError::Syntax { text: text.into() })?;
    let folder = format!("models--{}--{}", r.org, r.name);
    let looked = cache_dirs();
    let Some(repo) = looked.iter().map(|d| d.join(&folder)).find(|p| p.is_dir()) else {
        return Err(HubError::NotCached {
            text: text.into(),
            repo: format!("{}/{}", r.org, r.name),
            folder,
            looked,
        });
    };
    let snapshot = match r.revision {
        Some(rev) => snapshot_of(&repo, rev)?,
        None => default_snapshot(&repo)?,
    };
    Ok(match r.sub {
        Some(sub) => snapshot.join(sub),
        None => snapshot,
    })
}

/// The cache folders to search, in huggingface_hub's order of precedence, without repeats.
fn cache_dirs() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let candidates = [
        env("HF_HUB_CACHE"),
        env("HUGGINGFACE_HUB_CACHE"),
        env("HF_HOME").map(|h| h.join("hub")),
        env("XDG_CACHE_HOME").map(|x| x.join("huggingface").join("hub")),
        env("HOME").map(|h| h.join(".cache").join("huggingface").join("hub")),
    ];
    let mut out: Vec<PathBuf> = Vec::new();
    for c in candidates.into_iter().flatten() {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// A folder named `models--*` that holds `snapshots/`.
fn is_repo_folder(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("models--"))
        && p.join("snapshots").is_dir()
}

/// The names in `dir` (sorted; none when it is missing), with `/` between nested parts so
/// `refs/pr/1` lists as `pr/1`.
fn names_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && root.ends_with("refs") {
                walk(root, &p, out);
            } else if let Ok(rel) = p.strip_prefix(root) {
                let parts: Vec<_> = rel.iter().map(|c| c.to_string_lossy()).collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The snapshot of `refs/main`, else of the only ref, else the only snapshot.
fn default_snapshot(repo: &Path) -> Result<PathBuf, HubError> {
    let refs = names_under(&repo.join("refs"));
    if refs.iter().any(|r| r == "main") {
        return snapshot_of(repo, "main");
    }
    if let [only] = refs.as_slice() {
        return snapshot_of(repo, only);
    }
    let snapshots = names_under(&repo.join("snapshots"));
    match (refs.is_empty(), snapshots.as_slice()) {
        (true, [only]) => Ok(repo.join("snapshots").join(only)),
        _ => Err(HubError::NoDefault {
            repo: repo.to_path_buf(),
            refs,
            snapshots,
        }),
    }
}

/// The snapshot of `revision`: a ref (its file holds the commit) or a commit.
fn snapshot_of(repo: &Path, revision: &str) -> Result<PathBuf, HubError> {
    let reference = repo.join("refs").join(revision);
    if reference.is_file() {
        let commit = std::fs::read_to_string(&reference).map_err(|source| HubError::Io {
            path: reference.clone(),
            source,
        })?;
        let commit = commit.trim().to_string();
        let snapshot = repo.join("snapshots").join(&commit);
        let component =
            !matches!(commit.as_str(), "" | "." | "..") && !commit.contains(['/', '\\']);
        if !component || !snapshot.is_dir() {
            return Err(HubError::MissingSnapshot {
                reference,
                commit,
                snapshot,
            });
        }
        return Ok(snapshot);
    }
    let snapshot = repo.join("snapshots").join(revision);
    if !revision.contains(['/', '\\']) && snapshot.is_dir() {
        return Ok(snapshot);
    }
    Err(HubError::NoRevision {
        repo: repo.to_path_buf(),
        revision: revision.into(),
        refs: names_under(&repo.join("refs")),
        snapshots: names_under(&repo.join("snapshots")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_ref_naming_a_parent_folder_is_no_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--o--n");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots")).unwrap();
        for commit in ["..", ".", "../../x", ""] {
            std::fs::write(repo.join("refs/main"), commit).unwrap();
            let e = snapshot_of(&repo, "main").unwrap_err();
            assert!(
                matches!(e, HubError::MissingSnapshot { .. }),
                "{commit:?}: {e}"
            );
        }
    }

    use super::*;

    #[test]
    fn references_parse_into_their_parts() {
        let r = parse_reference("Wan-AI/Wan2.1@v1/transformer").unwrap();
        assert_eq!(
            (r.org, r.name, r.revision, r.sub),
            ("Wan-AI", "Wan2.1", Some("v1"), Some("transformer"))
        );
        let r = parse_reference("o/n").unwrap();
        assert_eq!((r.revision, r.sub), (None, None));
        for bad in ["o", "/n", "o/", "o/n@", "../n", "o/@x", "o/n@a@b"] {
            assert!(parse_reference(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn other_paths_are_left_alone() {
        for p in ["model.safetensors", "dir/hf:x", "models--a--b"] {
            assert_eq!(resolve(Path::new(p)).unwrap(), Path::new(p));
        }
    }
}
