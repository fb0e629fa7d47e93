//! A pipeline folder in gives a loadable pipeline folder out (issue 33): the golden WanPipeline
//! (`golden/pipeline/wan_t2v`, saved by diffusers 0.42.1; `golden/pipeline_folder_golden.py`
//! loaded wanbake's outputs of it with `WanPipeline.from_pretrained`, recorded in
//! `golden/pipeline/manifest.json`) merged, converted and restacked by the real binary: every
//! file but the transformer's is the input's, byte for byte (a hard link on the same file
//! system, a copy across file systems), listed in the manifest and checked by `verify`; hidden
//! folders and an input release's own manifest are not carried; symlinked inputs (a Hugging
//! Face cache snapshot) are followed; a refused or interrupted run leaves nothing, and the
//! input's files their single link.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{gated_child, ok, parts, repo, run, spawn_gated, tmp, tree};

const LORA: &str = "golden/adapters/diffusers_lora/pytorch_lora_weights.safetensors";

/// The golden pipeline's files, relative to its root.
fn golden_files() -> Vec<String> {
    let dir = repo().join("golden/pipeline/wan_t2v");
    (tree(&dir).into_iter())
        .filter(|rel| dir.join(rel).is_file())
        .collect()
}

/// A writable copy of the golden pipeline at `dir`.
fn copy_pipeline(dir: &Path) {
    let src = repo().join("golden/pipeline/wan_t2v");
    for rel in golden_files() {
        let to = dir.join(&rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(src.join(&rel), to).unwrap();
    }
}

/// The files an output must hold unchanged: every file but the transformer's weights and
/// config (rewritten), model_index.json included (a root file, the same bytes).
fn untouched(files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|f| !f.starts_with("transformer/"))
        .cloned()
        .collect()
}

fn sha256(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The manifest's files: path → (bytes, sha256).
fn manifest_files(out: &Path) -> BTreeMap<String, (u64, String)> {
    let text = std::fs::read_to_string(out.join("wanbake.manifest.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                (
                    f["bytes"].as_u64().unwrap(),
                    f["sha256"].as_str().unwrap().into(),
                ),
            )
        })
        .collect()
}

/// Every file of `base` an output must hold unchanged is in `out`, byte for byte, a plain
/// file (not a symlink), listed in the manifest with its size and sha256; `verify` passes.
#[track_caller]
fn assert_carried(base: &Path, out: &Path, root: &Path) {
    let listed = manifest_files(out);
    for rel in untouched(&golden_files()) {
        let (a, b) = (base.join(&rel), out.join(&rel));
        let meta = b
            .symlink_metadata()
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(meta.file_type().is_file(), "{rel} is not a plain file");
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "{rel}"
        );
        let (bytes, sha) = listed
            .get(&rel)
            .unwrap_or_else(|| panic!("{rel} not listed"));
        assert_eq!(
            (*bytes, sha.as_str()),
            (meta.len(), sha256(&a).as_str()),
            "{rel}"
        );
    }
    let out_s = out.to_str().unwrap();
    let v = ok(run(root, &["verify", out_s]));
    assert!(v.contains(": OK ("), "{v}");
}

/// No temporary output of a run is left under `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|e| e.contains("wanbake-tmp") || e.ends_with(".lock"))
        .collect()
}

#[test]
fn merge_convert_and_restack_of_a_pipeline_carry_every_other_component_byte_for_byte() {
    let t = tmp();
    let base = t.path().join("base");
    copy_pipeline(&base);
    let lora = repo().join(LORA);
    let runs: [(&str, Vec<&str>); 3] = [
        (
            "merged",
            vec![
                "merge",
                "--base",
                "base",
                "--adapter",
                lora.to_str().unwrap(),
            ],
        ),
        ("converted", vec!["convert", "base", "--dtype", "bf16"]),
        (
            "restacked",
            vec!["restack", "base", "--to", "diffusers", "--dtype", "f16"],
        ),
    ];
    for (out, args) in runs {
        let mut args = args.clone();
        args.extend(["--out", out]);
        let said = ok(run(t.path(), &args));
        assert!(
            said.contains("carried 8 files unchanged from the input")
                && said.contains("hard links"),
            "{said}"
        );
        let out = t.path().join(out);
        assert_carried(&base, &out, t.path());
        // Every entry of the output: the input's, and the manifest.
        let mut want = tree(&base);
        want.push("wanbake.manifest.json".into());
        want.sort();
        assert_eq!(tree(&out), want);
        assert_eq!(
            std::fs::read(base.join("model_index.json")).unwrap(),
            std::fs::read(out.join("model_index.json")).unwrap()
        );
        // Hard links: the VAE's weights are the input's inode.
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let vae = "vae/diffusion_pytorch_model.safetensors";
        assert_eq!(ino(&base.join(vae)), ino(&out.join(vae)));
    }
    // The transformer was rewritten (merged: the diffusers oracle's own fuse_lora, checked
    // by the golden script; here: it differs from the input).
    assert_ne!(
        sha256(&base.join("transformer/diffusion_pytorch_model.safetensors")),
        sha256(
            &t.path()
                .join("merged/transformer/diffusion_pytorch_model.safetensors")
        )
    );
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
}

#[test]
fn verify_finds_a_carried_file_that_changed() {
    let t = tmp();
    let base = t.path().join("base");
    copy_pipeline(&base);
    ok(run(
        t.path(),
        &["convert", "base", "--dtype", "f32", "--out", "out"],
    ));
    // A new file in place of the link (editing the link in place would edit the input too).
    let cfg = t.path().join("out/scheduler/scheduler_config.json");
    let mut bytes = std::fs::read(&cfg).unwrap();
    bytes.push(b' ');
    std::fs::remove_file(&cfg).unwrap();
    std::fs::write(&cfg, bytes).unwrap();
    let (code, out, err) = parts(&run(t.path(), &["verify", "out"]));
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("mismatch: scheduler/scheduler_config.json: sha256"),
        "{out}{err}"
    );
}

#[test]
fn root_files_travel_hidden_folders_and_an_input_releases_manifest_do_not() {
    let t = tmp();
    let base = t.path().join("base");
    copy_pipeline(&base);
    // What a `huggingface-cli download --local-dir` and a git clone leave beside the model.
    std::fs::write(base.join(".gitattributes"), "*.safetensors filter=lfs\n").unwrap();
    std::fs::create_dir_all(base.join(".cache/huggingface/download")).unwrap();
    std::fs::write(
        base.join(".cache/huggingface/download/README.md.metadata"),
        "x",
    )
    .unwrap();
    let first = ok(run(
        t.path(),
        &["convert", "base", "--dtype", "bf16", "--out", "first"],
    ));
    assert!(first.contains("carried 9 files"), "{first}");
    let first = t.path().join("first");
    assert_eq!(
        std::fs::read(first.join(".gitattributes")).unwrap(),
        b"*.safetensors filter=lfs\n"
    );
    assert!(first.join("README.md").is_file());
    assert!(!first.join(".cache").exists());
    // A release of a pipeline is a pipeline: converted again, its manifest is not carried
    // (the new one describes the new output) and the new release verifies.
    ok(run(
        t.path(),
        &["convert", "first", "--dtype", "f32", "--out", "second"],
    ));
    let second = t.path().join("second");
    let listed = manifest_files(&second);
    assert!(listed.contains_key("vae/diffusion_pytorch_model.safetensors"));
    assert!(!listed.contains_key("wanbake.manifest.json"));
    ok(run(t.path(), &["verify", "second"]));
}

#[test]
fn a_hugging_face_snapshot_is_carried_as_the_files_its_links_point_to() {
    let t = tmp();
    let repo_dir = t.path().join("hub/models--tiny--wan-pipeline");
    let snapshot = repo_dir.join("snapshots/0123456789abcdef0123456789abcdef01234567");
    let blobs = repo_dir.join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let src = repo().join("golden/pipeline/wan_t2v");
    for rel in golden_files() {
        let blob = blobs.join(sha256(&src.join(&rel)));
        std::fs::copy(src.join(&rel), &blob).unwrap();
        let link = snapshot.join(&rel);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let depth = rel.matches('/').count() + 2;
        let target = PathBuf::from("../".repeat(depth))
            .join("blobs")
            .join(sha256(&blob));
        std::os::unix::fs::symlink(target, &link).unwrap();
    }
    std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
    std::fs::write(
        repo_dir.join("refs/main"),
        "0123456789abcdef0123456789abcdef01234567",
    )
    .unwrap();
    let said = ok(run(
        t.path(),
        &[
            "convert",
            "hub/models--tiny--wan-pipeline",
            "--dtype",
            "bf16",
            "--out",
            "out",
        ],
    ));
    assert!(said.contains("carried 8 files"), "{said}");
    assert_carried(&snapshot, &t.path().join("out"), t.path());
}

#[test]
fn across_file_systems_the_carried_files_are_copied() {
    // /dev/shm is a tmpfs on Linux: an input there and an output in the temp folder are on two
    // file systems, where no hard link can be made.
    let shm = Path::new("/dev/shm");
    let t = tmp();
    let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
    if !shm.is_dir() || dev(shm) == dev(t.path()) {
        eprintln!("skipped: /dev/shm is missing or on the temp folder's file system");
        return;
    }
    let input = tempfile::Builder::new()
        .prefix("wanbake-test-")
        .tempdir_in(shm)
        .unwrap();
    let base = input.path().join("base");
    copy_pipeline(&base);
    let out = t.path().join("out");
    let said = ok(run(
        t.path(),
        &[
            "convert",
            base.to_str().unwrap(),
            "--dtype",
            "bf16",
            "--out",
            "out",
        ],
    ));
    assert!(
        said.contains("carried 8 files") && said.contains("copies"),
        "{said}"
    );
    assert_carried(&base, &out, t.path());
}

#[test]
fn a_refused_run_leaves_nothing_and_the_input_untouched() {
    let t = tmp();
    let base = t.path().join("base");
    copy_pipeline(&base);
    let links = |p: &Path| std::fs::metadata(p).unwrap().nlink();
    let vae = base.join("vae/diffusion_pytorch_model.safetensors");
    // An adapter for an image-to-video model: refused when binding, before any output.
    let i2v = repo().join("golden/adapters/peft_i2v");
    let (code, _, err) = parts(&run(
        t.path(),
        &[
            "merge",
            "--base",
            "base",
            "--adapter",
            i2v.to_str().unwrap(),
            "--out",
            "out",
        ],
    ));
    assert_ne!(code, 0, "{err}");
    assert!(!t.path().join("out").exists());
    // An existing destination: refused, left as it was.
    std::fs::create_dir(t.path().join("taken")).unwrap();
    let (code, _, err) = parts(&run(
        t.path(),
        &["convert", "base", "--dtype", "bf16", "--out", "taken"],
    ));
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("already exists"), "{err}");
    assert!(tree(&t.path().join("taken")).is_empty());
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
    assert_eq!(links(&vae), 1);
}

#[test]
fn an_interrupted_run_removes_the_carried_files_with_the_rest() {
    use rustix::process::{Pid, Signal, kill_process};
    let t = tmp();
    copy_pipeline(&t.path().join("base"));
    let child = spawn_gated(
        "gated_convert",
        "convert",
        t.path(),
        std::process::Stdio::piped(),
    );
    // At the gate the carried files are in the temporary output: the VAE's weights have a
    // second link there.
    let vae = t
        .path()
        .join("base/vae/diffusion_pytorch_model.safetensors");
    let links = |p: &Path| std::fs::metadata(p).unwrap().nlink();
    assert_eq!(
        links(&vae),
        2,
        "the carried files are not staged at the gate"
    );
    assert!(!leftovers(t.path()).is_empty());
    kill_process(Pid::from_child(&child), Signal::INT).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("interrupted by SIG"), "{err}");
    assert!(!t.path().join("out").exists(), "a release was committed");
    assert!(leftovers(t.path()).is_empty(), "{:?}", leftovers(t.path()));
    assert_eq!(links(&vae), 1, "a carried link was left behind");
    assert_eq!(
        std::fs::read(&vae).unwrap(),
        std::fs::read(
            repo()
                .join("golden/pipeline/wan_t2v")
                .join("vae/diffusion_pytorch_model.safetensors")
        )
        .unwrap()
    );
}

/// What [`an_interrupted_run_removes_the_carried_files_with_the_rest`] runs in its child:
/// `wanbake convert base --dtype bf16 --out out`, held at its gate.
#[test]
#[ignore = "run by the interrupt test in a child process"]
fn gated_convert() {
    gated_child(|_, hooks| {
        let spec = wanbake::convert::ConvertSpec {
            input: PathBuf::from("base"),
            out: PathBuf::from("out"),
            dtype: wanbake::layout::OutputDType::BF16,
            shard_bytes: None,
            replace: wanbake::release::staging::Replace::Never,
            nonfinite: wanbake::pipeline::NonFinite::Refuse,
        };
        wanbake::convert::convert_release(&spec, hooks)?;
        Ok(())
    });
}

#[test]
fn a_quantized_or_orbax_output_of_a_pipeline_names_the_components_it_leaves_out() {
    let t = tmp();
    copy_pipeline(&t.path().join("base"));
    for (out, to) in [("fp8", "fp8-scaled"), ("orbax", "orbax")] {
        let (code, _, err) = parts(&run(
            t.path(),
            &["convert", "base", "--to", to, "--out", out],
        ));
        assert_eq!(code, 0, "{err}");
        assert!(
            err.contains(
                "not carried to the output: 8 files of the input pipeline \
                 (README.md, scheduler, text_encoder, tokenizer, vae)"
            ),
            "{to}: {err}"
        );
        assert!(!t.path().join(out).join("vae").exists());
    }
}

#[test]
fn a_pipeline_restacked_to_another_layout_says_it_is_no_diffusers_pipeline() {
    let t = tmp();
    copy_pipeline(&t.path().join("base"));
    for (to, warns) in [("wan", true), ("nnx", true), ("diffusers", false)] {
        let (code, _, err) = parts(&run(
            t.path(),
            &["restack", "base", "--to", to, "--out", to],
        ));
        assert_eq!(code, 0, "{err}");
        let said =
            format!("is not a diffusers pipeline: its transformers are in the `{to}` layout");
        assert_eq!(err.contains(&said), warns, "{to}: {err}");
        // The other components travel all the same.
        assert_carried(&t.path().join("base"), &t.path().join(to), t.path());
    }
}
