//! Files an output holds unchanged from its input (`io::checkpoint::CarriedFile`: a pipeline's VAE,
//! text encoder, tokenizer, scheduler, model card), put into the staged output.
//!
//! Owns: how a carried file reaches the temporary output (a hard link where the file system
//! allows: no bytes written, the same inode; otherwise a copy, read in 8 MiB chunks and hashed
//! as it is copied, so an 11 GB text encoder needs neither memory nor a second read), its size
//! and sha256 for the manifest (a linked file through the input-hash cache,
//! `input_hash::sha256_input`), the check that the input did not change meanwhile, and what
//! was done ([`Carried`], for the summary). Does not own: which files are carried
//! (`checkpoint`), the temporary folder, the space check, the seal and the rename (`staging`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::io::checkpoint::CarriedFile;
use crate::io::digest;
use crate::io::file::ReadError;
use crate::io::input_hash::{NO_PACE, remember_unchanged, sha256_input};
use crate::io::mmap::{FileStamp, describe_change};
use crate::progress::Progress;

/// Bytes read and written per step of a copy.
const CHUNK: usize = 8 << 20;

/// How the carried files reached the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Carried {
    /// Files hard-linked (same file system: no bytes written).
    pub linked: usize,
    /// Files copied (another file system, or one that refuses the link).
    pub copied: usize,
    /// Bytes of all carried files.
    pub bytes: u64,
}

impl Carried {
    /// Files carried.
    pub fn files(&self) -> usize {
        self.linked + self.copied
    }
}

/// Size and sha256 of each carried file, by its path relative to the output.
pub type CarriedDigests = BTreeMap<PathBuf, (u64, String)>;

/// Why a carried file could not be put into the output.
#[derive(Debug, thiserror::Error)]
pub enum CarryError {
    /// Reading (or hashing) the input file failed, or it changed.
    #[error("carrying a file of the input unchanged")]
    Read(#[source] ReadError),
    /// Writing the copy failed.
    #[error("{}: copying {} into the output", dest.display(), source_path.display())]
    Write {
        /// The file being written.
        dest: PathBuf,
        /// The input file.
        source_path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Hard-links every file of `files` into `tmp` (at its relative path) where the file system
/// allows; returns the files it could not link, for [`copy_all`], with what was linked.
pub fn link_all<'f>(
    tmp: &Path,
    files: &'f [CarriedFile],
    phase: &Progress,
    digests: &mut CarriedDigests,
) -> Result<Vec<&'f CarriedFile>, CarryError> {
    let mut unlinked = Vec::new();
    for f in files {
        let dest = tmp.join(&f.rel_path);
        make_parent(&dest, f)?;
        match link_one(f, &dest, phase)? {
            Some(d) => {
                phase.add_item();
                digests.insert(f.rel_path.clone(), d);
            }
            None => unlinked.push(f),
        }
    }
    Ok(unlinked)
}

/// Copies each of `files` into `tmp`, hashing as it copies.
pub fn copy_all(
    tmp: &Path,
    files: &[&CarriedFile],
    phase: &Progress,
    digests: &mut CarriedDigests,
) -> Result<(), CarryError> {
    for f in files {
        let dest = tmp.join(&f.rel_path);
        let d = copy_one(f, &dest, phase)?;
        phase.add_item();
        digests.insert(f.rel_path.clone(), d);
    }
    Ok(())
}

fn make_parent(dest: &Path, f: &CarriedFile) -> Result<(), CarryError> {
    let Some(dir) = dest.parent() else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).map_err(|source| CarryError::Write {
        dest: dir.to_path_buf(),
        source_path: f.source.clone(),
        source,
    })
}

/// Hashes `f.source` (the cache may know it: a link changes the file's change time, so it is
/// hashed before linking), then links it at `dest`. `None` when the link is refused (another
/// file system, a file system without links, `fs.protected_hardlinks` on a file this user does
/// not own): the caller copies it instead.
fn link_one(
    f: &CarriedFile,
    dest: &Path,
    phase: &Progress,
) -> Result<Option<(u64, String)>, CarryError> {
    let before = stamp(&f.source)?;
    unchanged_since_open(f, &before)?;
    let (bytes, sha) =
        sha256_input(&f.source, &|n| phase.add_bytes(n), NO_PACE).map_err(CarryError::Read)?;
    if std::fs::hard_link(&f.source, dest).is_err() {
        return Ok(None);
    }
    // The link changed the change time, and only that; the cache learns the new identity,
    // so the next run's link finds the hash there (the input's and the output's inode).
    let linked = stamp(dest)?;
    let after = FileStamp {
        ctime_ns: before.ctime_ns,
        ..linked
    };
    changed(&f.source, &before, &after)?;
    remember_unchanged(&linked, &sha);
    Ok(Some((bytes, sha)))
}

/// Copies `f.source` to `dest` in [`CHUNK`]s, hashing the bytes as they pass, and fsyncs it.
fn copy_one(f: &CarriedFile, dest: &Path, phase: &Progress) -> Result<(u64, String), CarryError> {
    let read_err = |e: std::io::Error| CarryError::Read(ReadError::io(&f.source, e));
    let write_err = |source: std::io::Error| CarryError::Write {
        dest: dest.to_path_buf(),
        source_path: f.source.clone(),
        source,
    };
    let mut input = std::fs::File::open(&f.source).map_err(read_err)?;
    let before = FileStamp::of(&input.metadata().map_err(read_err)?);
    unchanged_since_open(f, &before)?;
    let mut out = std::fs::File::create(dest).map_err(write_err)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; CHUNK.min(before.size.max(1) as usize)];
    let mut total = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(e)),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(write_err)?;
        total += n as u64;
        phase.add_bytes(n as u64);
    }
    out.sync_all().map_err(write_err)?;
    let after = FileStamp {
        size: total,
        ..stamp(&f.source)?
    };
    changed(&f.source, &before, &after)?;
    Ok((total, digest::hex(&hasher.finalize())))
}

fn stamp(path: &Path) -> Result<FileStamp, CarryError> {
    FileStamp::at(path).map_err(|e| CarryError::Read(ReadError::io(path, e)))
}

/// The file still has the size it had when the input was opened.
fn unchanged_since_open(f: &CarriedFile, now: &FileStamp) -> Result<(), CarryError> {
    if now.size == f.bytes {
        return Ok(());
    }
    Err(CarryError::Read(ReadError::Changed {
        path: f.source.clone(),
        what: format!(
            "it was {} bytes when wanbake opened the input, and is {} now",
            f.bytes, now.size
        ),
    }))
}

fn changed(path: &Path, before: &FileStamp, after: &FileStamp) -> Result<(), CarryError> {
    match describe_change(before, after, false) {
        None => Ok(()),
        Some(what) => Err(CarryError::Read(ReadError::Changed {
            path: path.to_path_buf(),
            what,
        })),
    }
}
