//! Error text through the real binary (issue 28, item 5): `error: ` and each cause once,
//! as the chain has them; then the `hint: ` line, spelled for the front end that ran: the
//! command's flags, or the recipe's keys for `bake` (and `bake --dry-run`). Each refusal
//! leaves nothing written, and following the hint makes the refusal go away.

mod common;

use std::path::{Path, PathBuf};

use common::{parts, repo, run, tmp, tree, write_f32};

/// The OS's text for ENOENT.
fn enoent() -> String {
    std::io::Error::from_raw_os_error(2).to_string()
}

/// Exit code and stderr of `wanbake ARGS` in `dir`.
fn refused(dir: &Path, args: &[&str]) -> (i32, String) {
    let (code, out, err) = parts(&run(dir, args));
    assert_ne!(code, 0, "expected a refusal of {args:?}\n{out}");
    (code, err)
}

/// A recipe `r.toml` in `dir`: `base`, one adapter (`adapter_extra` lines under it), the
/// output `out` (`output_extra` lines under it) and a `[merge]` of `merge` lines.
fn recipe(
    dir: &Path,
    base: &Path,
    adapter: &Path,
    adapter_extra: &str,
    output_extra: &str,
    merge: &str,
) -> PathBuf {
    let text = format!(
        "[base]\npath = \"{}\"\n\n[[adapter]]\npath = \"{}\"\n{adapter_extra}\n\n\
         [output]\ndir = \"out\"\n{output_extra}\n\n[merge]\n{merge}\n",
        base.display(),
        adapter.display()
    );
    let path = dir.join("r.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn t2v() -> PathBuf {
    repo().join("golden/models/t2v")
}

fn lora() -> PathBuf {
    repo().join("golden/adapters/comfy_lora/comfy_lora.safetensors")
}

/// Regression for issue 28 item 5: main printed the chain skipping any cause whose text
/// was already printed, because errors said their source and returned it too. Each now
/// says only its own part and the chain is printed as it is; for a nested I/O error the
/// text is the old de-duplicated one, byte for byte (these are the old binary's stderr).
#[test]
fn r_issue_28_a_nested_io_error_reads_as_before() {
    let t = tmp();
    let d = t.path();
    let e = enoent();
    let (code, err) = refused(d, &["inspect", "/nonexistent/x.safetensors"]);
    assert_eq!(
        (code, err.as_str()),
        (1, &*format!("error: /nonexistent/x.safetensors: {e}\n"))
    );
    let args = ["merge", "--base", "/nonexistent", "--adapter"];
    let (code, err) = refused(
        d,
        &[&args[..], &[lora().to_str().unwrap(), "--out", "o"]].concat(),
    );
    assert_eq!(
        (code, err.as_str()),
        (1, &*format!("error: /nonexistent: {e}\n"))
    );
    let r = recipe(d, Path::new("/nonexistent"), &lora(), "", "", "");
    let (code, err) = refused(d, &["bake", r.to_str().unwrap()]);
    assert_eq!(
        (code, err.as_str()),
        (1, &*format!("error: /nonexistent: {e}\n"))
    );
    let (code, err) = refused(d, &["bake", "missing.toml"]);
    assert_eq!(
        (code, err.as_str()),
        (1, &*format!("error: missing.toml: {e}\n"))
    );
    // Four links, each said once.
    let (code, err) = refused(
        d,
        &[
            &args[..],
            &[
                lora().to_str().unwrap(),
                "--out",
                "o",
                "--svd-cache",
                // Created when missing (issue 33), so one that cannot be: under a file.
                "r.toml/cache",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, 2, "{err}");
    let enotdir = std::io::Error::from_raw_os_error(20).to_string();
    assert_eq!(
        err,
        format!(
            "error: --svd-cache: SVD cache: r.toml/cache: failed to create directory \
             `r.toml/cache`: {enotdir}\n"
        )
    );
    assert_eq!(tree(d), ["r.toml"], "something was written");
}

/// An adapter entry that binds to nothing: the flag for `merge`, the `[merge]` key for
/// `bake`, no hint for `extract` (it has no such flag).
#[test]
fn r_issue_28_unmatched_entries_hint_in_the_front_ends_spelling() {
    let t = tmp();
    let d = t.path();
    let adapter = d.join("a.safetensors");
    write_f32(
        &adapter,
        &[
            (
                "diffusion_model.blocks.0.self_attn.q.lora_down.weight",
                vec![2, 32],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.0.self_attn.q.lora_up.weight",
                vec![32, 2],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.7.self_attn.q.lora_down.weight",
                vec![2, 32],
                vec![0.0; 64],
            ),
            (
                "diffusion_model.blocks.7.self_attn.q.lora_up.weight",
                vec![32, 2],
                vec![0.0; 64],
            ),
        ],
    );
    let (base, a) = (t2v(), adapter.to_str().unwrap().to_string());
    let merge = [
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        &a,
        "--out",
        "out",
    ];
    let (code, err) = refused(d, &merge);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1 entry binds to no tensor of the base"),
        "{err}"
    );
    assert!(
        err.ends_with("\nhint: pass --allow-unmatched to skip them knowingly\n"),
        "{err}"
    );
    let extract = ["extract", "--base", base.to_str().unwrap(), "--adapter", &a];
    let (code, err) = refused(
        d,
        &[&extract[..], &["--rank", "2", "--out", "out"]].concat(),
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("binds to no tensor") && !err.contains("hint:"),
        "{err}"
    );

    let r = recipe(d, &base, &adapter, "", "", "");
    for dry in [&[][..], &["--dry-run"]] {
        let (code, err) = refused(d, &[&["bake", r.to_str().unwrap()][..], dry].concat());
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("binds to no tensor of the base"), "{err}");
        assert!(
            err.ends_with(
                "\nhint: set `allow_unmatched = true` in [merge] to skip them knowingly\n"
            ),
            "{err}"
        );
        assert!(!err.contains("--"), "a recipe's hint names no flag: {err}");
    }
    assert_eq!(
        tree(d),
        ["a.safetensors", "r.toml"],
        "something was written"
    );
    // Each hint, followed, is accepted.
    recipe(d, &base, &adapter, "", "", "allow_unmatched = true");
    common::ok(run(d, &["bake", r.to_str().unwrap(), "--dry-run"]));
    common::ok(run(d, &[&merge[..], &["--allow-unmatched"]].concat()));
}

/// An output that exists: `--overwrite` for the commands that have it, `overwrite = true`
/// in `[output]` for `bake`.
#[test]
fn r_issue_28_an_existing_output_hints_in_the_front_ends_spelling() {
    let t = tmp();
    let d = t.path();
    std::fs::create_dir(d.join("out")).unwrap();
    let (base, lora) = (t2v(), lora());
    let merge = [
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        lora.to_str().unwrap(),
        "--out",
        "out",
    ];
    let (code, err) = refused(d, &merge);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err,
        "error: out: already exists\nhint: choose another output path or pass --overwrite\n"
    );
    let r = recipe(d, &base, &lora, "", "", "");
    for dry in [&[][..], &["--dry-run"]] {
        let (code, err) = refused(d, &[&["bake", r.to_str().unwrap()][..], dry].concat());
        assert_eq!(code, 1, "{err}");
        assert_eq!(
            err,
            format!(
                "error: {}: output.dir: {}: already exists\nhint: set `overwrite = true` in \
                 [output] to replace it, or choose another output.dir\n",
                r.display(),
                d.join("out").display()
            )
        );
    }
    assert_eq!(tree(d), ["out", "r.toml"], "something was written");
    recipe(d, &base, &lora, "", "overwrite = true", "");
    common::ok(run(d, &["bake", r.to_str().unwrap(), "--dry-run"]));
    common::ok(run(d, &[&merge[..], &["--overwrite"]].concat()));
}

/// An adapter on the two-expert A14B pipeline that does not say which expert it is for:
/// a usage error (exit 2) whose hint is `--adapter COMPONENT=PATH` for `merge`, a recipe
/// refusal (exit 1) whose hint is the `expert` key for `bake`.
#[test]
fn r_issue_28_an_a14b_component_hint_in_the_front_ends_spelling() {
    let t = tmp();
    let d = t.path();
    let base = repo().join("golden/models/a14b");
    let high = repo().join("golden/adapters/a14b_pair/high.safetensors");
    let h = high.to_str().unwrap();
    let (code, err) = refused(
        d,
        &[
            "merge",
            "--base",
            base.to_str().unwrap(),
            "--adapter",
            h,
            "--out",
            "out",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err,
        format!(
            "error: adapter `{h}`: the base has 2 transformers (transformer, transformer_2); \
             say which one it is for\nhint: say it as --adapter transformer={h}, or all={h} \
             for every one\n"
        )
    );
    let r = recipe(d, &base, &high, "", "", "");
    for dry in [&[][..], &["--dry-run"]] {
        let (code, err) = refused(d, &[&["bake", r.to_str().unwrap()][..], dry].concat());
        assert_eq!(code, 1, "{err}");
        assert_eq!(
            err,
            format!(
                "error: adapter `adapter[0] {h}`: the base has 2 transformers (transformer, \
                 transformer_2); say which one it is for\nhint: give its [[adapter]] an \
                 expert: `expert = \"transformer\"` or `expert = \"transformer_2\"`\n"
            )
        );
    }
    // A single model and an expert: the prefix (or key) to drop.
    let one = recipe(d, &t2v(), &lora(), "expert = \"transformer_2\"", "", "");
    let (code, err) = refused(d, &["bake", one.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.ends_with("\nhint: remove `expert = \"transformer_2\"` from its [[adapter]]\n"),
        "{err}"
    );
    let prefixed = format!("transformer_2={}", lora().display());
    let (code, err) = refused(
        d,
        &[
            "merge",
            "--base",
            t2v().to_str().unwrap(),
            "--adapter",
            &prefixed,
            "--out",
            "out",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.ends_with("\nhint: drop the prefix `transformer_2=`\n"),
        "{err}"
    );
    assert_eq!(tree(d), ["r.toml"], "something was written");
    recipe(d, &base, &high, "expert = \"transformer\"", "", "");
    common::ok(run(d, &["bake", r.to_str().unwrap(), "--dry-run"]));
}

/// An adapter made for another model (issue 33): the verdict (which model its shapes
/// imply) comes first, then the count and the first 8 entries that do not fit with a count
/// of the rest; `--json` carries every one. Which entries do not fit is read here from the
/// two files with the reference `safetensors` reader: a LoRA's B rows or A columns that
/// differ from its target's.
#[test]
fn r_issue_33_an_adapter_for_another_model_says_its_verdict_first_and_lists_eight() {
    let t = tmp();
    let d = t.path();
    let adapter = repo().join("golden/adapters/peft_plain");
    let base = repo().join("golden/models/ti2v");
    let read = |p: PathBuf| {
        let bytes = std::fs::read(p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let a = read(adapter.join("adapter_model.safetensors"));
    let b = read(base.join("diffusion_pytorch_model.safetensors"));
    let misfits: Vec<String> = a
        .iter()
        .filter_map(|(k, shape_b)| {
            let module = k.strip_suffix(".lora_B.weight")?;
            let shape_a = &a[&format!("{module}.lora_A.weight")];
            // (The base has two blocks: block 2's entries are unmatched, a later error.)
            let w = b.get(&format!(
                "{}.weight",
                module.strip_prefix("base_model.model.")?
            ))?;
            (shape_b[0] != w[0] || shape_a[1] != w[1]).then(|| module.to_string())
        })
        .collect();
    assert_eq!(misfits.len(), 22);
    let args = [
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        "out",
    ];
    let (code, err) = refused(d, &args);
    assert_eq!(code, 1, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "error: {}: the adapter's shapes imply",
            adapter.display()
        )) && lines[0].contains("matches no released model"),
        "{err}"
    );
    assert_eq!(
        lines[1],
        format!("22 entries do not fit the base {}:", base.display())
    );
    let listed: Vec<&str> = lines[2..10]
        .iter()
        .map(|l| l.trim_start().split(' ').next().unwrap())
        .collect();
    assert_eq!(listed, misfits[..8]);
    assert_eq!(lines[10], "  … and 14 more (all of them with --json)");
    assert_eq!(lines.len(), 11, "{err}");
    // --json: every entry, and the verdict on its own.
    let (code, out, _) = parts(&run(d, &[&args[..], &["--json"]].concat()));
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let all: Vec<&str> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["module"].as_str().unwrap())
        .collect();
    assert_eq!(all, misfits);
    assert!(
        doc["verdict"]
            .as_str()
            .unwrap()
            .starts_with("the adapter's shapes imply"),
        "{doc}"
    );
    assert!(doc["error"].as_str().unwrap().contains("… and 14 more"));
    // One entry reads as one (golden/adapters/comfy_lora's patch embedding on the I2V base).
    let one = [
        "merge",
        "--base",
        repo().join("golden/models/i2v").to_str().unwrap(),
        "--adapter",
        repo().join("golden/adapters/comfy_lora").to_str().unwrap(),
        "--out",
        "out",
    ]
    .map(str::to_string);
    let (_, err) = refused(d, &one.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(err.contains("\n1 entry does not fit the base"), "{err}");
    assert!(!err.contains("entr("), "{err}");
    assert!(!d.join("out").exists());
}

/// Consistency of the command line and recipes (issue 33): a value that is not one of its
/// field's names exits 2 in a recipe as on the command line; `--dtype fp8` (and
/// `dtype = "fp8"`) points at `--to fp8-scaled` where the command has it; `--svd-cache`
/// creates its folder as `[merge] svd_cache` does; summaries count with agreeing nouns and
/// say sizes in decimal units.
#[test]
fn r_issue_33_values_caches_plurals_and_sizes_read_alike_everywhere() {
    let t = tmp();
    let d = t.path();
    let base = t2v();
    let lora = lora();
    let lora_s = lora.to_str().unwrap();
    for (field, value) in [
        ("dtype", "fp9"),
        ("layout", "sideways"),
        ("to", "gguf:q9_9"),
    ] {
        let r = recipe(d, &base, &lora, "", &format!("{field} = \"{value}\""), "");
        let (code, err) = refused(d, &["bake", r.to_str().unwrap(), "--dry-run"]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains(&format!("output.{field}")) && err.contains(value),
            "{err}"
        );
        let args = ["merge", "--base", base.to_str().unwrap(), "--adapter"];
        let flag = format!("--{field}");
        let cli = [&args[..], &[lora_s, "--out", "o", &flag, value]].concat();
        let (code, err) = refused(d, &cli);
        assert_eq!(code, 2, "{err}");
    }
    // Out of range (not a name): still a refusal of the recipe's value, exit 1.
    let r = recipe(d, &base, &lora, "strength = inf", "", "");
    assert_eq!(refused(d, &["bake", r.to_str().unwrap(), "--dry-run"]).0, 1);

    // fp8 is --to's.
    let hint = "hint: fp8 is an encoding, not a dtype: --to fp8-scaled writes";
    for command in ["merge", "convert"] {
        let mut args = vec![command, "--dtype", "fp8", "--out", "o"];
        args.extend(match command {
            "merge" => vec!["--base", "b", "--adapter", "a"],
            _ => vec!["in"],
        });
        let (code, err) = refused(d, &args);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(hint), "{command}: {err}");
    }
    let (code, err) = refused(
        d,
        &["synth", "--dtype", "fp8", "--out", "o", "--model", "x"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("hint:"), "synth has no --to: {err}");
    let r = recipe(d, &base, &lora, "", "dtype = \"fp8\"", "");
    let (code, err) = refused(d, &["bake", r.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("set `to = \"fp8-scaled\"` in [output]"),
        "{err}"
    );

    // --svd-cache: created when missing.
    let cache = d.join("caches/svd");
    let out = d.join("merged");
    let args = [
        "merge",
        "--base",
        base.to_str().unwrap(),
        "--adapter",
        lora_s,
        "--out",
        out.to_str().unwrap(),
        "--svd-cache",
        cache.to_str().unwrap(),
    ];
    let (code, said, err) = parts(&run(d, &args));
    assert_eq!(code, 0, "{err}");
    assert!(cache.is_dir());
    // One adapter, its entries and the files: nouns agree, the size is decimal.
    let written: u64 = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum::<u64>()
        - std::fs::metadata(out.join("wanbake.manifest.json"))
            .unwrap()
            .len();
    let size = format!("{:.2} kB", written as f64 / 1000.0);
    assert!(said.contains("merged 1 adapter into "), "{said}");
    assert!(
        said.contains(&format!("(2 files, {size}, 96 tensors)")),
        "{said}"
    );
    assert!(!said.contains("(s)") && !said.contains("bytes"), "{said}");
}
