//! Hugging Face cache layouts as inputs (issue 33): `hf:ORG/NAME[@REVISION]` and a cache
//! repo folder (`models--ORG--NAME`) open the snapshot their ref names, wherever a model or
//! adapter path is taken (command line and recipe); the snapshot's files, symlinks into
//! `blobs/`, are hashed as the files they point to; a missing repo or revision names where
//! it was looked for. The caches are built here in huggingface_hub's layout (relative
//! symlinks `snapshots/<commit>/<file> -> ../../blobs/<sha256>`, `refs/<name>` holding the
//! commit), and the hashes are computed here with `sha2`, not by wanbake.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

const COMMIT_A: &str = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1";
const COMMIT_B: &str = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2";

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Adds `commit` of repo `ORG/NAME` under `hub`, holding the files of `src` (a folder or
/// one file) as symlinks into `blobs/`; `refs` name it.
fn cache_snapshot(hub: &Path, repo: &str, commit: &str, src: &Path, refs: &[&str]) -> PathBuf {
    let root = hub.join(format!("models--{}", repo.replace('/', "--")));
    let snapshot = root.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    let files: Vec<PathBuf> = match src.is_dir() {
        true => std::fs::read_dir(src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect(),
        false => vec![src.to_path_buf()],
    };
    for f in files {
        let sha = sha256_hex(&f);
        std::fs::copy(&f, root.join("blobs").join(&sha)).unwrap();
        let link = snapshot.join(f.file_name().unwrap());
        std::os::unix::fs::symlink(format!("../../blobs/{sha}"), link).unwrap();
    }
    for r in refs {
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs").join(r), commit).unwrap();
    }
    snapshot
}

/// Runs wanbake in `cwd` with only the cache variables of `env` set.
fn run_env(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut c = Command::new(bin());
    c.args(args).current_dir(cwd);
    for k in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
        "HOME",
    ] {
        c.env_remove(k);
    }
    c.env("WANBAKE_CACHE_DIR", cwd.join("wanbake-cache"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn inspect_json(cwd: &Path, env: &[(&str, &Path)], path: &str) -> Value {
    let out = ok(run_env(cwd, env, &["inspect", "--json", "--hash", path]));
    serde_json::from_str::<Value>(&out).unwrap()[0].clone()
}

/// A tiny T2V repo: `main` at commit A (the diffusers folder), `v2` at commit B (the
/// original-naming file).
fn t2v_repo(hub: &Path) -> (PathBuf, PathBuf) {
    let a = cache_snapshot(
        hub,
        "Wan-AI/Tiny",
        COMMIT_A,
        &repo().join("golden/models/t2v"),
        &["main"],
    );
    let b = cache_snapshot(
        hub,
        "Wan-AI/Tiny",
        COMMIT_B,
        &repo().join("golden/models/t2v_original.safetensors"),
        &["v2"],
    );
    (a, b)
}

#[test]
fn references_and_repo_folders_open_the_snapshot_their_ref_names() {
    let t = tmp();
    let weights = repo().join("golden/models/t2v/diffusion_pytorch_model.safetensors");
    let want_sha = sha256_hex(&weights);
    // The three places the cache is looked for, each on its own.
    for (var, value, under) in [
        ("HF_HUB_CACHE", "c1", ""),
        ("HF_HOME", "c2", "hub"),
        ("HOME", "c3", ".cache/huggingface/hub"),
    ] {
        let set = t.path().join(value);
        let hub = set.join(under);
        let (a, b) = t2v_repo(&hub);
        let env = [(var, set.as_path())];
        let r = inspect_json(t.path(), &env, "hf:Wan-AI/Tiny");
        assert_eq!(r["path"], a.display().to_string(), "{var}");
        let file = &r["components"][0]["files"][0];
        // Named by its snapshot path, hashed as the blob it points to.
        assert_eq!(
            file["path"],
            a.join("diffusion_pytorch_model.safetensors")
                .display()
                .to_string()
        );
        assert_eq!(file["sha256"], want_sha.as_str(), "{var}");
        assert_eq!(r["components"][0]["tensor_count"], 96);
        for rev in ["v2", COMMIT_B] {
            let r = inspect_json(t.path(), &env, &format!("hf:Wan-AI/Tiny@{rev}"));
            assert_eq!(r["path"], b.display().to_string(), "@{rev}");
        }
        // A file inside the snapshot.
        let r = inspect_json(t.path(), &env, "hf:Wan-AI/Tiny@v2/t2v_original.safetensors");
        assert_eq!(
            r["path"],
            b.join("t2v_original.safetensors").display().to_string()
        );
        // The cache repo folder itself: its refs/main.
        let folder = hub.join("models--Wan-AI--Tiny");
        let r = inspect_json(t.path(), &[], folder.to_str().unwrap());
        assert_eq!(r["path"], a.display().to_string());
    }
}

#[test]
fn merge_and_bake_read_bases_and_adapters_from_the_cache() {
    let t = tmp();
    let hub = t.path().join("hub");
    let (snap, _) = t2v_repo(&hub);
    let lora = cache_snapshot(
        &hub,
        "someone/tiny-lora",
        COMMIT_A,
        &repo().join("golden/adapters/peft_plain"),
        &["main"],
    );
    let env = [("HF_HUB_CACHE", hub.as_path())];
    let merge = |out: &str, base: &str, adapter: &str| {
        let args = ["merge", "--base", base, "--adapter", adapter, "--out", out];
        ok(run_env(t.path(), &env, &args));
        let m: Value = serde_json::from_slice(
            &std::fs::read(t.path().join(out).join("wanbake.manifest.json")).unwrap(),
        )
        .unwrap();
        let weights = std::fs::read(
            t.path()
                .join(out)
                .join("diffusion_pytorch_model.safetensors"),
        );
        (m, weights.unwrap())
    };
    let (m, from_cache) = merge("a", "hf:Wan-AI/Tiny", "hf:someone/tiny-lora:0.5");
    let direct = repo().join("golden/models/t2v");
    let (_, from_golden) = merge(
        "b",
        direct.to_str().unwrap(),
        &format!(
            "{}:0.5",
            repo().join("golden/adapters/peft_plain").display()
        ),
    );
    assert!(
        from_cache == from_golden,
        "the same merge, read from the cache"
    );
    // The manifest names the snapshot paths and the hashes of the blobs behind them.
    let inputs = m["inputs"].as_array().unwrap();
    for (dir, golden) in [
        (&snap, direct.clone()),
        (&lora, repo().join("golden/adapters/peft_plain")),
    ] {
        for f in std::fs::read_dir(&golden).unwrap() {
            let f = f.unwrap().path();
            let named = dir.join(f.file_name().unwrap()).display().to_string();
            let entry = inputs.iter().find(|i| i["path"] == named.as_str());
            let entry = entry.unwrap_or_else(|| panic!("{named} not in {inputs:?}"));
            assert_eq!(entry["sha256"], sha256_hex(&f).as_str(), "{named}");
        }
    }
    // A recipe: the reference and a repo folder relative to the recipe.
    let recipe = t.path().join("r.toml");
    std::fs::write(
        &recipe,
        "[base]\npath = \"hf:Wan-AI/Tiny\"\n\n[[adapter]]\npath = \"hub/models--someone--tiny-lora\"\n\
         strength = 0.5\n\n[output]\ndir = \"baked\"\n",
    )
    .unwrap();
    let plan = ok(run_env(t.path(), &env, &["bake", "r.toml", "--dry-run"]));
    // (An adapter inside the recipe's folder is shown relative to it.)
    let lora_rel = lora.strip_prefix(t.path()).unwrap().display().to_string();
    assert!(
        plan.contains(&format!("base     {} ", snap.display()))
            && plan.contains(&format!("adapter[0] {lora_rel}: peft")),
        "{plan}"
    );
}

#[test]
fn a_missing_repo_or_revision_names_where_it_looked() {
    let t = tmp();
    let hub = t.path().join("hub");
    let (snap, _) = t2v_repo(&hub);
    let home = t.path().join("home");
    let hf_home = t.path().join("hfhome");
    let env = [
        ("HF_HUB_CACHE", hub.as_path()),
        ("HF_HOME", hf_home.as_path()),
        ("HOME", home.as_path()),
    ];
    let (code, _, err) = parts(&run_env(t.path(), &env, &["inspect", "hf:Wan-AI/Other"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("models--Wan-AI--Other"), "{err}");
    for dir in [
        hub.clone(),
        hf_home.join("hub"),
        home.join(".cache/huggingface/hub"),
    ] {
        assert!(err.contains(&dir.display().to_string()), "{dir:?} in {err}");
    }
    // A revision that is not cached: the refs and snapshots that are.
    let (code, _, err) = parts(&run_env(
        t.path(),
        &env,
        &[
            "merge",
            "--base",
            "hf:Wan-AI/Tiny@v9",
            "--adapter",
            "x",
            "--out",
            "o",
        ],
    ));
    assert_eq!(code, 1, "{err}");
    for part in ["`v9`", "refs: main, v2", COMMIT_A, COMMIT_B] {
        assert!(err.contains(part), "{part} in {err}");
    }
    // A ref whose snapshot is gone.
    std::fs::remove_dir_all(&snap).unwrap();
    let (code, _, err) = parts(&run_env(t.path(), &env, &["inspect", "hf:Wan-AI/Tiny"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("refs/main") && err.contains(COMMIT_A), "{err}");
    // Not ORG/NAME; in a recipe, the field is named.
    let (code, _, err) = parts(&run_env(t.path(), &env, &["inspect", "hf:Wan-AI"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("expected hf:ORG/NAME"), "{err}");
    std::fs::write(
        t.path().join("r.toml"),
        "[base]\npath = \"hf:Wan-AI/Other\"\n\n[output]\ndir = \"baked\"\n",
    )
    .unwrap();
    let (code, _, err) = parts(&run_env(t.path(), &env, &["bake", "r.toml", "--dry-run"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("base.path") && err.contains(&hub.display().to_string()),
        "{err}"
    );
}
