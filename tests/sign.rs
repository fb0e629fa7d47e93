//! `wanbake sign` and `wanbake verify --public-key` (issue 17), driven through the binary.
//!
//! Oracles, all made by the reference tool (PyPI model-signing 1.1.1, golden/signing/):
//! `example/` is the spec's own vector (a model signed by the real tool), `py/` holds the real
//! tool's signatures over `model/` with P-256/P-384/P-521 keys, and `wanbake/` holds wanbake's
//! signatures that the real tool's `verify key` accepted (golden/signing/interop.py).

mod common;

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{ok, parts, repo, run, tmp};
use wanbake::signing::{SigningKey, VerifyingKey, bundle};

fn golden() -> PathBuf {
    repo().join("golden/signing")
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// A writable copy of the spec example (model/ with the real tool's model.sig, pub.pem).
fn example(t: &Path) -> PathBuf {
    copy_tree(&golden().join("example"), t);
    t.join("model")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[track_caller]
fn code(o: std::process::Output, want: i32) -> (String, String) {
    let (c, out, err) = parts(&o);
    assert_eq!(c, want, "exit code\n--- stdout\n{out}\n--- stderr\n{err}");
    (out, err)
}

fn verify(dir: &Path, key: &Path, sig: Option<&Path>) -> std::process::Output {
    let mut args = vec!["verify", s(dir), "--public-key", s(key)];
    if let Some(sig) = sig {
        args.extend(["--signature", s(sig)]);
    }
    run(dir.parent().unwrap(), &args)
}

#[test]
fn the_reference_tools_signature_of_the_spec_example_verifies() {
    let t = tmp();
    let model = example(t.path());
    let (out, _) = code(verify(&model, &t.path().join("pub.pem"), None), 0);
    assert!(out.contains("signature OK (3 files, P-256 key"), "{out}");
    // A file under the top-level .github is ignored by both tools.
    std::fs::write(model.join(".github/more.txt"), "x").unwrap();
    code(verify(&model, &t.path().join("pub.pem"), None), 0);
}

#[test]
fn the_key_hint_is_the_sha256_of_the_canonical_public_key_pem() {
    let pem = std::fs::read(golden().join("example/pub.pem")).unwrap();
    let key = VerifyingKey::from_pem("pub.pem", &pem).unwrap();
    // The hint the real tool wrote into the example bundle (spec section 9).
    assert_eq!(
        key.hint(),
        "46104a87bf1338b893fd04f4cbd612e08627cf79071cec07dcb23171bd114cf2"
    );
    let sk = SigningKey::from_pem(
        "key.pem",
        &std::fs::read(golden().join("example/key.pem")).unwrap(),
    )
    .unwrap();
    assert_eq!(sk.verifying_key().hint(), key.hint());
}

#[test]
fn a_flipped_byte_an_extra_or_missing_file_another_key_are_each_rejected_with_exit_3() {
    let t = tmp();
    let model = example(t.path());
    let pubkey = t.path().join("pub.pem");
    let w = model.join("weights.bin");
    let orig = std::fs::read(&w).unwrap();
    let mut bad = orig.clone();
    bad[3] ^= 1;
    std::fs::write(&w, &bad).unwrap();
    let (_, err) = code(verify(&model, &pubkey, None), 3);
    assert!(err.contains("weights.bin: sha256"), "{err}");
    std::fs::write(&w, &orig).unwrap();
    code(verify(&model, &pubkey, None), 0);

    std::fs::write(model.join("sub/extra.txt"), "").unwrap();
    let (_, err) = code(verify(&model, &pubkey, None), 3);
    assert!(err.contains("sub/extra.txt: file is not covered"), "{err}");
    std::fs::remove_file(model.join("sub/extra.txt")).unwrap();

    std::fs::rename(model.join("config.json"), t.path().join("c.json")).unwrap();
    let (_, err) = code(verify(&model, &pubkey, None), 3);
    assert!(err.contains("config.json: signed file is missing"), "{err}");
    std::fs::rename(t.path().join("c.json"), model.join("config.json")).unwrap();

    let other = golden().join("keys/p256_pub.pem");
    let (_, err) = code(verify(&model, &other, None), 3);
    assert!(err.contains("key mismatch"), "{err}");
}

/// Rewrites the example bundle's JSON with `edit` (no re-signing).
fn edit_bundle(model: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = model.join("model.sig");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// One edit of a bundle's JSON.
type Edit = dyn FnOnce(&mut serde_json::Value);

#[test]
fn an_edited_payload_or_a_malformed_bundle_is_rejected_with_exit_3() {
    let cases: Vec<(&str, Box<Edit>)> = vec![
        (
            "does not verify",
            Box::new(|v| {
                let env = &mut v["dsseEnvelope"];
                let payload = STANDARD.decode(env["payload"].as_str().unwrap()).unwrap();
                let text = String::from_utf8(payload)
                    .unwrap()
                    .replace("\"model\"", "\"modex\"");
                env["payload"] = STANDARD.encode(text).into();
            }),
        ),
        (
            "unknown field",
            Box::new(|v| v["dsseEnvelope"]["extra"] = 1.into()),
        ),
        (
            "mediaType",
            Box::new(|v| {
                v["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.3".into()
            }),
        ),
        (
            "signatures is empty",
            Box::new(|v| v["dsseEnvelope"]["signatures"] = serde_json::json!([])),
        ),
        (
            "payloadType",
            Box::new(|v| v["dsseEnvelope"]["payloadType"] = "application/json".into()),
        ),
    ];
    for (want, edit) in cases {
        let t = tmp();
        let model = example(t.path());
        edit_bundle(&model, edit);
        let (_, err) = code(verify(&model, &t.path().join("pub.pem"), None), 3);
        assert!(err.contains(want), "case `{want}`: {err}");
    }
}

#[test]
fn a_missing_or_unreadable_signature_exits_1() {
    let t = tmp();
    let model = example(t.path());
    std::fs::remove_file(model.join("model.sig")).unwrap();
    let (_, err) = code(verify(&model, &t.path().join("pub.pem"), None), 1);
    assert!(err.contains("the release is not signed"), "{err}");
    // There but unreadable (a folder in its place): the OS's reason.
    std::fs::create_dir(model.join("model.sig")).unwrap();
    let (_, err) = code(verify(&model, &t.path().join("pub.pem"), None), 1);
    assert!(
        err.contains("model.sig: cannot read the signature"),
        "{err}"
    );
}

/// Signs `statement` with the example key into the example's model.sig (as a hostile signer
/// holding the right key could).
fn resign(model: &Path, statement: &serde_json::Value) {
    let key = SigningKey::from_pem(
        "key.pem",
        &std::fs::read(model.parent().unwrap().join("key.pem")).unwrap(),
    )
    .unwrap();
    let payload = serde_json::to_vec(statement).unwrap();
    let sig = key.sign_der(&bundle::pae(&payload));
    let b = bundle::write(&key.verifying_key().hint(), &payload, &sig);
    std::fs::write(model.join("model.sig"), b).unwrap();
}

#[test]
fn ignore_paths_that_could_hide_release_files_are_refused() {
    // The real tool accepts `ignore_paths: ["."]` with no resources (spec section 10): it
    // signs nothing. wanbake refuses it, and any entry that hides a file of the folder.
    let empty_root = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    let statement = |ignore: &[&str], resources: serde_json::Value, root: &str| {
        serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"name": "model", "digest": {"sha256": root}}],
            "predicateType": "https://model_signing/signature/v1.0",
            "predicate": {"serialization": {"method": "files", "hash_type": "sha256",
                "allow_symlinks": false, "ignore_paths": ignore}, "resources": resources}
        })
    };
    let t = tmp();
    let model = example(t.path());
    let pubkey = t.path().join("pub.pem");
    resign(
        &model,
        &statement(&["."], serde_json::json!([]), empty_root),
    );
    let (_, err) = code(verify(&model, &pubkey, None), 3);
    assert!(err.contains("ignore_paths entry `.` is unsafe"), "{err}");
    resign(
        &model,
        &statement(&["sub"], serde_json::json!([]), empty_root),
    );
    let (_, err) = code(verify(&model, &pubkey, None), 3);
    assert!(
        err.contains("would hide the file `sub/readme.txt`"),
        "{err}"
    );
    // The same statement machinery with the real resources verifies (the test is not vacuous).
    let payload: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.path().join("payload.json")).unwrap()).unwrap();
    resign(&model, &payload);
    code(verify(&model, &pubkey, None), 0);
}

const CASES: [(&str, &str); 5] = [
    ("p256_sec1", "p256"),
    ("p256_pkcs8", "p256"),
    ("p384_sec1", "p384"),
    ("p384_pkcs8", "p384"),
    ("p521_pkcs8", "p521"),
];

#[test]
fn the_reference_tools_signatures_with_p256_p384_p521_keys_verify() {
    for (stem, curve) in CASES {
        let t = tmp();
        let model = t.path().join("model");
        copy_tree(&golden().join("model"), &model);
        let sig = golden().join(format!("py/{stem}.sig"));
        let pubkey = golden().join(format!("keys/{curve}_pub.pem"));
        code(verify(&model, &pubkey, Some(&sig)), 0);
        let other = if curve == "p384" { "p256" } else { "p384" };
        let (_, err) = code(
            verify(
                &model,
                &golden().join(format!("keys/{other}_pub.pem")),
                Some(&sig),
            ),
            3,
        );
        assert!(err.contains("key mismatch"), "{stem}: {err}");
    }
}

#[test]
fn wanbake_signs_deterministically_the_bytes_the_reference_tool_accepted() {
    for (stem, curve) in CASES {
        let t = tmp();
        let model = t.path().join("model");
        copy_tree(&golden().join("model"), &model);
        let sig = t.path().join(format!("{stem}.sig"));
        let key = golden().join(format!("keys/{stem}.pem"));
        ok(run(
            t.path(),
            &["sign", "model", "--key", s(&key), "--signature", s(&sig)],
        ));
        let want = std::fs::read(golden().join(format!("wanbake/{stem}.sig"))).unwrap();
        assert_eq!(std::fs::read(&sig).unwrap(), want, "{stem}");
        let pubkey = golden().join(format!("keys/{curve}_pub.pem"));
        code(verify(&model, &pubkey, Some(&sig)), 0);
    }
}

#[test]
fn re_signing_replaces_the_signature_and_never_lists_it() {
    let t = tmp();
    let model = t.path().join("model");
    copy_tree(&golden().join("model"), &model);
    let key = golden().join("keys/p256_pkcs8.pem");
    ok(run(t.path(), &["sign", "model", "--key", s(&key)]));
    let first = std::fs::read(model.join("model.sig")).unwrap();
    ok(run(t.path(), &["sign", "model", "--key", s(&key)]));
    assert_eq!(std::fs::read(model.join("model.sig")).unwrap(), first);
    let v: serde_json::Value = serde_json::from_slice(&first).unwrap();
    let payload = STANDARD
        .decode(v["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    let names: Vec<&str> = st["predicate"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // Component order, hidden and empty files included, git paths and model.sig left out.
    assert_eq!(
        names,
        [
            ".hidden",
            "Z",
            "a/b",
            "a-b",
            "a.b",
            "config.json",
            "empty.txt",
            "sub/readme.txt",
            "weights.bin"
        ]
    );
    code(verify(&model, &golden().join("keys/p256_pub.pem"), None), 0);
}

#[test]
fn ed25519_and_rsa_keys_are_refused_and_nothing_is_written() {
    for (stem, what) in [("ed25519", "Ed25519"), ("rsa", "RSA")] {
        let t = tmp();
        let model = t.path().join("model");
        copy_tree(&golden().join("model"), &model);
        let key = golden().join(format!("keys/{stem}.pem"));
        let (_, err) = code(run(t.path(), &["sign", "model", "--key", s(&key)]), 1);
        assert!(err.contains(&format!("found an {what} key")), "{err}");
        assert!(!model.join("model.sig").exists());
    }
    let t = tmp();
    let model = example(t.path());
    let (_, err) = code(
        verify(&model, &golden().join("keys/ed25519_pub.pem"), None),
        1,
    );
    assert!(err.contains("found an Ed25519 key"), "{err}");
}

#[test]
fn symlinks_and_special_files_are_refused_and_nothing_is_written() {
    let t = tmp();
    let model = t.path().join("model");
    copy_tree(&golden().join("model"), &model);
    let key = golden().join("keys/p256_pkcs8.pem");
    std::os::unix::fs::symlink("config.json", model.join(".github/link")).unwrap();
    let (_, err) = code(run(t.path(), &["sign", "model", "--key", s(&key)]), 1);
    assert!(err.contains("is a symbolic link"), "{err}");
    assert!(!model.join("model.sig").exists());
    std::fs::remove_file(model.join(".github/link")).unwrap();
    let fifo = model.join("sub/pipe");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    let (_, err) = code(run(t.path(), &["sign", "model", "--key", s(&key)]), 1);
    assert!(
        err.contains("neither a regular file nor a directory"),
        "{err}"
    );
    assert!(!model.join("model.sig").exists());
}

#[test]
fn a_baked_release_signs_from_its_manifest_and_verifies_both_ways() {
    let t = tmp();
    let out = t.path().join("demo-out");
    // The demo recipe without its checks (they are tested in tests/bake.rs).
    let text = std::fs::read_to_string(repo().join("recipes/demo.toml")).unwrap();
    let text = text[..text.find("[[check]]").unwrap_or(text.len())]
        .replace("\"../", &format!("\"{}/", repo().display()))
        .replace(
            &format!("\"{}/out/demo\"", repo().display()),
            &format!("\"{}\"", out.display()),
        );
    std::fs::write(t.path().join("demo.toml"), text).unwrap();
    ok(run(t.path(), &["bake", "demo.toml"]));
    let key = golden().join("keys/p384_sec1.pem");
    let pubkey = golden().join("keys/p384_pub.pem");
    let stdout = ok(run(t.path(), &["sign", "demo-out", "--key", s(&key)]));
    assert!(
        stdout.contains("digests from the verified manifest"),
        "{stdout}"
    );
    // Plain verify still passes: the signature is not an unlisted output.
    ok(run(t.path(), &["verify", "demo-out"]));
    let stdout = ok(verify(&out, &pubkey, None));
    assert!(
        stdout.contains("manifest OK") && stdout.contains("signature OK (3 files"),
        "{stdout}"
    );
    let cfg = out.join("config.json");
    let mut bytes = std::fs::read(&cfg).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&cfg, bytes).unwrap();
    let (_, err) = code(verify(&out, &pubkey, None), 3);
    assert!(
        err.contains("mismatch: config.json") && err.contains("mismatch: signature: config.json"),
        "{err}"
    );
}

/// The demo recipe without its checks, writing to `out`, plus `extra` TOML.
fn demo_recipe(dir: &Path, out: &Path, extra: &str) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("recipes/demo.toml")).unwrap();
    let text = text[..text.find("[[check]]").unwrap_or(text.len())]
        .replace("\"../", &format!("\"{}/", repo().display()))
        .replace(
            &format!("\"{}/out/demo\"", repo().display()),
            &format!("\"{}\"", out.display()),
        );
    let path = dir.join("demo.toml");
    std::fs::write(&path, format!("{text}\n{extra}")).unwrap();
    path
}

/// Every file under `dir`, recursively.
fn all_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(all_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_recipe_with_sign_bakes_a_signed_release_and_never_shows_the_private_key() {
    let t = tmp();
    let keys = t.path().join("secret-keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::copy(
        golden().join("keys/p256_sec1.pem"),
        keys.join("release-key.pem"),
    )
    .unwrap();
    let out = t.path().join("demo-out");
    let recipe = demo_recipe(
        t.path(),
        &out,
        "[sign]\nkey = \"secret-keys/release-key.pem\"\n",
    );
    let o = run(t.path(), &["bake", s(&recipe)]);
    let (_, _, stderr) = parts(&o);
    let stdout = ok(o);
    assert!(
        stdout.contains("signed: model.sig (P-256 key hint "),
        "{stdout}"
    );
    let pubkey = golden().join("keys/p256_pub.pem");
    let hint = VerifyingKey::from_pem("p", &std::fs::read(&pubkey).unwrap())
        .unwrap()
        .hint();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("wanbake.manifest.json")).unwrap()).unwrap();
    assert_eq!(m["options"]["sign"]["key_hint"], hint.as_str());
    let stdout_v = ok(verify(&out, &pubkey, None));
    assert!(stdout_v.contains("signature OK (3 files"), "{stdout_v}");
    ok(run(t.path(), &["verify", "demo-out"]));
    // The subject is the release's own name, not the temporary directory's.
    let first_sig = std::fs::read(out.join("model.sig")).unwrap();
    let sig: serde_json::Value = serde_json::from_slice(&first_sig).unwrap();
    let payload = STANDARD
        .decode(sig["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(st["subject"][0]["name"], "demo-out");
    // Neither the key's path nor its bytes appear in any output.
    let key_text = std::fs::read_to_string(keys.join("release-key.pem")).unwrap();
    let key_body: String = key_text.lines().nth(1).unwrap().to_string();
    let json = run(t.path(), &["bake", s(&recipe), "--json"]);
    let (_, json_out, json_err) = parts(&json);
    let mut texts = vec![stdout.clone(), stderr, json_out, json_err];
    for f in all_files(&out) {
        texts.push(String::from_utf8_lossy(&std::fs::read(f).unwrap()).into_owned());
    }
    for text in &texts {
        for needle in ["release-key", "secret-keys", key_body.as_str()] {
            assert!(!text.contains(needle), "`{needle}` appears in an output");
        }
    }
    // The same recipe and key give the same signature (and manifest).
    assert_eq!(std::fs::read(out.join("model.sig")).unwrap(), first_sig);
}

#[test]
fn a_recipe_with_a_refused_key_writes_nothing_and_does_not_name_the_key_file() {
    let t = tmp();
    std::fs::copy(
        golden().join("keys/ed25519.pem"),
        t.path().join("hidden-name.pem"),
    )
    .unwrap();
    let out = t.path().join("demo-out");
    let recipe = demo_recipe(t.path(), &out, "[sign]\nkey = \"hidden-name.pem\"\n");
    let (out_text, err) = code(run(t.path(), &["bake", s(&recipe)]), 1);
    assert!(
        err.contains("sign.key") && err.contains("found an Ed25519 key"),
        "{err}"
    );
    assert!(
        !err.contains("hidden-name") && !out_text.contains("hidden-name"),
        "{err}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        2,
        "only the recipe and the key"
    );
}

#[test]
fn a_bundle_without_a_key_hint_is_checked_by_its_signature_alone_with_a_warning() {
    // The real tool accepts `hint: ""` and `publicKey: {}` with a warning (spec section 10).
    let t = tmp();
    let model = example(t.path());
    edit_bundle(&model, |v| {
        v["verificationMaterial"]["publicKey"] = serde_json::json!({"hint": ""})
    });
    let (_, err) = code(verify(&model, &t.path().join("pub.pem"), None), 0);
    assert!(err.contains("no key hint"), "{err}");
    let (_, err) = code(verify(&model, &golden().join("keys/p256_pub.pem"), None), 3);
    assert!(err.contains("the signature does not verify"), "{err}");
}

/// `verify --json` prints one document, with or without `--public-key`: a `result` a script
/// can test (`verified` exactly when the exit status is 0) and the `reasons`, beside the
/// manifest's and the signature's reports (issue 33: a corrupted release used to print the
/// manifest's recorded `"status": "ok"` next to its mismatches).
#[test]
fn verify_json_has_one_result_a_script_can_test() {
    let t = tmp();
    let release = t.path().join("release");
    let g = repo().join("golden/models/t2v");
    ok(run(
        t.path(),
        &["convert", s(&g), "--dtype", "bf16", "--out", s(&release)],
    ));
    let json = |args: &[&str], want: i32| -> serde_json::Value {
        let mut a = vec!["verify", s(&release), "--json"];
        a.extend(args);
        let (out, _) = code(run(t.path(), &a), want);
        serde_json::from_str(&out).unwrap()
    };
    let v = json(&[], 0);
    assert_eq!(v["result"], "verified", "{v}");
    assert_eq!(v["reasons"], serde_json::json!([]), "{v}");
    assert!(v["manifest"]["files_checked"].as_u64() > Some(0), "{v}");
    assert!(v["signature"].is_null(), "{v}");
    // Signed: the same shape, both reports present.
    let key = golden().join("keys/p256_pkcs8.pem");
    ok(run(t.path(), &["sign", s(&release), "--key", s(&key)]));
    let public = golden().join("keys/p256_pub.pem");
    let v = json(&["--public-key", s(&public)], 0);
    assert_eq!(v["result"], "verified", "{v}");
    assert!(v["manifest"]["files_checked"].as_u64() > Some(0), "{v}");
    assert!(v["signature"].is_object(), "{v}");
    // Corrupted: `failed`, with the reason, on both paths.
    let weights = release.join("diffusion_pytorch_model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(&weights, bytes).unwrap();
    for args in [vec![], vec!["--public-key", s(&public)]] {
        let v = json(&args, 3);
        assert_eq!(v["result"], "failed", "{v}");
        let reasons = v["reasons"].to_string();
        assert!(reasons.contains("2 mismatches with the manifest"), "{v}");
        assert_eq!(
            v["manifest"]["status"], "ok",
            "the manifest's own record stays: {v}"
        );
    }
}

/// What a user hits first with keys and folders (issue 33), each one clear line naming the
/// path and the way out, nothing written: an encrypted key (both PEM forms OpenSSL 3 writes,
/// golden/signing/keys/p256_encrypted_*.pem, passphrase `wanbake-test`), a missing key file,
/// `verify` on a file or a folder that is no release, and `verify --public-key` on a release
/// that was never signed.
#[test]
fn key_and_folder_mistakes_are_explained() {
    let t = tmp();
    let release = t.path().join("release");
    let g = repo().join("golden/models/t2v");
    ok(run(
        t.path(),
        &["convert", s(&g), "--dtype", "bf16", "--out", s(&release)],
    ));
    let fails = |args: &[&str], needles: &[&str]| {
        let (_, err) = code(run(t.path(), args), 1);
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in\n{err}");
        }
    };
    for form in ["pkcs8", "sec1"] {
        let key = golden().join(format!("keys/p256_encrypted_{form}.pem"));
        fails(
            &["sign", s(&release), "--key", s(&key)],
            &["the key is encrypted", "openssl pkey"],
        );
    }
    assert!(!release.join("model.sig").exists());
    let missing = t.path().join("nope.pem");
    fails(
        &["sign", s(&release), "--key", s(&missing)],
        &["nope.pem: cannot read the key file: No such file"],
    );
    let weights = release.join("diffusion_pytorch_model.safetensors");
    fails(
        &["verify", s(&weights)],
        &["is a file; a release is the folder"],
    );
    fails(
        &["verify", s(&t.path().join("absent"))],
        &["absent: no such folder"],
    );
    fails(
        &["verify", s(&g)],
        &["no wanbake.manifest.json, so not a wanbake release"],
    );
    let public = golden().join("keys/p256_pub.pem");
    fails(
        &["verify", s(&release), "--public-key", s(&public)],
        &["the release is not signed", "model.sig", "wanbake sign"],
    );
}
