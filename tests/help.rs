//! Each command's `--help` speaks of that command only (issue 33): a flag shared by several
//! commands says, on each, what it means there, and the top-level summary names what each
//! command does.

mod common;

use common::*;

fn help(args: &[&str]) -> String {
    let d = tmp();
    let mut a = args.to_vec();
    a.push("--help");
    ok(run(d.path(), &a))
}

/// Help text with its line wrapping undone, so phrases can be searched for.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn each_commands_help_speaks_of_that_command_only() {
    // (command, phrases its help must not contain, phrases it must contain)
    // (command, phrases its help must not contain, phrases it must contain); the absent
    // ones are how the shared texts used to address other commands.
    let others = [
        "synth,",
        "convert:",
        "resize:",
        "extract:",
        "(merge",
        "the SVDs",
        "restack runs",
    ];
    let but = |own: &[&str]| -> Vec<&str> {
        others
            .iter()
            .copied()
            .filter(|p| !own.contains(p))
            .collect()
    };
    let cases: Vec<(&str, Vec<&str>, &[&str])> = vec![
        ("synth", but(&[]), &["default f32"]),
        (
            "convert",
            but(&[]),
            &["with --to fp8-scaled", "Default: one file per model"],
        ),
        (
            "restack",
            but(&["restack runs"]),
            &["restack runs on the CPU", "Default: one file per model"],
        ),
        ("merge", but(&[]), &["Default: shards like the base"]),
        (
            "extract",
            but(&["the SVDs"]),
            &["Where the SVDs are computed", "Dtype of the factors"],
        ),
        ("resize", but(&[]), &["Dtype of the new factors"]),
        (
            "verify",
            vec!["`verify` never", "verify never"],
            &["never from the hash cache"],
        ),
    ];
    for (command, absent, present) in cases {
        let text = flat(&help(&[command]));
        for phrase in absent {
            assert!(
                !text.contains(phrase),
                "{command} --help mentions {phrase:?}:\n{text}"
            );
        }
        for phrase in present.iter() {
            assert!(
                text.contains(phrase),
                "{command} --help lacks {phrase:?}:\n{text}"
            );
        }
    }
}

#[test]
fn the_summary_names_what_each_command_does() {
    let text = help(&[]);
    let line = |command: &str| {
        let start = text
            .lines()
            .position(|l| l.trim_start().starts_with(&format!("{command} ")))
            .unwrap_or_else(|| panic!("no {command} in the summary:\n{text}"));
        // A summary may wrap onto indented lines.
        let rest = text.lines().skip(start + 1);
        let more = rest.take_while(|l| l.starts_with("            "));
        flat(
            &std::iter::once(text.lines().nth(start).unwrap())
                .chain(more)
                .collect::<Vec<_>>()
                .join(" "),
        )
    };
    let convert = line("convert");
    assert!(
        convert.contains("fp8") && convert.contains("GGUF"),
        "{convert}"
    );
    let translate = line("translate");
    assert!(translate.contains("LyCORIS"), "{translate}");
}

#[test]
fn completion_scripts_name_every_command_and_survive_a_closed_pipe() {
    let d = tmp();
    let commands = [
        "inspect",
        "verify",
        "synth",
        "convert",
        "translate",
        "merge",
        "restack",
        "run",
        "bake",
        "sign",
        "extract",
        "resize",
    ];
    for (shell, header) in [
        ("bash", "_wanbake()"),
        ("zsh", "#compdef wanbake"),
        ("fish", "complete -c wanbake"),
    ] {
        let script = ok(run(d.path(), &["completions", shell]));
        assert!(script.contains(header), "{shell}: {script}");
        for c in commands {
            assert!(script.contains(c), "{shell}: no `{c}`");
        }
        // A flag of one command, with its values: merge's --to lists fp8-scaled.
        assert!(script.contains("fp8-scaled"), "{shell}");
    }
    let bad = run(d.path(), &["completions", "tcsh"]);
    assert_eq!(parts(&bad).0, 2);
    // `wanbake completions bash | head -1`: the reader goes away, the command still exits 0.
    let mut child = std::process::Command::new(bin())
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert!(child.wait().unwrap().success());
}
